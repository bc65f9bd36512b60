#include "connection.hpp"

#include <poll.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace idem::postgres_detail {
namespace {

using std::chrono::milliseconds;

// Waits until the socket is ready for `events` or the deadline passes. Readiness includes errors
// and hang-ups: libpq finds out what they mean on its next read or write.
Io wait_socket(PGconn* conn, short events, Deadline deadline, short* revents = nullptr) {
  const int fd = PQsocket(conn);
  if (fd < 0) return Io::lost;
  for (;;) {
    const auto left = std::chrono::ceil<milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) return Io::timed_out;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 60'000)));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Io::lost;
    }
    if (n == 0) continue;  // re-check the deadline
    if (revents) *revents = p.revents;
    return Io::ok;
  }
}

void ignore_notice(void*, const char*) {}

std::string trimmed(const char* message) {
  std::string s = message ? message : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() ? "unknown libpq error" : s;
}

void put_be(char* out, std::uint64_t value, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) {
    out[i] = static_cast<char>(value & 0xff);
    value >>= 8;
  }
}

std::uint64_t get_be(const char* in, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value = (value << 8) | static_cast<unsigned char>(in[i]);
  return value;
}

// Collects a query's results up to PQgetResult's NULL; keeps the first error, else the last result.
std::expected<Result, Failure> collect(PGconn* conn, milliseconds silence, const Exchange& exchange) {
  if (Io io = flush(conn, SteadyClock::now() + silence); io != Io::ok) return std::unexpected(io_failure(conn, io, exchange));
  Result kept;
  std::optional<Failure> failure;
  for (;;) {
    Result r;
    if (Io io = next_result(conn, SteadyClock::now() + silence, r); io != Io::ok) {
      if (failure) {  // the server already said no; the connection died after
        failure->poison = true;
        return std::unexpected(*failure);
      }
      return std::unexpected(io_failure(conn, io, exchange));
    }
    if (!r) break;
    const ExecStatusType status = PQresultStatus(r.get());
    if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK || status == PGRES_EMPTY_QUERY) {
      kept = std::move(r);
      continue;
    }
    if (status == PGRES_COPY_IN || status == PGRES_COPY_OUT || status == PGRES_COPY_BOTH) {
      Exchange e = exchange;
      e.what = "unexpected COPY";
      return std::unexpected(map_error(Cause::connection_lost, "", "a statement started COPY, which the store does not drive", e));
    }
    if (!failure) {
      failure = result_failure(conn, r.get(), exchange);
      if (!is_server_error(r.get())) return std::unexpected(*failure);  // the socket failed
    }
  }
  if (failure) return std::unexpected(*failure);
  return kept;
}

}  // namespace

std::expected<Conn, Failure> connect(const std::string& conninfo, const std::string& application_name,
                                     Deadline deadline) {
  const Exchange exchange{"connect", false, false};
  // Later keywords override earlier ones: the conninfo may set its own application_name, and
  // nothing overrides the encoding the store needs.
  const char* keys[] = {"application_name", "dbname", "client_encoding", nullptr};
  const char* values[] = {application_name.c_str(), conninfo.c_str(), "UTF8", nullptr};
  Conn conn(PQconnectStartParams(keys, values, /*expand_dbname=*/1));
  if (!conn) return std::unexpected(map_error(Cause::connection_lost, "", "out of memory", exchange));
  if (PQstatus(conn.get()) == CONNECTION_BAD) {
    return std::unexpected(map_error(Cause::connection_lost, "", trimmed(PQerrorMessage(conn.get())), exchange));
  }
  // libpq's own connect_timeout does not apply to a non-blocking connect: the deadline is ours.
  PostgresPollingStatusType polling = PGRES_POLLING_WRITING;
  for (;;) {
    if (polling == PGRES_POLLING_OK) break;
    if (polling == PGRES_POLLING_FAILED) {
      return std::unexpected(map_error(Cause::connection_lost, "", trimmed(PQerrorMessage(conn.get())), exchange));
    }
    const short events = polling == PGRES_POLLING_READING ? POLLIN : POLLOUT;
    const Io io = wait_socket(conn.get(), events, deadline);
    if (io == Io::timed_out) {
      // Nothing was asked of the server yet: it is unreachable, not slow to answer.
      return std::unexpected(
          map_error(Cause::connection_lost, "", "timed out: the server did not accept the connection in time", exchange));
    }
    if (io == Io::lost) {
      return std::unexpected(map_error(Cause::connection_lost, "", trimmed(PQerrorMessage(conn.get())), exchange));
    }
    polling = PQconnectPoll(conn.get());
  }
  if (PQsetnonblocking(conn.get(), 1) != 0) {
    return std::unexpected(map_error(Cause::connection_lost, "", trimmed(PQerrorMessage(conn.get())), exchange));
  }
  // Notices (and the FATAL a server sends an idle connection when it shuts down) would go to
  // stderr; the store reports what matters through its results.
  PQsetNoticeProcessor(conn.get(), ignore_notice, nullptr);
  return conn;
}

Io flush(PGconn* conn, Deadline deadline) {
  for (;;) {
    const int rc = PQflush(conn);
    if (rc == 0) return Io::ok;
    if (rc < 0) return Io::lost;
    short revents = 0;
    if (Io io = wait_socket(conn, POLLIN | POLLOUT, deadline, &revents); io != Io::ok) return io;
    if ((revents & (POLLIN | POLLHUP | POLLERR)) && !PQconsumeInput(conn)) return Io::lost;
  }
}

Io next_result(PGconn* conn, Deadline deadline, Result& out) {
  for (;;) {
    if (!PQisBusy(conn)) {
      out.reset(PQgetResult(conn));
      return Io::ok;
    }
    if (Io io = wait_socket(conn, POLLIN, deadline); io != Io::ok) return io;
    // When the socket fails libpq may still hand out what it had, ending in an error result.
    if (!PQconsumeInput(conn) && PQisBusy(conn)) return Io::lost;
  }
}

bool idle_connection_alive(PGconn* conn) {
  if (PQstatus(conn) != CONNECTION_OK) return false;
  const int fd = PQsocket(conn);
  if (fd < 0) return false;
  // A shutting-down server sends a FATAL and closes: two reads may be needed to see the EOF.
  for (int i = 0; i < 4; ++i) {
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, 0);
    if (n == 0) return true;
    if (n < 0) return errno == EINTR;
    if (!PQconsumeInput(conn) || PQstatus(conn) != CONNECTION_OK) return false;
  }
  // Still readable after several reads of an idle connection: something is wrong with it.
  return false;
}

Failure io_failure(PGconn* conn, Io io, const Exchange& exchange) {
  if (io == Io::timed_out) return map_error(Cause::client_timeout, "", "the server did not answer", exchange);
  return map_error(Cause::connection_lost, "", trimmed(PQerrorMessage(conn)), exchange);
}

bool is_server_error(const PGresult* result) {
  const char* state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
  return state && *state;
}

Failure result_failure(PGconn* conn, const PGresult* result, const Exchange& exchange) {
  const char* message = PQresultErrorMessage(result);
  if (is_server_error(result)) {
    return map_error(Cause::server, PQresultErrorField(result, PG_DIAG_SQLSTATE), trimmed(message), exchange);
  }
  const std::string detail = message && *message ? trimmed(message) : trimmed(PQerrorMessage(conn));
  return map_error(Cause::connection_lost, "", detail, exchange);
}

void Params::int8(std::int64_t value) {
  auto& buf = scratch_.emplace_back();
  put_be(buf.data(), static_cast<std::uint64_t>(value), 8);
  add(std::string_view(buf.data(), 8), 1);
}

void Params::int4(std::int32_t value) {
  auto& buf = scratch_.emplace_back();
  put_be(buf.data(), static_cast<std::uint32_t>(value), 4);
  add(std::string_view(buf.data(), 4), 1);
}

void Params::boolean(bool value) {
  auto& buf = scratch_.emplace_back();
  buf[0] = value ? 1 : 0;
  add(std::string_view(buf.data(), 1), 1);
}

std::int64_t Reader::int8(int col) {
  if (null(col) || PQgetlength(result_, row_, col) != 8) {
    ok_ = false;
    return 0;
  }
  return static_cast<std::int64_t>(get_be(PQgetvalue(result_, row_, col), 8));
}

std::int32_t Reader::int4(int col) {
  if (null(col) || PQgetlength(result_, row_, col) != 4) {
    ok_ = false;
    return 0;
  }
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(get_be(PQgetvalue(result_, row_, col), 4)));
}

std::expected<Result, Failure> exec(PGconn* conn, const std::string& sql, const Params& params, int result_format,
                                    milliseconds silence, const Exchange& exchange) {
  if (!PQsendQueryParams(conn, sql.c_str(), params.size(), nullptr, params.values(), params.lengths(), params.formats(),
                         result_format)) {
    Exchange unsent = exchange;
    unsent.commit_sent = false;  // nothing reached the server
    return std::unexpected(map_error(Cause::connection_lost, "", trimmed(PQerrorMessage(conn)), unsent));
  }
  return collect(conn, silence, exchange);
}

std::expected<Result, Failure> exec_prepared(PGconn* conn, const char* name, const Params& params,
                                             milliseconds silence, const Exchange& exchange) {
  if (!PQsendQueryPrepared(conn, name, params.size(), params.values(), params.lengths(), params.formats(), 1)) {
    Exchange unsent = exchange;
    unsent.commit_sent = false;
    return std::unexpected(map_error(Cause::connection_lost, "", trimmed(PQerrorMessage(conn)), unsent));
  }
  return collect(conn, silence, exchange);
}

std::expected<Done, Failure> exec_script(PGconn* conn, const std::string& sql, milliseconds silence,
                                         const Exchange& exchange) {
  if (!PQsendQuery(conn, sql.c_str())) {
    Exchange unsent = exchange;
    unsent.commit_sent = false;
    return std::unexpected(map_error(Cause::connection_lost, "", trimmed(PQerrorMessage(conn)), unsent));
  }
  auto result = collect(conn, silence, exchange);
  if (!result) return std::unexpected(result.error());
  return Done{};
}

std::uint64_t affected_rows(const PGresult* result) {
  const char* n = PQcmdTuples(const_cast<PGresult*>(result));
  return n && *n ? std::strtoull(n, nullptr, 10) : 0;
}

std::string quote_ident(std::string_view name) {
  std::string out = "\"";
  for (char c : name) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

bool valid_text(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == 0) return false;
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    std::uint32_t cp = 0;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + static_cast<std::size_t>(len) > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += static_cast<std::size_t>(len);
  }
  return true;
}

}  // namespace idem::postgres_detail
