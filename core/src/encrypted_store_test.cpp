#include "idem/encrypted_store.hpp"

#include <gtest/gtest.h>

#include <string>

#include "idem/consumer.hpp"
#include "idem/engine.hpp"
#include "idem/fingerprint.hpp"
#include "idem/memory_store.hpp"
#include "idem/problem.hpp"
#include "idem/testing/manual_clock.hpp"
#include "idem/testing/store_conformance.hpp"
#include "idem/testing/test_keys.hpp"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Store> encrypted_memory_store() {
  auto inner = std::make_unique<MemoryStore>();
  StoreAdmin* admin = inner.get();
  return std::make_unique<EncryptedStore>(std::move(inner), admin,
                                          test_key_ring(test_key_line("k1", 1) + test_key_line("k2", 2)));
}

// The whole Store and Consumer contract holds through the decorator.
INSTANTIATE_TEST_SUITE_P(EncryptedMemory, StoreConformance,
                         ::testing::Values(StoreFactory{"encrypted_memory", encrypted_memory_store, nullptr}),
                         StoreConformance::name_of);
INSTANTIATE_TEST_SUITE_P(EncryptedMemory, ConsumerConformance,
                         ::testing::Values(StoreFactory{"encrypted_memory", encrypted_memory_store, nullptr}),
                         ConsumerConformance::name_of);

constexpr std::string_view kMarker = "MARKER-4f1c9a-card-4242424242424242";

struct TestRequest {
  std::string body = R"({"amount":100})";
  std::string key = "key-0123456789abcdef";
  std::vector<HeaderView> headers;
  RequestView view() {
    headers = {{"Idempotency-Key", key}, {"Content-Type", "application/json"}};
    return RequestView{"POST", "/v1/payments", "", headers, body};
  }
};

class EncryptedStoreTest : public ::testing::Test {
 protected:
  // The memory store the decorator owns, seen raw.
  static std::unique_ptr<EncryptedStore> wrap(MemoryStore*& raw) {
    auto owned = std::make_unique<MemoryStore>();
    raw = owned.get();
    return std::make_unique<EncryptedStore>(std::move(owned), raw, test_key_ring(test_key_line("k1", 1)));
  }

  // Executes a request through the engine and stores `body` as its response; the decision of
  // the next identical request.
  Decision execute_then_retry(TestRequest request, std::string body) {
    auto first = engine.begin_and_wait(policy, request.view(), "acme");
    EXPECT_EQ(first.verdict, Verdict::execute);
    if (first.verdict != Verdict::execute) return first;
    auto finished =
        engine.finish_and_wait(*first.ticket, StoredResponse{201, {{"Content-Type", "application/json"}}, body});
    EXPECT_EQ(finished.value_or(FinishStatus::fenced_out), FinishStatus::stored);
    return engine.begin_and_wait(policy, request.view(), "acme");
  }

  Record raw_record(const std::string& key) { return *BlockingStore(*raw).get(RecordId{"acme", key}).value(); }

  // Stores `response` for `request` behind the decorator's back, as the bytes an attacker or a
  // broken disk would leave: claimed and completed on the raw store.
  void put_raw(TestRequest request, StoredResponse response) {
    ClaimRequest claim;
    claim.id = RecordId{"acme", request.key};
    claim.request_hash = fingerprint(request.view(), policy.fingerprint);
    claim.token = new_fencing_token();
    claim.now = clock.now();
    claim.lease_expires = claim.now + policy.lease;
    claim.expires = claim.now + policy.retention;
    const Fence fence{claim.id, claim.token};
    ASSERT_EQ(BlockingStore(*raw).claim(std::move(claim))->status, ClaimStatus::claimed);
    ASSERT_EQ(BlockingStore(*raw).complete(CompleteRequest{fence, std::move(response), clock.now(),
                                                           clock.now() + policy.retention}),
              FenceStatus::ok);
  }
  StoredResponse sealed_for(const TestRequest& request, std::string body) {
    return *store->keys()->seal(RecordId{"acme", request.key}, StoredResponse{201, {}, std::move(body)});
  }

  MemoryStore* raw = nullptr;
  std::unique_ptr<EncryptedStore> store = wrap(raw);  // after raw, before engine
  ManualClock clock;
  Engine engine{*store, clock};
  Policy policy;
};

TEST_F(EncryptedStoreTest, StoresSealedResponsesAndReplaysThem) {
  TestRequest request;
  auto replay = execute_then_retry(request, std::string(kMarker));
  ASSERT_EQ(replay.verdict, Verdict::replay);
  EXPECT_EQ(replay.replay->status, 201);
  EXPECT_EQ(replay.replay->body, kMarker);
  EXPECT_EQ(replay.replay->headers, (Headers{{"Content-Type", "application/json"}}));

  const Record stored = raw_record(request.key);
  ASSERT_TRUE(stored.response);
  EXPECT_EQ(stored.response->status, kSealedStatus);
  EXPECT_EQ(sealed_key_id(*stored.response), "k1");
  EXPECT_EQ(stored.response->body.find(kMarker), std::string::npos);
  EXPECT_EQ(stored.request_hash, fingerprint(request.view(), policy.fingerprint));  // in the clear

  auto got = BlockingStore(*store).get(RecordId{"acme", request.key});
  ASSERT_TRUE(got && *got);
  EXPECT_EQ((*got)->response->body, kMarker);
}

TEST_F(EncryptedStoreTest, PlaintextRecordsFromBeforeStillReplay) {
  TestRequest request;
  Engine plain_engine(*raw, clock);  // the same storage before encryption was turned on
  auto first = plain_engine.begin_and_wait(policy, request.view(), "acme");
  ASSERT_EQ(first.verdict, Verdict::execute);
  ASSERT_TRUE(plain_engine.finish_and_wait(*first.ticket, StoredResponse{200, {}, "plain"}));
  auto replay = engine.begin_and_wait(policy, request.view(), "acme");
  ASSERT_EQ(replay.verdict, Verdict::replay);
  EXPECT_EQ(replay.replay->body, "plain");
}

TEST_F(EncryptedStoreTest, AnAlteredRecordIsNeitherReplayedNorExecuted) {
  TestRequest request;
  StoredResponse altered = sealed_for(request, std::string(kMarker));
  altered.body[altered.body.size() / 2] ^= 0x20;
  put_raw(request, altered);
  const Record r = raw_record(request.key);

  for (int i = 0; i < 3; ++i) {
    auto d = engine.begin_and_wait(policy, request.view(), "acme");
    EXPECT_EQ(d.verdict, Verdict::record_unreadable);
    EXPECT_FALSE(d.ticket);
    EXPECT_FALSE(d.replay);
    ASSERT_TRUE(d.store_error);
    EXPECT_EQ(d.store_error->code, StoreErrc::undecryptable);
    EXPECT_FALSE(d.store_error->retryable());
    EXPECT_NE(d.store_error->message.find("key id \"k1\""), std::string::npos) << d.store_error->message;
    auto problem = problem_for(d);
    ASSERT_TRUE(problem);
    EXPECT_EQ(problem->status, 500);
    EXPECT_EQ(problem->code, "idempotency_record_unreadable");
    EXPECT_FALSE(problem->retry_after_seconds);
  }
  // The claim changed nothing: the record is the altered one, still completed, same token.
  const Record after = raw_record(request.key);
  EXPECT_EQ(after.state, RecordState::completed);
  EXPECT_EQ(after.fencing_token, r.fencing_token);
  EXPECT_EQ(*after.response, altered);
  auto got = BlockingStore(*store).get(RecordId{"acme", request.key});
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, StoreErrc::undecryptable);
}

TEST_F(EncryptedStoreTest, ACiphertextMovedToAnotherRecordIsRefused) {
  TestRequest a, b;
  b.key = "key-fedcba9876543210";
  const StoredResponse sealed_a = sealed_for(a, "a's response");
  put_raw(a, sealed_a);
  put_raw(b, sealed_a);
  EXPECT_EQ(engine.begin_and_wait(policy, b.view(), "acme").verdict, Verdict::record_unreadable);
  auto replay = engine.begin_and_wait(policy, a.view(), "acme");
  ASSERT_EQ(replay.verdict, Verdict::replay);
  EXPECT_EQ(replay.replay->body, "a's response");
}

TEST_F(EncryptedStoreTest, AMissingKeyIsRefusedNamingItsId) {
  TestRequest request;
  ASSERT_EQ(execute_then_retry(request, "sealed with k1").verdict, Verdict::replay);
  store->set_keys(test_key_ring(test_key_line("k2", 2)));
  auto d = engine.begin_and_wait(policy, request.view(), "acme");
  EXPECT_EQ(d.verdict, Verdict::record_unreadable);
  ASSERT_TRUE(d.store_error);
  EXPECT_NE(d.store_error->message.find("\"k1\", which the key file does not list"), std::string::npos)
      << d.store_error->message;
}

TEST_F(EncryptedStoreTest, AMismatchStaysAMismatchEvenWhenTheResponseIsUnreadable) {
  TestRequest request;
  ASSERT_EQ(execute_then_retry(request, "sealed with k1").verdict, Verdict::replay);
  store->set_keys(test_key_ring(test_key_line("k2", 2)));
  TestRequest other = request;
  other.body = R"({"amount":999})";
  EXPECT_EQ(engine.begin_and_wait(policy, other.view(), "acme").verdict, Verdict::mismatch);
}

TEST_F(EncryptedStoreTest, SwappedKeysApplyToTheNextCalls) {
  TestRequest old_request;
  ASSERT_EQ(execute_then_retry(old_request, "old").verdict, Verdict::replay);
  store->set_keys(test_key_ring(test_key_line("k1", 1) + test_key_line("k2", 2)));
  TestRequest new_request;
  new_request.key = "key-after-rotation-01";
  ASSERT_EQ(execute_then_retry(new_request, "new").verdict, Verdict::replay);
  EXPECT_EQ(sealed_key_id(*raw_record(old_request.key).response), "k1");
  EXPECT_EQ(sealed_key_id(*raw_record(new_request.key).response), "k2");
  EXPECT_EQ(engine.begin_and_wait(policy, old_request.view(), "acme").replay->body, "old");
  EXPECT_EQ(*store->keys()->sealing_key_id(), "k2");
}

TEST_F(EncryptedStoreTest, OperatorsResolveSealedAndListOpened) {
  ClaimRequest claim;
  claim.id = RecordId{"acme", "key-stuck-0000000001"};
  claim.request_hash = "h";
  claim.token = new_fencing_token();
  claim.now = clock.now();
  claim.lease_expires = claim.now + 1min;
  claim.expires = claim.now + 1h;
  ASSERT_EQ(BlockingStore(*store).claim(claim)->status, ClaimStatus::claimed);
  auto resolved = wait_for<AdminStatus>([&](auto cb) {
    store->resolve(claim.id, StoredResponse{200, {}, std::string(kMarker)}, clock.now(), clock.now() + 1h,
                   std::move(cb));
  });
  ASSERT_EQ(resolved.value_or(AdminStatus::not_found), AdminStatus::done);
  EXPECT_EQ(raw_record(claim.id.key).response->body.find(kMarker), std::string::npos);
  auto listed = wait_for<std::vector<Record>>([&](auto cb) { store->list(ListQuery{}, std::move(cb)); });
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().response->body, kMarker);

  // One unreadable record fails the list rather than hiding or faking its response.
  store->set_keys(test_key_ring(test_key_line("k9", 9)));
  auto refused = wait_for<std::vector<Record>>([&](auto cb) { store->list(ListQuery{}, std::move(cb)); });
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, StoreErrc::undecryptable);
}

TEST_F(EncryptedStoreTest, ConsumerResultsAreSealedAndAnUnreadableOneNeverRunsTheHandler) {
  ConsumerOptions options;
  options.name = "billing";
  options.clock = &clock;
  auto consumer = Consumer::create(*store, options);
  ASSERT_TRUE(consumer) << consumer.error();
  int runs = 0;
  auto handler = [&runs]() -> std::expected<std::string, std::string> {
    ++runs;
    return std::string(kMarker);
  };
  auto first = consumer->process_once("msg-1", "payload", handler);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, MessageStatus::processed);
  const Record stored = *BlockingStore(*raw).get(RecordId{consumer->tenant(), "msg-1"}).value();
  EXPECT_EQ(stored.response->body.find(kMarker), std::string::npos);
  auto again = consumer->process_once("msg-1", "payload", handler);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, MessageStatus::duplicate);
  EXPECT_EQ(again->result, kMarker);

  store->set_keys(test_key_ring(test_key_line("k2", 2)));
  auto refused = consumer->process_once("msg-1", "payload", handler);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, StoreErrc::undecryptable);
  EXPECT_EQ(runs, 1);
}

TEST_F(EncryptedStoreTest, WithoutASealingKeyNewRecordsArePlaintextAndOldOnesStillOpen) {
  TestRequest sealed_request;
  ASSERT_EQ(execute_then_retry(sealed_request, "sealed").verdict, Verdict::replay);
  store->set_keys(test_key_ring(test_key_line("k1", 1, "decrypt-only")));
  TestRequest plain_request;
  plain_request.key = "key-plain-000000001";
  ASSERT_EQ(execute_then_retry(plain_request, "plain").verdict, Verdict::replay);
  EXPECT_FALSE(is_sealed(*raw_record(plain_request.key).response));
  EXPECT_EQ(engine.begin_and_wait(policy, sealed_request.view(), "acme").replay->body, "sealed");
}

}  // namespace
}  // namespace idem::testing
