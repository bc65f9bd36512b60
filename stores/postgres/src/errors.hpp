#pragma once

// How PostgreSQL and libpq failures become StoreErrors: the one place that decides which failures
// a caller may retry, which poison a connection, and when a write is in doubt. No libpq here, so
// the rules are testable without a server.

#include <string_view>

#include "idem/result.hpp"

namespace idem::postgres_detail {

/// Where a failure came from.
enum class Cause : unsigned char {
  server,          ///< the server answered with an error (it has a SQLSTATE)
  connection_lost, ///< libpq lost the connection (reset, EOF, refused, protocol error)
  client_timeout,  ///< the server stayed silent past our deadline; we abandon the connection
};

/// What the caller knows about the exchange that failed.
struct Exchange {
  std::string_view what;  ///< "claim batch", "connect", ... for the message
  /// The exchange could change data (a write, or a transaction with writes).
  bool writes = false;
  /// The commit point may have been reached: the transaction's commit (the pipeline's Sync, a
  /// COMMIT, an autocommitted statement) was handed to the socket, and no server error said the
  /// transaction aborted before it. With `writes`, a connection failure here is in doubt.
  bool commit_sent = false;
};

/// The verdict on one failure.
struct Failure {
  StoreError error;
  bool poison = false;   ///< the connection cannot be trusted again: close it and reconnect
  bool retry = false;    ///< a transient conflict rolled the transaction back: run it again
  bool isolate = false;  ///< the server refused a statement for its data: in a batch, run each operation alone
};

/// Maps one failure. `sqlstate` is the server's code (empty when libpq produced the error) and
/// `detail` the message to pass on.
Failure map_error(Cause cause, std::string_view sqlstate, std::string_view detail, const Exchange& exchange);

}  // namespace idem::postgres_detail
