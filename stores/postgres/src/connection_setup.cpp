#include "connection_setup.hpp"

namespace idem::postgres_detail {

std::optional<Failure> setup_connection(PGconn* conn, const StatementSql& sql, const PostgresOptions& o,
                                            std::chrono::milliseconds silence) {
  const Exchange ex{"prepare connection", false, false};
  auto lost = [&] { return io_failure(conn, Io::lost, ex); };
  if (!PQenterPipelineMode(conn)) return lost();
  const std::string timeout = std::to_string(o.statement_timeout.count());
  Params p;
  p.text_form(timeout.c_str());
  if (!PQsendQueryParams(conn, "SELECT set_config('statement_timeout', $1, false)", 1, nullptr, p.values(),
                         p.lengths(), p.formats(), 0)) {
    return lost();
  }
  for (int i = 0; i < kStatementCount; ++i) {
    if (!PQsendPrepare(conn, statement_name(static_cast<Stmt>(i)), sql[static_cast<std::size_t>(i)].c_str(), 0,
                       nullptr)) {
      return lost();
    }
  }
  if (!PQpipelineSync(conn)) return lost();
  if (Io io = flush(conn, SteadyClock::now() + silence); io != Io::ok) return io_failure(conn, io, ex);
  std::optional<Failure> failure;
  for (int i = 0; i < 1 + kStatementCount; ++i) {
    for (bool first = true;; first = false) {
      Result r;
      if (Io io = next_result(conn, SteadyClock::now() + silence, r); io != Io::ok) {
        return io_failure(conn, io, ex);
      }
      if (!r) break;
      const auto status = PQresultStatus(r.get());
      if (first && (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK || status == PGRES_PIPELINE_ABORTED)) continue;
      if (!failure) failure = result_failure(conn, r.get(), ex);
      failure->poison = true;  // a connection that failed its setup is never used
    }
  }
  Result sync;
  if (Io io = next_result(conn, SteadyClock::now() + silence, sync); io != Io::ok) {
    return io_failure(conn, io, ex);
  }
  if (failure) return failure;
  if (!sync || PQresultStatus(sync.get()) != PGRES_PIPELINE_SYNC) {
    if (sync) return result_failure(conn, sync.get(), ex);
    return lost();
  }
  return std::nullopt;
}

std::chrono::milliseconds silence_of(const PostgresOptions& o) {
  // The server cancels a statement at statement_timeout; a second more without a word means the
  // connection (or the server) is gone.
  const Millis base = o.statement_timeout > Millis::zero() ? o.statement_timeout : Millis{60'000};
  return base + Millis{1000};
}

std::expected<Conn, Failure> open_connection(const PostgresOptions& o, const StatementSql* sql) {
  auto conn = connect(o.conninfo, o.application_name, SteadyClock::now() + o.connect_timeout);
  if (!conn) return conn;
  if (sql) {
    if (auto failed = setup_connection(conn->get(), *sql, o, silence_of(o))) return std::unexpected(*failed);
  }
  return conn;
}

}  // namespace idem::postgres_detail
