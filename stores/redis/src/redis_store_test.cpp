// RedisStore against real servers: the conformance suite on a standalone Redis and on a Redis
// Cluster, then what is particular to Redis (key layout, TTLs, NOSCRIPT, pipelining, WAIT,
// slots as the cluster computes them). Faults that disturb the servers are in
// redis_fault_test.cpp.
#include "idem/redis_store.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <future>
#include <thread>

#include "idem/headers_codec.hpp"
#include "idem/memory_store.hpp"
#include "idem/testing/manual_clock.hpp"
#include "idem/testing/store_conformance.hpp"
#include "record_codec.hpp"
#include "redis_test_support.hpp"
#include "slot.hpp"

namespace idem {
namespace {

using namespace std::chrono_literals;
using redis_test::RawRedis;

[[maybe_unused]] auto* const servers_environment = ::testing::AddGlobalTestEnvironment(new redis_test::ServersEnvironment);

std::unique_ptr<RedisStore> open_store(RedisOptions options) {
  auto store = RedisStore::open(std::move(options));
  if (!store) throw std::runtime_error("RedisStore::open: " + store.error().message);
  return std::move(*store);
}

std::unique_ptr<RedisStore> open_store(const std::string& url, const std::string& prefix) {
  RedisOptions options;
  options.url = url;
  options.key_prefix = prefix;
  // A parallel ctest on 2 cores can stall a server for longer than the production defaults;
  // the fault tests, which test timeouts, set their own.
  options.connect_timeout = std::chrono::seconds(10);
  options.command_timeout = std::chrono::seconds(10);
  return open_store(std::move(options));
}

// ---- the conformance suite, twice ---------------------------------------------------------------

// A fresh prefix per make() is fresh, empty storage without FLUSHALL (other tests may be running
// against the same servers); share() opens another store on the last prefix.
std::string standalone_prefix, cluster_prefix;

std::unique_ptr<Store> make_standalone() {
  standalone_prefix = redis_test::unique_prefix("conf");
  return open_store(redis_test::standalone_url(), standalone_prefix);
}
std::unique_ptr<Store> share_standalone() { return open_store(redis_test::standalone_url(), standalone_prefix); }
std::unique_ptr<Store> make_cluster() {
  cluster_prefix = redis_test::unique_prefix("conf");
  return open_store(redis_test::cluster_url(), cluster_prefix);
}
std::unique_ptr<Store> share_cluster() { return open_store(redis_test::cluster_url(), cluster_prefix); }

}  // namespace

namespace testing {
INSTANTIATE_TEST_SUITE_P(Redis, StoreConformance,
                         ::testing::Values(StoreFactory{"redis", make_standalone, share_standalone},
                                           StoreFactory{"redis_cluster", make_cluster, share_cluster}),
                         StoreConformance::name_of);
INSTANTIATE_TEST_SUITE_P(Redis, ConsumerConformance,
                         ::testing::Values(StoreFactory{"redis", make_standalone, share_standalone},
                                           StoreFactory{"redis_cluster", make_cluster, share_cluster}),
                         ConsumerConformance::name_of);
}  // namespace testing

namespace {

// ---- Redis-specific, on both topologies ---------------------------------------------------------

class RedisStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string url() const { return GetParam() == "standalone" ? redis_test::standalone_url() : redis_test::cluster_url(); }

  // Where a key lives: the standalone server, or the cluster master owning its slot.
  redis_detail::Address node_of(const std::string& key) {
    auto first = redis_test::cluster_nodes().front();
    if (GetParam() == "standalone") return redis_detail::parse_redis_url(redis_test::standalone_url())->nodes[0];
    RawRedis raw(first);
    auto slots = raw.call({"CLUSTER", "SLOTS"});
    const int slot = redis_detail::key_slot(key);
    for (const auto& range : slots.elements) {
      if (range.elements[0].integer <= slot && slot <= range.elements[1].integer) {
        return redis_detail::Address{range.elements[2].elements[0].str,
                                     static_cast<int>(range.elements[2].elements[1].integer)};
      }
    }
    throw std::runtime_error("no owner for slot " + std::to_string(slot));
  }

  std::vector<redis_detail::Address> masters() {
    if (GetParam() == "standalone") return {redis_detail::parse_redis_url(redis_test::standalone_url())->nodes[0]};
    RawRedis raw(redis_test::cluster_nodes().front());
    std::vector<redis_detail::Address> out;
    for (const auto& range : raw.call({"CLUSTER", "SLOTS"}).elements) {
      out.push_back({range.elements[2].elements[0].str, static_cast<int>(range.elements[2].elements[1].integer)});
    }
    return out;
  }

  ClaimRequest request(const std::string& tenant, const std::string& key, const std::string& hash = "h") {
    ClaimRequest r;
    r.id = RecordId{tenant, key};
    r.request_hash = hash;
    r.token = next_token++;
    r.now = clock.now();
    r.lease_expires = r.now + 60s;
    r.expires = r.now + 24h;
    return r;
  }
  static Fence fence_of(const ClaimResult& c) { return Fence{RecordId{c.record.tenant, c.record.key}, c.record.fencing_token}; }

  testing::ManualClock clock;
  std::uint64_t next_token = 1;
};

INSTANTIATE_TEST_SUITE_P(Topologies, RedisStoreTest, ::testing::Values("standalone", "cluster"),
                         [](const auto& info) { return info.param; });

TEST_P(RedisStoreTest, RecordIsOneReadableStringWithAPhysicalTtlBeyondItsLogicalLife) {
  auto store = open_store(url(), redis_test::unique_prefix("layout"));
  BlockingStore b(*store);
  auto c = b.claim(request("acme", "order-0000000001"));
  ASSERT_TRUE(c && c->status == ClaimStatus::claimed);
  const std::string key = store->redis_key(RecordId{"acme", "order-0000000001"});
  EXPECT_TRUE(key.ends_with("{acme:order-0000000001}"));
  RawRedis raw(node_of(key));
  EXPECT_EQ(raw.text({"TYPE", key}), "string");
  EXPECT_EQ(raw.text({"GET", key}), redis_detail::encode_record(c->record));
  EXPECT_TRUE(raw.text({"GET", key}).starts_with("I1|" + std::to_string(c->record.fencing_token) + "|"));
  // In progress, the key outlives its lease (so an expired lease can still be reported as
  // outcome unknown or taken over): its TTL is the retention plus the grace.
  auto pttl = raw.call({"PTTL", key}).integer;
  EXPECT_GT(pttl, std::chrono::milliseconds(24h).count());
  EXPECT_LE(pttl, std::chrono::milliseconds(24h + 10min).count());
  ASSERT_EQ(b.complete(CompleteRequest{fence_of(*c), StoredResponse{200, {{"A", "b"}}, "ok"}, clock.now(),
                                       clock.now() + 1h}),
            FenceStatus::ok);
  pttl = raw.call({"PTTL", key}).integer;
  EXPECT_GT(pttl, std::chrono::milliseconds(1h).count());
  EXPECT_LE(pttl, std::chrono::milliseconds(1h + 10min).count());
  const std::string value = raw.text({"GET", key});
  EXPECT_TRUE(value.starts_with("C1|") && value.ends_with("ok")) << value;
  // What the script wrote is what the C++ codec reads (both sides of lua/record.lua).
  auto decoded = redis_detail::decode_record(RecordId{"acme", "order-0000000001"}, value);
  ASSERT_TRUE(decoded) << decoded.error().message;
  EXPECT_EQ(decoded->request_hash, "h");
  EXPECT_EQ(decoded->created, c->record.created);
  EXPECT_EQ(decoded->fencing_token, c->record.fencing_token);
  ASSERT_TRUE(decoded->response);
  EXPECT_EQ(decoded->response->headers, (Headers{{"A", "b"}}));
}

// Strings written before attempt numbers (`I|token|...`, no attempt, no lookup_len): the SET NX
// GET path and the scripts read them as attempt 1, and a takeover writes them back as attempt 2
// in the current layout, keeping the creation time and the TTL's reach.
TEST_P(RedisStoreTest, StringsFromBeforeAttemptNumbersCountOnFromOne) {
  auto store = open_store(url(), redis_test::unique_prefix("preattempt"));
  BlockingStore b(*store);
  const RecordId id{"acme", "preattempt-key-0001"};
  const std::string key = store->redis_key(id);
  const auto created_ms = to_epoch_ms(clock.now() - 10min);
  const auto expires_ms = to_epoch_ms(clock.now() + 1h);
  const std::string old = "I|8|" + std::to_string(to_epoch_ms(clock.now() - 1s)) + "|" + std::to_string(created_ms) +
                          "|" + std::to_string(expires_ms) + "|||1|0|h";
  RawRedis raw(node_of(key));
  raw.call({"SET", key, old, "PX", "3600000"});
  auto got = b.get(id);
  ASSERT_TRUE(got && *got) << (got ? "absent" : got.error().message);
  EXPECT_EQ((*got)->attempt, 1u);
  EXPECT_EQ((*got)->fencing_token, 8u);
  auto takeover = b.claim(request("acme", id.key));
  ASSERT_TRUE(takeover) << takeover.error().message;
  ASSERT_EQ(takeover->status, ClaimStatus::claimed);
  EXPECT_EQ(takeover->kind, ClaimKind::after_lease_expiry);
  EXPECT_EQ(takeover->record.attempt, 2u);
  EXPECT_EQ(takeover->record.created, from_epoch_ms(created_ms));
  const std::string now_stored = raw.text({"GET", key});
  EXPECT_TRUE(now_stored.starts_with("I2|" + std::to_string(takeover->record.fencing_token) + "|")) << now_stored;
}

// Records written by an idem from before the string layout: one hash per key.
TEST_P(RedisStoreTest, LegacyHashRecordsAreReadAndRewrittenOnTheirNextWrite) {
  const std::string prefix = redis_test::unique_prefix("legacy");
  auto store = open_store(url(), prefix);
  BlockingStore b(*store);
  const auto now_ms = std::to_string(to_epoch_ms(clock.now()));
  const auto later_ms = std::to_string(to_epoch_ms(clock.now() + 1h));
  const RecordId done_id{"acme", "legacy-completed-01"}, busy_id{"acme", "legacy-progress-01"},
      old_id{"acme", "legacy-expired-0001"};
  const std::string done_key = store->redis_key(done_id), busy_key = store->redis_key(busy_id),
                    old_key = store->redis_key(old_id);
  RawRedis(node_of(done_key)).call({"HSET", done_key, "state", "completed", "hash", "h", "token", "7",
                                    "lease_expires", later_ms, "created", now_ms, "completed", now_ms, "expires",
                                    later_ms, "status", "201", "headers", encode_headers({{"A", "b"}}), "body",
                                    "paid"});
  RawRedis(node_of(done_key)).call({"PEXPIRE", done_key, "3600000"});
  RawRedis(node_of(busy_key)).call({"HSET", busy_key, "state", "in_progress", "hash", "h", "token", "8",
                                    "lease_expires", later_ms, "created", now_ms, "expires", later_ms});
  RawRedis(node_of(old_key)).call({"HSET", old_key, "state", "failed_retryable", "hash", "h", "token", "9",
                                   "lease_expires", now_ms, "created", now_ms, "expires", now_ms});

  // Reads take them as they are.
  auto got = b.get(done_id);
  ASSERT_TRUE(got && *got) << (got ? "absent" : got.error().message);
  EXPECT_EQ((*got)->state, RecordState::completed);
  ASSERT_TRUE((*got)->response);
  EXPECT_EQ((*got)->response->body, "paid");
  std::promise<StoreResult<StateCounts>> counted;
  store->count(clock.now(), [&](auto r) { counted.set_value(std::move(r)); });
  auto counts = counted.get_future().get();
  ASSERT_TRUE(counts) << counts.error().message;
  EXPECT_EQ(counts->completed, 1u);
  EXPECT_EQ(counts->in_progress, 1u);
  EXPECT_EQ(counts->expired, 1u);
  std::promise<StoreResult<std::vector<Record>>> listed;
  store->list(ListQuery{}, [&](auto r) { listed.set_value(std::move(r)); });
  auto all = listed.get_future().get();
  ASSERT_TRUE(all) << all.error().message;
  EXPECT_EQ(all->size(), 3u);
  EXPECT_EQ(RawRedis(node_of(done_key)).text({"TYPE", done_key}), "hash");

  // A claim replays the completed one (and rewrites it as a string, keeping its TTL) ...
  auto replay = b.claim(request("acme", done_id.key));
  ASSERT_TRUE(replay) << replay.error().message;
  EXPECT_EQ(replay->status, ClaimStatus::completed);
  ASSERT_TRUE(replay->record.response);
  EXPECT_EQ(replay->record.response->body, "paid");
  EXPECT_EQ(RawRedis(node_of(done_key)).text({"TYPE", done_key}), "string");
  const auto pttl = RawRedis(node_of(done_key)).call({"PTTL", done_key}).integer;
  EXPECT_GT(pttl, 3000000);
  EXPECT_LE(pttl, 3600000);
  EXPECT_EQ(b.claim(request("acme", done_id.key, "other"))->status, ClaimStatus::mismatch);
  // ... the holder of the in-progress one still completes it with its token, and only with it ...
  EXPECT_EQ(b.claim(request("acme", busy_id.key))->status, ClaimStatus::in_progress);
  EXPECT_EQ(b.complete(CompleteRequest{Fence{busy_id, 99}, StoredResponse{200, {}, "no"}, clock.now(), clock.now() + 1h}),
            FenceStatus::lost);
  EXPECT_EQ(b.complete(CompleteRequest{Fence{busy_id, 8}, StoredResponse{200, {}, "yes"}, clock.now(), clock.now() + 1h}),
            FenceStatus::ok);
  auto finished = b.get(busy_id);
  ASSERT_TRUE(finished && *finished);
  EXPECT_EQ((*finished)->state, RecordState::completed);
  EXPECT_EQ((*finished)->response->body, "yes");
  // ... and an expired one is purged.
  auto purged = b.purge_expired(clock.now(), 100);
  ASSERT_TRUE(purged) << purged.error().message;
  EXPECT_EQ(*purged, 1u);
  EXPECT_EQ(RawRedis(node_of(old_key)).call({"EXISTS", old_key}).integer, 0);
}

TEST_P(RedisStoreTest, AnyTenantAndKeyBytesRoundTripAndList) {
  auto store = open_store(url(), redis_test::unique_prefix("bytes"));
  BlockingStore b(*store);
  const std::vector<RecordId> ids = {{"t{1}", "k}{:%-00000000001"},
                                     {"t", std::string("nul\0and\xff-0000001", 17)},
                                     {"t:x", "y"},
                                     {"t", "x:y"}};
  for (const auto& id : ids) {
    auto c = b.claim(request(id.tenant, id.key));
    ASSERT_TRUE(c);
    EXPECT_EQ(c->status, ClaimStatus::claimed);
    auto r = b.get(id);
    ASSERT_TRUE(r && *r);
    EXPECT_EQ((*r)->tenant, id.tenant);
    EXPECT_EQ((*r)->key, id.key);
  }
  std::promise<StoreResult<std::vector<Record>>> listed;
  store->list(ListQuery{}, [&](auto r) { listed.set_value(std::move(r)); });
  auto all = listed.get_future().get();
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), ids.size());
  for (std::size_t i = 1; i < all->size(); ++i) {
    EXPECT_LT(std::tie((*all)[i - 1].tenant, (*all)[i - 1].key), std::tie((*all)[i].tenant, (*all)[i].key));
  }
}

TEST_P(RedisStoreTest, ExpiresRecordsByItselfSoNoReaperIsNeeded) {
  auto store = open_store(url(), redis_test::unique_prefix("ttl"));
  // Every record carries a key TTL (RecordIsOneReadableStringWithAPhysicalTtlBeyondItsLogicalLife).
  EXPECT_TRUE(store->expires_records_itself());
  EXPECT_FALSE(MemoryStore{}.expires_records_itself());
}

TEST_P(RedisStoreTest, NoscriptFallsBackToEval) {
  auto store = open_store(url(), redis_test::unique_prefix("noscript"));
  BlockingStore b(*store);
  // A fresh claim is a plain SET; the completion is a script. Other test processes share these
  // servers (ctest -j): one of them may fall back to EVAL, and so cache the script again, between
  // our flush and our completion. Every step must succeed regardless; the fallback itself must
  // show up within a few flushes.
  const auto before = store->stats().noscript;
  std::optional<ClaimResult> c;
  for (int attempt = 0; attempt < 20 && store->stats().noscript == before; ++attempt) {
    auto claimed = b.claim(request("t", "after-flush-" + std::to_string(10000 + attempt)));
    ASSERT_TRUE(claimed) << claimed.error().message;
    ASSERT_EQ(claimed->status, ClaimStatus::claimed);
    c = *claimed;
    for (const auto& m : masters()) RawRedis(m).text({"SCRIPT", "FLUSH"});
    auto done = b.complete(CompleteRequest{fence_of(*c), StoredResponse{201, {}, "x"}, clock.now(), clock.now() + 1h});
    ASSERT_TRUE(done) << done.error().message;
    ASSERT_EQ(*done, FenceStatus::ok);
  }
  EXPECT_GT(store->stats().noscript, before);
  ASSERT_TRUE(c);
  EXPECT_EQ(b.claim(request("t", c->record.key))->status, ClaimStatus::completed);
}

TEST_P(RedisStoreTest, ConcurrentCallsArePipelinedOnOneConnectionPerNode) {
  auto store = open_store(url(), redis_test::unique_prefix("pipeline"));
  constexpr int kCalls = 2000;
  std::atomic<int> left{kCalls}, claimed{0};
  std::promise<void> all_done;
  for (int i = 0; i < kCalls; ++i) {
    store->claim(request("t", "pipelined-" + std::to_string(i)), [&](StoreResult<ClaimResult> r) {
      if (r && r->status == ClaimStatus::claimed) ++claimed;
      if (--left == 0) all_done.set_value();
    });
  }
  all_done.get_future().get();
  EXPECT_EQ(claimed.load(), kCalls);
  const auto stats = store->stats();
  EXPECT_GT(stats.largest_batch, 10u) << "commands were not pipelined";
  EXPECT_LT(stats.batches, static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(stats.connects, GetParam() == "standalone" ? 1u : masters().size());
}

// A batch call is one write per node: every node gets its share of the items in one go (a
// cluster: the items spread over every master).
TEST_P(RedisStoreTest, ABatchIsOneWritePerNode) {
  auto store = open_store(url(), redis_test::unique_prefix("batch-write"));
  BlockingStore b(*store);
  ASSERT_TRUE(b.ping());  // connected to every master before counting
  std::vector<ClaimRequest> requests;
  for (int i = 0; i < 64; ++i) requests.push_back(request("t", "batched-" + std::to_string(i)));
  const auto before = store->stats();
  auto claims = b.claim_many(requests);
  const auto after = store->stats();
  for (const auto& c : claims) ASSERT_TRUE(c && c->status == ClaimStatus::claimed);
  EXPECT_EQ(after.commands - before.commands, 64u);
  EXPECT_EQ(after.batches - before.batches, masters().size());
  EXPECT_GE(after.largest_batch, 64u / masters().size());

  std::vector<Fence> fences;
  for (const auto& c : claims) fences.push_back(fence_of(*c));
  std::vector<CompleteRequest> completions;
  for (const auto& f : fences) completions.push_back(CompleteRequest{f, StoredResponse{200, {}, "ok"}, clock.now(), clock.now() + 24h});
  const auto mid = store->stats();
  for (const auto& r : b.complete_many(std::move(completions))) ASSERT_TRUE(r && *r == FenceStatus::ok);
  // A node that does not have the script yet answers NOSCRIPT: its share goes again as EVAL, in
  // one more write.
  const auto end = store->stats();
  EXPECT_GE(end.batches - mid.batches, masters().size());
  EXPECT_LE(end.batches - mid.batches, masters().size() + (end.noscript - mid.noscript));
  auto replays = b.claim_many(requests);
  for (const auto& c : replays) {
    ASSERT_TRUE(c);
    EXPECT_EQ(c->status, ClaimStatus::completed);
  }
}

TEST(RedisCluster, SlotsAgreeWithTheServer) {
  RawRedis raw(redis_test::cluster_nodes().front());
  auto store = open_store(redis_test::cluster_url(), "idem:");
  for (const auto& id : std::vector<RecordId>{{"acme", "key-0001"}, {"t{x}", "k}"}, {"", ""}, {"a b", "\x01\x7f"}}) {
    const auto key = store->redis_key(id);
    EXPECT_EQ(raw.call({"CLUSTER", "KEYSLOT", key}).integer, redis_detail::key_slot(key)) << key;
  }
  for (int i = 0; i < 200; ++i) {
    const std::string key = "k" + std::to_string(i * 7919) + "{" + std::to_string(i) + "}";
    EXPECT_EQ(raw.call({"CLUSTER", "KEYSLOT", key}).integer, redis_detail::key_slot(key)) << key;
  }
}

TEST_P(RedisStoreTest, WaitReplicasAcknowledgedOrInDoubt) {
  RedisOptions options;
  options.url = url();
  options.key_prefix = redis_test::unique_prefix("wait");
  options.wait_replicas = 1;
  options.wait_timeout = 200ms;
  auto store = open_store(options);
  auto c = BlockingStore(*store).claim(request("t", "waited-000000001"));
  if (GetParam() == "cluster") {
    // Every master has one replica: the claim is acknowledged by it.
    ASSERT_TRUE(c) << c.error().message;
    EXPECT_EQ(c->status, ClaimStatus::claimed);
  } else {
    // The standalone server has no replica: the write happened but is not replicated.
    ASSERT_FALSE(c);
    EXPECT_EQ(c.error().code, StoreErrc::unavailable);
    EXPECT_TRUE(c.error().in_doubt);
  }
}

TEST_P(RedisStoreTest, PingAndCountsAcrossMasters) {
  auto store = open_store(url(), redis_test::unique_prefix("count"));
  BlockingStore b(*store);
  EXPECT_TRUE(b.ping());
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(b.claim(request("t", "counted-" + std::to_string(i))));
  std::promise<StoreResult<StateCounts>> counted;
  store->count(clock.now(), [&](auto r) { counted.set_value(std::move(r)); });
  auto counts = counted.get_future().get();
  ASSERT_TRUE(counts);
  EXPECT_EQ(counts->in_progress, 50u);
}

// ---- options and failures without a server ------------------------------------------------------

TEST(RedisStoreOpen, RejectsBadOptions) {
  RedisOptions bad_url;
  bad_url.url = "memcached://h";
  EXPECT_FALSE(RedisStore::open(bad_url));
  RedisOptions bad_prefix;
  bad_prefix.url = redis_test::standalone_url();
  bad_prefix.key_prefix = "a{b}:";
  auto r = RedisStore::open(bad_prefix);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, StoreErrc::internal);
  RedisOptions bad_wait;
  bad_wait.url = redis_test::standalone_url();
  bad_wait.wait_replicas = 1;
  bad_wait.wait_timeout = bad_wait.command_timeout;
  EXPECT_FALSE(RedisStore::open(bad_wait));
}

// A port nothing listens on (bound, never listened, then closed).
int dead_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(RedisStoreOpen, UnreachableServer) {
  RedisOptions options;
  options.url = "redis://127.0.0.1:" + std::to_string(dead_port());
  auto checked = RedisStore::open(options);
  ASSERT_FALSE(checked);
  EXPECT_EQ(checked.error().code, StoreErrc::unavailable);

  // Unchecked, it opens, and every call fails fast with unavailable, never in doubt.
  options.check_on_open = false;
  auto store = open_store(options);
  BlockingStore b(*store);
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    ClaimRequest r;
    r.id = {"t", "k"};
    auto c = b.claim(r);
    ASSERT_FALSE(c);
    EXPECT_EQ(c.error().code, StoreErrc::unavailable) << c.error().message;
    EXPECT_FALSE(c.error().in_doubt);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms);
  }
  EXPECT_GE(store->stats().connect_failures, 1u);
  EXPECT_FALSE(b.ping());
}

// A batch against a server that cannot be reached: every item fails fast as unavailable, none in
// doubt (nothing was sent).
TEST(RedisStoreOpen, ABatchAgainstAnUnreachableServerFailsEveryItem) {
  RedisOptions options;
  options.url = "redis://127.0.0.1:" + std::to_string(dead_port());
  options.check_on_open = false;
  auto store = open_store(options);
  BlockingStore b(*store);
  std::vector<ClaimRequest> requests(5);
  for (std::size_t i = 0; i < requests.size(); ++i) requests[i].id = {"t", "k" + std::to_string(i)};
  const auto start = std::chrono::steady_clock::now();
  auto claims = b.claim_many(requests);
  auto completes = b.complete_many({CompleteRequest{Fence{{"t", "k0"}, 1}, {}, {}, {}}});
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  ASSERT_EQ(claims.size(), 5u);
  for (const auto& c : claims) {
    ASSERT_FALSE(c);
    EXPECT_EQ(c.error().code, StoreErrc::unavailable) << c.error().message;
    EXPECT_FALSE(c.error().in_doubt);
  }
  ASSERT_EQ(completes.size(), 1u);
  ASSERT_FALSE(completes[0]);
  EXPECT_EQ(completes[0].error().code, StoreErrc::unavailable);
}

TEST(RedisStoreOpen, UnreachableClusterSeeds) {
  RedisOptions options;
  options.url = "redis+cluster://127.0.0.1:" + std::to_string(dead_port());
  auto checked = RedisStore::open(options);
  ASSERT_FALSE(checked);
  EXPECT_EQ(checked.error().code, StoreErrc::unavailable);
  options.check_on_open = false;
  auto store = open_store(options);
  ClaimRequest r;
  r.id = {"t", "k"};
  auto c = BlockingStore(*store).claim(r);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, StoreErrc::unavailable);
}

TEST(RedisStoreOpen, AClusterUrlNamingAStandaloneRedisSaysWhatEachSeedAnswered) {
  const std::string standalone = redis_test::standalone_url().substr(std::string("redis://").size());
  const std::string dead = "127.0.0.1:" + std::to_string(dead_port());
  RedisOptions options;
  options.url = "redis+cluster://" + standalone + "," + dead;
  auto opened = RedisStore::open(options);
  ASSERT_FALSE(opened);
  const std::string& why = opened.error().message;
  EXPECT_NE(why.find(standalone + ": ERR This instance has cluster support disabled"), std::string::npos) << why;
  EXPECT_NE(why.find(dead + ": "), std::string::npos) << why;
}

TEST(RedisStoreOpen, ARedisUrlNamingAClusterNodeSaysToUseRedisCluster) {
  const std::string node = redis_test::cluster_url().substr(std::string("redis+cluster://").size());
  const std::string first = node.substr(0, node.find(','));
  RedisOptions options;
  options.url = "redis://" + first;
  auto opened = RedisStore::open(options);
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.error().code, StoreErrc::unavailable);
  EXPECT_NE(opened.error().message.find("is a Redis Cluster node: use redis+cluster://" + first), std::string::npos)
      << opened.error().message;
}

}  // namespace
}  // namespace idem
