#include "router.hpp"

#include <algorithm>
#include <iterator>
#include <set>

namespace idem::redis_detail {
namespace {

// Refreshes never run closer together than this, however many failures ask for one.
constexpr Millis kMinRefreshGap{100};

// How long an unreachable node's view of the cluster is trusted less than the others'.
constexpr Millis kSuspectFor{15000};

// CLUSTER SLOTS: [[start, end, [ip, port, id, ...], replica...], ...] -> (start, end, master).
struct SlotRange {
  int start = 0, end = 0;
  Address master;
};

std::optional<std::vector<SlotRange>> parse_cluster_slots(const Reply& reply, const Address& asked) {
  if (!reply.is_array() || reply.elements.empty()) return std::nullopt;
  std::vector<SlotRange> ranges;
  for (const auto& entry : reply.elements) {
    if (!entry.is_array() || entry.elements.size() < 3) return std::nullopt;
    const auto& start = entry.elements[0];
    const auto& end = entry.elements[1];
    const auto& master = entry.elements[2];
    if (start.type != Reply::Type::integer || end.type != Reply::Type::integer || !master.is_array() ||
        master.elements.size() < 2 || master.elements[1].type != Reply::Type::integer) {
      return std::nullopt;
    }
    SlotRange r;
    r.start = static_cast<int>(start.integer);
    r.end = static_cast<int>(end.integer);
    if (r.start < 0 || r.end >= kSlots || r.start > r.end) return std::nullopt;
    r.master.host = master.elements[0].str;
    if (r.master.host.empty()) r.master.host = asked.host;  // "": the node we asked
    if (r.master.host == "?") continue;                      // unknown endpoint: leave unrouted
    r.master.port = static_cast<int>(master.elements[1].integer);
    ranges.push_back(std::move(r));
  }
  return ranges;
}

}  // namespace

Router::Router(RedisUrl url, Settings settings, Counters& counters, Millis refresh_interval)
    : url_(std::move(url)), settings_(std::move(settings)), counters_(counters), refresh_interval_(refresh_interval) {
  if (!url_.cluster) {
    std::lock_guard lock(mutex_);
    node_locked(url_.nodes.front());
  } else {
    refresh_thread_ = std::thread([this] { refresher(); });
  }
  timer_thread_ = std::thread([this] { timer(); });
}

Router::~Router() { shutdown(); }

std::expected<void, Failure> Router::start() {
  if (url_.cluster) {
    std::string why;
    if (refresh_once(&why)) return {};
    return std::unexpected(Failure{Failure::Kind::connect, "no seed node answered CLUSTER SLOTS (" + why + ")", ""});
  }
  auto conn = Connection::open(url_.nodes.front(), settings_.connect, /*nonblocking=*/false);
  if (!conn) return std::unexpected(conn.error());
  auto pong = conn->call({"PING"});
  if (!pong) return std::unexpected(pong.error());
  if (pong->is_error()) return std::unexpected(Failure{Failure::Kind::reply, pong->str, url_.nodes.front().str()});
  // A cluster node named by redis:// would answer most keys with MOVED: every command would take
  // a detour, and admin scans would see one node's keys only. Say which URL to use instead. A
  // server that does not answer INFO (a proxy, a restricted user) is taken as standalone.
  auto info = conn->call({"INFO", "cluster"});
  if (info && info->type == Reply::Type::string && info->str.find("cluster_enabled:1") != std::string::npos) {
    const std::string node = url_.nodes.front().str();
    return std::unexpected(Failure{Failure::Kind::wrong_kind,
                                   "this Redis is a Redis Cluster node: use redis+cluster://" + node +
                                       " (more nodes may follow, comma-separated)",
                                   node});
  }
  return {};
}

void Router::shutdown() {
  {
    std::lock_guard lock(refresh_mutex_);
    refresh_stop_ = true;
  }
  refresh_cv_.notify_all();
  if (refresh_thread_.joinable()) refresh_thread_.join();
  {
    std::lock_guard lock(timer_mutex_);
    timer_stop_ = true;
  }
  timer_cv_.notify_all();
  if (timer_thread_.joinable()) timer_thread_.join();  // sends what it still held
  std::vector<Node*> nodes;
  {
    std::lock_guard lock(mutex_);
    shutting_down_ = true;
    for (auto& [address, node] : nodes_) nodes.push_back(node.get());
  }
  for (Node* n : nodes) n->stop();
  for (Node* n : nodes) n->join();
}

Node* Router::node_locked(const Address& address) {
  auto it = nodes_.find(address);
  if (it != nodes_.end()) return it->second.get();
  if (shutting_down_) return nullptr;
  auto node = std::make_unique<Node>(address, settings_, *this, counters_);
  Node* raw = node.get();
  nodes_.emplace(address, std::move(node));
  return raw;
}

std::vector<Address> Router::masters() {
  std::lock_guard lock(mutex_);
  if (!url_.cluster) return {url_.nodes.front()};
  std::vector<Address> out;
  std::set<Node*> seen;
  for (Node* n : slots_) {
    if (n && seen.insert(n).second) out.push_back(n->address());
  }
  return out;
}

void Router::fail(Op& op, const Failure& why) {
  counters_.replies.fetch_add(1, std::memory_order_relaxed);
  op.done(std::unexpected(map_error(why)));
}

void Router::dispatch(Op op) {
  if (op.node) {
    const Address to = *op.node;
    send_to(to, std::move(op));
    return;
  }
  if (url_.cluster && (op.slot < 0 || op.slot >= kSlots)) {
    fail(op, Failure{Failure::Kind::no_route, "no slot for the command", ""});
    return;
  }
  Node* node = nullptr;
  {
    std::lock_guard lock(mutex_);
    node = url_.cluster ? slots_[static_cast<std::size_t>(op.slot)] : nodes_.begin()->second.get();
  }
  if (!node) {
    request_refresh();
    fail(op, Failure{Failure::Kind::no_route, "no node known for slot " + std::to_string(op.slot), ""});
    return;
  }
  node->submit(std::move(op));
}

Node* Router::route_locked(const Op& op) {
  if (op.node) return node_locked(*op.node);
  if (!url_.cluster) return nodes_.begin()->second.get();
  if (op.slot < 0 || op.slot >= kSlots) return nullptr;
  return slots_[static_cast<std::size_t>(op.slot)];
}

void Router::dispatch_many(std::vector<Op> ops) {
  std::vector<std::pair<Node*, std::vector<Op>>> shares;  // few nodes: a vector beats a map
  std::vector<Op> unrouted;
  {
    std::lock_guard lock(mutex_);
    for (auto& op : ops) {
      Node* node = route_locked(op);
      if (!node) {
        unrouted.push_back(std::move(op));
        continue;
      }
      auto share = std::find_if(shares.begin(), shares.end(), [node](const auto& s) { return s.first == node; });
      if (share == shares.end()) {
        shares.emplace_back(node, std::vector<Op>{});
        share = std::prev(shares.end());
      }
      share->second.push_back(std::move(op));
    }
  }
  for (auto& [node, share] : shares) node->submit_many(std::move(share));
  // dispatch says why each of these has no route (and asks for a fresh slot map).
  for (auto& op : unrouted) dispatch(std::move(op));
}

void Router::send_to(const Address& to, Op op) {
  Node* node = nullptr;
  {
    std::lock_guard lock(mutex_);
    node = node_locked(to);
  }
  if (!node) {
    fail(op, Failure{Failure::Kind::closing, "", to.str()});
    return;
  }
  node->submit(std::move(op));
}

void Router::retry_later(Op op, Millis delay) {
  {
    std::lock_guard lock(timer_mutex_);
    if (!timer_stop_) {
      timers_.emplace(Steady::now() + delay, std::move(op));
      timer_cv_.notify_one();
      return;
    }
  }
  dispatch(std::move(op));  // closing: no more delays
}

void Router::moved(int slot, const Address& to) {
  if (!url_.cluster || slot < 0 || slot >= kSlots) return;
  {
    std::lock_guard lock(mutex_);
    if (Node* node = node_locked(to)) slots_[static_cast<std::size_t>(slot)] = node;
  }
  request_refresh();
}

void Router::node_failed(const Address& node, bool unreachable) {
  if (!url_.cluster) return;
  if (unreachable) {
    std::lock_guard lock(mutex_);
    suspect_until_[node] = Steady::now() + kSuspectFor;
  }
  request_refresh();
}

void Router::request_refresh() {
  if (!url_.cluster) return;
  {
    std::lock_guard lock(refresh_mutex_);
    refresh_requested_ = true;
  }
  refresh_cv_.notify_one();
}

bool Router::refresh_once(std::string* why) {
  // Ask the nodes we route to first (they know best), then the seeds, then everyone else seen;
  // nodes that were unreachable lately come last (see suspect_until_).
  std::vector<Address> all = masters();
  for (const auto& seed : url_.nodes) all.push_back(seed);
  std::vector<Address> candidates, suspects;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [address, node] : nodes_) all.push_back(address);
    const auto now = Steady::now();
    for (auto& address : all) {
      auto it = suspect_until_.find(address);
      const bool suspect = it != suspect_until_.end() && it->second > now;
      (suspect ? suspects : candidates).push_back(std::move(address));
    }
  }
  candidates.insert(candidates.end(), suspects.begin(), suspects.end());
  std::set<Address> tried;
  for (const auto& address : candidates) {
    if (!tried.insert(address).second) continue;
    // What this node said, for `why`: a seed that is a standalone Redis answers "ERR This
    // instance has cluster support disabled", which tells the operator to use redis://.
    const auto note = [&](const std::string& said) {
      if (!why) return;
      if (!why->empty()) *why += "; ";
      *why += said;
    };
    auto conn = Connection::open(address, settings_.connect, /*nonblocking=*/false);
    if (!conn) {
      note(map_error(conn.error()).message);
      continue;
    }
    auto reply = conn->call({"CLUSTER", "SLOTS"});
    if (!reply) {
      note(map_error(reply.error()).message);
      continue;
    }
    if (reply->is_error()) {
      note(address.str() + ": " + reply->str);
      continue;
    }
    auto ranges = parse_cluster_slots(*reply, address);
    if (!ranges || ranges->empty()) {
      note(address.str() + ": no slot is served yet (cluster not created, or still forming)");
      continue;
    }
    std::array<Node*, kSlots> fresh{};
    {
      std::lock_guard lock(mutex_);
      for (const auto& r : *ranges) {
        Node* node = node_locked(r.master);
        if (!node) return false;  // shutting down
        std::fill(fresh.begin() + r.start, fresh.begin() + r.end + 1, node);
      }
      slots_ = fresh;
    }
    counters_.topology_refreshes.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  return false;
}

void Router::refresher() {
  block_sigpipe_on_this_thread();
  auto next_periodic = Steady::now() + refresh_interval_;
  std::unique_lock lock(refresh_mutex_);
  while (!refresh_stop_) {
    if (!refresh_requested_) {
      if (refresh_interval_.count() > 0) {
        refresh_cv_.wait_until(lock, next_periodic, [&] { return refresh_stop_ || refresh_requested_; });
      } else {
        refresh_cv_.wait(lock, [&] { return refresh_stop_ || refresh_requested_; });
      }
      if (refresh_stop_) break;
      if (!refresh_requested_ && Steady::now() < next_periodic) continue;
    }
    refresh_requested_ = false;
    lock.unlock();
    refresh_once();
    next_periodic = Steady::now() + refresh_interval_;
    lock.lock();
    refresh_cv_.wait_for(lock, kMinRefreshGap, [&] { return refresh_stop_; });
  }
}

void Router::timer() {
  std::unique_lock lock(timer_mutex_);
  while (!timer_stop_) {
    if (timers_.empty()) {
      timer_cv_.wait(lock, [&] { return timer_stop_ || !timers_.empty(); });
      continue;
    }
    auto first = timers_.begin();
    if (first->first > Steady::now()) {
      timer_cv_.wait_until(lock, first->first);
      continue;
    }
    Op op = std::move(first->second);
    timers_.erase(first);
    lock.unlock();
    dispatch(std::move(op));
    lock.lock();
  }
  auto rest = std::move(timers_);
  timers_.clear();
  lock.unlock();
  for (auto& [when, op] : rest) dispatch(std::move(op));
}

}  // namespace idem::redis_detail
