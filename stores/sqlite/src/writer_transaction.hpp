#pragma once

// Lets SqliteOutbox::enqueue reuse a prepared INSERT while complete_in_transaction's work runs on
// the store's writer connection. enqueue's interface is a bare sqlite3* (the work's, or any
// transaction of the application's), and preparing the INSERT of idem_outbox (its CHECKs, its
// trigger, four indexes) costs more than running it: prepared per call, it was a quarter of a
// payment's writer time (docs/benchmarks.md). The writer marks the span of each work call with a
// WriterTransaction; inside it, enqueue on that very connection uses the writer's statement.

#include "connection.hpp"

namespace idem::sqlite_detail {

/// Marks, for the calling thread and the life of the object, that `db` is the store's writer
/// connection inside complete_in_transaction's work, and where its cached outbox INSERT lives
/// (prepared by the first enqueue, then reused; it outlives the scope with the connection).
/// Scopes nest; each restores the one it replaced.
class WriterTransaction {
 public:
  WriterTransaction(sqlite3* db, Statement& outbox_insert);
  ~WriterTransaction();
  WriterTransaction(const WriterTransaction&) = delete;
  WriterTransaction& operator=(const WriterTransaction&) = delete;

  /// The cached INSERT slot for `db` if the calling thread is inside a WriterTransaction on it;
  /// nullptr otherwise (another connection, or no store work running on this thread).
  static Statement* outbox_insert_for(sqlite3* db);

 private:
  sqlite3* db_;
  Statement& outbox_insert_;
  WriterTransaction* previous_;
};

}  // namespace idem::sqlite_detail
