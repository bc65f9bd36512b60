#include "idem/memory_store.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "idem/testing/store_conformance.hpp"

namespace idem::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Memory, StoreConformance,
                         ::testing::Values(StoreFactory{"memory", [] { return std::make_unique<MemoryStore>(); }, nullptr}),
                         StoreConformance::name_of);
// A store that has only the single calls, so that its batch calls are the Store's defaults (the
// single calls one after the other): the suite's batch tests hold for them too.
class SingleCallsOnly final : public Store, public StoreAdmin {
 public:
  void claim(ClaimRequest r, Callback<ClaimResult> done) override { inner_.claim(std::move(r), std::move(done)); }
  void complete(CompleteRequest r, Callback<FenceStatus> done) override { inner_.complete(std::move(r), std::move(done)); }
  void fail(FailRequest r, Callback<FenceStatus> done) override { inner_.fail(std::move(r), std::move(done)); }
  void release(Fence f, Callback<FenceStatus> done) override { inner_.release(std::move(f), std::move(done)); }
  void abandon(AbandonRequest r, Callback<FenceStatus> done) override { inner_.abandon(std::move(r), std::move(done)); }
  void get(RecordId id, Callback<std::optional<Record>> done) override { inner_.get(std::move(id), std::move(done)); }
  void purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) override {
    inner_.purge_expired(now, limit, std::move(done));
  }
  void ping(Callback<Done> done) override { inner_.ping(std::move(done)); }

  void list(ListQuery q, Callback<std::vector<Record>> done) override { inner_.list(std::move(q), std::move(done)); }
  void mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) override {
    inner_.mark_retryable(std::move(id), now, std::move(done));
  }
  void resolve(RecordId id, StoredResponse response, TimePoint now, TimePoint expires,
               Callback<AdminStatus> done) override {
    inner_.resolve(std::move(id), std::move(response), now, expires, std::move(done));
  }
  void count(TimePoint now, Callback<StateCounts> done) override { inner_.count(now, std::move(done)); }

 private:
  MemoryStore inner_;
};

INSTANTIATE_TEST_SUITE_P(MemorySingleCalls, StoreConformance,
                         ::testing::Values(StoreFactory{"memory_single_calls",
                                                        [] { return std::make_unique<SingleCallsOnly>(); }, nullptr}),
                         StoreConformance::name_of);
INSTANTIATE_TEST_SUITE_P(Memory, ConsumerConformance,
                         ::testing::Values(StoreFactory{"memory", [] { return std::make_unique<MemoryStore>(); }, nullptr}),
                         ConsumerConformance::name_of);

// The memory store's expiry index keeps one bucket per second and may hold stale entries; these
// cases aim at its edges, which the conformance suite's whole-hour steps do not reach.
using namespace std::chrono_literals;

class MemoryStoreExpiry : public ::testing::Test {
 protected:
  // A time in the middle of a second, so that +/- a few hundred ms stays in it.
  const TimePoint t0 = from_epoch_ms(1'800'000'000'500);

  ClaimResult claim(const std::string& key, TimePoint now, Millis lease, Millis retention) {
    ClaimRequest r;
    r.id = {"t", key};
    r.request_hash = "h";
    r.token = new_fencing_token();
    r.now = now;
    r.lease_expires = now + lease;
    r.expires = now + retention;
    return *blocking.claim(r);
  }
  FenceStatus complete(const ClaimResult& c, TimePoint now, TimePoint expires) {
    CompleteRequest r;
    r.fence = {{c.record.tenant, c.record.key}, c.record.fencing_token};
    r.response.status = 200;
    r.now = now;
    r.expires = expires;
    return *blocking.complete(r);
  }
  FenceStatus release(const ClaimResult& c) {
    return *blocking.release({{c.record.tenant, c.record.key}, c.record.fencing_token});
  }
  bool present(const std::string& key) { return blocking.get({"t", key})->has_value(); }
  std::size_t purge(TimePoint now, std::size_t limit = 1000) { return *blocking.purge_expired(now, limit); }

  MemoryStore store;
  BlockingStore blocking{store};
};

TEST_F(MemoryStoreExpiry, WithinOneSecondOnlyWhatExpiredGoes) {
  claim("early", t0, 100ms, 100ms);  // expires at t0 + 100 ms
  claim("late", t0, 300ms, 300ms);   // at t0 + 300 ms, the same second
  EXPECT_EQ(purge(t0 + 99ms), 0u);
  EXPECT_EQ(purge(t0 + 100ms), 1u);
  EXPECT_FALSE(present("early"));
  EXPECT_TRUE(present("late"));
  EXPECT_EQ(purge(t0 + 299ms), 0u);
  EXPECT_TRUE(present("late"));
  EXPECT_EQ(purge(t0 + 300ms), 1u);
  EXPECT_FALSE(present("late"));
  EXPECT_EQ(purge(t0 + 10s), 0u);
}

TEST_F(MemoryStoreExpiry, AKeyClaimedAndReleasedOftenIsPurgedOnce) {
  for (int i = 0; i < 5; ++i) ASSERT_EQ(release(claim("churn", t0, 60s, 60s)), FenceStatus::ok);
  auto held = claim("churn", t0, 60s, 60s);
  ASSERT_EQ(held.status, ClaimStatus::claimed);
  EXPECT_EQ(purge(t0 + 59s), 0u);
  EXPECT_EQ(purge(t0 + 60s), 1u);  // six index entries, one record
  EXPECT_FALSE(present("churn"));
}

TEST_F(MemoryStoreExpiry, ACompletedRecordOutlivesItsLease) {
  auto c = claim("done", t0, 1s, 1h);
  ASSERT_EQ(complete(c, t0 + 200ms, t0 + 200ms + 24h), FenceStatus::ok);
  EXPECT_EQ(purge(t0 + 2h), 0u);  // past the lease and the claim's retention, not the completion's
  EXPECT_TRUE(present("done"));
  EXPECT_EQ(purge(t0 + 200ms + 24h), 1u);
}

TEST_F(MemoryStoreExpiry, ATakenOverRecordFollowsItsNewLease) {
  claim("taken", t0, 1s, 1s);
  auto again = claim("taken", t0 + 2s, 10s, 10s);  // the first lease ran out
  ASSERT_EQ(again.status, ClaimStatus::claimed);
  EXPECT_EQ(purge(t0 + 5s), 0u);
  EXPECT_TRUE(present("taken"));
  EXPECT_EQ(purge(t0 + 12s), 1u);
}

TEST_F(MemoryStoreExpiry, TheLimitStopsInsideASecondAndTheRestFollow) {
  for (int i = 0; i < 7; ++i) claim("k" + std::to_string(i), t0, 1s, 1s);
  EXPECT_EQ(purge(t0 + 1s, 3), 3u);
  EXPECT_EQ(purge(t0 + 1s, 3), 3u);
  EXPECT_EQ(purge(t0 + 1s, 3), 1u);
  EXPECT_EQ(purge(t0 + 1s, 3), 0u);
  for (int i = 0; i < 7; ++i) EXPECT_FALSE(present("k" + std::to_string(i)));
}

TEST_F(MemoryStoreExpiry, ListPagesInKeyOrderWhateverTheInsertionOrder) {
  // Insert in a scrambled order; page through with a small limit.
  std::vector<std::string> keys;
  for (int i = 0; i < 50; ++i) keys.push_back("key-" + std::to_string((i * 37) % 50 + 100));
  for (const auto& k : keys) claim(k, t0, 60s, 60s);
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> seen;
  ListQuery q;
  q.limit = 7;
  for (;;) {
    std::vector<Record> page;
    store.list(q, [&](StoreResult<std::vector<Record>>&& r) {
      ASSERT_TRUE(r.has_value()) << r.error().message;
      page = std::move(r.value());
    });
    if (page.empty()) break;
    ASSERT_LE(page.size(), 7u);
    for (const auto& r : page) seen.push_back(r.key);
    q.after = RecordId{page.back().tenant, page.back().key};
  }
  EXPECT_EQ(seen, keys);
}

}  // namespace
}  // namespace idem::testing
