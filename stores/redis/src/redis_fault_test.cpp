// RedisStore through faults, against the shared test servers (scripts/lib/servers.sh):
//   - a standalone Redis shut down and restarted mid-run,
//   - a cluster master failed over (CLUSTER FAILOVER on its replica) mid-run,
//   - a cluster master killed (SIGKILL) mid-run, its replica promoted by the cluster,
//   - a slot migrated between masters (ASK during the migration, MOVED after it) and back,
//   - a server that stops answering (CLIENT PAUSE) past the command timeout.
// While Redis is down, calls fail fast with `unavailable` and nothing executes; afterwards the
// store recovers by itself; over every run no key executes twice. These tests stop and reshape
// the servers, so ctest runs them alone (RUN_SERIAL). Every server is up again at the end (a
// failover leaves master and replica swapped).
#include "idem/redis_store.hpp"

#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "idem/testing/manual_clock.hpp"
#include "redis_test_support.hpp"
#include "slot.hpp"

namespace idem {
namespace {

using namespace std::chrono_literals;
using redis_detail::Address;
using redis_test::RawRedis;
using testing::ManualClock;

[[maybe_unused]] auto* const servers_environment = ::testing::AddGlobalTestEnvironment(new redis_test::ServersEnvironment);

constexpr Millis kLease = 60s;

// A claim of `key` for tenant "t" with this token, at the clock's time: the test lease, a day's
// retention.
ClaimRequest claim_request(const std::string& key, std::uint64_t token, const ManualClock& clock) {
  ClaimRequest r;
  r.id = RecordId{"t", key};
  r.request_hash = "h";
  r.token = token;
  r.now = clock.now();
  r.lease_expires = r.now + kLease;
  r.expires = r.now + 24h;
  return r;
}

std::unique_ptr<RedisStore> open_store(RedisOptions options) {
  auto store = RedisStore::open(std::move(options));
  if (!store) throw std::runtime_error("RedisStore::open: " + store.error().message);
  return std::move(*store);
}

RedisOptions fast_options(const std::string& url, const std::string& what) {
  RedisOptions o;
  o.url = url;
  o.key_prefix = redis_test::unique_prefix(what);
  o.reconnect_backoff_min = 50ms;
  o.reconnect_backoff_max = 200ms;
  return o;
}

template <class Pred>
bool eventually(Millis timeout, Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return pred();
}

// ---- clients that retry like SPEC §8, counting executions -------------------------------------

// Executions per key, and how the store answered along the way.
struct Ledger {
  std::mutex mutex;
  std::map<std::string, int> executions;
  std::atomic<int> errors{0}, in_doubt{0}, replays{0};

  void executed(const std::string& key) {
    std::lock_guard lock(mutex);
    ++executions[key];
  }

  // What happened to each key, to explain a failure.
  std::map<std::string, std::vector<std::string>> history;
  void note(const std::string& key, std::string what) {
    std::lock_guard lock(mutex);
    history[key].push_back(std::move(what));
  }
};

const char* status_name(ClaimStatus s) {
  switch (s) {
    case ClaimStatus::claimed: return "claimed";
    case ClaimStatus::mismatch: return "mismatch";
    case ClaimStatus::completed: return "completed";
    case ClaimStatus::in_progress: return "in_progress";
    case ClaimStatus::outcome_unknown: return "outcome_unknown";
  }
  return "?";
}

enum class Outcome { done, stuck, gave_up };

// Drives one operation under `key` until it has a final answer: claim; when claimed, "execute"
// (count it) and record the outcome, retrying the completion with the same token until the store
// takes it. Errors are retried after a pause, like a client would. `stuck`: the key is held by a
// claim whose answer was lost (in doubt); its lease must expire first.
Outcome drive(Store& store, ManualClock& clock, std::atomic<std::uint64_t>& tokens, Ledger& ledger,
              const std::string& key, std::chrono::steady_clock::time_point deadline) {
  BlockingStore b(store);
  while (std::chrono::steady_clock::now() < deadline) {
    const ClaimRequest r = claim_request(key, tokens++, clock);
    auto c = b.claim(r);
    ledger.note(key, "claim token " + std::to_string(r.token) + ": " +
                         (c ? std::string(status_name(c->status)) : "error " + c.error().message +
                                                                          (c.error().in_doubt ? " (in doubt)" : "")));
    if (!c) {
      ++ledger.errors;
      if (c.error().in_doubt) ++ledger.in_doubt;
      std::this_thread::sleep_for(20ms);
      continue;
    }
    switch (c->status) {
      case ClaimStatus::completed:
        ++ledger.replays;
        return Outcome::done;
      case ClaimStatus::in_progress:
        return Outcome::stuck;
      case ClaimStatus::mismatch:
      case ClaimStatus::outcome_unknown:
        ADD_FAILURE() << key << ": unexpected claim status";
        return Outcome::gave_up;
      case ClaimStatus::claimed:
        break;
    }
    ledger.executed(key);
    const Fence fence{r.id, r.token};
    // Having executed, the holder keeps trying to record the outcome for longer: giving up
    // would leave the key to be taken over, and executed again, after its lease.
    const auto record_deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < record_deadline) {
      auto d = b.complete(CompleteRequest{fence, StoredResponse{201, {}, "done " + key}, clock.now(), clock.now() + 24h});
      ledger.note(key, "complete: " + (d ? std::string(*d == FenceStatus::ok ? "ok" : "lost")
                                         : "error " + d.error().message + (d.error().in_doubt ? " (in doubt)" : "")));
      if (d && *d == FenceStatus::ok) return Outcome::done;
      if (d && *d == FenceStatus::lost) {
        // Only an earlier attempt of ours whose answer was lost can have completed it.
        auto again = b.get(r.id);
        if (again && *again && (*again)->state == RecordState::completed && (*again)->fencing_token == r.token) {
          return Outcome::done;
        }
        ADD_FAILURE() << key << ": fenced out of its own claim";
        return Outcome::gave_up;
      }
      ++ledger.errors;
      if (!d && d.error().in_doubt) ++ledger.in_doubt;
      std::this_thread::sleep_for(20ms);
    }
    return Outcome::gave_up;
  }
  return Outcome::gave_up;
}

// Runs `threads` clients over fresh keys (and replays of finished ones) until `stop`; then lets
// the leases of claims lost in doubt expire and finishes those keys. Afterwards every key must
// have executed exactly once.
class Hammer {
 public:
  Hammer(Store& store, std::string key_prefix) : store_(store), key_prefix_(std::move(key_prefix)) {}

  void start(int threads) {
    for (int t = 0; t < threads; ++t) {
      workers_.emplace_back([this] {
        while (!stop_) {
          const int i = next_++;
          const std::string key = key_prefix_ + std::to_string(i);
          const auto outcome = drive(store_, clock_, tokens_, ledger_, key, std::chrono::steady_clock::now() + 10s);
          std::lock_guard lock(mutex_);
          keys_.push_back(key);
          (outcome == Outcome::done ? done_ : unfinished_).push_back(key);
          if (i % 5 == 0 && done_.size() > 10) replay_.push_back(done_[done_.size() / 2]);
        }
      });
    }
  }

  void stop_and_finish() {
    stop_ = true;
    for (auto& w : workers_) w.join();
    // A replayed key must replay, never execute again.
    for (const auto& key : replay_) {
      EXPECT_EQ(drive(store_, clock_, tokens_, ledger_, key, std::chrono::steady_clock::now() + 5s), Outcome::done);
    }
    clock_.advance(kLease);
    for (const auto& key : unfinished_) {
      EXPECT_EQ(drive(store_, clock_, tokens_, ledger_, key, std::chrono::steady_clock::now() + 5s), Outcome::done)
          << key;
    }
    int twice = 0, never = 0;
    for (const auto& key : keys_) {
      const int n = ledger_.executions[key];
      if (n > 1) ++twice;
      if (n == 0) ++never;
      if (n > 1) {
        std::string story;
        for (const auto& line : ledger_.history[key]) story += "\n  " + line;
        ADD_FAILURE() << key << " executed " << n << " times:" << story;
      }
    }
    EXPECT_EQ(twice, 0);
    EXPECT_EQ(never, 0) << "keys never executed";
    std::printf("hammer: %zu keys, %zu unfinished at first (claims lost in doubt), %zu replays checked, "
                "%d errors (%d in doubt), executed twice: %d\n",
                keys_.size(), unfinished_.size(), replay_.size(), ledger_.errors.load(), ledger_.in_doubt.load(),
                twice);
  }

  std::size_t keys_so_far() {
    std::lock_guard lock(mutex_);
    return keys_.size();
  }

 private:
  Store& store_;
  std::string key_prefix_;
  ManualClock clock_;
  std::atomic<std::uint64_t> tokens_{1};
  Ledger ledger_;
  std::atomic<bool> stop_{false};
  std::atomic<int> next_{0};
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::vector<std::string> keys_, done_, unfinished_, replay_;
};

// ---- servers -----------------------------------------------------------------------------------

Address standalone_address() { return redis_detail::parse_redis_url(redis_test::standalone_url())->nodes[0]; }

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// The command line scripts/lib/servers.sh started a server with, from CONFIG GET.
std::string restart_command(RawRedis& raw) {
  std::string cmd = "redis-server --daemonize yes";
  for (const char* name : {"port", "bind", "dir", "pidfile", "logfile", "appendonly", "appendfsync", "save"}) {
    cmd += std::string(" --") + name + " " + quoted(raw.config(name));
  }
  if (raw.config("cluster-enabled") == "yes") {
    for (const char* name : {"cluster-enabled", "cluster-config-file", "cluster-node-timeout"}) {
      cmd += std::string(" --") + name + " " + quoted(raw.config(name));
    }
  }
  return cmd + " >/dev/null 2>&1";
}

// The server's pid, from its pidfile.
pid_t pid_of(RawRedis& raw) {
  std::ifstream file(raw.config("pidfile"));
  pid_t pid = 0;
  file >> pid;
  if (pid <= 0) throw std::runtime_error("no pid in " + raw.config("pidfile"));
  return pid;
}

bool cluster_ok(const Address& node) {
  try {
    RawRedis raw(node, 500ms);
    return raw.text({"CLUSTER", "INFO"}).find("cluster_state:ok") != std::string::npos;
  } catch (const std::exception&) {
    return false;
  }
}

void expect_every_server_up() {
  EXPECT_TRUE(redis_test::answers(standalone_address()));
  for (const auto& node : redis_test::cluster_nodes()) {
    EXPECT_TRUE(eventually(10s, [&] { return cluster_ok(node); })) << node.str();
  }
}

// One line of CLUSTER NODES.
struct ClusterNode {
  std::string id;
  Address address;
  bool master = false;
  std::string master_id;
};

std::vector<ClusterNode> cluster_topology() {
  RawRedis raw(redis_test::cluster_nodes().front());
  std::vector<ClusterNode> out;
  std::stringstream lines(raw.text({"CLUSTER", "NODES"}));
  for (std::string line; std::getline(lines, line);) {
    std::stringstream fields(line);
    ClusterNode n;
    std::string address, flags;
    fields >> n.id >> address >> flags >> n.master_id;
    if (flags.find("fail") != std::string::npos) continue;
    auto parsed = redis_detail::parse_address(address.substr(0, address.find('@')));
    if (!parsed) continue;
    n.address = *parsed;
    n.master = flags.find("master") != std::string::npos;
    out.push_back(std::move(n));
  }
  return out;
}

// ---- the faults --------------------------------------------------------------------------------

TEST(RedisFaults, StandaloneRestartFailsFastThenRecoversByItself) {
  const Address address = standalone_address();
  RawRedis admin(address);
  const std::string restart = restart_command(admin);
  auto store = open_store(fast_options(redis_test::standalone_url(), "restart"));

  // A record completed before the restart must survive it (AOF, fsynced by SHUTDOWN).
  ManualClock clock;
  std::atomic<std::uint64_t> tokens{1'000'000};
  Ledger before;
  ASSERT_EQ(drive(*store, clock, tokens, before, "before-restart", std::chrono::steady_clock::now() + 5s),
            Outcome::done);

  Hammer hammer(*store, "restart-");
  hammer.start(4);
  std::this_thread::sleep_for(300ms);

  try {
    admin.call({"SHUTDOWN"});
  } catch (const std::exception&) {
    // SHUTDOWN answers by closing the connection.
  }
  ASSERT_TRUE(eventually(10s, [&] { return !redis_test::answers(address); }));

  // Down: every claim fails at once with `unavailable`; none is claimed, so nothing executes.
  {
    BlockingStore b(*store);
    for (int i = 0; i < 20; ++i) {
      const ClaimRequest r = claim_request("while-down-" + std::to_string(i), tokens++, clock);
      const auto start = std::chrono::steady_clock::now();
      auto c = b.claim(r);
      const auto took = std::chrono::steady_clock::now() - start;
      ASSERT_FALSE(c) << "a claim succeeded while Redis was down";
      EXPECT_EQ(c.error().code, StoreErrc::unavailable) << c.error().message;
      EXPECT_LT(took, 200ms) << c.error().message;
      std::this_thread::sleep_for(25ms);
    }
  }

  ASSERT_EQ(std::system(restart.c_str()), 0) << restart;
  ASSERT_TRUE(eventually(20s, [&] { return redis_test::answers(address); })) << "redis did not come back";
  // Recovered by itself: new keys complete again.
  const auto keys_at_restart = hammer.keys_so_far();
  EXPECT_TRUE(eventually(10s, [&] { return hammer.keys_so_far() > keys_at_restart + 50; }));
  hammer.stop_and_finish();

  BlockingStore b(*store);
  auto c = b.claim(claim_request("before-restart", tokens++, clock));
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->status, ClaimStatus::completed) << "a completed record did not survive the restart";
  const auto stats = store->stats();
  EXPECT_GE(stats.connections_lost, 1u);
  EXPECT_GE(stats.connect_failures, 1u);
  EXPECT_GE(stats.connects, 2u);
  expect_every_server_up();
}

// A Redis that refuses writes it could not make safe: `min-replicas-to-write` with fewer replicas
// connected, as a primary answers when its replica is gone (NOREPLICAS). That is the server being
// unavailable, not a bug in the request: claims and completions fail at once, retryable and not in
// doubt (Redis refuses before writing), reads go on, and writes succeed once it accepts them again.
TEST(RedisFaults, ARedisRefusingWritesForWantOfReplicasIsUnavailableThenRecovers) {
  RawRedis admin(standalone_address());
  const std::string saved = admin.config("min-replicas-to-write");
  auto store = open_store(fast_options(redis_test::standalone_url(), "noreplicas"));
  BlockingStore b(*store);
  ManualClock clock;
  std::uint64_t token = 1;
  auto claim = [&](const std::string& key) { return b.claim(claim_request(key, token++, clock)); };
  auto complete = [&](const ClaimResult& c) {
    return b.complete(CompleteRequest{Fence{RecordId{c.record.tenant, c.record.key}, c.record.fencing_token},
                                      StoredResponse{201, {}, "ok"}, clock.now(), clock.now() + 24h});
  };
  const auto held = claim("held-across-refusal");
  ASSERT_TRUE(held && held->status == ClaimStatus::claimed);

  admin.call({"CONFIG", "SET", "min-replicas-to-write", "1"});
  const auto refused_claim = claim("claimed-during-refusal");
  const auto refused_completion = complete(*held);
  const auto read = b.get(RecordId{"t", "held-across-refusal"});
  admin.call({"CONFIG", "SET", "min-replicas-to-write", saved});

  ASSERT_FALSE(refused_claim);
  EXPECT_EQ(refused_claim.error().code, StoreErrc::unavailable) << refused_claim.error().message;
  EXPECT_FALSE(refused_claim.error().in_doubt) << refused_claim.error().message;
  EXPECT_NE(refused_claim.error().message.find("NOREPLICAS"), std::string::npos) << refused_claim.error().message;
  ASSERT_FALSE(refused_completion);
  EXPECT_EQ(refused_completion.error().code, StoreErrc::unavailable) << refused_completion.error().message;
  EXPECT_FALSE(refused_completion.error().in_doubt) << refused_completion.error().message;
  ASSERT_TRUE(read && *read);
  EXPECT_EQ((*read)->state, RecordState::in_progress);

  // Writes accepted again: the refused claim left nothing behind, and the held key completes.
  const auto again = claim("claimed-during-refusal");
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(again->status, ClaimStatus::claimed);
  EXPECT_EQ(complete(*held), FenceStatus::ok);
  expect_every_server_up();
}

TEST(RedisFaults, ClusterFailoverMidRunExecutesEveryKeyOnce) {
  // A master and its replica.
  auto topology = cluster_topology();
  const ClusterNode* replica = nullptr;
  for (const auto& n : topology) {
    if (!n.master && n.master_id != "-") replica = &n;
  }
  ASSERT_NE(replica, nullptr) << "no replica in the cluster";

  auto options = fast_options(redis_test::cluster_url(), "failover");
  options.command_timeout = 2s;
  auto store = open_store(options);
  const auto refreshes_before = store->stats().topology_refreshes;

  Hammer hammer(*store, "failover-");
  hammer.start(8);
  std::this_thread::sleep_for(400ms);

  RawRedis promote(replica->address);
  ASSERT_EQ(promote.text({"CLUSTER", "FAILOVER"}), "OK");
  ASSERT_TRUE(eventually(15s, [&] {
    RawRedis r(replica->address);
    auto role = r.call({"ROLE"});
    return role.is_array() && !role.elements.empty() && role.elements[0].str == "master";
  })) << replica->address.str() << " did not become master";
  const auto keys_at_failover = hammer.keys_so_far();
  EXPECT_TRUE(eventually(15s, [&] { return hammer.keys_so_far() > keys_at_failover + 300; }))
      << "the store did not recover after the failover";
  hammer.stop_and_finish();

  const auto stats = store->stats();
  EXPECT_GT(stats.topology_refreshes, refreshes_before);
  std::printf("failover: moved=%llu refreshes=%llu retries=%llu timeouts=%llu\n",
              static_cast<unsigned long long>(stats.moved), static_cast<unsigned long long>(stats.topology_refreshes),
              static_cast<unsigned long long>(stats.retries), static_cast<unsigned long long>(stats.timeouts));
  expect_every_server_up();
}

TEST(RedisFaults, ClusterMasterCrashFailsOverAndWaitKeepsAcknowledgedRecords) {
  // A master that dies (SIGKILL): the cluster notices after cluster-node-timeout and promotes
  // its replica. Meanwhile that master's keys fail fast (or CLUSTERDOWN, retried then
  // unavailable); the store re-reads the slot map until the new master shows up. With
  // wait_replicas = 1 every acknowledged write is on the replica that takes over, so no key
  // executes twice; without it an acknowledged record could be lost with the master.
  auto topology = cluster_topology();
  const ClusterNode* victim = nullptr;
  for (const auto& n : topology) {
    if (!n.master) continue;
    for (const auto& r : topology) {
      if (!r.master && r.master_id == n.id) victim = &n;
    }
  }
  ASSERT_NE(victim, nullptr) << "no master with a replica";
  RawRedis victim_admin(victim->address);
  const std::string restart = restart_command(victim_admin);
  const pid_t pid = pid_of(victim_admin);

  auto options = fast_options(redis_test::cluster_url(), "crash");
  options.wait_replicas = 1;
  options.wait_timeout = 500ms;
  options.command_timeout = 2s;
  auto store = open_store(options);

  Hammer hammer(*store, "crash-");
  hammer.start(8);
  std::this_thread::sleep_for(300ms);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  const auto killed_at = std::chrono::steady_clock::now();
  // Promoted: some other node now serves the victim's first slot.
  const Address first = redis_test::cluster_nodes().front() == victim->address ? redis_test::cluster_nodes()[1]
                                                                                 : redis_test::cluster_nodes().front();
  ASSERT_TRUE(eventually(20s, [&] {
    try {
      RawRedis r(first, 500ms);
      for (const auto& range : r.call({"CLUSTER", "SLOTS"}).elements) {
        Address owner{range.elements[2].elements[0].str, static_cast<int>(range.elements[2].elements[1].integer)};
        if (owner == victim->address) return false;
      }
      return r.text({"CLUSTER", "INFO"}).find("cluster_state:ok") != std::string::npos;
    } catch (const std::exception&) {
      return false;
    }
  })) << "the replica was not promoted";
  const auto failover_took = std::chrono::steady_clock::now() - killed_at;
  // The crashed node comes back and rejoins as the new master's replica: only then can writes
  // to that shard be acknowledged by a replica again (until then they fail, in doubt).
  ASSERT_EQ(std::system(restart.c_str()), 0) << restart;
  ASSERT_TRUE(eventually(20s, [&] {
    try {
      RawRedis r(victim->address, 500ms);
      auto role = r.call({"ROLE"});
      return role.is_array() && role.elements.size() >= 4 && role.elements[0].str == "slave" &&
             role.elements[3].str == "connected";
    } catch (const std::exception&) {
      return false;
    }
  })) << "the crashed node did not rejoin as a replica";
  const auto keys_at_rejoin = hammer.keys_so_far();
  EXPECT_TRUE(eventually(15s, [&] { return hammer.keys_so_far() > keys_at_rejoin + 300; }))
      << "the store did not recover after the failover";
  hammer.stop_and_finish();

  const auto stats = store->stats();
  std::printf("crash: failover took %lld ms; moved=%llu refreshes=%llu retries=%llu connect_failures=%llu\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(failover_took).count()),
              static_cast<unsigned long long>(stats.moved), static_cast<unsigned long long>(stats.topology_refreshes),
              static_cast<unsigned long long>(stats.retries), static_cast<unsigned long long>(stats.connect_failures));
  EXPECT_GE(stats.topology_refreshes, 2u);
  expect_every_server_up();
}

TEST(RedisFaults, SlotMigrationIsFollowedThroughAskThenMoved) {
  auto store = open_store(fast_options(redis_test::cluster_url(), "migrate"));
  BlockingStore b(*store);
  ManualClock clock;
  std::atomic<std::uint64_t> tokens{1};
  Ledger ledger;
  auto deadline = [] { return std::chrono::steady_clock::now() + 10s; };

  const RecordId first{"t", "migrating-0"};
  const std::string first_key = store->redis_key(first);
  const int slot = redis_detail::key_slot(first_key);
  ASSERT_EQ(drive(*store, clock, tokens, ledger, first.key, deadline()), Outcome::done);

  // Another identity in the same slot, created while the slot migrates.
  RecordId second{"t", ""};
  for (int i = 1; second.key.empty(); ++i) {
    const std::string candidate = "migrating-" + std::to_string(i);
    if (redis_detail::key_slot(store->redis_key(RecordId{"t", candidate})) == slot) second.key = candidate;
  }

  // Owner (source) and another master (target), with their node ids.
  RawRedis any(redis_test::cluster_nodes().front());
  Address source, target;
  for (const auto& range : any.call({"CLUSTER", "SLOTS"}).elements) {
    Address owner{range.elements[2].elements[0].str, static_cast<int>(range.elements[2].elements[1].integer)};
    if (range.elements[0].integer <= slot && slot <= range.elements[1].integer) {
      source = owner;
    } else if (target.host.empty()) {
      target = owner;
    }
  }
  ASSERT_FALSE(source.host.empty());
  ASSERT_FALSE(target.host.empty());
  RawRedis src(source), tgt(target);
  const std::string src_id = src.text({"CLUSTER", "MYID"}), tgt_id = tgt.text({"CLUSTER", "MYID"});
  const std::string s = std::to_string(slot);

  auto move_slot = [&](RawRedis& from, const Address& from_address, const std::string& from_id, RawRedis& to,
                       const Address& to_address, const std::string& to_id) {
    ASSERT_EQ(to.text({"CLUSTER", "SETSLOT", s, "IMPORTING", from_id}), "OK");
    ASSERT_EQ(from.text({"CLUSTER", "SETSLOT", s, "MIGRATING", to_id}), "OK");
    auto keys = from.call({"CLUSTER", "GETKEYSINSLOT", s, "1000"});
    for (const auto& k : keys.elements) {
      // NOKEY: a key past its TTL that Redis had not reclaimed yet (GETKEYSINSLOT still lists it).
      const auto answer =
          from.text({"MIGRATE", to_address.host, std::to_string(to_address.port), "", "0", "5000", "KEYS", k.str});
      ASSERT_TRUE(answer == "OK" || answer == "NOKEY") << answer;
    }
    (void)from_address;
  };
  auto assign_slot = [&](const std::string& owner_id) {
    for (const auto& n : cluster_topology()) {
      if (n.master) {
        EXPECT_EQ(RawRedis(n.address).text({"CLUSTER", "SETSLOT", s, "NODE", owner_id}), "OK");
      }
    }
  };

  // A batch of that key and one in another slot: the first item alone follows the redirection.
  RecordId elsewhere{"t", ""};
  for (int i = 0; elsewhere.key.empty(); ++i) {
    const std::string candidate = "elsewhere-" + std::to_string(i);
    if (redis_detail::key_slot(store->redis_key(RecordId{"t", candidate})) != slot) elsewhere.key = candidate;
  }
  auto batch_of_both = [&](int n) {
    return b.claim_many({claim_request(first.key, tokens++, clock),
                         claim_request(elsewhere.key + "-" + std::to_string(n), tokens++, clock)});
  };
  auto expect_replay_and_claim = [](const BatchResults<ClaimResult>& results) {
    ASSERT_EQ(results.size(), 2u);
    ASSERT_TRUE(results[0]) << results[0].error().message;
    EXPECT_EQ(results[0]->status, ClaimStatus::completed);
    ASSERT_TRUE(results[1]) << results[1].error().message;
    EXPECT_EQ(results[1]->status, ClaimStatus::claimed);
  };

  // Migrating: the record moved to the target while the map still names the source -> ASK.
  move_slot(src, source, src_id, tgt, target, tgt_id);
  const auto ask_before_batch = store->stats().ask;
  expect_replay_and_claim(batch_of_both(1));
  EXPECT_GT(store->stats().ask, ask_before_batch);
  ASSERT_EQ(drive(*store, clock, tokens, ledger, first.key, deadline()), Outcome::done);  // a replay
  EXPECT_GE(store->stats().ask, 1u);
  ASSERT_EQ(drive(*store, clock, tokens, ledger, second.key, deadline()), Outcome::done);  // created on the target
  tgt.text({"ASKING"});  // the target answers for the importing slot only after ASKING
  EXPECT_EQ(tgt.call({"EXISTS", store->redis_key(second)}).integer, 1);

  // Migrated: the target owns the slot -> MOVED, and the store follows it from then on.
  assign_slot(tgt_id);
  const auto moved_before = store->stats().moved;
  expect_replay_and_claim(batch_of_both(2));
  EXPECT_GT(store->stats().moved, moved_before);
  ASSERT_EQ(drive(*store, clock, tokens, ledger, first.key, deadline()), Outcome::done);

  // And back, leaving the cluster as it was.
  move_slot(tgt, target, tgt_id, src, source, src_id);
  assign_slot(src_id);
  ASSERT_EQ(drive(*store, clock, tokens, ledger, first.key, deadline()), Outcome::done);
  ASSERT_EQ(drive(*store, clock, tokens, ledger, second.key, deadline()), Outcome::done);
  EXPECT_EQ(ledger.executions[first.key], 1);
  EXPECT_EQ(ledger.executions[second.key], 1);
  EXPECT_EQ(src.call({"EXISTS", first_key}).integer, 1);
  expect_every_server_up();
}

TEST(RedisFaults, StalledServerTimesOutInDoubtThenRecovers) {
  auto options = fast_options(redis_test::standalone_url(), "stall");
  options.command_timeout = 200ms;
  auto store = open_store(options);
  BlockingStore b(*store);
  ManualClock clock;
  auto request = [&](const std::string& key) { return claim_request(key, 7, clock); };
  ASSERT_TRUE(b.claim(request("before-stall")));
  RawRedis admin(standalone_address());
  ASSERT_EQ(admin.text({"CLIENT", "PAUSE", "1000", "ALL"}), "OK");
  const auto start = std::chrono::steady_clock::now();
  auto c = b.claim(request("during-stall"));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, StoreErrc::timeout) << c.error().message;
  EXPECT_TRUE(c.error().in_doubt);  // it was written: Redis may or may not run it
  EXPECT_LT(took, 700ms);
  EXPECT_TRUE(eventually(5s, [&] { return b.claim(request("after-stall")).has_value(); }));
  EXPECT_GE(store->stats().timeouts, 1u);
  // The claim that timed out is either absent (the dropped connection's unread command was
  // discarded) or held in progress: never completed, never lost once answered.
  auto r = b.get(RecordId{"t", "during-stall"});
  ASSERT_TRUE(r);
  if (*r) {
    EXPECT_EQ((*r)->state, RecordState::in_progress);
  }
}

// A batch sent to a server that stalls (CLIENT PAUSE) times out item by item, each in doubt; each
// key is afterwards what a single claim that timed out could leave: absent or held in progress.
TEST(RedisFaults, ABatchToAStalledServerTimesOutEveryItemInDoubt) {
  auto options = fast_options(redis_test::standalone_url(), "stall-batch");
  options.command_timeout = 200ms;
  auto store = open_store(options);
  BlockingStore b(*store);
  ManualClock clock;
  ASSERT_TRUE(b.claim(claim_request("before-batch-stall", 1, clock)));
  std::vector<ClaimRequest> requests;
  for (int i = 0; i < 8; ++i) requests.push_back(claim_request("during-batch-stall-" + std::to_string(i), 10 + i, clock));
  RawRedis admin(standalone_address());
  ASSERT_EQ(admin.text({"CLIENT", "PAUSE", "1000", "ALL"}), "OK");
  auto claims = b.claim_many(requests);
  ASSERT_EQ(claims.size(), requests.size());
  for (const auto& c : claims) {
    ASSERT_FALSE(c);
    EXPECT_EQ(c.error().code, StoreErrc::timeout) << c.error().message;
    EXPECT_TRUE(c.error().in_doubt);
  }
  EXPECT_TRUE(eventually(5s, [&] { return b.claim(claim_request("after-batch-stall", 99, clock)).has_value(); }));
  for (const auto& r : requests) {
    auto record = b.get(r.id);
    ASSERT_TRUE(record);
    if (*record) {
      EXPECT_EQ((*record)->state, RecordState::in_progress);
      EXPECT_EQ((*record)->fencing_token, r.token);
    }
  }
}

}  // namespace
}  // namespace idem
