#include "idem/sqlite_store.hpp"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <limits>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "connection.hpp"
#include "operations.hpp"
#include "schema.hpp"

namespace idem {
namespace {

using sqlite_detail::Db;
using sqlite_detail::Effects;
using sqlite_detail::internal_error;
using sqlite_detail::prepare_statements;
using sqlite_detail::map_error;
using sqlite_detail::Statement;
using sqlite_detail::Statements;
using namespace sqlite_detail::ops;

const char* synchronous_pragma(SqliteSynchronous mode) {
  switch (mode) {
    case SqliteSynchronous::off:
      return "PRAGMA synchronous = OFF";
    case SqliteSynchronous::normal:
      return "PRAGMA synchronous = NORMAL";
    case SqliteSynchronous::full:
      return "PRAGMA synchronous = FULL";
    case SqliteSynchronous::extra:
      return "PRAGMA synchronous = EXTRA";
  }
  return "PRAGMA synchronous = FULL";
}

// How an operation uses the transaction it runs in.
enum class OpClass : std::uint8_t {
  read,   // reads only; a batch of reads only needs no write lock
  write,  // writes inside the batch's write transaction, in a savepoint of its own
  solo,   // writes in a transaction of its own (purge: a big delete should not delay requests)
};

// One queued operation: its body runs on the writer thread; its callback runs after the commit.
class Op {
 public:
  explicit Op(OpClass op_class) : op_class_(op_class) {}
  virtual ~Op() = default;
  OpClass op_class() const { return op_class_; }
  // Runs the body; false when the operation's savepoint must be undone.
  virtual bool run(Db& db) = 0;
  // Replaces the outcome with an error (the transaction did not begin, was lost or did not commit).
  virtual void fail(const StoreError& error) = 0;
  // Whether the body has run (or the operation has already been failed).
  virtual bool ran() const = 0;
  // Whether the body produced a value (as opposed to an error).
  virtual bool succeeded() const = 0;
  // Whether the body changed the database.
  virtual bool wrote() const = 0;
  // Calls the callback, once.
  virtual void deliver() = 0;
  // How many of the store's operations it carries (a batch call: one per item).
  virtual std::size_t size() const { return 1; }

 private:
  OpClass op_class_;
};

template <class T>
class TypedOp final : public Op {
 public:
  using Body = std::move_only_function<StoreResult<T>(Db&, Effects&)>;
  TypedOp(OpClass op_class, Body body, Callback<T> done)
      : Op(op_class), body_(std::move(body)), done_(std::move(done)) {}

  bool run(Db& db) override {
    result_ = body_(db, effects_);
    if (effects_.rollback) effects_.wrote = false;
    return result_->has_value() && !effects_.rollback;
  }
  void fail(const StoreError& error) override { result_ = std::unexpected(error); }
  bool ran() const override { return result_.has_value(); }
  bool succeeded() const override { return result_ && result_->has_value(); }
  bool wrote() const override { return effects_.wrote; }
  void deliver() override {
    if (!result_) result_ = std::unexpected(internal_error("sqlite: operation was never run"));
    auto done = std::move(done_);
    if (done) done(std::move(*result_));
  }

 private:
  Body body_;
  Callback<T> done_;
  std::optional<StoreResult<T>> result_;
  Effects effects_;
};

// A batch call: its items, one after the other, each in a savepoint of its own inside the batch's
// savepoint, so that an item that fails undoes only itself (as the single call's savepoint does).
// The body takes its item as ItemRef: const, but for items whose work it runs.
template <class Item, class T, class ItemRef = const Item&>
class BatchOp final : public Op {
 public:
  using Body = StoreResult<T> (*)(Db&, ItemRef, Effects&);
  BatchOp(std::vector<Item> items, Body body, BatchCallback<T> done)
      : Op(OpClass::write),
        items_(std::move(items)),
        body_(body),
        done_(std::move(done)),
        results_(items_.size()),
        wrote_(items_.size(), false) {}

  bool run(Db& db) override {
    ran_ = true;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (auto opened = db.st.savepoint.run("savepoint"); !opened) return broken(opened.error());
      Effects fx;
      results_[i] = body_(db, items_[i], fx);
      const bool keep = results_[i]->has_value() && !fx.rollback;
      // An I/O error or a full disk can make SQLite roll the whole transaction back: the writer
      // sees it and fails every operation still standing, this batch's earlier items included.
      if (sqlite3_get_autocommit(db.raw)) return false;
      if (!keep) {
        if (auto undone = db.st.rollback_to_savepoint.run("roll back to savepoint"); !undone) {
          return broken(undone.error());
        }
      }
      if (auto released = db.st.release_savepoint.run("release savepoint"); !released) return broken(released.error());
      wrote_[i] = keep && fx.wrote;
    }
    return true;
  }
  // Items that failed on their own keep their error; the others take this one, in doubt only if
  // the item wrote.
  void fail(const StoreError& error) override {
    ran_ = true;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (results_[i] && !results_[i]->has_value()) continue;
      StoreError item_error = error;
      item_error.in_doubt = error.in_doubt && wrote_[i];
      results_[i] = std::unexpected(std::move(item_error));
    }
  }
  bool ran() const override { return ran_; }
  bool succeeded() const override { return ran_ && !broken_; }
  bool wrote() const override { return std::find(wrote_.begin(), wrote_.end(), true) != wrote_.end(); }
  void deliver() override {
    BatchResults<T> results;
    results.reserve(results_.size());
    for (auto& r : results_) {
      results.push_back(r ? std::move(*r) : std::unexpected(internal_error("sqlite: batch item was never run")));
    }
    auto done = std::move(done_);
    if (done) done(std::move(results));
  }
  std::size_t size() const override { return items_.size(); }

 private:
  // The savepoint statements themselves failed: nothing of the batch can be trusted, so every
  // item fails and the batch's savepoint is undone.
  bool broken(const StoreError& error) {
    broken_ = true;
    for (auto& r : results_) r = std::unexpected(error);
    std::fill(wrote_.begin(), wrote_.end(), false);
    return false;
  }

  std::vector<Item> items_;
  Body body_;
  BatchCallback<T> done_;
  std::vector<std::optional<StoreResult<T>>> results_;
  std::vector<bool> wrote_;
  bool ran_ = false;
  bool broken_ = false;
};

template <class T, class Body>
std::unique_ptr<Op> make_op(OpClass op_class, Body&& body, Callback<T> done) {
  return std::make_unique<TypedOp<T>>(op_class, typename TypedOp<T>::Body(std::forward<Body>(body)), std::move(done));
}

}  // namespace

// ---- the writer -------------------------------------------------------------------------------

class SqliteStore::Impl {
 public:
  Impl(SqliteOptions options, sqlite_detail::Connection db, Statements statements)
      : options_(std::move(options)), db_(std::move(db)), st_(std::move(statements)) {
    writer_ = std::thread([this] { writer_loop(); });
    if (options_.reaper_interval > Millis::zero()) reaper_ = std::thread([this] { reaper_loop(); });
  }

  ~Impl() {
    {
      std::lock_guard lock(reaper_mutex_);
      reaper_stop_ = true;
    }
    reaper_cv_.notify_all();
    if (reaper_.joinable()) reaper_.join();
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    writer_.join();
  }

  void submit(std::unique_ptr<Op> op) {
    {
      std::lock_guard lock(mutex_);
      if (!closed_) {
        queue_.push_back(std::move(op));
        cv_.notify_one();
        return;
      }
    }
    op->fail(StoreError{StoreErrc::unavailable, "sqlite: the store is closed"});
    op->deliver();
  }

  bool on_writer_thread() const { return std::this_thread::get_id() == writer_.get_id(); }

  SqliteStoreStats stats() const {
    SqliteStoreStats s;
    s.operations = operations_.load(std::memory_order_relaxed);
    s.transactions = transactions_.load(std::memory_order_relaxed);
    s.write_transactions = write_transactions_.load(std::memory_order_relaxed);
    s.largest_batch = largest_batch_.load(std::memory_order_relaxed);
    s.failed_transactions = failed_transactions_.load(std::memory_order_relaxed);
    s.reaped = reaped_.load(std::memory_order_relaxed);
    s.reaper_batches = reaper_batches_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  void writer_loop() {
    block_file_size_signal();
    std::vector<std::unique_ptr<Op>> ops;
    ops.reserve(batch_limit());
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) {  // stopping, and everything queued is done
          closed_ = true;
          break;
        }
        ops.push_back(std::move(queue_.front()));
        queue_.pop_front();
        if (ops.front()->op_class() != OpClass::solo) take_locked(ops, /*reads_only=*/false);
      }
      run_transaction(ops);
      for (auto& op : ops) op->deliver();  // after the commit, with no lock held
      ops.clear();
    }
    // Closed here rather than by the destructor's thread: closing checkpoints the WAL into the
    // database file, a write like the others (see block_file_size_signal).
    st_ = Statements{};
    db_.reset();
  }

  // The store writes on this thread (all but the schema's creation in open). A write past the
  // process's file-size limit (ulimit -f, systemd's LimitFSIZE) raises SIGXFSZ at the writing
  // thread, and its default action kills the whole process. Blocked here, it stays pending on
  // this thread and the write fails with EFBIG: an I/O error the operations report as
  // unavailable, like a full disk, and the store writes again once the limit is raised.
  static void block_file_size_signal() {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGXFSZ);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  }

  std::size_t batch_limit() const { return std::max<std::size_t>(options_.max_batch, 1); }

  // Moves queued operations that may join the current transaction into `ops`, in order, up to
  // the batch limit; stops at a solo operation (and, for a read transaction, at a write).
  // Returns whether it took any. Requires mutex_.
  bool take_locked(std::vector<std::unique_ptr<Op>>& ops, bool reads_only) {
    const std::size_t before = ops.size();
    while (!queue_.empty() && ops.size() < batch_limit()) {
      const OpClass next = queue_.front()->op_class();
      if (next == OpClass::solo || (reads_only && next != OpClass::read)) break;
      ops.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    return ops.size() > before;
  }

  // Runs `ops` in one transaction, each write in its own savepoint. Operations queued while it
  // runs join it before the commit (up to the batch limit): they would otherwise wait a whole
  // fsync for the next one.
  void run_transaction(std::vector<std::unique_ptr<Op>>& ops) {
    Db db{db_.get(), st_};
    const bool writes =
        std::any_of(ops.begin(), ops.end(), [](const auto& op) { return op->op_class() != OpClass::read; });
    transactions_.fetch_add(1, std::memory_order_relaxed);

    // BEGIN IMMEDIATE takes the write lock now (waiting up to busy_timeout for other processes),
    // so every read below sees the latest commit and nothing can change under the decisions.
    if (auto begun = (writes ? st_.begin_immediate : st_.begin_deferred).run("begin"); !begun) {
      failed_transactions_.fetch_add(1, std::memory_order_relaxed);
      count_operations(ops);
      for (auto& op : ops) op->fail(begun.error());
      return;
    }
    const bool solo = ops.front()->op_class() == OpClass::solo;
    std::size_t i = 0;
    for (;;) {
      for (; i < ops.size(); ++i) {
        Op& op = *ops[i];
        if (op.op_class() == OpClass::read) {
          op.run(db);
        } else if (auto step = run_in_savepoint(db, op); !step) {
          count_operations(ops);
          abort_transaction(ops, step.error());
          return;
        }
        // Some errors (I/O, disk full) make SQLite roll the whole transaction back by itself.
        if (sqlite3_get_autocommit(db_.get())) {
          count_operations(ops);
          abort_transaction(ops,
                            StoreError{StoreErrc::unavailable,
                                       "sqlite: the transaction was rolled back by an error in one of its operations"});
          return;
        }
      }
      if (solo) break;
      std::lock_guard lock(mutex_);
      if (!take_locked(ops, /*reads_only=*/!writes)) break;
    }
    count_operations(ops);
    if (auto committed = st_.commit.run("commit"); !committed) {
      failed_transactions_.fetch_add(1, std::memory_order_relaxed);
      // A lock error means the commit never started; anything else (an I/O error while writing
      // the WAL) may have left the transaction durable after all.
      const int primary = sqlite3_errcode(db_.get()) & 0xff;
      const bool maybe_written = primary != SQLITE_BUSY && primary != SQLITE_LOCKED;
      if (!sqlite3_get_autocommit(db_.get())) (void)st_.rollback.run("rollback");
      for (auto& op : ops) {
        if (!op->succeeded()) continue;
        StoreError error = committed.error();
        error.in_doubt = maybe_written && op->wrote();
        op->fail(error);
      }
      return;
    }
    if (writes) write_transactions_.fetch_add(1, std::memory_order_relaxed);
  }

  void count_operations(std::span<const std::unique_ptr<Op>> ops) {
    std::size_t n = 0;
    for (const auto& op : ops) n += op->size();
    operations_.fetch_add(n, std::memory_order_relaxed);
    if (n > largest_batch_.load(std::memory_order_relaxed)) largest_batch_.store(n, std::memory_order_relaxed);
  }

  // Runs one operation inside its own savepoint; an error here means the savepoint machinery
  // itself failed, and the transaction cannot be trusted.
  StoreResult<Done> run_in_savepoint(Db& db, Op& op) {
    if (auto opened = st_.savepoint.run("savepoint"); !opened) return opened;
    if (op.run(db)) return st_.release_savepoint.run("release savepoint");
    if (sqlite3_get_autocommit(db_.get())) return Done{};  // already rolled back entirely
    if (auto undone = st_.rollback_to_savepoint.run("roll back to savepoint"); !undone) return undone;
    return st_.release_savepoint.run("release savepoint");
  }

  // Rolls the transaction back and fails every operation in it; the ones that had failed on
  // their own keep their own error.
  void abort_transaction(std::span<std::unique_ptr<Op>> ops, const StoreError& cause) {
    failed_transactions_.fetch_add(1, std::memory_order_relaxed);
    if (!sqlite3_get_autocommit(db_.get())) (void)st_.rollback.run("rollback");
    for (auto& op : ops) {
      if (op->ran() && !op->succeeded()) continue;
      StoreError error = cause;
      // Usually SQLite rolled the writes back; but a `work` of complete_in_transaction that
      // COMMITs behind our back makes earlier writes durable, so a write stays in doubt.
      error.in_doubt = op->wrote();
      op->fail(error);
    }
  }

  void reaper_loop() {
    const Clock& clock = options_.clock ? *options_.clock : SystemClock::instance();
    const std::size_t batch = std::max<std::size_t>(options_.reaper_batch, 1);
    std::unique_lock lock(reaper_mutex_);
    while (!reaper_cv_.wait_for(lock, options_.reaper_interval, [&] { return reaper_stop_; })) {
      lock.unlock();
      const TimePoint now = clock.now();
      for (;;) {
        std::promise<StoreResult<std::size_t>> promise;
        auto future = promise.get_future();
        submit(make_op<std::size_t>(
            OpClass::solo, [now, batch](Db& db, Effects& fx) { return run_purge(db, now, batch, fx); },
            [&promise](StoreResult<std::size_t> r) { promise.set_value(std::move(r)); }));
        auto deleted = future.get();
        if (!deleted) break;  // try again next interval
        reaped_.fetch_add(*deleted, std::memory_order_relaxed);
        if (*deleted > 0) reaper_batches_.fetch_add(1, std::memory_order_relaxed);
        if (*deleted < batch) break;
        std::lock_guard stop_check(reaper_mutex_);
        if (reaper_stop_) break;
      }
      lock.lock();
    }
  }

  const SqliteOptions options_;
  sqlite_detail::Connection db_;
  Statements st_;  // declared after db_: finalized before the connection closes

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Op>> queue_;  // guarded by mutex_
  bool stopping_ = false;                  // guarded by mutex_
  bool closed_ = false;                    // guarded by mutex_: the writer has exited

  std::mutex reaper_mutex_;
  std::condition_variable reaper_cv_;
  bool reaper_stop_ = false;  // guarded by reaper_mutex_

  std::atomic<std::uint64_t> operations_{0}, transactions_{0}, write_transactions_{0}, largest_batch_{0},
      failed_transactions_{0}, reaped_{0}, reaper_batches_{0};

  std::thread writer_;  // last: started once everything above exists
  std::thread reaper_;
};

// ---- SqliteStore ------------------------------------------------------------------------------

StoreResult<std::unique_ptr<SqliteStore>> SqliteStore::open(SqliteOptions options) {
  if (options.path.empty()) return std::unexpected(internal_error("sqlite: SqliteOptions::path is empty"));
  const int busy_timeout_ms = static_cast<int>(options.busy_timeout.count());
  auto db = sqlite_detail::open_connection(options.path, busy_timeout_ms);
  if (!db) return std::unexpected(db.error());
  sqlite3* raw = db->get();

  if (auto wal = sqlite_detail::enable_wal(raw, options.path, busy_timeout_ms); !wal) {
    return std::unexpected(wal.error());
  }
  if (auto sync = sqlite_detail::exec(raw, synchronous_pragma(options.synchronous), "set synchronous"); !sync) {
    return std::unexpected(sync.error());
  }
  // Checkpoints: after every wal_autocheckpoint pages, and the WAL file kept at most that large.
  const int checkpoint_pages = std::max(options.wal_autocheckpoint, 1);
  sqlite3_wal_autocheckpoint(raw, checkpoint_pages);
  std::int64_t page_size = 4096;
  if (auto page = Statement::prepare(raw, "PRAGMA page_size"); page && page->step() == SQLITE_ROW) {
    page_size = page->int64(0);
  }
  const std::string size_limit = "PRAGMA journal_size_limit = " + std::to_string(checkpoint_pages * page_size);
  if (auto limited = sqlite_detail::exec(raw, size_limit.c_str(), "set journal_size_limit"); !limited) {
    return std::unexpected(limited.error());
  }
  if (auto migrated = sqlite_detail::migrate(raw); !migrated) return std::unexpected(migrated.error());
  auto statements = prepare_statements(raw);
  if (!statements) return std::unexpected(statements.error());
  return std::unique_ptr<SqliteStore>(
      new SqliteStore(std::make_unique<Impl>(std::move(options), std::move(*db), std::move(*statements))));
}

SqliteStore::SqliteStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SqliteStore::~SqliteStore() = default;

void SqliteStore::claim(ClaimRequest request, Callback<ClaimResult> done) {
  impl_->submit(make_op<ClaimResult>(
      OpClass::write, [req = std::move(request)](Db& db, Effects& fx) { return run_claim(db, req, fx); },
      std::move(done)));
}

void SqliteStore::complete(CompleteRequest request, Callback<FenceStatus> done) {
  impl_->submit(make_op<FenceStatus>(
      OpClass::write, [req = std::move(request)](Db& db, Effects& fx) { return run_complete(db, req, fx); },
      std::move(done)));
}

void SqliteStore::fail(FailRequest request, Callback<FenceStatus> done) {
  impl_->submit(make_op<FenceStatus>(
      OpClass::write, [req = std::move(request)](Db& db, Effects& fx) { return run_fail(db, req, fx); },
      std::move(done)));
}

void SqliteStore::release(Fence fence, Callback<FenceStatus> done) {
  impl_->submit(make_op<FenceStatus>(
      OpClass::write, [fence = std::move(fence)](Db& db, Effects& fx) { return run_release(db, fence, fx); },
      std::move(done)));
}

void SqliteStore::abandon(AbandonRequest request, Callback<FenceStatus> done) {
  impl_->submit(make_op<FenceStatus>(
      OpClass::write, [req = std::move(request)](Db& db, Effects& fx) { return run_abandon(db, req, fx); },
      std::move(done)));
}

namespace {

// A batch call as one operation of the writer; null when there is nothing to queue (an empty
// batch, answered here).
template <class Item, class T>
std::unique_ptr<Op> batch_op(std::vector<Item> items, typename BatchOp<Item, T>::Body body, BatchCallback<T>& done) {
  if (items.empty()) {
    done(BatchResults<T>{});
    return nullptr;
  }
  return std::make_unique<BatchOp<Item, T>>(std::move(items), body, std::move(done));
}

}  // namespace

void SqliteStore::claim_many(std::vector<ClaimRequest> requests, BatchCallback<ClaimResult> done) {
  if (auto op = batch_op<ClaimRequest, ClaimResult>(std::move(requests), run_claim, done)) impl_->submit(std::move(op));
}

void SqliteStore::complete_many(std::vector<CompleteRequest> requests, BatchCallback<FenceStatus> done) {
  if (auto op = batch_op<CompleteRequest, FenceStatus>(std::move(requests), run_complete, done)) impl_->submit(std::move(op));
}

void SqliteStore::fail_many(std::vector<FailRequest> requests, BatchCallback<FenceStatus> done) {
  if (auto op = batch_op<FailRequest, FenceStatus>(std::move(requests), run_fail, done)) impl_->submit(std::move(op));
}

void SqliteStore::release_many(std::vector<Fence> fences, BatchCallback<FenceStatus> done) {
  if (auto op = batch_op<Fence, FenceStatus>(std::move(fences), run_release, done)) impl_->submit(std::move(op));
}

void SqliteStore::get(RecordId id, Callback<std::optional<Record>> done) {
  impl_->submit(make_op<std::optional<Record>>(
      OpClass::read, [id = std::move(id)](Db& db, Effects&) { return read_record(db, id); }, std::move(done)));
}

void SqliteStore::purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) {
  impl_->submit(make_op<std::size_t>(
      OpClass::solo, [now, limit](Db& db, Effects& fx) { return run_purge(db, now, limit, fx); }, std::move(done)));
}

void SqliteStore::ping(Callback<Done> done) {
  impl_->submit(make_op<Done>(
      OpClass::write, [](Db& db, Effects&) { return run_ping(db); }, std::move(done)));
}

void SqliteStore::complete_in_transaction(CompleteRequest request, SqliteWork work, Callback<FenceStatus> done) {
  impl_->submit(make_op<FenceStatus>(
      OpClass::write,
      [req = std::move(request), work = std::move(work)](Db& db, Effects& fx) mutable {
        return run_complete_in_transaction(db, req, work, fx);
      },
      std::move(done)));
}

StoreResult<FenceStatus> SqliteStore::complete_in_transaction(CompleteRequest request, SqliteWork work) {
  if (impl_->on_writer_thread()) {
    return std::unexpected(
        internal_error("sqlite: blocking complete_in_transaction called from a store callback (would deadlock)"));
  }
  std::promise<StoreResult<FenceStatus>> promise;
  auto future = promise.get_future();
  complete_in_transaction(std::move(request), std::move(work),
                          [&promise](StoreResult<FenceStatus> r) { promise.set_value(std::move(r)); });
  return future.get();
}

void SqliteStore::complete_many_in_transaction(std::vector<SqliteWorkItem> items, BatchCallback<WorkResult> done) {
  if (items.empty()) return done(BatchResults<WorkResult>{});
  impl_->submit(std::make_unique<BatchOp<SqliteWorkItem, WorkResult, SqliteWorkItem&>>(std::move(items), run_work_item,
                                                                                       std::move(done)));
}

BatchResults<WorkResult> SqliteStore::complete_many_in_transaction(std::vector<SqliteWorkItem> items) {
  if (impl_->on_writer_thread()) {
    return BatchResults<WorkResult>(
        items.size(),
        std::unexpected(internal_error(
            "sqlite: blocking complete_many_in_transaction called from a store callback (would deadlock)")));
  }
  std::promise<BatchResults<WorkResult>> promise;
  auto future = promise.get_future();
  complete_many_in_transaction(std::move(items),
                               [&promise](BatchResults<WorkResult> r) { promise.set_value(std::move(r)); });
  return future.get();
}

void SqliteStore::list(ListQuery query, Callback<std::vector<Record>> done) {
  impl_->submit(make_op<std::vector<Record>>(
      OpClass::read, [query = std::move(query)](Db& db, Effects&) { return run_list(db, query); }, std::move(done)));
}

void SqliteStore::mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) {
  impl_->submit(make_op<AdminStatus>(
      OpClass::write, [id = std::move(id), now](Db& db, Effects& fx) { return run_mark_retryable(db, id, now, fx); },
      std::move(done)));
}

void SqliteStore::resolve(RecordId id, StoredResponse response, TimePoint now, TimePoint expires,
                          Callback<AdminStatus> done) {
  impl_->submit(make_op<AdminStatus>(
      OpClass::write,
      [id = std::move(id), response = std::move(response), now, expires](Db& db, Effects& fx) {
        return run_resolve(db, id, response, now, expires, fx);
      },
      std::move(done)));
}

void SqliteStore::count(TimePoint now, Callback<StateCounts> done) {
  impl_->submit(make_op<StateCounts>(
      OpClass::read, [now](Db& db, Effects&) { return run_count(db, now); }, std::move(done)));
}

SqliteStoreStats SqliteStore::stats() const { return impl_->stats(); }

int SqliteStore::schema_version() { return sqlite_detail::latest_schema_version(); }

bool sqlite_configure_process() {
  if (sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0) != SQLITE_OK) return false;  // SQLite already in use
  sqlite_detail::configure_statement_journal_spill();
  return true;
}

int sqlite_configure_connection(sqlite3* db) { return sqlite_detail::configure_connection(db); }

}  // namespace idem
