// The Consumer conformance suite (SPEC §10): process_once on each backend, unchanged. Every claim
// that a message is processed "once" is hammered here with concurrent and repeated deliveries,
// counting handler runs.
#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/consumer.hpp"
#include "idem/key_holds.hpp"
#include "idem/testing/manual_clock.hpp"
#include "idem/testing/redeliveries.hpp"
#include "idem/testing/store_conformance.hpp"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;

Consumer make_consumer(Store& store, const std::string& name, const Clock* clock = nullptr,
                       LeaseExpiry on_lease_expiry = LeaseExpiry::reexecute) {
  ConsumerOptions options;
  options.name = name;
  options.lease = 30s;
  options.retention = 24h;
  options.on_lease_expiry = on_lease_expiry;
  options.clock = clock;
  auto consumer = Consumer::create(store, std::move(options));
  if (!consumer) throw std::runtime_error(consumer.error());
  return std::move(*consumer);
}

// A handler that counts its runs and returns the count ("1", "2", ...) as its result.
auto counting(int& runs) {
  return [&runs]() -> std::expected<std::string, std::string> { return std::to_string(++runs); };
}

MessageOutcome process(Consumer& consumer, const std::string& id, const std::string& payload, MessageHandler handler) {
  auto outcome = consumer.process_once(id, payload, std::move(handler));
  if (!outcome) throw std::runtime_error("process_once: " + outcome.error().message);
  return std::move(*outcome);
}

}  // namespace

#define CONSUMER_TEST(name) TEST_P(ConsumerConformance, name)

CONSUMER_TEST(ProcessesOnceAndRemembersTheResult) {
  auto store = GetParam().make();
  auto consumer = make_consumer(*store, "billing");
  int runs = 0;
  auto handler = [&runs]() -> std::expected<std::string, std::string> {
    ++runs;
    return "invoice-7";
  };
  auto first = process(consumer, "msg-1", "{\"amount\":100}", handler);
  EXPECT_EQ(first.status, MessageStatus::processed);
  EXPECT_EQ(first.result, "invoice-7");
  EXPECT_TRUE(first.ack());
  for (int i = 0; i < 3; ++i) {
    auto again = process(consumer, "msg-1", "{\"amount\":100}", handler);
    EXPECT_EQ(again.status, MessageStatus::duplicate);
    EXPECT_EQ(again.result, "invoice-7");
    EXPECT_TRUE(again.ack());
  }
  EXPECT_EQ(runs, 1);

  // Stored like any record, under a tenant no HTTP request can name (it has a space).
  auto record = BlockingStore(*store).get(RecordId{"consumer billing", "msg-1"});
  ASSERT_TRUE(record.has_value());
  ASSERT_TRUE(record->has_value());
  EXPECT_EQ((*record)->state, RecordState::completed);
  EXPECT_EQ(consumer.tenant(), "consumer billing");
}

CONSUMER_TEST(TheSameIdWithAnotherPayloadIsAConflictAndRunsNothing) {
  auto store = GetParam().make();
  auto consumer = make_consumer(*store, "billing");
  int runs = 0;
  auto handler = counting(runs);
  EXPECT_EQ(process(consumer, "msg-2", "amount=100", handler).status, MessageStatus::processed);
  auto other = process(consumer, "msg-2", "amount=200", handler);
  EXPECT_EQ(other.status, MessageStatus::conflict);
  EXPECT_FALSE(other.ack());
  EXPECT_EQ(runs, 1);
  // The conflict did not poison the processed record.
  EXPECT_EQ(process(consumer, "msg-2", "amount=100", handler).status, MessageStatus::duplicate);
}

CONSUMER_TEST(EachConsumerNameProcessesEveryMessage) {
  auto store = GetParam().make();
  auto billing = make_consumer(*store, "billing");
  auto emails = make_consumer(*store, "emails");
  int runs = 0;
  auto handler = counting(runs);
  EXPECT_EQ(process(billing, "msg-3", "p", handler).status, MessageStatus::processed);
  EXPECT_EQ(process(emails, "msg-3", "p", handler).status, MessageStatus::processed);
  EXPECT_EQ(process(billing, "msg-3", "p", handler).status, MessageStatus::duplicate);
  EXPECT_EQ(process(emails, "msg-3", "p", handler).status, MessageStatus::duplicate);
  EXPECT_EQ(runs, 2);
}

CONSUMER_TEST(AFailedHandlerIsForgottenSoTheNextDeliveryRunsIt) {
  auto store = GetParam().make();
  auto consumer = make_consumer(*store, "billing");
  int runs = 0;
  auto failing = [&runs]() -> std::expected<std::string, std::string> {
    ++runs;
    return std::unexpected("the payment provider said 503");
  };
  auto failed = process(consumer, "msg-4", "p", failing);
  EXPECT_EQ(failed.status, MessageStatus::handler_failed);
  EXPECT_EQ(failed.detail, "the payment provider said 503");
  EXPECT_FALSE(failed.ack());
  auto record = BlockingStore(*store).get(RecordId{consumer.tenant(), "msg-4"});
  ASSERT_TRUE(record.has_value());
  EXPECT_FALSE(record->has_value()) << "the failed claim must be forgotten, not left in progress";

  auto throwing = [&runs]() -> std::expected<std::string, std::string> {
    ++runs;
    throw std::runtime_error("bug");
  };
  EXPECT_THROW(consumer.process_once("msg-4", "p", throwing), std::runtime_error);

  auto ok = counting(runs);
  auto done = process(consumer, "msg-4", "p", ok);
  EXPECT_EQ(done.status, MessageStatus::processed);
  EXPECT_EQ(done.result, "3");
}

CONSUMER_TEST(ADeliveryWhileAnotherHoldsTheMessageIsInProgress) {
  auto store = GetParam().make();
  auto consumer = make_consumer(*store, "billing");
  auto held = consumer.claim("msg-5", "p");
  ASSERT_TRUE(held.has_value());
  ASSERT_TRUE(std::holds_alternative<Consumer::Held>(*held));
  int runs = 0;
  auto handler = counting(runs);
  auto busy = process(consumer, "msg-5", "p", handler);
  EXPECT_EQ(busy.status, MessageStatus::in_progress);
  EXPECT_FALSE(busy.ack());
  EXPECT_EQ(runs, 0);
}

CONSUMER_TEST(AnExpiredLeaseIsTakenOverOrReportedUnknown) {
  auto store = GetParam().make();
  ManualClock clock;
  auto consumer = make_consumer(*store, "billing", &clock);
  auto cautious = make_consumer(*store, "ledger", &clock, LeaseExpiry::unknown);
  int runs = 0;
  auto handler = counting(runs);

  // A holder that died: its claims stay until their lease runs out.
  ASSERT_TRUE(consumer.claim("msg-6", "p").has_value());
  ASSERT_TRUE(cautious.claim("msg-6", "p").has_value());
  clock.advance(31s);
  EXPECT_EQ(process(consumer, "msg-6", "p", handler).status, MessageStatus::processed);
  auto unknown = process(cautious, "msg-6", "p", handler);
  EXPECT_EQ(unknown.status, MessageStatus::outcome_unknown);
  EXPECT_FALSE(unknown.ack());
  EXPECT_EQ(runs, 1);
}

CONSUMER_TEST(AHandlerThatOutlivesItsLeaseIsLost) {
  auto store = GetParam().make();
  ManualClock clock;
  auto consumer = make_consumer(*store, "billing", &clock);
  int runs = 0;
  MessageOutcome inner;
  // While the first delivery's handler runs past its lease, a redelivery takes the message over.
  auto slow = [&]() -> std::expected<std::string, std::string> {
    ++runs;
    clock.advance(31s);
    inner = process(consumer, "msg-7", "p", [&runs]() -> std::expected<std::string, std::string> {
      ++runs;
      return "second";
    });
    return "first";
  };
  auto outer = process(consumer, "msg-7", "p", slow);
  EXPECT_EQ(inner.status, MessageStatus::processed);
  EXPECT_EQ(outer.status, MessageStatus::lost);
  EXPECT_FALSE(outer.ack());
  EXPECT_EQ(runs, 2);
  // The record is the taker's.
  auto replay = process(consumer, "msg-7", "p", [] { return std::expected<std::string, std::string>("third"); });
  EXPECT_EQ(replay.status, MessageStatus::duplicate);
  EXPECT_EQ(replay.result, "second");
}

CONSUMER_TEST(BadNamesAndMessageIdsAreRefused) {
  auto store = GetParam().make();
  for (const char* name : {"", "has space", "tab\there"}) {
    ConsumerOptions options;
    options.name = name;
    auto refused = Consumer::create(*store, options);
    ASSERT_FALSE(refused.has_value()) << name;
    EXPECT_NE(refused.error().find("consumer name"), std::string::npos) << refused.error();
  }
  ConsumerOptions zero_lease;
  zero_lease.name = "billing";
  zero_lease.lease = Millis::zero();
  EXPECT_FALSE(Consumer::create(*store, zero_lease).has_value());

  auto consumer = make_consumer(*store, "billing");
  int runs = 0;
  for (const std::string& id : {std::string(), std::string("with space"), std::string(257, 'x'), std::string("caf\xc3\xa9")}) {
    auto refused = process(consumer, id, "p", counting(runs));
    EXPECT_EQ(refused.status, MessageStatus::invalid_id) << id;
    EXPECT_FALSE(refused.ack());
    EXPECT_NE(refused.detail.find("message id"), std::string::npos) << refused.detail;
  }
  EXPECT_EQ(runs, 0);
}

// The claim that matters: deliveries of the same messages racing on many threads (and, where
// the backend can share its storage, through two store instances: two consumer processes) run
// each handler exactly once, and every duplicate gets the one run's result.
CONSUMER_TEST(ConcurrentRedeliveriesRunEachHandlerExactlyOnce) {
  const auto& factory = GetParam();
  auto store = factory.make();
  std::unique_ptr<Store> second = factory.share ? factory.share() : nullptr;
  std::vector<Consumer> consumers;
  consumers.push_back(make_consumer(*store, "billing"));
  if (second) consumers.push_back(make_consumer(*second, "billing"));

  constexpr int kMessages = 40, kThreads = 8, kDeliveries = 3;
  std::vector<std::atomic<int>> runs(kMessages);
  auto tally = redeliver_concurrently(kThreads, kMessages, kDeliveries, [&](int thread, const std::string& id) {
    const int i = std::stoi(id.substr(4));
    return consumers[thread % consumers.size()].process_once(
        id, "payload-" + id, [&runs, i, id]() -> std::expected<std::string, std::string> {
          std::this_thread::yield();  // widen the window for a racing delivery
          return "run-" + std::to_string(runs[i].fetch_add(1) + 1) + "-of-" + id;
        });
  });
  expect_each_processed_once(tally, kMessages, kThreads * kDeliveries);
  for (int i = 0; i < kMessages; ++i) {
    const std::string id = redelivered_id(i);
    EXPECT_EQ(runs[i].load(), 1) << id;
    for (const MessageOutcome& o : tally.outcomes[id]) EXPECT_EQ(o.result, "run-1-of-" + id);
  }
  RecordProperty("in_progress_answers", tally.in_progress_answers);
}

// Keys held behind a dead letter (ConsumeLoop with holds) live in the store as in_progress records
// rewritten by abandon + takeover: every backend must keep the parked ids (the record's lookup)
// through that, and concurrent parks through two store instances (two consumer processes) must
// all be kept.
CONSUMER_TEST(KeyHoldsKeepTheirParkedIdsInOrderAcrossWritersAndEndWithTheLast) {
  const auto& factory = GetParam();
  auto store = factory.make();
  std::unique_ptr<Store> second = factory.share ? factory.share() : nullptr;
  StoreKeyHolds one(*store, "billing");
  StoreKeyHolds two(second ? *second : *store, "billing");
  using Ids = std::vector<std::string>;
  ASSERT_TRUE(one.park("pay_1", "m-0"));
  ASSERT_TRUE(two.park("pay_1", "m-1"));
  ASSERT_TRUE(one.park("pay_1", "m-0"));
  EXPECT_EQ(two.parked("pay_1").value_or(Ids{}), (Ids{"m-0", "m-1"}));

  constexpr int kThreads = 4, kEach = 10;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      StoreKeyHolds& holds = t % 2 == 0 ? one : two;
      for (int i = 0; i < kEach; ++i) {
        if (!holds.park("pay_2", std::string("t") + std::to_string(t) + "-" + std::to_string(i))) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(one.parked("pay_2").value_or(Ids{}).size(), static_cast<std::size_t>(kThreads * kEach));

  ASSERT_TRUE(two.unpark_first("pay_1", "m-0"));
  EXPECT_EQ(one.parked("pay_1").value_or(Ids{}), (Ids{"m-1"}));
  ASSERT_TRUE(one.unpark_first("pay_1", "m-1"));
  EXPECT_EQ(two.parked("pay_1").value_or(Ids{"not read"}), Ids{});
  auto gone = BlockingStore(*store).get({StoreKeyHolds::tenant_of("billing"), "pay_1"});
  ASSERT_TRUE(gone);
  EXPECT_FALSE(gone->has_value()) << "the last unpark deletes the hold";
}

}  // namespace idem::testing
