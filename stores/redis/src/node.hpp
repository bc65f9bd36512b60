#pragma once

// One Redis node as the store sees it: a queue, one connection and one thread that pipelines
// every queued command on that connection (write all that is queued, read replies as they come,
// in order), follows the node-local answers (NOSCRIPT), and hands MOVED/ASK/retries back to the
// router.

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "idem/redis_wire/connection.hpp"
#include "errors.hpp"
#include "idem/result.hpp"
#include "idem/redis_wire/reply.hpp"
#include "scripts.hpp"
#include "idem/redis_wire/url.hpp"

namespace idem::redis_detail {

using Steady = std::chrono::steady_clock;

/// What a command's caller receives: the reply (error replies that are final are already
/// mapped to a StoreError, unless the Op asks for raw_errors) or the failure.
using ReplyCallback = std::move_only_function<void(StoreResult<Reply>)>;

/// One command on its way: where it goes, how it has been redirected, who waits for it.
struct Op {
  std::vector<std::string> args;
  int slot = -1;                   ///< the key's slot (cluster routing)
  std::optional<Address> node;     ///< set: goes to this node whatever the slot (SCAN, PING)
  const Script* script = nullptr;  ///< args are EVALSHA of this script (NOSCRIPT -> EVAL)
  bool write = false;              ///< a write: followed by WAIT when wait_replicas > 0
  bool asking = false;             ///< preceded by ASKING (after an ASK redirection)
  bool raw_errors = false;         ///< final error replies reach `done` as replies, unmapped
  int redirects = 0;
  int retries = 0;
  Steady::time_point deadline{};   ///< the caller's deadline (command_timeout from the call)
  ReplyCallback done;
};

/// The knobs every node shares (from RedisOptions).
struct Settings {
  ConnectSettings connect;
  Millis command_timeout{1000};
  Millis backoff_min{100};
  Millis backoff_max{1000};
  int max_retries = 3;
  Millis retry_delay{50};
  int max_redirects = 5;
  int wait_replicas = 0;
  Millis wait_timeout{100};
};

/// Counters shared by all nodes (RedisStoreStats).
struct Counters {
  std::atomic<std::uint64_t> commands{0}, replies{0}, batches{0}, largest_batch{0}, moved{0}, ask{0}, retries{0},
      noscript{0}, connects{0}, connect_failures{0}, connections_lost{0}, timeouts{0}, topology_refreshes{0};
};

/// What a node asks of the router (cluster.hpp).
class Dispatcher {
 public:
  virtual ~Dispatcher() = default;
  /// Sends by slot (or to the only node of a standalone Redis).
  virtual void dispatch(Op op) = 0;
  /// Sends to one node (ASK, SCAN, PING).
  virtual void send_to(const Address& to, Op op) = 0;
  /// Sends by slot again after `delay`.
  virtual void retry_later(Op op, Millis delay) = 0;
  /// A MOVED answer: the slot's owner is `to` (updates the map, schedules a refresh).
  virtual void moved(int slot, const Address& to) = 0;
  /// The node could not be reached (`unreachable`: connect failed or the connection broke), or
  /// it answered CLUSTERDOWN-like errors: the slot map may be stale.
  virtual void node_failed(const Address& node, bool unreachable) = 0;
};

/// A node's queue, connection and thread.
class Node {
 public:
  Node(Address address, const Settings& settings, Dispatcher& dispatcher, Counters& counters);
  /// Drains (finishes queued and in-flight commands), then joins.
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  /// Queues a command; never blocks beyond a mutex. After close, fails it at once.
  void submit(Op op);
  /// Queues commands together, in order, so that the thread writes them in one go (a batch
  /// call's round trip). After close, fails them at once.
  void submit_many(std::vector<Op> ops);
  /// Asks the thread to finish what is queued and in flight, then stop; returns at once.
  void stop();
  /// Waits for the thread after stop().
  void join();

  const Address& address() const { return address_; }

 private:
  struct InFlight {
    Op op;
    bool asking_reply_pending = false;
    bool wait_reply_pending = false;
    std::optional<Reply> reply;
  };

  void run();
  void start(std::vector<Op> batch);
  bool ensure_connected(Failure& why);
  void on_reply(Reply reply);
  void finish(Op op, Reply reply, std::optional<Reply> wait_reply);
  void drop_connection(const Failure& why);
  void fail(Op& op, const Failure& why);

  const Address address_;
  const Settings& settings_;
  Dispatcher& dispatcher_;
  Counters& counters_;

  std::mutex mutex_;
  std::vector<Op> queue_;   // guarded by mutex_
  bool stopping_ = false;   // guarded by mutex_
  bool closed_ = false;     // guarded by mutex_
  int wake_fd_ = -1;        // eventfd: "the queue went from empty to not empty", or stop

  // The thread's own.
  std::optional<Connection> conn_;
  bool write_pending_ = false;
  std::deque<InFlight> inflight_;
  Steady::time_point next_connect_{};
  Millis backoff_;
  std::string last_connect_error_;

  std::thread thread_;
};

}  // namespace idem::redis_detail
