#pragma once

// The thin layer over libpq: RAII handles, a connect and waits that never block past a deadline,
// binary parameters and results. The only header of the module that includes libpq-fe.h; nothing
// here is installed.

#include <libpq-fe.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "errors.hpp"

namespace idem::postgres_detail {

using SteadyClock = std::chrono::steady_clock;
using Deadline = SteadyClock::time_point;

/// Closes a connection when its owner goes away.
struct ConnCloser {
  void operator()(PGconn* conn) const { PQfinish(conn); }
};
/// An open connection.
using Conn = std::unique_ptr<PGconn, ConnCloser>;

/// Frees a result.
struct ResultClearer {
  void operator()(PGresult* result) const { PQclear(result); }
};
/// A result.
using Result = std::unique_ptr<PGresult, ResultClearer>;

/// How a wait on the connection ended.
enum class Io : unsigned char { ok, lost, timed_out };

/// Opens a connection in non-blocking mode, giving up at `deadline`. `conninfo` is a URL or
/// key=value string; `application_name` applies unless the conninfo sets its own. The client
/// encoding is forced to UTF-8 (text parameters are sent as UTF-8 bytes).
std::expected<Conn, Failure> connect(const std::string& conninfo, const std::string& application_name, Deadline deadline);

/// Sends everything libpq has buffered, reading input meanwhile so that a server busy writing
/// results to us never blocks on a full socket while we block on ours.
Io flush(PGconn* conn, Deadline deadline);

/// Waits until the next result is ready and takes it; `out` is null when the current query's
/// results are over (PQgetResult's NULL).
Io next_result(PGconn* conn, Deadline deadline, Result& out);

/// Whether an idle connection is still usable: reads whatever the server sent meanwhile (a
/// shutdown notice, an EOF) without waiting.
bool idle_connection_alive(PGconn* conn);

/// The failure a wait ended with (connection lost or timed out).
Failure io_failure(PGconn* conn, Io io, const Exchange& exchange);

/// The failure an error result stands for: a server error if it carries a SQLSTATE, a lost
/// connection otherwise (libpq makes up results without SQLSTATE when the socket fails).
Failure result_failure(PGconn* conn, const PGresult* result, const Exchange& exchange);

/// Whether a result is a server error (as opposed to one libpq made up).
bool is_server_error(const PGresult* result);

/// Binary-format parameters. Text and bytea values are not copied: the bytes must outlive the
/// send. Integers are kept inside.
class Params {
 public:
  void text(std::string_view value) { add(value, 1); }
  void bytea(std::string_view value) { add(value, 1); }
  void int8(std::int64_t value);
  void int4(std::int32_t value);
  void boolean(bool value);
  void null() {
    values_.push_back(nullptr);
    lengths_.push_back(0);
    formats_.push_back(1);
  }
  /// A parameter in PostgreSQL's text form, NUL-terminated (null for SQL NULL); not copied.
  void text_form(const char* value) {
    values_.push_back(value);
    lengths_.push_back(0);
    formats_.push_back(0);
  }

  int size() const { return static_cast<int>(values_.size()); }
  const char* const* values() const { return values_.data(); }
  const int* lengths() const { return lengths_.data(); }
  const int* formats() const { return formats_.data(); }

 private:
  void add(std::string_view value, int format) {
    values_.push_back(value.data() ? value.data() : "");  // a null pointer would mean SQL NULL
    lengths_.push_back(static_cast<int>(value.size()));
    formats_.push_back(format);
  }
  std::vector<const char*> values_;
  std::vector<int> lengths_;
  std::vector<int> formats_;
  std::deque<std::array<char, 8>> scratch_;  // a deque: elements never move
};

/// Reads binary-format result columns; a value of the wrong size marks the reader bad instead
/// of reading past it.
class Reader {
 public:
  Reader(const PGresult* result, int row) : result_(result), row_(row) {}
  bool null(int col) const { return PQgetisnull(result_, row_, col); }
  std::string_view bytes(int col) const {
    return {PQgetvalue(result_, row_, col), static_cast<std::size_t>(PQgetlength(result_, row_, col))};
  }
  std::int64_t int8(int col);
  std::int32_t int4(int col);
  bool ok() const { return ok_; }

 private:
  const PGresult* result_;
  int row_;
  bool ok_ = true;
};

/// Runs one statement outside pipeline mode (parameters may be empty) and waits for its
/// result, each wait ending at now + `silence`. Returns the result of a successful statement.
std::expected<Result, Failure> exec(PGconn* conn, const std::string& sql, const Params& params, int result_format,
                                    std::chrono::milliseconds silence, const Exchange& exchange);

/// Runs a prepared statement outside pipeline mode, as exec does.
std::expected<Result, Failure> exec_prepared(PGconn* conn, const char* name, const Params& params,
                                             std::chrono::milliseconds silence, const Exchange& exchange);

/// Runs a script of several statements (simple protocol, no parameters), e.g. a migration.
std::expected<Done, Failure> exec_script(PGconn* conn, const std::string& sql, std::chrono::milliseconds silence,
                                         const Exchange& exchange);

/// Rows affected by an INSERT, UPDATE or DELETE.
std::uint64_t affected_rows(const PGresult* result);

/// `"name"`, with inner quotes doubled: an SQL identifier for any name.
std::string quote_ident(std::string_view name);

/// Whether a string can be a text value: valid UTF-8 without NUL (the server refuses others).
bool valid_text(std::string_view value);

}  // namespace idem::postgres_detail
