#pragma once

// Where each command goes: the one node of a standalone Redis, or the owner of the key's slot
// in a Redis Cluster. Keeps the slot map (CLUSTER SLOTS, re-read after MOVED, node failures and
// periodically), creates a Node per address it meets, and delays retries on a timer thread.

#include <array>
#include <condition_variable>
#include <expected>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "node.hpp"
#include "slot.hpp"
#include "idem/redis_wire/url.hpp"

namespace idem::redis_detail {

/// Routes commands to nodes; the Dispatcher every Node reports back to.
class Router final : public Dispatcher {
 public:
  /// Starts the timer and (cluster) topology threads; connects nothing yet.
  Router(RedisUrl url, Settings settings, Counters& counters, Millis refresh_interval);
  /// shutdown(), then frees the nodes.
  ~Router() override;
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  /// Blocking, for open(): a standalone server must answer PING; a cluster must give its slot
  /// map.
  std::expected<void, Failure> start();
  /// Stops the threads; each node finishes what it has queued and in flight.
  void shutdown();

  bool cluster() const { return url_.cluster; }
  /// The nodes holding data: the standalone server, or each slot owner of the current map.
  std::vector<Address> masters();
  /// Asks the topology thread to re-read the slot map soon (cluster; no-op otherwise).
  void request_refresh();

  void dispatch(Op op) override;
  /// Sends many by slot at once: each node's share in one submission, in their order, so that
  /// each node writes its share in one go. Commands no node is known for fail alone.
  void dispatch_many(std::vector<Op> ops);
  void send_to(const Address& to, Op op) override;
  void retry_later(Op op, Millis delay) override;
  void moved(int slot, const Address& to) override;
  void node_failed(const Address& node, bool unreachable) override;

  const Settings& settings() const { return settings_; }

 private:
  Node* node_locked(const Address& address);  // requires mutex_; nullptr once shutting down
  /// `why`, when given and no node answered, says what each node said (for start-up errors).
  bool refresh_once(std::string* why = nullptr);
  void refresher();
  void timer();
  void fail(Op& op, const Failure& why);
  /// The node an Op goes to by slot (or the standalone server); null when none is known.
  Node* route_locked(const Op& op);  // requires mutex_

  const RedisUrl url_;
  const Settings settings_;
  Counters& counters_;
  const Millis refresh_interval_;

  std::mutex mutex_;
  std::map<Address, std::unique_ptr<Node>> nodes_;   // guarded by mutex_; never shrinks
  std::array<Node*, kSlots> slots_{};                // guarded by mutex_ (cluster)
  bool shutting_down_ = false;                       // guarded by mutex_
  // Nodes that were unreachable lately. Their view of the cluster is asked for last: a master
  // restarted after a failover still claims its old slots until gossip corrects it, and
  // trusting it would route writes to stale data.
  std::map<Address, Steady::time_point> suspect_until_;  // guarded by mutex_

  std::mutex refresh_mutex_;
  std::condition_variable refresh_cv_;
  bool refresh_requested_ = false;  // guarded by refresh_mutex_
  bool refresh_stop_ = false;       // guarded by refresh_mutex_
  std::thread refresh_thread_;

  std::mutex timer_mutex_;
  std::condition_variable timer_cv_;
  std::multimap<Steady::time_point, Op> timers_;  // guarded by timer_mutex_
  bool timer_stop_ = false;                       // guarded by timer_mutex_
  std::thread timer_thread_;
};

}  // namespace idem::redis_detail
