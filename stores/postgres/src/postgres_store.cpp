#include "idem/postgres_store.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "connection.hpp"
#include "connection_setup.hpp"
#include "errors.hpp"
#include "idem/headers_codec.hpp"
#include "idem/store_batch.hpp"
#include "interactive.hpp"
#include "operations.hpp"
#include "records.hpp"
#include "schema.hpp"
#include "session.hpp"

namespace idem {

namespace pd = postgres_detail;
using pd::CompleteWrite;
using pd::InteractiveOp;
using pd::internal_error;
using pd::Op;
using pd::OpMode;
using pd::PurgeArgs;
using pd::bind_claim;
using pd::bind_complete;
using pd::bind_fence;
using pd::fenced;
using pd::parse_claim;
using pd::read_record;
using pd::run_complete_in_transaction;
using pd::run_mark_retryable;
using pd::run_resolve;
using pd::ResolveArgs;
using pd::Session;
using pd::StatementSql;
using pd::Stmt;
using pd::limit_to_db;
using pd::open_connection;
using pd::setup_connection;
using pd::silence_of;
using pd::statement_op;
using pd::unstorable;
using SteadyClock = pd::SteadyClock;

// ---- the connection threads -------------------------------------------------------------------

class PostgresStore::Impl {
 public:
  Impl(PostgresOptions options, StatementSql sql, std::vector<pd::Conn> conns)
      : options_(std::move(options)), sql_(std::move(sql)), silence_(silence_of(options_)) {
    workers_.reserve(conns.size());
    for (auto& conn : conns) {
      auto w = std::make_unique<Worker>();
      w->conn = std::move(conn);
      w->backoff = options_.reconnect_backoff_min;
      workers_.push_back(std::move(w));
    }
    healthy_ = workers_.size();
    connects_ = workers_.size();
    for (auto& w : workers_) w->thread = std::thread([this, worker = w.get()] { worker_loop(*worker); });
    for (auto& w : workers_) thread_ids_.push_back(w->thread.get_id());
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
    for (auto& w : workers_) w->thread.join();
  }

  void submit(std::unique_ptr<Op> op) {
    {
      std::lock_guard lock(mutex_);
      if (!closed_) {
        queue_.push_back(std::move(op));
        // One wake-up is enough while every thread is connected; otherwise it might go to a
        // thread waiting out its reconnect backoff, which leaves the work to the others.
        if (healthy_ == workers_.size()) {
          cv_.notify_one();
        } else {
          cv_.notify_all();
        }
        return;
      }
    }
    op->fail(StoreError{StoreErrc::unavailable, "postgres: the store is closed"});
    op->deliver();
  }

  // Queues the operations of one batch call together, so that one thread takes them all into
  // one transaction.
  void submit_group(std::vector<std::unique_ptr<Op>> ops) {
    if (ops.empty()) return;
    ops.front()->set_group_size(ops.size());
    for (std::size_t i = 1; i < ops.size(); ++i) ops[i]->set_group_size(0);
    {
      std::lock_guard lock(mutex_);
      if (!closed_) {
        for (auto& op : ops) queue_.push_back(std::move(op));
        if (healthy_ == workers_.size()) {
          cv_.notify_one();
        } else {
          cv_.notify_all();
        }
        return;
      }
    }
    for (auto& op : ops) {
      op->fail(StoreError{StoreErrc::unavailable, "postgres: the store is closed"});
      op->deliver();
    }
  }

  bool on_store_thread() const {
    return std::find(thread_ids_.begin(), thread_ids_.end(), std::this_thread::get_id()) != thread_ids_.end();
  }

  PostgresStoreStats stats() const {
    PostgresStoreStats s;
    s.operations = operations_.load(std::memory_order_relaxed);
    s.transactions = transactions_.load(std::memory_order_relaxed);
    s.largest_batch = largest_batch_.load(std::memory_order_relaxed);
    s.retried = retried_.load(std::memory_order_relaxed);
    s.isolated = isolated_.load(std::memory_order_relaxed);
    s.failed = failed_.load(std::memory_order_relaxed);
    s.in_doubt = in_doubt_.load(std::memory_order_relaxed);
    s.connects = connects_.load(std::memory_order_relaxed);
    s.connect_failures = connect_failures_.load(std::memory_order_relaxed);
    s.reaped = reaped_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  struct Worker {
    pd::Conn conn;                            // null while disconnected
    SteadyClock::time_point next_attempt{};   // no reconnect before this
    Millis backoff{0};
    std::string last_error;
    std::thread thread;
  };

  void worker_loop(Worker& w) {
    std::vector<std::unique_ptr<Op>> ops;
    ops.reserve(batch_limit());
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        for (;;) {
          if (queue_.empty()) {
            if (stopping_) {
              // Only the last thread out closes the queue: the others may still be draining it.
              if (++exited_ == workers_.size()) closed_ = true;
              if (w.conn) --healthy_;
              cv_.notify_all();
              return;
            }
            cv_.wait(lock);
            continue;
          }
          // A disconnected thread waiting out its backoff leaves the work to connected ones; if
          // none is connected it takes the work and answers at once (unavailable), fail fast.
          if (w.conn || healthy_ == 0 || SteadyClock::now() >= w.next_attempt) break;
          cv_.wait_until(lock, w.next_attempt);
        }
        take_group_locked(ops);
        if (ops.front()->mode() == OpMode::batched) {
          // More queued operations join while their whole batch call fits; the first group
          // comes whole, however large.
          while (!queue_.empty() && queue_.front()->mode() == OpMode::batched &&
                 ops.size() + queue_.front()->group_size() <= batch_limit()) {
            take_group_locked(ops);
          }
        }
      }
      process(w, ops);
      for (auto& op : ops) op->deliver();  // after the commit, with no lock held
      ops.clear();
    }
  }

  std::size_t batch_limit() const { return std::max<std::size_t>(options_.max_batch, 1); }

  // Moves the operation at the front of the queue into `ops`, with the rest of its batch call.
  // Requires mutex_.
  void take_group_locked(std::vector<std::unique_ptr<Op>>& ops) {
    const std::size_t size = std::max<std::size_t>(queue_.front()->group_size(), 1);
    for (std::size_t i = 0; i < size && !queue_.empty(); ++i) {
      ops.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
  }

  void process(Worker& w, std::vector<std::unique_ptr<Op>>& ops) {
    operations_.fetch_add(ops.size(), std::memory_order_relaxed);
    if (!ensure_connection(w)) {
      fail_all(ops, StoreError{StoreErrc::unavailable, "postgres: not connected: " + w.last_error});
      return;
    }
    if (ops.front()->mode() == OpMode::interactive) {
      run_interactive(w, *ops.front());
      return;
    }
    // Every transaction locks rows in (tenant, key) order, so two batches never wait for each
    // other in a cycle. Operations of one batch are concurrent requests: any order is theirs, but
    // those on one key keep their arrival order (the index breaks ties: a stable sort without
    // std::stable_sort, whose libstdc++ 12 buffer Clang reports as deprecated).
    std::vector<std::size_t> order(ops.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&ops](std::size_t i, std::size_t j) {
      const RecordId* x = ops[i]->id();
      const RecordId* y = ops[j]->id();
      if (!x || !y) return (!x && y) || (!x && !y && i < j);
      return std::tie(x->tenant, x->key, i) < std::tie(y->tenant, y->key, j);
    });
    std::vector<Op*> batch;
    batch.reserve(ops.size());
    for (std::size_t i : order) batch.push_back(ops[i].get());
    run_batch(w, batch, /*may_isolate=*/true);
  }

  void fail_all(std::vector<std::unique_ptr<Op>>& ops, const StoreError& error) {
    failed_.fetch_add(1, std::memory_order_relaxed);
    for (auto& op : ops) op->fail(error);
  }

  // Whether the thread has a usable connection, reconnecting if it may.
  bool ensure_connection(Worker& w) {
    if (w.conn) {
      if (pd::idle_connection_alive(w.conn.get())) return true;
      // Closed while idle (a server restart, a terminated backend): nothing was sent, so
      // nothing is in doubt; reconnect at once.
      drop_connection(w, "the server closed the idle connection");
    }
    if (SteadyClock::now() < w.next_attempt) return false;
    auto conn = open_connection(options_, &sql_);
    if (!conn) {
      connect_failures_.fetch_add(1, std::memory_order_relaxed);
      w.last_error = conn.error().error.message;
      w.next_attempt = SteadyClock::now() + w.backoff;
      w.backoff = std::min(w.backoff * 2, std::max(options_.reconnect_backoff_max, options_.reconnect_backoff_min));
      return false;
    }
    connects_.fetch_add(1, std::memory_order_relaxed);
    w.conn = std::move(*conn);
    w.backoff = options_.reconnect_backoff_min;
    {
      std::lock_guard lock(mutex_);
      ++healthy_;
    }
    return true;
  }

  void drop_connection(Worker& w, std::string why) {
    if (!w.conn) return;
    w.conn.reset();
    w.last_error = std::move(why);
    w.next_attempt = SteadyClock::now();  // the first reconnect is immediate
    {
      std::lock_guard lock(mutex_);
      --healthy_;
    }
    cv_.notify_all();  // disconnected threads may now have to serve the queue themselves
  }

  void run_batch(Worker& w, std::span<Op* const> ops, bool may_isolate) {
    bool reconnected = false;
    for (int attempt = 0;; ++attempt) {
      if (!w.conn && !ensure_connection(w)) {
        failed_.fetch_add(1, std::memory_order_relaxed);
        for (Op* op : ops) op->fail(StoreError{StoreErrc::unavailable, "postgres: not connected: " + w.last_error});
        return;
      }
      transactions_.fetch_add(1, std::memory_order_relaxed);
      if (ops.size() > largest_batch_.load(std::memory_order_relaxed)) {
        largest_batch_.store(ops.size(), std::memory_order_relaxed);
      }
      auto failure = run_pipeline(w, ops);
      if (!failure) return;
      if (failure->poison) drop_connection(w, failure->error.message);
      if (failure->retry && attempt < options_.max_retries) {
        retried_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      // A connection lost before anything could commit: one more try on a new connection.
      if (failure->poison && !failure->error.in_doubt && failure->error.code == StoreErrc::unavailable &&
          !reconnected) {
        reconnected = true;
        continue;
      }
      if (failure->isolate && may_isolate && ops.size() > 1) {
        // The transaction rolled back as a whole; run each operation alone so that only the
        // refused one fails.
        isolated_.fetch_add(1, std::memory_order_relaxed);
        for (Op* op : ops) run_batch(w, std::span<Op* const>(&op, 1), /*may_isolate=*/false);
        return;
      }
      failed_.fetch_add(1, std::memory_order_relaxed);
      for (Op* op : ops) {
        StoreError error = failure->error;
        error.in_doubt = error.in_doubt && op->writes();
        if (error.in_doubt) in_doubt_.fetch_add(1, std::memory_order_relaxed);
        op->fail(error);
      }
      return;
    }
  }

  // Sends the operations' statements and a Sync in one go — the statements up to the Sync form
  // one implicit transaction, committed by the Sync — then reads every answer. Returns the
  // failure that ended the transaction, if any; on success every operation has its result.
  std::optional<pd::Failure> run_pipeline(Worker& w, std::span<Op* const> ops) {
    PGconn* c = w.conn.get();
    const bool writes = std::any_of(ops.begin(), ops.end(), [](const Op* op) { return op->writes(); });
    pd::Exchange ex{ops.size() == 1 ? pd::statement_name(ops.front()->stmt()) : "batch", writes, false};
    auto deadline = [&] { return SteadyClock::now() + silence_; };

    for (Op* op : ops) {
      const pd::Params& p = *op->params();
      if (!PQsendQueryPrepared(c, pd::statement_name(op->stmt()), p.size(), p.values(), p.lengths(), p.formats(), 1)) {
        return pd::io_failure(c, pd::Io::lost, ex);  // no Sync sent: nothing can commit
      }
    }
    if (!PQpipelineSync(c)) return pd::io_failure(c, pd::Io::lost, ex);
    ex.commit_sent = true;
    if (pd::Io io = pd::flush(c, deadline()); io != pd::Io::ok) return pd::io_failure(c, io, ex);

    // The first server error aborts the transaction: from then on nothing can commit.
    std::optional<pd::Failure> aborted;
    const pd::Exchange after_abort{ex.what, writes, false};
    auto io_failed = [&](pd::Io io) {
      if (aborted) {
        aborted->poison = true;
        return *aborted;
      }
      return pd::io_failure(c, io, ex);
    };
    for (Op* op : ops) {
      pd::Result r;
      if (pd::Io io = pd::next_result(c, deadline(), r); io != pd::Io::ok) return io_failed(io);
      if (!r) return pd::map_error(pd::Cause::connection_lost, "", "a result is missing from the pipeline", ex);
      switch (PQresultStatus(r.get())) {
        case PGRES_TUPLES_OK:
        case PGRES_COMMAND_OK:
          op->accept(r.get());
          break;
        case PGRES_PIPELINE_ABORTED:
          break;
        default:
          if (!pd::is_server_error(r.get())) return pd::result_failure(c, r.get(), ex);  // the socket failed
          if (!aborted) aborted = pd::result_failure(c, r.get(), after_abort);
          break;
      }
      // Each statement's results end with a null.
      if (pd::Io io = pd::next_result(c, deadline(), r); io != pd::Io::ok) return io_failed(io);
      if (r) return pd::map_error(pd::Cause::connection_lost, "", "unexpected extra result in the pipeline", ex);
    }
    pd::Result sync;
    if (pd::Io io = pd::next_result(c, deadline(), sync); io != pd::Io::ok) return io_failed(io);
    if (sync && PQresultStatus(sync.get()) == PGRES_PIPELINE_SYNC) return aborted;
    // An error in place of the Sync's answer: the commit itself failed, or the session ended
    // around it (map_error keeps the doubt for the latter).
    if (aborted) {
      aborted->poison = true;
      return aborted;
    }
    if (!sync) return pd::map_error(pd::Cause::connection_lost, "", "the pipeline's Sync was not answered", ex);
    auto f = pd::result_failure(c, sync.get(), ex);
    f.poison = true;
    return f;
  }

  void run_interactive(Worker& w, Op& op) {
    transactions_.fetch_add(1, std::memory_order_relaxed);
    PGconn* c = w.conn.get();
    // Out of pipeline mode, so the application's code may use libpq as it usually does.
    if (!PQexitPipelineMode(c)) {
      drop_connection(w, "could not leave pipeline mode: " + std::string(PQerrorMessage(c)));
      op.fail(StoreError{StoreErrc::unavailable, "postgres: " + w.last_error});
      return;
    }
    Session session(c, silence_, options_.schema);
    op.run(session);
    if (session.poisoned()) {
      drop_connection(w, session.poison_error().message);
      return;
    }
    if (PQtransactionStatus(c) != PQTRANS_IDLE || !PQenterPipelineMode(c)) {
      drop_connection(w, "the connection was left busy or inside a transaction");
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
        submit(purge_op(now, batch, [&promise](StoreResult<std::size_t> r) { promise.set_value(std::move(r)); }));
        auto deleted = future.get();
        if (!deleted) break;  // try again next interval
        reaped_.fetch_add(*deleted, std::memory_order_relaxed);
        if (*deleted < batch) break;
        std::lock_guard stop_check(reaper_mutex_);
        if (reaper_stop_) break;
      }
      lock.lock();
    }
  }

 public:
  static std::unique_ptr<Op> purge_op(TimePoint now, std::size_t limit, Callback<std::size_t> done) {
    return statement_op<std::size_t, PurgeArgs>(
        OpMode::alone, true, Stmt::purge, PurgeArgs{now, limit},
        [](const PurgeArgs& a, pd::Params& p) {
          p.int8(to_epoch_ms(a.now));
          p.int8(limit_to_db(a.limit));
        },
        [](const PurgeArgs&, const PGresult* r) -> StoreResult<std::size_t> {
          return static_cast<std::size_t>(pd::affected_rows(r));
        },
        nullptr, std::move(done));
  }

 private:
  const PostgresOptions options_;
  const StatementSql sql_;
  const std::chrono::milliseconds silence_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Op>> queue_;  // guarded by mutex_
  std::size_t healthy_ = 0;                // guarded by mutex_: threads with a connection
  std::size_t exited_ = 0;                 // guarded by mutex_
  bool stopping_ = false;                  // guarded by mutex_
  bool closed_ = false;                    // guarded by mutex_: every thread has exited

  std::mutex reaper_mutex_;
  std::condition_variable reaper_cv_;
  bool reaper_stop_ = false;  // guarded by reaper_mutex_

  std::atomic<std::uint64_t> operations_{0}, transactions_{0}, largest_batch_{0}, retried_{0}, isolated_{0},
      failed_{0}, in_doubt_{0}, connects_{0}, connect_failures_{0}, reaped_{0};

  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::thread::id> thread_ids_;
  std::thread reaper_;
};

// ---- PostgresStore ----------------------------------------------------------------------------

StoreResult<std::unique_ptr<PostgresStore>> PostgresStore::open(PostgresOptions options) {
  if (options.schema.empty()) return std::unexpected(internal_error("postgres: PostgresOptions::schema is empty"));
  if (options.pool_size == 0) return std::unexpected(internal_error("postgres: PostgresOptions::pool_size is 0"));
  if (options.statement_timeout < Millis::zero() || options.connect_timeout <= Millis::zero()) {
    return std::unexpected(internal_error("postgres: connect_timeout must be positive, statement_timeout not negative"));
  }
  StatementSql sql;
  for (int i = 0; i < pd::kStatementCount; ++i) {
    sql[static_cast<std::size_t>(i)] = pd::statement_sql(static_cast<Stmt>(i), options.schema);
  }
  // The first connection migrates (outside pipeline mode), then joins the pool.
  auto first = open_connection(options, nullptr);
  if (!first) return std::unexpected(first.error().error);
  if (auto migrated = pd::migrate(first->get(), options.schema, options.migrate, silence_of(options)); !migrated) {
    return std::unexpected(migrated.error().error);
  }
  if (auto failed = setup_connection(first->get(), sql, options, silence_of(options))) {
    return std::unexpected(failed->error);
  }
  std::vector<pd::Conn> conns;
  conns.push_back(std::move(*first));
  while (conns.size() < options.pool_size) {
    auto conn = open_connection(options, &sql);
    if (!conn) return std::unexpected(conn.error().error);
    conns.push_back(std::move(*conn));
  }
  return std::unique_ptr<PostgresStore>(
      new PostgresStore(std::make_unique<Impl>(std::move(options), std::move(sql), std::move(conns))));
}

PostgresStore::PostgresStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PostgresStore::~PostgresStore() = default;

// The operation of each call that takes part in batches; null when the request cannot be stored
// (then `done` has been called with the error).
namespace {

std::unique_ptr<Op> claim_op(ClaimRequest request, Callback<ClaimResult>& done) {
  if (auto bad = unstorable(request.id)) {
    done(std::unexpected(*bad));
    return nullptr;
  }
  if (!pd::valid_text(request.request_hash) || !pd::valid_text(request.lookup)) {
    done(std::unexpected(internal_error("postgres: request hash and lookup must be valid UTF-8")));
    return nullptr;
  }
  return statement_op<ClaimResult, ClaimRequest>(
      OpMode::batched, true, Stmt::claim, std::move(request), bind_claim, parse_claim,
      [](const ClaimRequest& r) { return &r.id; }, std::move(done));
}

std::unique_ptr<Op> complete_op(CompleteRequest request, Callback<FenceStatus>& done) {
  if (auto bad = unstorable(request.fence.id)) {
    done(std::unexpected(*bad));
    return nullptr;
  }
  std::string headers = encode_headers(request.response.headers);
  return statement_op<FenceStatus, CompleteWrite>(
      OpMode::batched, true, Stmt::complete, CompleteWrite{std::move(request), std::move(headers)}, bind_complete,
      [](const CompleteWrite&, const PGresult* r) { return fenced(r); },
      [](const CompleteWrite& w) { return &w.req.fence.id; }, std::move(done));
}

std::unique_ptr<Op> fail_op(FailRequest request, Callback<FenceStatus>& done) {
  if (auto bad = unstorable(request.fence.id)) {
    done(std::unexpected(*bad));
    return nullptr;
  }
  return statement_op<FenceStatus, FailRequest>(
      OpMode::batched, true, Stmt::fail, std::move(request),
      [](const FailRequest& r, pd::Params& p) {
        bind_fence(r.fence, p);
        p.int8(to_epoch_ms(r.expires));
      },
      [](const FailRequest&, const PGresult* r) { return fenced(r); },
      [](const FailRequest& r) { return &r.fence.id; }, std::move(done));
}

std::unique_ptr<Op> release_op(Fence fence, Callback<FenceStatus>& done) {
  if (auto bad = unstorable(fence.id)) {
    done(std::unexpected(*bad));
    return nullptr;
  }
  return statement_op<FenceStatus, Fence>(
      OpMode::batched, true, Stmt::release, std::move(fence), bind_fence,
      [](const Fence&, const PGresult* r) { return fenced(r); }, [](const Fence& f) { return &f.id; },
      std::move(done));
}

// The operations of a batch call's items, each answering into its place of the batch's results.
// Items that cannot be stored are answered at once and not queued.
template <class T, class Item, class MakeOp>
std::vector<std::unique_ptr<Op>> batch_ops(std::vector<Item> items, BatchCallback<T> done, MakeOp make_op) {
  auto collector = BatchCollector<T>::make(items.size(), std::move(done));
  std::vector<std::unique_ptr<Op>> ops;
  ops.reserve(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    Callback<T> slot = BatchCollector<T>::slot(collector, i);
    if (auto op = make_op(std::move(items[i]), slot)) ops.push_back(std::move(op));
  }
  return ops;
}

}  // namespace

void PostgresStore::claim(ClaimRequest request, Callback<ClaimResult> done) {
  if (auto op = claim_op(std::move(request), done)) impl_->submit(std::move(op));
}

void PostgresStore::complete(CompleteRequest request, Callback<FenceStatus> done) {
  if (auto op = complete_op(std::move(request), done)) impl_->submit(std::move(op));
}

void PostgresStore::fail(FailRequest request, Callback<FenceStatus> done) {
  if (auto op = fail_op(std::move(request), done)) impl_->submit(std::move(op));
}

void PostgresStore::release(Fence fence, Callback<FenceStatus> done) {
  if (auto op = release_op(std::move(fence), done)) impl_->submit(std::move(op));
}

void PostgresStore::claim_many(std::vector<ClaimRequest> requests, BatchCallback<ClaimResult> done) {
  impl_->submit_group(batch_ops<ClaimResult>(std::move(requests), std::move(done), claim_op));
}

void PostgresStore::complete_many(std::vector<CompleteRequest> requests, BatchCallback<FenceStatus> done) {
  impl_->submit_group(batch_ops<FenceStatus>(std::move(requests), std::move(done), complete_op));
}

void PostgresStore::fail_many(std::vector<FailRequest> requests, BatchCallback<FenceStatus> done) {
  impl_->submit_group(batch_ops<FenceStatus>(std::move(requests), std::move(done), fail_op));
}

void PostgresStore::release_many(std::vector<Fence> fences, BatchCallback<FenceStatus> done) {
  impl_->submit_group(batch_ops<FenceStatus>(std::move(fences), std::move(done), release_op));
}

void PostgresStore::abandon(AbandonRequest request, Callback<FenceStatus> done) {
  if (auto bad = unstorable(request.fence.id)) return done(std::unexpected(*bad));
  impl_->submit(statement_op<FenceStatus, AbandonRequest>(
      OpMode::batched, true, Stmt::abandon, std::move(request),
      [](const AbandonRequest& r, pd::Params& p) {
        bind_fence(r.fence, p);
        p.int8(to_epoch_ms(r.now));
      },
      [](const AbandonRequest&, const PGresult* r) { return fenced(r); },
      [](const AbandonRequest& r) { return &r.fence.id; }, std::move(done)));
}

void PostgresStore::get(RecordId id, Callback<std::optional<Record>> done) {
  if (auto bad = unstorable(id)) return done(std::unexpected(*bad));
  impl_->submit(statement_op<std::optional<Record>, RecordId>(
      OpMode::batched, false, Stmt::get, std::move(id),
      [](const RecordId& id, pd::Params& p) {
        p.text(id.tenant);
        p.text(id.key);
      },
      [](const RecordId& id, const PGresult* r) -> StoreResult<std::optional<Record>> {
        if (PQntuples(r) == 0) return std::nullopt;
        auto record = read_record(r, 0, 0, id.tenant, id.key);
        if (!record) return std::unexpected(record.error());
        return std::move(*record);
      },
      [](const RecordId& id) { return &id; }, std::move(done)));
}

void PostgresStore::purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) {
  impl_->submit(Impl::purge_op(now, limit, std::move(done)));
}

void PostgresStore::ping(Callback<Done> done) {
  impl_->submit(statement_op<Done, Done>(
      OpMode::batched, false, Stmt::ping, Done{}, [](const Done&, pd::Params&) {},
      [](const Done&, const PGresult*) -> StoreResult<Done> { return Done{}; }, nullptr, std::move(done)));
}

void PostgresStore::list(ListQuery query, Callback<std::vector<Record>> done) {
  if (query.after) {
    if (auto bad = unstorable(*query.after)) return done(std::unexpected(*bad));
  }
  if (query.tenant) {
    if (auto bad = unstorable({*query.tenant})) return done(std::unexpected(*bad));
  }
  const Stmt stmt = query.tenant ? (query.after ? Stmt::list_tenant_after : Stmt::list_tenant)
                                 : (query.after ? Stmt::list_after : Stmt::list_all);
  impl_->submit(statement_op<std::vector<Record>, ListQuery>(
      OpMode::batched, false, stmt, std::move(query),
      [](const ListQuery& q, pd::Params& p) {
        if (q.state) {
          p.text(to_string(*q.state));
        } else {
          p.null();
        }
        p.int8(limit_to_db(q.limit));
        if (q.after) {
          p.text(q.after->tenant);
          p.text(q.after->key);
        }
        if (q.tenant) p.text(*q.tenant);
      },
      [](const ListQuery&, const PGresult* r) -> StoreResult<std::vector<Record>> {
        std::vector<Record> out;
        out.reserve(static_cast<std::size_t>(PQntuples(r)));
        for (int i = 0; i < PQntuples(r); ++i) {
          pd::Reader in(r, i);
          auto record = read_record(r, i, 2, std::string(in.bytes(0)), std::string(in.bytes(1)));
          if (!record) return std::unexpected(record.error());
          out.push_back(std::move(*record));
        }
        return out;
      },
      nullptr, std::move(done)));
}

void PostgresStore::mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) {
  if (auto bad = unstorable(id)) return done(std::unexpected(*bad));
  impl_->submit(std::make_unique<InteractiveOp<AdminStatus>>(
      true, [id = std::move(id), now](Session& s) { return run_mark_retryable(s, id, now); }, std::move(done)));
}

void PostgresStore::resolve(RecordId id, StoredResponse response, TimePoint now, TimePoint expires,
                            Callback<AdminStatus> done) {
  if (auto bad = unstorable(id)) return done(std::unexpected(*bad));
  std::string headers = encode_headers(response.headers);
  impl_->submit(std::make_unique<InteractiveOp<AdminStatus>>(
      true,
      [args = ResolveArgs{std::move(id), std::move(response), std::move(headers), now, expires}](Session& s) {
        return run_resolve(s, args);
      },
      std::move(done)));
}

void PostgresStore::count(TimePoint now, Callback<StateCounts> done) {
  impl_->submit(statement_op<StateCounts, TimePoint>(
      OpMode::batched, false, Stmt::count, now, [](const TimePoint& now, pd::Params& p) { p.int8(to_epoch_ms(now)); },
      [](const TimePoint&, const PGresult* r) -> StoreResult<StateCounts> {
        if (PQntuples(r) != 1) return std::unexpected(internal_error("postgres: count returned no row"));
        pd::Reader in(r, 0);
        StateCounts c;
        c.in_progress = static_cast<std::uint64_t>(in.int8(0));
        c.completed = static_cast<std::uint64_t>(in.int8(1));
        c.failed_retryable = static_cast<std::uint64_t>(in.int8(2));
        c.expired = static_cast<std::uint64_t>(in.int8(3));
        if (!in.ok()) return std::unexpected(internal_error("postgres: count returned a malformed row"));
        return c;
      },
      nullptr, std::move(done)));
}

void PostgresStore::complete_in_transaction(CompleteRequest request, PostgresWork work, Callback<FenceStatus> done) {
  if (auto bad = unstorable(request.fence.id)) return done(std::unexpected(*bad));
  std::string headers = encode_headers(request.response.headers);
  impl_->submit(std::make_unique<InteractiveOp<FenceStatus>>(
      true,
      [w = CompleteWrite{std::move(request), std::move(headers)}, work = std::move(work)](Session& s) mutable {
        return run_complete_in_transaction(s, w, work);
      },
      std::move(done)));
}

StoreResult<FenceStatus> PostgresStore::complete_in_transaction(CompleteRequest request, PostgresWork work) {
  if (impl_->on_store_thread()) {
    return std::unexpected(
        internal_error("postgres: blocking complete_in_transaction called from a store callback (would deadlock)"));
  }
  std::promise<StoreResult<FenceStatus>> promise;
  auto future = promise.get_future();
  complete_in_transaction(std::move(request), std::move(work),
                          [&promise](StoreResult<FenceStatus> r) { promise.set_value(std::move(r)); });
  return future.get();
}

void PostgresStore::complete_many_in_transaction(std::vector<PostgresWorkItem> items, BatchCallback<WorkResult> done) {
  // Items the server would refuse fail alone, here; the others go in one interactive transaction.
  BatchResults<WorkResult> refused(items.size());
  std::vector<std::size_t> sent;  // which item each write is
  std::vector<pd::WorkWrite> writes;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (auto bad = unstorable(items[i].request.fence.id)) {
      refused[i] = std::unexpected(*bad);
      continue;
    }
    std::string headers = encode_headers(items[i].request.response.headers);
    writes.push_back(pd::WorkWrite{CompleteWrite{std::move(items[i].request), std::move(headers)}, std::move(items[i].work)});
    sent.push_back(i);
  }
  if (writes.empty()) return done(std::move(refused));
  // The answers of the sent items go back to their places; an operation that failed as a whole
  // (no connection) fails each of them.
  auto merge = [refused = std::move(refused), sent, done = std::move(done)](
                   StoreResult<BatchResults<WorkResult>> answered) mutable {
    for (std::size_t j = 0; j < sent.size(); ++j) {
      if (!answered) {
        refused[sent[j]] = std::unexpected(answered.error());
      } else if (j < answered->size()) {
        refused[sent[j]] = std::move((*answered)[j]);
      } else {
        refused[sent[j]] = std::unexpected(internal_error("postgres: batch item was never run"));
      }
    }
    done(std::move(refused));
  };
  impl_->submit(std::make_unique<InteractiveOp<BatchResults<WorkResult>>>(
      true,
      [writes = std::move(writes)](Session& s) mutable -> StoreResult<BatchResults<WorkResult>> {
        return pd::run_complete_many_in_transaction(s, writes);
      },
      std::move(merge)));
}

BatchResults<WorkResult> PostgresStore::complete_many_in_transaction(std::vector<PostgresWorkItem> items) {
  if (impl_->on_store_thread()) {
    return BatchResults<WorkResult>(
        items.size(),
        std::unexpected(internal_error(
            "postgres: blocking complete_many_in_transaction called from a store callback (would deadlock)")));
  }
  std::promise<BatchResults<WorkResult>> promise;
  auto future = promise.get_future();
  complete_many_in_transaction(std::move(items),
                               [&promise](BatchResults<WorkResult> r) { promise.set_value(std::move(r)); });
  return future.get();
}

PostgresStoreStats PostgresStore::stats() const { return impl_->stats(); }

int PostgresStore::schema_version() { return pd::latest_schema_version(); }

}  // namespace idem