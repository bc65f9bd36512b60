// The Store conformance suite: every rule of SPEC §4 and §6 that a backend must keep, run
// unchanged against each backend (see store_conformance.hpp for how a backend instantiates it).
#include "idem/testing/store_conformance.hpp"

#include <atomic>
#include <barrier>
#include <cstdio>
#include <future>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "idem/store_admin.hpp"
#include "idem/testing/manual_clock.hpp"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;

constexpr Millis kLease = 60s;

// "prefix-000042": fixed-width names so keys sort and read alike on every backend.
std::string numbered(const char* prefix, int i) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%08d", prefix, i);
  return buf;
}
constexpr Millis kRetention = 24h;

class Harness {
 public:
  explicit Harness(Store& store) : store_(store), blocking_(store) {}

  ClaimRequest request(const std::string& tenant, const std::string& key, const std::string& hash,
                       bool take_over = true) {
    ClaimRequest r;
    r.id = RecordId{tenant, key};
    r.request_hash = hash;
    r.token = next_token_++;
    r.now = clock.now();
    r.lease_expires = r.now + kLease;
    r.expires = r.now + kRetention;
    r.take_over_expired_lease = take_over;
    return r;
  }

  ClaimResult claim(const std::string& tenant, const std::string& key, const std::string& hash,
                    bool take_over = true, std::string lookup = {}) {
    ClaimRequest r = request(tenant, key, hash, take_over);
    r.lookup = std::move(lookup);
    auto result = blocking_.claim(std::move(r));
    EXPECT_TRUE(result.has_value()) << (result ? "" : result.error().message);
    return result.value_or(ClaimResult{});
  }

  FenceStatus abandon(const Fence& fence) {
    auto result = blocking_.abandon(AbandonRequest{fence, clock.now()});
    EXPECT_TRUE(result.has_value()) << (result ? "" : result.error().message);
    return result.value_or(FenceStatus::lost);
  }

  FenceStatus complete(const Fence& fence, StoredResponse response) {
    auto result = blocking_.complete(CompleteRequest{fence, std::move(response), clock.now(), clock.now() + kRetention});
    EXPECT_TRUE(result.has_value()) << (result ? "" : result.error().message);
    return result.value_or(FenceStatus::lost);
  }

  FenceStatus fail(const Fence& fence) {
    auto result = blocking_.fail(FailRequest{fence, clock.now(), clock.now() + kRetention});
    EXPECT_TRUE(result.has_value()) << (result ? "" : result.error().message);
    return result.value_or(FenceStatus::lost);
  }

  FenceStatus release(const Fence& fence) {
    auto result = blocking_.release(fence);
    EXPECT_TRUE(result.has_value()) << (result ? "" : result.error().message);
    return result.value_or(FenceStatus::lost);
  }

  std::optional<Record> get(const std::string& tenant, const std::string& key) {
    auto result = blocking_.get(RecordId{tenant, key});
    EXPECT_TRUE(result.has_value()) << (result ? "" : result.error().message);
    return result.value_or(std::nullopt);
  }

  // The batch calls, whose results are checked item by item by the tests.
  BatchResults<ClaimResult> claim_many(std::vector<ClaimRequest> requests) {
    return blocking_.claim_many(std::move(requests));
  }
  BatchResults<FenceStatus> complete_many(const std::vector<Fence>& fences, const std::string& body = "batch") {
    std::vector<CompleteRequest> requests;
    for (const Fence& f : fences) {
      requests.push_back(CompleteRequest{f, StoredResponse{200, {{"X-Body", body}}, body}, clock.now(),
                                         clock.now() + kRetention});
    }
    return blocking_.complete_many(std::move(requests));
  }
  BatchResults<FenceStatus> fail_many(const std::vector<Fence>& fences) {
    std::vector<FailRequest> requests;
    for (const Fence& f : fences) requests.push_back(FailRequest{f, clock.now(), clock.now() + kRetention});
    return blocking_.fail_many(std::move(requests));
  }
  BatchResults<FenceStatus> release_many(std::vector<Fence> fences) { return blocking_.release_many(std::move(fences)); }

  static Fence fence_of(const ClaimResult& c) { return Fence{RecordId{c.record.tenant, c.record.key}, c.record.fencing_token}; }

  ManualClock clock;

 private:
  Store& store_;
  BlockingStore blocking_;
  std::atomic<std::uint64_t> next_token_{1000};
};

StoredResponse sample_response(std::string body = "{\"id\":\"pay_1\"}") {
  return StoredResponse{201, {{"Content-Type", "application/json"}, {"Location", "/v1/payments/pay_1"}}, std::move(body)};
}

}  // namespace

// The suite's tests are declared on StoreConformance so backends instantiate that name.
#define STORE_TEST(name) TEST_P(StoreConformance, name)

namespace {
struct Fixture {
  std::unique_ptr<Store> store;
  std::unique_ptr<Harness> h;
  explicit Fixture(const StoreFactory& f) : store(f.make()), h(std::make_unique<Harness>(*store)) {}
};
}  // namespace

STORE_TEST(PingAnswers) {
  Fixture f(GetParam());
  BlockingStore b(*f.store);
  EXPECT_TRUE(b.ping().has_value());
}

STORE_TEST(AbsentRecordReadsAsNothing) {
  Fixture f(GetParam());
  EXPECT_FALSE(f.h->get("t", "absent-key-0000000").has_value());
}

STORE_TEST(FreshClaimHoldsTheKey) {
  Fixture f(GetParam());
  auto c = f.h->claim("t", "key-fresh-000000", "h1");
  EXPECT_EQ(c.status, ClaimStatus::claimed);
  EXPECT_EQ(c.kind, ClaimKind::fresh);
  auto r = f.h->get("t", "key-fresh-000000");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state, RecordState::in_progress);
  EXPECT_EQ(r->request_hash, "h1");
  EXPECT_EQ(r->fencing_token, c.record.fencing_token);
  EXPECT_EQ(r->lease_expires, f.h->clock.now() + kLease);
  EXPECT_EQ(r->created, f.h->clock.now());
  EXPECT_FALSE(r->response.has_value());
}

STORE_TEST(SecondClaimWhileLeaseValidIsInProgress) {
  Fixture f(GetParam());
  auto first = f.h->claim("t", "key-inprogress-01", "h1");
  ASSERT_EQ(first.status, ClaimStatus::claimed);
  f.h->clock.advance(kLease - 1ms);
  auto second = f.h->claim("t", "key-inprogress-01", "h1");
  EXPECT_EQ(second.status, ClaimStatus::in_progress);
  EXPECT_EQ(second.record.lease_expires, first.record.lease_expires);
  EXPECT_EQ(f.h->get("t", "key-inprogress-01")->fencing_token, first.record.fencing_token);
}

STORE_TEST(CompletedRecordReplaysExactBytes) {
  Fixture f(GetParam());
  auto c = f.h->claim("t", "key-complete-0001", "h1");
  std::string body("binary\0body\xff\xfe\n\r", 16);
  StoredResponse response{201,
                          {{"Content-Type", "application/json"},
                           {"Set-Cookie", "a=1"},
                           {"Set-Cookie", "b=2"},
                           {"X-Odd", "v\xc3\xa9 \t;,\"q\""}},
                          body};
  ASSERT_EQ(f.h->complete(Harness::fence_of(c), response), FenceStatus::ok);
  f.h->clock.advance(1h);
  auto replay = f.h->claim("t", "key-complete-0001", "h1");
  ASSERT_EQ(replay.status, ClaimStatus::completed);
  ASSERT_TRUE(replay.record.response);
  EXPECT_EQ(*replay.record.response, response);
  auto r = f.h->get("t", "key-complete-0001");
  ASSERT_TRUE(r && r->completed);
  EXPECT_EQ(r->state, RecordState::completed);
  EXPECT_EQ(*r->completed, f.h->clock.now() - 1h);
}

STORE_TEST(EmptyBodyAndNoHeadersRoundTrip) {
  Fixture f(GetParam());
  auto c = f.h->claim("t", "key-empty-body-01", "h1");
  ASSERT_EQ(f.h->complete(Harness::fence_of(c), StoredResponse{204, {}, ""}), FenceStatus::ok);
  auto replay = f.h->claim("t", "key-empty-body-01", "h1");
  ASSERT_EQ(replay.status, ClaimStatus::completed);
  EXPECT_EQ(*replay.record.response, (StoredResponse{204, {}, ""}));
}

STORE_TEST(ExpiredLeaseIsTakenOverAndFencesTheOldHolder) {
  Fixture f(GetParam());
  auto old_holder = f.h->claim("t", "key-takeover-001", "h1");
  f.h->clock.advance(kLease);
  auto new_holder = f.h->claim("t", "key-takeover-001", "h1");
  ASSERT_EQ(new_holder.status, ClaimStatus::claimed);
  EXPECT_EQ(new_holder.kind, ClaimKind::after_lease_expiry);
  EXPECT_NE(new_holder.record.fencing_token, old_holder.record.fencing_token);
  EXPECT_EQ(new_holder.record.created, old_holder.record.created);
  // The crashed holder wakes up: every write it attempts is refused.
  EXPECT_EQ(f.h->complete(Harness::fence_of(old_holder), sample_response("stale")), FenceStatus::lost);
  EXPECT_EQ(f.h->fail(Harness::fence_of(old_holder)), FenceStatus::lost);
  EXPECT_EQ(f.h->release(Harness::fence_of(old_holder)), FenceStatus::lost);
  EXPECT_EQ(f.h->get("t", "key-takeover-001")->state, RecordState::in_progress);
  EXPECT_EQ(f.h->complete(Harness::fence_of(new_holder), sample_response("fresh")), FenceStatus::ok);
  EXPECT_EQ(f.h->claim("t", "key-takeover-001", "h1").record.response->body, "fresh");
}

STORE_TEST(ExpiredLeaseWithUnknownPolicyIsReportedNotTaken) {
  Fixture f(GetParam());
  auto holder = f.h->claim("t", "key-unknown-0001", "h1");
  f.h->clock.advance(kLease + 1s);
  auto c = f.h->claim("t", "key-unknown-0001", "h1", /*take_over=*/false);
  EXPECT_EQ(c.status, ClaimStatus::outcome_unknown);
  auto r = f.h->get("t", "key-unknown-0001");
  EXPECT_EQ(r->fencing_token, holder.record.fencing_token);
  EXPECT_EQ(r->state, RecordState::in_progress);
  // The original holder may still finish: its token is intact.
  EXPECT_EQ(f.h->complete(Harness::fence_of(holder), sample_response()), FenceStatus::ok);
}

STORE_TEST(FailedRecordExecutesAgainWithANewToken) {
  Fixture f(GetParam());
  auto first = f.h->claim("t", "key-failed-00001", "h1");
  ASSERT_EQ(f.h->fail(Harness::fence_of(first)), FenceStatus::ok);
  EXPECT_EQ(f.h->get("t", "key-failed-00001")->state, RecordState::failed_retryable);
  auto retry = f.h->claim("t", "key-failed-00001", "h1");
  ASSERT_EQ(retry.status, ClaimStatus::claimed);
  EXPECT_EQ(retry.kind, ClaimKind::after_failure);
  EXPECT_NE(retry.record.fencing_token, first.record.fencing_token);
  EXPECT_EQ(f.h->complete(Harness::fence_of(first), sample_response()), FenceStatus::lost);
  EXPECT_EQ(f.h->complete(Harness::fence_of(retry), sample_response()), FenceStatus::ok);
}

STORE_TEST(ReleaseForgetsTheKey) {
  Fixture f(GetParam());
  auto c = f.h->claim("t", "key-release-0001", "h1");
  ASSERT_EQ(f.h->release(Harness::fence_of(c)), FenceStatus::ok);
  EXPECT_FALSE(f.h->get("t", "key-release-0001").has_value());
  auto again = f.h->claim("t", "key-release-0001", "h2");  // even another request may use it now
  EXPECT_EQ(again.status, ClaimStatus::claimed);
  EXPECT_EQ(again.kind, ClaimKind::fresh);
}

// ---- attempt numbers (SPEC §12): what the upstream is told, so it can refuse a stale holder ----

STORE_TEST(AttemptCountsEveryTakeoverOfAnExpiredLease) {
  Fixture f(GetParam());
  auto first = f.h->claim("t", "key-attempt-lease", "h1");
  ASSERT_EQ(first.status, ClaimStatus::claimed);
  EXPECT_EQ(first.record.attempt, 1u);
  EXPECT_EQ(f.h->get("t", "key-attempt-lease")->attempt, 1u);
  for (std::uint32_t expected = 2; expected <= 4; ++expected) {
    f.h->clock.advance(kLease);
    auto next = f.h->claim("t", "key-attempt-lease", "h1");
    ASSERT_EQ(next.status, ClaimStatus::claimed);
    EXPECT_EQ(next.kind, ClaimKind::after_lease_expiry);
    EXPECT_EQ(next.record.attempt, expected);
    EXPECT_EQ(f.h->get("t", "key-attempt-lease")->attempt, expected);
  }
  // Answers that change nothing carry the stored number; completing keeps it.
  auto busy = f.h->claim("t", "key-attempt-lease", "h1");
  EXPECT_EQ(busy.status, ClaimStatus::in_progress);
  EXPECT_EQ(busy.record.attempt, 4u);
  EXPECT_EQ(f.h->claim("t", "key-attempt-lease", "other").record.attempt, 4u);  // mismatch
  const auto holder = f.h->get("t", "key-attempt-lease");
  ASSERT_TRUE(holder);
  ASSERT_EQ(f.h->complete(Fence{RecordId{"t", "key-attempt-lease"}, holder->fencing_token}, sample_response()),
            FenceStatus::ok);
  EXPECT_EQ(f.h->get("t", "key-attempt-lease")->attempt, 4u);
  auto replay = f.h->claim("t", "key-attempt-lease", "h1");
  EXPECT_EQ(replay.status, ClaimStatus::completed);
  EXPECT_EQ(replay.record.attempt, 4u);
}

STORE_TEST(AttemptCountsClaimsAfterFailure) {
  Fixture f(GetParam());
  auto first = f.h->claim("t", "key-attempt-fail", "h1");
  ASSERT_EQ(f.h->fail(Harness::fence_of(first)), FenceStatus::ok);
  EXPECT_EQ(f.h->get("t", "key-attempt-fail")->attempt, 1u);  // fail keeps it
  auto second = f.h->claim("t", "key-attempt-fail", "h1");
  ASSERT_EQ(second.status, ClaimStatus::claimed);
  EXPECT_EQ(second.kind, ClaimKind::after_failure);
  EXPECT_EQ(second.record.attempt, 2u);
  ASSERT_EQ(f.h->fail(Harness::fence_of(second)), FenceStatus::ok);
  f.h->clock.advance(kLease);  // a lease that ran out meanwhile does not matter to a failed record
  auto third = f.h->claim("t", "key-attempt-fail", "h1");
  EXPECT_EQ(third.kind, ClaimKind::after_failure);
  EXPECT_EQ(third.record.attempt, 3u);
  // An operator's release (StoreAdmin::mark_retryable) keeps the number too; the next claim counts on.
  StoreAdmin* admin = dynamic_cast<StoreAdmin*>(f.store.get());
  ASSERT_NE(admin, nullptr);
  auto marked = wait_for<AdminStatus>(
      [&](auto cb) { admin->mark_retryable(RecordId{"t", "key-attempt-fail"}, f.h->clock.now(), std::move(cb)); });
  ASSERT_TRUE(marked && *marked == AdminStatus::done);
  EXPECT_EQ(f.h->get("t", "key-attempt-fail")->attempt, 3u);
  EXPECT_EQ(f.h->claim("t", "key-attempt-fail", "h1").record.attempt, 4u);
}

// A key that starts over is a new operation: a released record (deleted) and one past its
// retention both give attempt 1 again. (The engine releases only fresh claims: a takeover's
// record is marked failed_retryable instead, so that its count never goes back.)
STORE_TEST(AKeyThatStartsOverStartsAtAttemptOne) {
  Fixture f(GetParam());
  auto first = f.h->claim("t", "key-attempt-over", "h1");
  f.h->clock.advance(kLease);
  auto second = f.h->claim("t", "key-attempt-over", "h1");
  ASSERT_EQ(second.record.attempt, 2u);
  ASSERT_EQ(f.h->release(Harness::fence_of(second)), FenceStatus::ok);
  auto again = f.h->claim("t", "key-attempt-over", "h1");
  EXPECT_EQ(again.kind, ClaimKind::fresh);
  EXPECT_EQ(again.record.attempt, 1u);
  ASSERT_EQ(f.h->complete(Harness::fence_of(again), sample_response()), FenceStatus::ok);
  f.h->clock.advance(kRetention);
  auto later = f.h->claim("t", "key-attempt-over", "h1");
  EXPECT_EQ(later.kind, ClaimKind::fresh);
  EXPECT_EQ(later.record.attempt, 1u);
  EXPECT_EQ(f.h->get("t", "key-attempt-over")->attempt, 1u);
}

// ---- abandon: a holder that learnt nothing gives the key back ----

STORE_TEST(AbandonEndsTheLeaseAndLeavesTheOutcomeUnknown) {
  Fixture f(GetParam());
  auto holder = f.h->claim("t", "key-abandon-0001", "h1");
  f.h->clock.advance(1s);
  ASSERT_EQ(f.h->abandon(Harness::fence_of(holder)), FenceStatus::ok);
  auto r = f.h->get("t", "key-abandon-0001");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state, RecordState::in_progress);
  EXPECT_EQ(r->fencing_token, holder.record.fencing_token);
  EXPECT_EQ(r->lease_expires, f.h->clock.now());
  EXPECT_EQ(r->attempt, 1u);
  EXPECT_EQ(r->created, holder.record.created);
  EXPECT_EQ(r->expires, holder.record.expires);
  // At once the lease counts as run out: "unknown" reports it, a takeover counts on.
  EXPECT_EQ(f.h->claim("t", "key-abandon-0001", "h1", /*take_over=*/false).status, ClaimStatus::outcome_unknown);
  auto next = f.h->claim("t", "key-abandon-0001", "h1");
  ASSERT_EQ(next.status, ClaimStatus::claimed);
  EXPECT_EQ(next.kind, ClaimKind::after_lease_expiry);
  EXPECT_EQ(next.record.attempt, 2u);
  // The old holder is fenced out of abandon like any other write.
  EXPECT_EQ(f.h->abandon(Harness::fence_of(holder)), FenceStatus::lost);
  EXPECT_EQ(f.h->get("t", "key-abandon-0001")->lease_expires, next.record.lease_expires);
}

STORE_TEST(AbandonNeedsTheHolderOfAnInProgressRecord) {
  Fixture f(GetParam());
  auto c = f.h->claim("t", "key-abandon-0002", "h1");
  Fence forged = Harness::fence_of(c);
  forged.token += 1;
  EXPECT_EQ(f.h->abandon(forged), FenceStatus::lost);
  EXPECT_EQ(f.h->abandon(Fence{RecordId{"t", "key-abandon-none"}, 77}), FenceStatus::lost);
  ASSERT_EQ(f.h->complete(Harness::fence_of(c), sample_response()), FenceStatus::ok);
  EXPECT_EQ(f.h->abandon(Harness::fence_of(c)), FenceStatus::lost);
  EXPECT_EQ(f.h->claim("t", "key-abandon-0002", "h1").status, ClaimStatus::completed);
  auto failed = f.h->claim("t", "key-abandon-0003", "h1");
  ASSERT_EQ(f.h->fail(Harness::fence_of(failed)), FenceStatus::ok);
  EXPECT_EQ(f.h->abandon(Harness::fence_of(failed)), FenceStatus::lost);
  EXPECT_EQ(f.h->get("t", "key-abandon-0003")->state, RecordState::failed_retryable);
}

// ---- the lookup a route with on_lease_expiry = "ask" stores, for idemctl reconcile ----

STORE_TEST(ClaimStoresTheRoutesLookup) {
  Fixture f(GetParam());
  const std::string lookup = "GET /v1/payments/by-idempotency-key/{key}?tenant={tenant}";
  auto c = f.h->claim("t", "key-lookup-00001", "h1", true, lookup);
  EXPECT_EQ(c.record.lookup, lookup);
  EXPECT_EQ(f.h->get("t", "key-lookup-00001")->lookup, lookup);
  ASSERT_EQ(f.h->abandon(Harness::fence_of(c)), FenceStatus::ok);
  EXPECT_EQ(f.h->get("t", "key-lookup-00001")->lookup, lookup);
  auto next = f.h->claim("t", "key-lookup-00001", "h1", true, lookup);
  ASSERT_EQ(f.h->complete(Harness::fence_of(next), sample_response()), FenceStatus::ok);
  auto done = f.h->claim("t", "key-lookup-00001", "h1");
  EXPECT_EQ(done.record.lookup, lookup);
  EXPECT_EQ(done.record.attempt, 2u);
  // Another claim writes its own (here: none).
  auto other = f.h->claim("t", "key-lookup-00002", "h1", true, lookup);
  f.h->clock.advance(kLease);
  auto plain = f.h->claim("t", "key-lookup-00002", "h1");
  EXPECT_EQ(plain.record.lookup, "");
  EXPECT_EQ(f.h->get("t", "key-lookup-00002")->lookup, "");
  (void)other;
}

STORE_TEST(WrongTokenChangesNothing) {
  Fixture f(GetParam());
  auto c = f.h->claim("t", "key-wrongtoken-01", "h1");
  Fence forged = Harness::fence_of(c);
  forged.token += 1;
  EXPECT_EQ(f.h->complete(forged, sample_response()), FenceStatus::lost);
  EXPECT_EQ(f.h->fail(forged), FenceStatus::lost);
  EXPECT_EQ(f.h->release(forged), FenceStatus::lost);
  auto r = f.h->get("t", "key-wrongtoken-01");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state, RecordState::in_progress);
  EXPECT_EQ(r->fencing_token, c.record.fencing_token);
}

STORE_TEST(CompletedRecordCannotBeWrittenAgain) {
  Fixture f(GetParam());
  auto c = f.h->claim("t", "key-double-done-1", "h1");
  ASSERT_EQ(f.h->complete(Harness::fence_of(c), sample_response("first")), FenceStatus::ok);
  EXPECT_EQ(f.h->complete(Harness::fence_of(c), sample_response("second")), FenceStatus::lost);
  EXPECT_EQ(f.h->fail(Harness::fence_of(c)), FenceStatus::lost);
  EXPECT_EQ(f.h->release(Harness::fence_of(c)), FenceStatus::lost);
  EXPECT_EQ(f.h->get("t", "key-double-done-1")->response->body, "first");
}

STORE_TEST(MismatchNeverPoisonsTheKeyInAnyState) {
  Fixture f(GetParam());
  // in_progress
  auto a = f.h->claim("t", "key-mismatch-in-p", "h1");
  EXPECT_EQ(f.h->claim("t", "key-mismatch-in-p", "other").status, ClaimStatus::mismatch);
  EXPECT_EQ(f.h->get("t", "key-mismatch-in-p")->fencing_token, a.record.fencing_token);
  EXPECT_EQ(f.h->complete(Harness::fence_of(a), sample_response()), FenceStatus::ok);
  // completed
  auto m = f.h->claim("t", "key-mismatch-in-p", "other");
  EXPECT_EQ(m.status, ClaimStatus::mismatch);
  auto replay = f.h->claim("t", "key-mismatch-in-p", "h1");
  EXPECT_EQ(replay.status, ClaimStatus::completed);
  EXPECT_EQ(*replay.record.response, sample_response());
  // failed_retryable
  auto b = f.h->claim("t", "key-mismatch-fail", "h1");
  ASSERT_EQ(f.h->fail(Harness::fence_of(b)), FenceStatus::ok);
  EXPECT_EQ(f.h->claim("t", "key-mismatch-fail", "other").status, ClaimStatus::mismatch);
  EXPECT_EQ(f.h->get("t", "key-mismatch-fail")->state, RecordState::failed_retryable);
  EXPECT_EQ(f.h->claim("t", "key-mismatch-fail", "h1").status, ClaimStatus::claimed);
  // in_progress with an expired lease: still a mismatch, no takeover by the other request
  auto c = f.h->claim("t", "key-mismatch-lease", "h1");
  f.h->clock.advance(kLease * 2);
  EXPECT_EQ(f.h->claim("t", "key-mismatch-lease", "other").status, ClaimStatus::mismatch);
  EXPECT_EQ(f.h->get("t", "key-mismatch-lease")->fencing_token, c.record.fencing_token);
}

STORE_TEST(RetentionExpiryForgetsTheRecord) {
  Fixture f(GetParam());
  auto c = f.h->claim("t", "key-retention-001", "h1");
  ASSERT_EQ(f.h->complete(Harness::fence_of(c), sample_response()), FenceStatus::ok);
  f.h->clock.advance(kRetention - 1ms);
  EXPECT_EQ(f.h->claim("t", "key-retention-001", "h1").status, ClaimStatus::completed);
  f.h->clock.advance(1ms);
  // Past retention the key is new again, even for another request.
  auto again = f.h->claim("t", "key-retention-001", "h2");
  EXPECT_EQ(again.status, ClaimStatus::claimed);
  EXPECT_EQ(again.kind, ClaimKind::fresh);
  EXPECT_EQ(again.record.created, f.h->clock.now());
}

STORE_TEST(PurgeDeletesOnlyExpiredRecordsInBatches) {
  Fixture f(GetParam());
  for (int i = 0; i < 25; ++i) {
    auto c = f.h->claim("t", numbered("key-purge-old", i), "h");
    ASSERT_EQ(f.h->complete(Harness::fence_of(c), sample_response()), FenceStatus::ok);
  }
  f.h->clock.advance(kRetention);
  for (int i = 0; i < 5; ++i) f.h->claim("t", numbered("key-purge-new", i), "h");
  BlockingStore b(*f.store);
  auto first = b.purge_expired(f.h->clock.now(), 10);
  ASSERT_TRUE(first);
  EXPECT_EQ(*first, 10u);
  std::size_t total = *first;
  while (true) {
    auto n = b.purge_expired(f.h->clock.now(), 10);
    ASSERT_TRUE(n);
    if (*n == 0) break;
    total += *n;
  }
  EXPECT_EQ(total, 25u);
  for (int i = 0; i < 25; ++i) EXPECT_FALSE(f.h->get("t", numbered("key-purge-old", i)));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(f.h->get("t", numbered("key-purge-new", i)));
}

// An expiry that moved (completion later than the claim, a key released and claimed again)
// counts from its latest setting: purging at the earlier time keeps the record.
STORE_TEST(PurgeFollowsTheLatestExpiry) {
  Fixture f(GetParam());
  auto moved = f.h->claim("t", "key-expiry-moved", "h");
  auto again = f.h->claim("t", "key-expiry-again", "h");
  ASSERT_EQ(f.h->release(Harness::fence_of(again)), FenceStatus::ok);
  f.h->clock.advance(1h);
  ASSERT_EQ(f.h->complete(Harness::fence_of(moved), sample_response()), FenceStatus::ok);
  EXPECT_EQ(f.h->claim("t", "key-expiry-again", "h").status, ClaimStatus::claimed);

  BlockingStore b(*f.store);
  f.h->clock.advance(kRetention - 1h);
  auto early = b.purge_expired(f.h->clock.now(), 100);
  ASSERT_TRUE(early);
  EXPECT_EQ(*early, 0u);
  EXPECT_TRUE(f.h->get("t", "key-expiry-moved"));
  EXPECT_TRUE(f.h->get("t", "key-expiry-again"));

  f.h->clock.advance(1h);
  std::size_t total = 0;
  for (auto n = b.purge_expired(f.h->clock.now(), 100); n && *n > 0; n = b.purge_expired(f.h->clock.now(), 100)) {
    total += *n;
  }
  EXPECT_EQ(total, 2u);
  EXPECT_FALSE(f.h->get("t", "key-expiry-moved"));
  EXPECT_FALSE(f.h->get("t", "key-expiry-again"));
}

STORE_TEST(TenantsNeverSeeEachOthersRecords) {
  Fixture f(GetParam());
  auto a = f.h->claim("tenant-a", "shared-key-000001", "ha");
  auto b = f.h->claim("tenant-b", "shared-key-000001", "hb");
  EXPECT_EQ(a.status, ClaimStatus::claimed);
  EXPECT_EQ(b.status, ClaimStatus::claimed);  // no mismatch: another tenant's key is another key
  ASSERT_EQ(f.h->complete(Harness::fence_of(a), sample_response("for a")), FenceStatus::ok);
  EXPECT_EQ(f.h->get("tenant-b", "shared-key-000001")->state, RecordState::in_progress);
  ASSERT_EQ(f.h->complete(Harness::fence_of(b), sample_response("for b")), FenceStatus::ok);
  EXPECT_EQ(f.h->claim("tenant-a", "shared-key-000001", "ha").record.response->body, "for a");
  EXPECT_EQ(f.h->claim("tenant-b", "shared-key-000001", "hb").record.response->body, "for b");
  EXPECT_EQ(f.h->claim("tenant-c", "shared-key-000001", "ha").status, ClaimStatus::claimed);
  // A tenant that is a prefix of another, and keys that concatenate alike, stay apart.
  EXPECT_EQ(f.h->claim("ab", "c-key-0000000000", "x").status, ClaimStatus::claimed);
  EXPECT_EQ(f.h->claim("a", "bc-key-0000000000", "y").status, ClaimStatus::claimed);
}

// Runs `threads` workers that each send the same request `rounds` times, like clients retrying,
// executing only when they win the claim. Returns how many executions happened.
int hammer_one_key(std::vector<Store*> stores, int threads, int rounds, Harness& h) {
  std::atomic<int> executions{0};
  std::atomic<int> errors{0};
  std::barrier start(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      BlockingStore store(*stores[t % stores.size()]);
      start.arrive_and_wait();
      for (int round = 0; round < rounds; ++round) {
        auto c = store.claim(h.request("t", "one-hammered-key-0001", "same-request"));
        if (!c) {
          ++errors;
          continue;
        }
        if (c->status == ClaimStatus::claimed) {
          ++executions;
          std::this_thread::yield();
          auto done = store.complete(CompleteRequest{Harness::fence_of(*c), sample_response(), h.clock.now(),
                                                     h.clock.now() + kRetention});
          if (!done || *done != FenceStatus::ok) ++errors;
        } else if (c->status != ClaimStatus::in_progress && c->status != ClaimStatus::completed) {
          ++errors;
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(errors.load(), 0);
  return executions.load();
}

STORE_TEST(SixtyFourThreadsOnOneKeyExecuteOnce) {
  Fixture f(GetParam());
  EXPECT_EQ(hammer_one_key({f.store.get()}, 64, 20, *f.h), 1);
  auto r = f.h->get("t", "one-hammered-key-0001");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state, RecordState::completed);
}

STORE_TEST(TenThousandKeysFromEightThreadsExecuteTenThousandTimes) {
  Fixture f(GetParam());
  constexpr int kThreads = 8, kKeys = 10'000;
  std::atomic<int> next{0}, executions{0}, errors{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&] {
      BlockingStore store(*f.store);
      for (int i = next++; i < kKeys; i = next++) {
        auto c = store.claim(f.h->request("t", numbered("distinct-key", i), "h"));
        if (!c || c->status != ClaimStatus::claimed) {
          ++errors;
          continue;
        }
        ++executions;
        auto done = store.complete(CompleteRequest{Harness::fence_of(*c), sample_response(), f.h->clock.now(),
                                                   f.h->clock.now() + kRetention});
        if (!done || *done != FenceStatus::ok) ++errors;
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(executions.load(), kKeys);
  for (int i = 0; i < kKeys; i += 997) {
    auto r = f.h->get("t", numbered("distinct-key", i));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->state, RecordState::completed);
  }
}

STORE_TEST(ConcurrentTakeoverHasOneWinner) {
  Fixture f(GetParam());
  f.h->claim("t", "one-hammered-key-0001", "same-request");  // a holder that then crashes
  f.h->clock.advance(kLease);
  EXPECT_EQ(hammer_one_key({f.store.get()}, 32, 5, *f.h), 1);
  // One takeover, one attempt more: the losers counted nothing.
  auto r = f.h->get("t", "one-hammered-key-0001");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->attempt, 2u);
}

STORE_TEST(ReplicasSharingStorageExecuteOnce) {
  Fixture f(GetParam());
  // A backend whose storage cannot be shared between instances (memory) plays every replica
  // with its one instance.
  const auto& share = GetParam().share;
  std::unique_ptr<Store> second = share ? share() : nullptr, third = share ? share() : nullptr;
  Store* replica2 = second ? second.get() : f.store.get();
  Store* replica3 = third ? third.get() : f.store.get();
  EXPECT_EQ(hammer_one_key({f.store.get(), replica2, replica3}, 48, 10, *f.h), 1);
  // What one replica wrote, the others read.
  Harness h2(*replica2);
  auto c = f.h->claim("t", "key-cross-replica", "h1");
  ASSERT_EQ(f.h->complete(Harness::fence_of(c), sample_response("from replica 1")), FenceStatus::ok);
  auto seen = h2.claim("t", "key-cross-replica", "h1");
  ASSERT_EQ(seen.status, ClaimStatus::completed);
  EXPECT_EQ(seen.record.response->body, "from replica 1");
}

// ---- operator actions (StoreAdmin) ----

// Runs one StoreAdmin call and waits for it.
template <class T, class Call>
T admin_wait(Call&& call) {
  auto result = wait_for<T>(std::forward<Call>(call));
  EXPECT_TRUE(result.has_value()) << (result ? "" : result.error().message);
  return result.value_or(T{});
}

StoreAdmin& admin_of(Store& store) {
  auto* admin = dynamic_cast<StoreAdmin*>(&store);
  if (!admin) throw std::logic_error("every store must implement StoreAdmin");
  return *admin;
}

STORE_TEST(AdminListsRecordsByStateInKeyOrderWithPaging) {
  Fixture f(GetParam());
  StoreAdmin& admin = admin_of(*f.store);
  for (int i = 0; i < 7; ++i) {
    auto c = f.h->claim("t", numbered("key-list", i), "h");
    if (i % 2 == 0) f.h->complete(Harness::fence_of(c), sample_response());
  }
  // Field by field: brace-initialising some of ListQuery's fields warns of the others.
  ListQuery completed_only;
  completed_only.state = RecordState::completed;
  auto completed = admin_wait<std::vector<Record>>([&](auto cb) { admin.list(completed_only, std::move(cb)); });
  ASSERT_EQ(completed.size(), 4u);
  EXPECT_EQ(completed[0].key, numbered("key-list", 0));
  EXPECT_EQ(completed[3].key, numbered("key-list", 6));
  ASSERT_TRUE(completed[0].response);
  ListQuery first_page;
  first_page.limit = 3;
  auto page1 = admin_wait<std::vector<Record>>([&](auto cb) { admin.list(first_page, std::move(cb)); });
  ASSERT_EQ(page1.size(), 3u);
  ListQuery next_page;
  next_page.after = RecordId{page1.back().tenant, page1.back().key};
  auto page2 = admin_wait<std::vector<Record>>([&](auto cb) { admin.list(next_page, std::move(cb)); });
  ASSERT_EQ(page2.size(), 4u);
  EXPECT_EQ(page2.front().key, numbered("key-list", 3));
  auto counts = admin_wait<StateCounts>([&](auto cb) { admin.count(f.h->clock.now(), std::move(cb)); });
  EXPECT_EQ(counts.completed, 4u);
  EXPECT_EQ(counts.in_progress, 3u);
  EXPECT_EQ(counts.failed_retryable, 0u);
  f.h->clock.advance(kRetention);
  counts = admin_wait<StateCounts>([&](auto cb) { admin.count(f.h->clock.now(), std::move(cb)); });
  EXPECT_EQ(counts.expired, 7u);
  EXPECT_EQ(counts.completed + counts.in_progress, 0u);
}

STORE_TEST(AdminListsOneTenantsRecords) {
  Fixture f(GetParam());
  StoreAdmin& admin = admin_of(*f.store);
  for (const char* tenant : {"", "acme", "acme-2", "consumer billing", "zeta"}) {
    for (int i = 0; i < 3; ++i) f.h->claim(tenant, numbered("key-tenant", i), "h");
  }
  auto of = [&](const std::string& tenant, std::optional<RecordId> after, std::size_t limit) {
    ListQuery q;
    q.tenant = tenant;
    q.after = std::move(after);
    q.limit = limit;
    return admin_wait<std::vector<Record>>([&](auto cb) { admin.list(q, std::move(cb)); });
  };
  for (const char* tenant : {"", "acme", "consumer billing"}) {
    auto records = of(tenant, std::nullopt, 100);
    ASSERT_EQ(records.size(), 3u) << tenant;
    for (const Record& r : records) EXPECT_EQ(r.tenant, tenant);
  }
  // Paging within the tenant.
  auto page1 = of("acme", std::nullopt, 2);
  ASSERT_EQ(page1.size(), 2u);
  auto page2 = of("acme", RecordId{page1.back().tenant, page1.back().key}, 2);
  ASSERT_EQ(page2.size(), 1u);
  EXPECT_EQ(page2[0].tenant, "acme");
  EXPECT_EQ(page2[0].key, numbered("key-tenant", 2));
  EXPECT_TRUE(of("nobody", std::nullopt, 100).empty());
}

STORE_TEST(AdminMarkRetryableUnsticksAKeyAndFencesItsHolder) {
  Fixture f(GetParam());
  StoreAdmin& admin = admin_of(*f.store);
  auto stuck = f.h->claim("t", "key-stuck-000001", "h1");
  auto mark = [&](const std::string& key) {
    return admin_wait<AdminStatus>([&](auto cb) { admin.mark_retryable(RecordId{"t", key}, f.h->clock.now(), std::move(cb)); });
  };
  EXPECT_EQ(mark("key-stuck-000001"), AdminStatus::done);
  EXPECT_EQ(f.h->get("t", "key-stuck-000001")->state, RecordState::failed_retryable);
  EXPECT_EQ(f.h->complete(Harness::fence_of(stuck), sample_response()), FenceStatus::lost);
  auto retry = f.h->claim("t", "key-stuck-000001", "h1");
  EXPECT_EQ(retry.status, ClaimStatus::claimed);
  EXPECT_EQ(retry.kind, ClaimKind::after_failure);
  EXPECT_EQ(f.h->claim("t", "key-stuck-000001", "other").status, ClaimStatus::mismatch);
  f.h->complete(Harness::fence_of(retry), sample_response());
  EXPECT_EQ(mark("key-stuck-000001"), AdminStatus::wrong_state);
  EXPECT_EQ(mark("key-absent-000001"), AdminStatus::not_found);
}

STORE_TEST(AdminResolveRecordsAKnownOutcome) {
  Fixture f(GetParam());
  StoreAdmin& admin = admin_of(*f.store);
  auto stuck = f.h->claim("t", "key-resolve-0001", "h1");
  auto resolve = [&](const std::string& key, StoredResponse r) {
    return admin_wait<AdminStatus>([&](auto cb) {
      admin.resolve(RecordId{"t", key}, std::move(r), f.h->clock.now(), f.h->clock.now() + kRetention, std::move(cb));
    });
  };
  StoredResponse known{200, {{"Content-Type", "application/json"}}, "{\"resolved\":true}"};
  EXPECT_EQ(resolve("key-resolve-0001", known), AdminStatus::done);
  EXPECT_EQ(f.h->complete(Harness::fence_of(stuck), sample_response()), FenceStatus::lost);
  auto replay = f.h->claim("t", "key-resolve-0001", "h1");
  ASSERT_EQ(replay.status, ClaimStatus::completed);
  EXPECT_EQ(*replay.record.response, known);
  EXPECT_EQ(resolve("key-resolve-0001", known), AdminStatus::wrong_state);
  EXPECT_EQ(resolve("key-absent-000002", known), AdminStatus::not_found);
}


// ---- batch calls: each item as its single call would decide it, in order ----

namespace {

// Prints an item's answer in failure messages.
template <class T>
std::string describe(const StoreResult<T>& r) {
  return r ? "ok" : "error: " + r.error().message;
}

// The status of item `i`, or a failure naming the item.
ClaimStatus status_of(const BatchResults<ClaimResult>& results, std::size_t i) {
  EXPECT_TRUE(results.at(i).has_value()) << "item " << i << ": " << describe(results.at(i));
  return results.at(i) ? results[i]->status : ClaimStatus::claimed;
}
FenceStatus fence_status_of(const BatchResults<FenceStatus>& results, std::size_t i) {
  EXPECT_TRUE(results.at(i).has_value()) << "item " << i << ": " << describe(results.at(i));
  return results.at(i).value_or(FenceStatus::lost);
}

}  // namespace

STORE_TEST(BatchClaimDecidesEachItemByItsRecord) {
  Fixture f(GetParam());
  Harness& h = *f.h;
  // One key in each state a claim can meet.
  auto done = h.claim("t", "batch-mixed-done", "h1");
  ASSERT_EQ(h.complete(Harness::fence_of(done), sample_response("done")), FenceStatus::ok);
  auto failed = h.claim("t", "batch-mixed-failed", "h1");
  ASSERT_EQ(h.fail(Harness::fence_of(failed)), FenceStatus::ok);
  auto expired = h.claim("t", "batch-mixed-expired", "h1");
  auto unknown = h.claim("t", "batch-mixed-unknown", "h1");
  h.clock.advance(kLease);
  auto busy = h.claim("t", "batch-mixed-busy", "h1");

  auto results = h.claim_many({h.request("t", "batch-mixed-new", "h1"), h.request("t", "batch-mixed-done", "h1"),
                               h.request("t", "batch-mixed-done", "other"), h.request("t", "batch-mixed-busy", "h1"),
                               h.request("t", "batch-mixed-failed", "h1"), h.request("t", "batch-mixed-expired", "h1"),
                               h.request("t", "batch-mixed-unknown", "h1", /*take_over=*/false)});
  ASSERT_EQ(results.size(), 7u);
  EXPECT_EQ(status_of(results, 0), ClaimStatus::claimed);
  EXPECT_EQ(results[0]->kind, ClaimKind::fresh);
  EXPECT_EQ(results[0]->record.attempt, 1u);
  EXPECT_EQ(status_of(results, 1), ClaimStatus::completed);
  ASSERT_TRUE(results[1]->record.response);
  EXPECT_EQ(*results[1]->record.response, sample_response("done"));
  EXPECT_EQ(status_of(results, 2), ClaimStatus::mismatch);
  EXPECT_EQ(status_of(results, 3), ClaimStatus::in_progress);
  EXPECT_EQ(results[3]->record.fencing_token, busy.record.fencing_token);
  EXPECT_EQ(status_of(results, 4), ClaimStatus::claimed);
  EXPECT_EQ(results[4]->kind, ClaimKind::after_failure);
  EXPECT_EQ(results[4]->record.attempt, 2u);
  EXPECT_EQ(status_of(results, 5), ClaimStatus::claimed);
  EXPECT_EQ(results[5]->kind, ClaimKind::after_lease_expiry);
  EXPECT_EQ(results[5]->record.created, expired.record.created);
  EXPECT_EQ(status_of(results, 6), ClaimStatus::outcome_unknown);
  EXPECT_EQ(results[6]->record.fencing_token, unknown.record.fencing_token);

  // What the batch wrote is what single calls read.
  EXPECT_EQ(h.get("t", "batch-mixed-new")->fencing_token, results[0]->record.fencing_token);
  EXPECT_EQ(h.get("t", "batch-mixed-failed")->fencing_token, results[4]->record.fencing_token);
  EXPECT_EQ(h.get("t", "batch-mixed-expired")->fencing_token, results[5]->record.fencing_token);
  EXPECT_EQ(h.get("t", "batch-mixed-unknown")->fencing_token, unknown.record.fencing_token);
  EXPECT_EQ(h.get("t", "batch-mixed-done")->state, RecordState::completed);
}

STORE_TEST(BatchDuplicatesResolveAsOneAfterTheOther) {
  Fixture f(GetParam());
  Harness& h = *f.h;
  auto stale = h.claim("t", "batch-dup-expired", "h1");
  h.clock.advance(kLease);
  auto claims = h.claim_many({h.request("t", "batch-dup-new", "h1"), h.request("t", "batch-dup-new", "h1"),
                              h.request("t", "batch-dup-new", "other"), h.request("t", "batch-dup-expired", "h1"),
                              h.request("t", "batch-dup-expired", "h1", /*take_over=*/false),
                              h.request("t", "batch-dup-expired", "h1")});
  ASSERT_EQ(claims.size(), 6u);
  // The first claim of a new key wins; the same request again finds it in progress, another one
  // a mismatch, both holding the first one's record.
  EXPECT_EQ(status_of(claims, 0), ClaimStatus::claimed);
  EXPECT_EQ(status_of(claims, 1), ClaimStatus::in_progress);
  EXPECT_EQ(claims[1]->record.fencing_token, claims[0]->record.fencing_token);
  EXPECT_EQ(status_of(claims, 2), ClaimStatus::mismatch);
  EXPECT_EQ(claims[2]->record.fencing_token, claims[0]->record.fencing_token);
  // The first takes the expired lease over; the next ones meet its fresh lease, not the old one.
  EXPECT_EQ(status_of(claims, 3), ClaimStatus::claimed);
  EXPECT_EQ(claims[3]->kind, ClaimKind::after_lease_expiry);
  EXPECT_NE(claims[3]->record.fencing_token, stale.record.fencing_token);
  EXPECT_EQ(status_of(claims, 4), ClaimStatus::in_progress);
  EXPECT_EQ(status_of(claims, 5), ClaimStatus::in_progress);
  EXPECT_EQ(claims[5]->record.fencing_token, claims[3]->record.fencing_token);
  EXPECT_EQ(h.get("t", "batch-dup-expired")->attempt, 2u);

  // A second write with the same fence finds the record no longer held.
  const Fence fresh = Harness::fence_of(*claims[0]);
  auto completes = h.complete_many({fresh, fresh});
  EXPECT_EQ(fence_status_of(completes, 0), FenceStatus::ok);
  EXPECT_EQ(fence_status_of(completes, 1), FenceStatus::lost);
  const Fence taken = Harness::fence_of(*claims[3]);
  auto fails = h.fail_many({taken, taken});
  EXPECT_EQ(fence_status_of(fails, 0), FenceStatus::ok);
  EXPECT_EQ(fence_status_of(fails, 1), FenceStatus::lost);
  EXPECT_EQ(h.get("t", "batch-dup-expired")->state, RecordState::failed_retryable);
  auto again = h.claim_many({h.request("t", "batch-dup-expired", "h1"), h.request("t", "batch-dup-expired", "h1")});
  EXPECT_EQ(status_of(again, 0), ClaimStatus::claimed);
  EXPECT_EQ(again[0]->kind, ClaimKind::after_failure);
  EXPECT_EQ(status_of(again, 1), ClaimStatus::in_progress);
  const Fence retry = Harness::fence_of(*again[0]);
  auto releases = h.release_many({retry, retry});
  EXPECT_EQ(fence_status_of(releases, 0), FenceStatus::ok);
  EXPECT_EQ(fence_status_of(releases, 1), FenceStatus::lost);
  EXPECT_FALSE(h.get("t", "batch-dup-expired"));
}

STORE_TEST(BatchFencesEachItemOnItsOwn) {
  Fixture f(GetParam());
  Harness& h = *f.h;
  std::vector<Fence> held;
  for (int i = 0; i < 9; ++i) held.push_back(Harness::fence_of(h.claim("t", numbered("batch-fence", i), "h1")));
  // Every third fence is stale: only those items are lost, the others apply.
  std::vector<Fence> fences = held;
  for (std::size_t i = 1; i < fences.size(); i += 3) fences[i].token += 1;
  std::vector<Fence> to_complete(fences.begin(), fences.begin() + 3);
  std::vector<Fence> to_fail(fences.begin() + 3, fences.begin() + 6);
  std::vector<Fence> to_release(fences.begin() + 6, fences.end());
  auto completes = h.complete_many(to_complete, "fenced");
  auto fails = h.fail_many(to_fail);
  auto releases = h.release_many(to_release);
  for (std::size_t i = 0; i < 3; ++i) {
    const FenceStatus expected = i == 1 ? FenceStatus::lost : FenceStatus::ok;
    EXPECT_EQ(fence_status_of(completes, i), expected) << i;
    EXPECT_EQ(fence_status_of(fails, i), expected) << i;
    EXPECT_EQ(fence_status_of(releases, i), expected) << i;
  }
  for (int i = 0; i < 9; ++i) {
    auto r = h.get("t", numbered("batch-fence", i));
    if (i % 3 == 1) {  // the stale fence changed nothing
      ASSERT_TRUE(r) << i;
      EXPECT_EQ(r->state, RecordState::in_progress) << i;
      EXPECT_EQ(r->fencing_token, held[static_cast<std::size_t>(i)].token) << i;
    } else if (i < 3) {
      ASSERT_TRUE(r && r->response) << i;
      EXPECT_EQ(r->state, RecordState::completed);
      EXPECT_EQ(r->response->body, "fenced");
    } else if (i < 6) {
      ASSERT_TRUE(r) << i;
      EXPECT_EQ(r->state, RecordState::failed_retryable);
    } else {
      EXPECT_FALSE(r) << i;
    }
  }
  // An absent key is lost too, and does not disturb its neighbours.
  auto mixed = h.complete_many({Fence{RecordId{"t", "batch-fence-absent"}, 5}, held[1]});
  EXPECT_EQ(fence_status_of(mixed, 0), FenceStatus::lost);
  EXPECT_EQ(fence_status_of(mixed, 1), FenceStatus::ok);
}

STORE_TEST(EmptyBatchesAnswerWithNoItems) {
  Fixture f(GetParam());
  BlockingStore b(*f.store);
  EXPECT_TRUE(b.claim_many({}).empty());
  EXPECT_TRUE(b.complete_many({}).empty());
  EXPECT_TRUE(b.fail_many({}).empty());
  EXPECT_TRUE(b.release_many({}).empty());
}

STORE_TEST(ConcurrentBatchesOnTheSameKeysExecuteEachOnce) {
  Fixture f(GetParam());
  constexpr int kThreads = 6, kKeys = 48;
  std::vector<std::atomic<int>> wins(kKeys);
  std::atomic<int> errors{0};
  std::barrier start(kThreads);
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      // Each thread claims every key in an order of its own: batches lock many rows at once.
      std::vector<ClaimRequest> requests;
      for (int i = 0; i < kKeys; ++i) {
        requests.push_back(f.h->request("t", numbered("batch-race", (i * (t + 1) * 7) % kKeys), "h"));
      }
      BlockingStore store(*f.store);
      start.arrive_and_wait();
      auto results = store.claim_many(std::move(requests));
      std::vector<Fence> won;
      for (const auto& r : results) {
        if (!r) {
          ++errors;
        } else if (r->status == ClaimStatus::claimed) {
          const int key = std::stoi(r->record.key.substr(r->record.key.rfind('-') + 1));
          ++wins[static_cast<std::size_t>(key)];
          won.push_back(Harness::fence_of(*r));
        } else if (r->status != ClaimStatus::in_progress && r->status != ClaimStatus::completed) {
          ++errors;
        }
      }
      std::vector<CompleteRequest> completions;
      for (const Fence& fence : won) {
        completions.push_back(CompleteRequest{fence, sample_response(), f.h->clock.now(), f.h->clock.now() + kRetention});
      }
      for (const auto& r : store.complete_many(std::move(completions))) {
        if (!r || *r != FenceStatus::ok) ++errors;
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(errors.load(), 0);
  for (int i = 0; i < kKeys; ++i) EXPECT_EQ(wins[static_cast<std::size_t>(i)].load(), 1) << i;
}

namespace {

// Whether two records agree in everything but the tenant (the differential test gives each
// store a tenant of its own).
void expect_same_record(const Record& a, const Record& b, const std::string& where) {
  EXPECT_EQ(a.key, b.key) << where;
  EXPECT_EQ(a.state, b.state) << where;
  EXPECT_EQ(a.request_hash, b.request_hash) << where;
  EXPECT_EQ(a.fencing_token, b.fencing_token) << where;
  EXPECT_EQ(a.attempt, b.attempt) << where;
  EXPECT_EQ(a.lease_expires, b.lease_expires) << where;
  EXPECT_EQ(a.created, b.created) << where;
  EXPECT_EQ(a.completed, b.completed) << where;
  EXPECT_EQ(a.expires, b.expires) << where;
  EXPECT_EQ(a.response, b.response) << where;
  EXPECT_EQ(a.lookup, b.lookup) << where;
}

template <class T>
void expect_same_errors(const StoreResult<T>& batched, const StoreResult<T>& single, const std::string& where) {
  ASSERT_EQ(batched.has_value(), single.has_value())
      << where << ": batched " << describe(batched) << ", single " << describe(single);
}

// Random operations on a few keys, so that batches often carry one key several times, fences
// are often stale, and leases run out between rounds. Each round is one kind of call.
class DifferentialRun {
 public:
  DifferentialRun(Store& batched, Store& single, std::uint32_t seed)
      : batched_(batched), single_(single), random_(seed), run_(numbered("diff", static_cast<int>(seed))) {}

  void round() {
    const int size = std::uniform_int_distribution<int>(1, 12)(random_);
    switch (std::uniform_int_distribution<int>(0, 3)(random_)) {
      case 0: claims(size); break;
      case 1: fenced_writes<CompleteRequest>(size, &BlockingStore::complete_many); break;
      case 2: fenced_writes<FailRequest>(size, &BlockingStore::fail_many); break;
      case 3: fenced_writes<Fence>(size, &BlockingStore::release_many); break;
    }
    // Sometimes time passes: a lease (60 s) runs out, or a record's retention (24 h).
    const int pass = std::uniform_int_distribution<int>(0, 9)(random_);
    if (pass >= 6) clock_ += pass == 9 ? kRetention / 2 : kLease / 2;
    ++rounds_;
  }

  // Every key read back from both stores.
  void compare_records() {
    for (int k = 0; k < kKeys; ++k) {
      auto a = BlockingStore(batched_).get(RecordId{tenant(true), key(k)});
      auto b = BlockingStore(single_).get(RecordId{tenant(false), key(k)});
      ASSERT_TRUE(a && b) << key(k);
      ASSERT_EQ(a->has_value(), b->has_value()) << key(k);
      if (a->has_value()) expect_same_record(**a, **b, "final record " + key(k));
    }
  }

 private:
  static constexpr int kKeys = 6;

  std::string tenant(bool batched) const { return std::string(batched ? "batched-" : "single-") + run_; }
  std::string key(int k) const { return run_ + "-" + numbered("key", k); }
  std::string where(std::size_t item) const {
    return "round " + std::to_string(rounds_) + " item " + std::to_string(item);
  }
  int any_key() { return std::uniform_int_distribution<int>(0, kKeys - 1)(random_); }
  bool coin(int percent) { return std::uniform_int_distribution<int>(0, 99)(random_) < percent; }

  void claims(int size) {
    std::vector<ClaimRequest> batch, singles;
    for (int i = 0; i < size; ++i) {
      ClaimRequest r;
      r.id = RecordId{tenant(true), key(any_key())};
      r.request_hash = coin(85) ? "same" : "other";
      r.token = ++tokens_;
      r.now = clock_;
      r.lease_expires = clock_ + kLease;
      r.expires = clock_ + kRetention;
      r.take_over_expired_lease = coin(80);
      r.lookup = coin(20) ? "GET /lookup/{key}" : "";
      batch.push_back(r);
      r.id.tenant = tenant(false);
      singles.push_back(std::move(r));
    }
    auto batched = BlockingStore(batched_).claim_many(std::move(batch));
    ASSERT_EQ(batched.size(), singles.size());
    BlockingStore one(single_);
    for (std::size_t i = 0; i < singles.size(); ++i) {
      const std::string at = where(i) + " claim " + singles[i].id.key;
      auto single = one.claim(singles[i]);
      expect_same_errors(batched[i], single, at);
      if (!single) continue;
      EXPECT_EQ(batched[i]->status, single->status) << at;
      if (single->status == ClaimStatus::claimed) {
        EXPECT_EQ(batched[i]->kind, single->kind) << at;
        held_[single->record.key] = single->record.fencing_token;
      }
      expect_same_record(batched[i]->record, single->record, at);
    }
  }

  // A fence for a random key: mostly the one the last winning claim got, sometimes a stale one.
  Fence fence(bool batched) {
    const std::string k = key(any_key());
    std::uint64_t token = held_.count(k) ? held_[k] : 1;
    if (coin(20)) token = coin(50) ? token + 1 : 1;
    return Fence{RecordId{tenant(batched), k}, token};
  }

  template <class Request>
  Request write_of(const Fence& fence, int body) {
    if constexpr (std::is_same_v<Request, Fence>) {
      return fence;
    } else if constexpr (std::is_same_v<Request, CompleteRequest>) {
      const std::string text = "body " + std::to_string(body);
      return CompleteRequest{fence, StoredResponse{200, {{"X-N", text}}, text}, clock_, clock_ + kRetention};
    } else {
      return FailRequest{fence, clock_, clock_ + kRetention};
    }
  }

  template <class Request>
  void fenced_writes(int size, BatchResults<FenceStatus> (BlockingStore::*many)(std::vector<Request>)) {
    std::vector<Request> batch, singles;
    for (int i = 0; i < size; ++i) {
      Fence f = fence(true);
      const int body = std::uniform_int_distribution<int>(0, 999)(random_);
      batch.push_back(write_of<Request>(f, body));
      f.id.tenant = tenant(false);
      singles.push_back(write_of<Request>(f, body));
    }
    BlockingStore b(batched_);
    auto batched = (b.*many)(std::move(batch));
    ASSERT_EQ(batched.size(), singles.size());
    BlockingStore one(single_);
    for (std::size_t i = 0; i < singles.size(); ++i) {
      StoreResult<FenceStatus> single;
      if constexpr (std::is_same_v<Request, Fence>) {
        single = one.release(singles[i]);
      } else if constexpr (std::is_same_v<Request, CompleteRequest>) {
        single = one.complete(singles[i]);
      } else {
        single = one.fail(singles[i]);
      }
      const std::string at = where(i) + " fenced write";
      expect_same_errors(batched[i], single, at);
      if (single) {
        EXPECT_EQ(*batched[i], *single) << at;
      }
    }
  }

  Store& batched_;
  Store& single_;
  std::mt19937 random_;
  const std::string run_;  // in every key: runs never meet each other's records
  TimePoint clock_ = from_epoch_ms(1'900'000'000'000);
  std::uint64_t tokens_ = 5000;
  std::map<std::string, std::uint64_t> held_;  // key -> the token its last winning claim got
  int rounds_ = 0;
};

}  // namespace

// The same random operations, as batches on one store and one by one on another, give the same
// answers and leave the same records.
STORE_TEST(BatchesAndSingleCallsAreEquivalent) {
  Fixture f(GetParam());
  std::unique_ptr<Store> other = GetParam().make();
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    DifferentialRun run(*f.store, *other, seed);
    for (int round = 0; round < 40; ++round) {
      run.round();
      if (::testing::Test::HasFatalFailure()) return;
    }
    run.compare_records();
  }
}

}  // namespace idem::testing
