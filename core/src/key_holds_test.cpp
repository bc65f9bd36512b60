#include "idem/key_holds.hpp"

#include <gtest/gtest.h>

#include <thread>

#include "idem/memory_store.hpp"

namespace idem {
namespace {

using Ids = std::vector<std::string>;

Ids parked(StoreKeyHolds& holds, std::string_view key) {
  auto p = holds.parked(key);
  EXPECT_TRUE(p.has_value()) << (p ? "" : p.error().message);
  return p ? *p : Ids{};
}

TEST(StoreKeyHolds, ParksInOrderOnceEachAndUnparksOnlyTheFirst) {
  MemoryStore store;
  StoreKeyHolds holds(store, "orders");
  EXPECT_TRUE(parked(holds, "pay_1").empty());
  ASSERT_TRUE(holds.park("pay_1", "m1"));
  ASSERT_TRUE(holds.park("pay_1", "m2"));
  ASSERT_TRUE(holds.park("pay_1", "m1"));  // parked already: no change
  ASSERT_TRUE(holds.park("pay_2", "x1"));
  EXPECT_EQ(parked(holds, "pay_1"), (Ids{"m1", "m2"}));
  EXPECT_EQ(parked(holds, "pay_2"), (Ids{"x1"}));

  ASSERT_TRUE(holds.unpark_first("pay_1", "m2"));  // not first: no change
  EXPECT_EQ(parked(holds, "pay_1"), (Ids{"m1", "m2"}));
  ASSERT_TRUE(holds.unpark_first("pay_1", "m1"));
  EXPECT_EQ(parked(holds, "pay_1"), (Ids{"m2"}));
  ASSERT_TRUE(holds.unpark_first("pay_1", "m2"));
  EXPECT_TRUE(parked(holds, "pay_1").empty());
  // The last unpark deleted the record; another park starts a new hold.
  auto record = BlockingStore(store).get({StoreKeyHolds::tenant_of("orders"), "pay_1"});
  ASSERT_TRUE(record);
  EXPECT_FALSE(record->has_value());

  auto forgot = holds.forget("pay_2");
  ASSERT_TRUE(forgot);
  EXPECT_TRUE(*forgot);
  EXPECT_TRUE(parked(holds, "pay_2").empty());
  forgot = holds.forget("pay_2");
  ASSERT_TRUE(forgot);
  EXPECT_FALSE(*forgot);
}

TEST(StoreKeyHolds, HoldsOfTwoConsumerNamesAreApart) {
  MemoryStore store;
  StoreKeyHolds a(store, "ledger");
  StoreKeyHolds b(store, "notifier");
  ASSERT_TRUE(a.park("pay_1", "m1"));
  EXPECT_TRUE(parked(b, "pay_1").empty());
  EXPECT_EQ(StoreKeyHolds::tenant_of("ledger"), "consumer ledger held");
}

TEST(StoreKeyHolds, ConcurrentParksOfOneKeyAreAllKept) {
  MemoryStore store;
  StoreKeyHolds holds(store, "orders");
  constexpr int kThreads = 4, kEach = 25;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        if (!holds.park("hot", std::string("t") + std::to_string(t) + "-" + std::to_string(i))) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  const Ids ids = parked(holds, "hot");
  ASSERT_EQ(ids.size(), static_cast<std::size_t>(kThreads * kEach));
  // Each thread's ids in its own order.
  for (int t = 0; t < kThreads; ++t) {
    int next = 0;
    const std::string prefix = std::string("t") + std::to_string(t) + "-";
    for (const auto& id : ids) {
      if (id.starts_with(prefix)) {
        EXPECT_EQ(id, prefix + std::to_string(next++));
      }
    }
    EXPECT_EQ(next, kEach);
  }
}

TEST(StoreKeyHolds, ARecordThatIsNotAHoldIsReportedNotOverwritten) {
  MemoryStore store;
  ClaimRequest claim;
  claim.id = {StoreKeyHolds::tenant_of("orders"), "pay_1"};
  claim.request_hash = std::string(64, 'a');
  claim.token = 7;
  claim.now = SystemClock::instance().now();
  claim.lease_expires = claim.now + std::chrono::minutes(1);
  claim.expires = claim.now + std::chrono::hours(1);
  ASSERT_TRUE(BlockingStore(store).claim(claim));
  StoreKeyHolds holds(store, "orders");
  auto p = holds.parked("pay_1");
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, StoreErrc::corrupt);
  EXPECT_FALSE(holds.park("pay_1", "m1"));
}

}  // namespace
}  // namespace idem
