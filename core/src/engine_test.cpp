#include "idem/engine.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "idem/memory_store.hpp"
#include "idem/testing/manual_clock.hpp"

namespace idem {
namespace {

using testing::ManualClock;

// A request as the engine sees it, owning its buffers.
struct TestRequest {
  std::string method = "POST";
  std::string path = "/v1/payments";
  std::string query;
  std::vector<std::pair<std::string, std::string>> header_storage;
  std::string body = R"({"amount":100,"currency":"USD"})";
  std::vector<HeaderView> headers;

  TestRequest& header(std::string name, std::string value) {
    header_storage.emplace_back(std::move(name), std::move(value));
    return *this;
  }
  TestRequest& key(std::string k) { return header("Idempotency-Key", std::move(k)); }
  RequestView view() {
    headers.clear();
    for (const auto& [n, v] : header_storage) headers.push_back({n, v});
    headers.push_back({"Content-Type", "application/json"});
    return RequestView{method, path, query, headers, body};
  }
};

const std::string kKey = "key-0123456789abcdef";

class EngineTest : public ::testing::Test {
 protected:
  Decision begin(TestRequest request, const std::string& tenant = "t") {
    return engine.begin_and_wait(policy, request.view(), tenant);
  }
  Decision begin_with_key(const std::string& key = kKey) { return begin(TestRequest{}.key(key)); }
  FinishStatus finish(const Decision& d, StoredResponse response) {
    EXPECT_EQ(d.verdict, Verdict::execute);
    auto r = engine.finish_and_wait(*d.ticket, std::move(response));
    EXPECT_TRUE(r.has_value());
    return r.value_or(FinishStatus::fenced_out);
  }

  MemoryStore store;
  ManualClock clock;
  Engine engine{store, clock};
  Policy policy;
};

TEST_F(EngineTest, SafeMethodsPassThroughEvenWithAKey) {
  policy.key_required = true;
  for (const char* method : {"GET", "HEAD", "OPTIONS", "TRACE"}) {
    TestRequest r;
    r.method = method;
    r.key(kKey);
    EXPECT_EQ(begin(r).verdict, Verdict::pass_through) << method;
  }
  EXPECT_FALSE(BlockingStore(store).get(RecordId{"t", kKey}).value());
}

TEST_F(EngineTest, NoKeyOnAnOptionalRoutePassesThrough) {
  EXPECT_EQ(begin(TestRequest{}).verdict, Verdict::pass_through);
}

TEST_F(EngineTest, NoKeyOnARequiredRouteIsMissing) {
  policy.key_required = true;
  auto d = begin(TestRequest{});
  EXPECT_EQ(d.verdict, Verdict::key_missing);
  EXPECT_FALSE(d.detail.empty());
}

TEST_F(EngineTest, BadKeyIsInvalidAndNeverReachesTheStore) {
  auto d = begin_with_key("short");
  EXPECT_EQ(d.verdict, Verdict::key_invalid);
  EXPECT_FALSE(BlockingStore(store).get(RecordId{"t", "short"}).value());
  TestRequest twice;
  twice.key(kKey).key(kKey);
  EXPECT_EQ(begin(twice).verdict, Verdict::key_invalid);
}

TEST_F(EngineTest, KeyHeaderNameIsConfigurable) {
  policy.key_header = "X-Request-Key";
  policy.key_required = true;
  EXPECT_EQ(begin_with_key().verdict, Verdict::key_missing);
  EXPECT_EQ(begin(TestRequest{}.header("x-request-key", kKey)).verdict, Verdict::execute);
}

TEST_F(EngineTest, ExecuteThenReplayTheStoredResponse) {
  auto first = begin_with_key();
  ASSERT_EQ(first.verdict, Verdict::execute);
  EXPECT_EQ(first.ticket->kind, ClaimKind::fresh);
  StoredResponse response{201, {{"Content-Type", "application/json"}}, R"({"id":"pay_1"})"};
  EXPECT_EQ(finish(first, response), FinishStatus::stored);
  auto second = begin_with_key();
  ASSERT_EQ(second.verdict, Verdict::replay);
  EXPECT_EQ(*second.replay, response);
}

TEST_F(EngineTest, ReorderedJsonIsTheSameRequest) {
  auto first = begin_with_key();
  finish(first, StoredResponse{200, {}, "ok"});
  TestRequest reordered;
  reordered.key(kKey);
  reordered.body = "{ \"currency\" : \"USD\", \"amount\" : 100 }";
  EXPECT_EQ(begin(reordered).verdict, Verdict::replay);
}

TEST_F(EngineTest, ADifferentRequestUnderTheSameKeyIsAMismatchThatDoesNotPoison) {
  auto first = begin_with_key();
  TestRequest other;
  other.key(kKey);
  other.body = R"({"amount":999,"currency":"USD"})";
  EXPECT_EQ(begin(other).verdict, Verdict::mismatch);  // while in progress
  finish(first, StoredResponse{200, {}, "ok"});
  EXPECT_EQ(begin(other).verdict, Verdict::mismatch);  // once completed
  EXPECT_EQ(begin_with_key().verdict, Verdict::replay);
  TestRequest other_path;
  other_path.key(kKey);
  other_path.path = "/v1/refunds";
  EXPECT_EQ(begin(other_path).verdict, Verdict::mismatch);
}

TEST_F(EngineTest, ConcurrentRetryIsInUseWithRetryAfter) {
  policy.retry_after = std::chrono::seconds{7};
  ASSERT_EQ(begin_with_key().verdict, Verdict::execute);
  auto d = begin_with_key();
  EXPECT_EQ(d.verdict, Verdict::in_use);
  EXPECT_EQ(d.retry_after, std::chrono::seconds{7});
}

TEST_F(EngineTest, ExpiredLeaseIsTakenOverAndTheOldHolderIsFencedOut) {
  policy.lease = 5s;
  auto crashed = begin_with_key();
  clock.advance(5s);
  auto takeover = begin_with_key();
  ASSERT_EQ(takeover.verdict, Verdict::execute);
  EXPECT_EQ(takeover.ticket->kind, ClaimKind::after_lease_expiry);
  EXPECT_EQ(finish(crashed, StoredResponse{200, {}, "late"}), FinishStatus::fenced_out);
  EXPECT_EQ(finish(takeover, StoredResponse{200, {}, "winner"}), FinishStatus::stored);
  EXPECT_EQ(begin_with_key().replay->body, "winner");
}

TEST_F(EngineTest, ExpiredLeaseUnderUnknownPolicyIsOutcomeUnknown) {
  policy.lease = 5s;
  policy.on_lease_expiry = LeaseExpiry::unknown;
  begin_with_key();
  clock.advance(6s);
  EXPECT_EQ(begin_with_key().verdict, Verdict::outcome_unknown);
  EXPECT_EQ(begin_with_key().verdict, Verdict::outcome_unknown);
}

TEST(ClassifyStatus, FollowsSpecStorageRules) {
  for (int s : {200, 201, 202, 204, 301, 302, 304, 400, 401, 402, 403, 404, 410, 422}) {
    EXPECT_EQ(classify_status(s, false), Disposition::store) << s;
  }
  for (int s : {408, 409, 425, 429}) {
    EXPECT_EQ(classify_status(s, false), Disposition::release) << s;
    EXPECT_EQ(classify_status(s, true), Disposition::release) << s;
  }
  for (int s : {500, 502, 503, 504}) {
    EXPECT_EQ(classify_status(s, false), Disposition::fail) << s;
    EXPECT_EQ(classify_status(s, true), Disposition::store) << s;
  }
}

TEST_F(EngineTest, ServerErrorsExecuteAgain) {
  auto first = begin_with_key();
  EXPECT_EQ(finish(first, StoredResponse{503, {}, "down"}), FinishStatus::failed_retryable);
  auto retry = begin_with_key();
  ASSERT_EQ(retry.verdict, Verdict::execute);
  EXPECT_EQ(retry.ticket->kind, ClaimKind::after_failure);
}

TEST_F(EngineTest, ServerErrorsAreReplayedWhenTheRouteStoresThem) {
  policy.store_server_errors = true;
  EXPECT_EQ(finish(begin_with_key(), StoredResponse{500, {}, "boom"}), FinishStatus::stored);
  EXPECT_EQ(begin_with_key().replay->status, 500);
}

TEST_F(EngineTest, RetryableClientStatusesReleaseTheKey) {
  for (int status : {408, 409, 425, 429}) {
    const std::string key = "key-release-" + std::to_string(status) + "-000000";
    auto d = begin_with_key(key);
    EXPECT_EQ(finish(d, StoredResponse{status, {}, ""}), FinishStatus::released);
    auto again = begin_with_key(key);
    ASSERT_EQ(again.verdict, Verdict::execute);
    EXPECT_EQ(again.ticket->kind, ClaimKind::fresh);
  }
}

TEST_F(EngineTest, ClientErrorsAreReplayed) {
  finish(begin_with_key(), StoredResponse{402, {}, "insufficient funds"});
  EXPECT_EQ(begin_with_key().replay->status, 402);
}

TEST_F(EngineTest, ReleaseLetsTheNextRequestExecute) {
  auto d = begin_with_key();
  EXPECT_EQ(engine.release_and_wait(*d.ticket).value(), FinishStatus::released);
  EXPECT_EQ(begin_with_key().verdict, Verdict::execute);
}

TEST_F(EngineTest, RetentionExpiryExecutesAgain) {
  policy.retention = 10s;
  finish(begin_with_key(), StoredResponse{200, {}, "ok"});
  clock.advance(9s);
  EXPECT_EQ(begin_with_key().verdict, Verdict::replay);
  clock.advance(1s);
  EXPECT_EQ(begin_with_key().verdict, Verdict::execute);
}

TEST_F(EngineTest, TenantsAreIsolated) {
  finish(begin(TestRequest{}.key(kKey), "alice"), StoredResponse{200, {}, "alice's"});
  auto bob = begin(TestRequest{}.key(kKey), "bob");
  ASSERT_EQ(bob.verdict, Verdict::execute);
  finish(bob, StoredResponse{200, {}, "bob's"});
  EXPECT_EQ(begin(TestRequest{}.key(kKey), "alice").replay->body, "alice's");
  EXPECT_EQ(begin(TestRequest{}.key(kKey), "bob").replay->body, "bob's");
}

TEST_F(EngineTest, ManyThreadsRetryingOneKeyExecuteOnce) {
  std::atomic<int> executions{0}, unexpected{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 64; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        auto d = begin_with_key();
        if (d.verdict == Verdict::execute) {
          ++executions;
          engine.finish_and_wait(*d.ticket, StoredResponse{201, {}, "once"});
        } else if (d.verdict != Verdict::in_use && d.verdict != Verdict::replay) {
          ++unexpected;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(executions.load(), 1);
  EXPECT_EQ(unexpected.load(), 0);
}

// ---- attempt numbers, on_lease_expiry = "ask", release and unclaim ----

TEST_F(EngineTest, TicketsCarryTheAttemptNumber) {
  policy.lease = std::chrono::seconds{10};
  auto first = begin_with_key();
  ASSERT_EQ(first.verdict, Verdict::execute);
  EXPECT_EQ(first.ticket->attempt, 1u);
  clock.advance(std::chrono::seconds{10});
  auto second = begin_with_key();
  ASSERT_EQ(second.verdict, Verdict::execute);
  EXPECT_EQ(second.ticket->kind, ClaimKind::after_lease_expiry);
  EXPECT_EQ(second.ticket->attempt, 2u);
  ASSERT_EQ(finish(second, StoredResponse{500, {}, ""}), FinishStatus::failed_retryable);
  auto third = begin_with_key();
  EXPECT_EQ(third.ticket->kind, ClaimKind::after_failure);
  EXPECT_EQ(third.ticket->attempt, 3u);
}

TEST_F(EngineTest, AskTakesOverAnExpiredLeaseAndStoresTheLookup) {
  policy.lease = std::chrono::seconds{10};
  policy.on_lease_expiry = LeaseExpiry::ask;
  policy.lookup = "GET /v1/payments/by-idempotency-key/{key}";
  policy.retry_after = std::chrono::seconds{3};
  auto first = begin_with_key();
  ASSERT_EQ(first.verdict, Verdict::execute);  // a fresh key has nothing to ask about
  EXPECT_EQ(begin_with_key().verdict, Verdict::in_use);
  clock.advance(std::chrono::seconds{10});
  auto asker = begin_with_key();
  ASSERT_EQ(asker.verdict, Verdict::ask);
  ASSERT_TRUE(asker.ticket);
  EXPECT_EQ(asker.ticket->attempt, 2u);
  EXPECT_EQ(asker.retry_after, std::chrono::seconds{3});
  // The asker holds the key: a concurrent retry waits, the vanished holder is fenced out.
  EXPECT_EQ(begin_with_key().verdict, Verdict::in_use);
  EXPECT_EQ(engine.finish_and_wait(*first.ticket, StoredResponse{201, {}, "late"}).value(), FinishStatus::fenced_out);
  auto stored = BlockingStore(store).get(RecordId{"t", kKey});
  ASSERT_TRUE(stored && *stored);
  EXPECT_EQ((*stored)->lookup, policy.lookup);
  // The lookup found it: its response is the outcome, replayed from now on.
  const StoredResponse found{201, {{"Content-Type", "application/json"}}, R"({"id":"pay_1"})"};
  EXPECT_EQ(engine.resolve_and_wait(*asker.ticket, found).value(), FinishStatus::stored);
  auto replay = begin_with_key();
  ASSERT_EQ(replay.verdict, Verdict::replay);
  EXPECT_EQ(*replay.replay, found);
}

TEST_F(EngineTest, AnUnansweredLookupLeavesTheKeyToBeAskedAgain) {
  policy.lease = std::chrono::seconds{10};
  policy.on_lease_expiry = LeaseExpiry::ask;
  policy.lookup = "GET /lookup/{key}";
  begin_with_key();
  clock.advance(std::chrono::seconds{10});
  auto asker = begin_with_key();
  ASSERT_EQ(asker.verdict, Verdict::ask);
  EXPECT_EQ(engine.unclaim_and_wait(*asker.ticket).value(), FinishStatus::abandoned);
  auto again = begin_with_key();  // at once: the abandoned lease has ended
  ASSERT_EQ(again.verdict, Verdict::ask);
  EXPECT_EQ(again.ticket->attempt, 3u);
  EXPECT_EQ(engine.unclaim_and_wait(*asker.ticket).value(), FinishStatus::fenced_out);
  // The lookup said "never happened": the asker executes with its ticket, as the takeover.
  EXPECT_EQ(engine.finish_and_wait(*again.ticket, StoredResponse{201, {}, "done"}).value(), FinishStatus::stored);
}

TEST_F(EngineTest, ReleaseDeletesAFreshClaimButKeepsATakeoversCount) {
  policy.lease = std::chrono::seconds{10};
  auto fresh = begin_with_key();
  EXPECT_EQ(engine.release_and_wait(*fresh.ticket).value(), FinishStatus::released);
  EXPECT_FALSE(BlockingStore(store).get(RecordId{"t", kKey}).value());

  auto first = begin_with_key();
  clock.advance(std::chrono::seconds{10});
  auto takeover = begin_with_key();
  ASSERT_EQ(takeover.ticket->attempt, 2u);
  // 429 from the upstream: the next retry executes, as attempt 3, never as a new attempt 1.
  EXPECT_EQ(finish(takeover, StoredResponse{429, {}, ""}), FinishStatus::failed_retryable);
  auto next = begin_with_key();
  ASSERT_EQ(next.verdict, Verdict::execute);
  EXPECT_EQ(next.ticket->attempt, 3u);
  EXPECT_EQ(engine.release_and_wait(*next.ticket).value(), FinishStatus::failed_retryable);
  (void)first;
}

TEST_F(EngineTest, UnclaimReturnsTheRecordToWhatTheClaimFound) {
  policy.lease = std::chrono::seconds{10};
  auto fresh = begin_with_key();
  EXPECT_EQ(engine.unclaim_and_wait(*fresh.ticket).value(), FinishStatus::released);
  EXPECT_FALSE(BlockingStore(store).get(RecordId{"t", kKey}).value());

  auto failing = begin_with_key();
  ASSERT_EQ(finish(failing, StoredResponse{503, {}, ""}), FinishStatus::failed_retryable);
  auto retry = begin_with_key();
  ASSERT_EQ(retry.ticket->kind, ClaimKind::after_failure);
  EXPECT_EQ(engine.unclaim_and_wait(*retry.ticket).value(), FinishStatus::failed_retryable);
  EXPECT_EQ(BlockingStore(store).get(RecordId{"t", kKey}).value()->state, RecordState::failed_retryable);

  policy.on_lease_expiry = LeaseExpiry::unknown;
  auto held = begin(TestRequest{}.key("key-unclaim-expired-1"));
  clock.advance(std::chrono::seconds{10});
  policy.on_lease_expiry = LeaseExpiry::reexecute;
  auto late = begin(TestRequest{}.key("key-unclaim-expired-1"));
  ASSERT_EQ(late.ticket->kind, ClaimKind::after_lease_expiry);
  EXPECT_EQ(engine.unclaim_and_wait(*late.ticket).value(), FinishStatus::abandoned);
  policy.on_lease_expiry = LeaseExpiry::unknown;
  EXPECT_EQ(begin(TestRequest{}.key("key-unclaim-expired-1")).verdict, Verdict::outcome_unknown);
  (void)held;
}

// A store that is down: every call fails as a network error would.
class DownStore final : public Store {
 public:
  template <class T>
  static void down(Callback<T>& done) {
    done(std::unexpected(StoreError{StoreErrc::unavailable, "connection refused"}));
  }
  void claim(ClaimRequest, Callback<ClaimResult> done) override { down(done); }
  void complete(CompleteRequest, Callback<FenceStatus> done) override { down(done); }
  void fail(FailRequest, Callback<FenceStatus> done) override { down(done); }
  void release(Fence, Callback<FenceStatus> done) override { down(done); }
  void abandon(AbandonRequest, Callback<FenceStatus> done) override { down(done); }
  void get(RecordId, Callback<std::optional<Record>> done) override { down(done); }
  void purge_expired(TimePoint, std::size_t, Callback<std::size_t> done) override { down(done); }
  void ping(Callback<Done> done) override { down(done); }
};

TEST(EngineWithoutStore, FailsClosedWithRetryAfter) {
  DownStore down;
  Engine engine(down);
  Policy policy;
  policy.retry_after = std::chrono::seconds{2};
  TestRequest r;
  r.key(kKey);
  auto d = engine.begin_and_wait(policy, r.view(), "t");
  EXPECT_EQ(d.verdict, Verdict::store_unavailable);
  EXPECT_EQ(d.retry_after, std::chrono::seconds{2});
  ASSERT_TRUE(d.store_error);
  EXPECT_EQ(d.store_error->code, StoreErrc::unavailable);
}

TEST(FencingToken, IsNonzeroAndVaries) {
  const auto a = new_fencing_token(), b = new_fencing_token();
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace idem
