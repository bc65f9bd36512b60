#include "reconcile_commands.hpp"

#include <gtest/gtest.h>

#include <deque>
#include <sstream>

#include "idem/memory_store.hpp"
#include "idem/testing/manual_clock.hpp"

namespace idem::cli {
namespace {

using namespace std::chrono_literals;
using testing::ManualClock;

const std::string kLookup = "GET /v1/payments/by-idempotency-key/{key}?t={tenant}";

// Answers lookups from a script, and keeps what it was asked.
class ScriptedUpstream final : public client::Transport {
 public:
  std::deque<std::expected<client::HttpResponse, client::TransportError>> answers;
  std::vector<client::HttpRequest> asked;
  std::expected<client::HttpResponse, client::TransportError> perform(const client::HttpRequest& request,
                                                                      Millis) override {
    asked.push_back(request);
    if (answers.empty()) return std::unexpected(client::TransportError{client::TransportErrc::no_answer, "no script"});
    auto next = std::move(answers.front());
    answers.pop_front();
    return next;
  }
};

client::HttpResponse answer(int status, Headers headers, std::string body = "") {
  return client::HttpResponse{status, std::move(headers), std::move(body)};
}

class ReconcileTest : public ::testing::Test {
 protected:
  // A key claimed by a route with `lookup` whose holder then vanished: its lease has run out.
  ClaimResult stuck(const std::string& tenant, const std::string& key, std::string lookup = kLookup) {
    ClaimRequest r;
    r.id = RecordId{tenant, key};
    r.request_hash = "hash-of-" + key;
    r.token = new_fencing_token();
    r.now = clock.now();
    r.lease_expires = r.now + 10s;
    r.expires = r.now + 24h;
    r.lookup = std::move(lookup);
    auto c = BlockingStore(store).claim(r);
    EXPECT_TRUE(c && c->status == ClaimStatus::claimed);
    return *c;
  }
  int run() {
    out.str("");
    err.str("");
    return run_reconcile(store, store, upstream, args, clock, Output{out, err, json});
  }
  Record record(const std::string& tenant, const std::string& key) {
    return BlockingStore(store).get(RecordId{tenant, key}).value().value();
  }
  ClaimResult retry(const std::string& tenant, const std::string& key) {
    ClaimRequest r;
    r.id = RecordId{tenant, key};
    r.request_hash = "hash-of-" + key;
    r.token = new_fencing_token();
    r.now = clock.now();
    r.lease_expires = r.now + 10s;
    r.expires = r.now + 24h;
    return BlockingStore(store).claim(r).value();
  }

  MemoryStore store;
  ManualClock clock;
  ScriptedUpstream upstream;
  ReconcileArgs args{.upstream = "http://127.0.0.1:8081"};
  std::ostringstream out, err;
  bool json = false;
};

TEST_F(ReconcileTest, AFoundOutcomeCompletesTheKeyAsTheUpstreamAnswered) {
  const ClaimResult holder = stuck("auth:ab", "key/with?odd#chars");
  clock.advance(11s);
  upstream.answers.push_back(answer(200,
                                    {{"Content-Type", "application/json"},
                                     {"Idempotency-Key", "key/with?odd#chars"},
                                     {"Idempotency-Original-Status", "201"}},
                                    R"({"id":"pay_1"})"));
  EXPECT_EQ(run(), kExitOk) << err.str();
  ASSERT_EQ(upstream.asked.size(), 1u);
  const client::HttpRequest& asked = upstream.asked.front();
  EXPECT_EQ(asked.method, "GET");
  EXPECT_EQ(asked.url, "http://127.0.0.1:8081/v1/payments/by-idempotency-key/key%2Fwith%3Fodd%23chars?t=auth%3Aab");
  EXPECT_EQ(asked.headers, (Headers{{"Idempotency-Key", "key/with?odd#chars"},
                                    {"Idempotency-Tenant", "auth:ab"},
                                    {"Idempotency-Attempt", "2"}}));
  const Record r = record("auth:ab", "key/with?odd#chars");
  EXPECT_EQ(r.state, RecordState::completed);
  EXPECT_EQ(r.attempt, 2u);
  ASSERT_TRUE(r.response);
  EXPECT_EQ(*r.response, (StoredResponse{201, {{"Content-Type", "application/json"}}, R"({"id":"pay_1"})"}));
  EXPECT_EQ(retry("auth:ab", "key/with?odd#chars").status, ClaimStatus::completed);
  // The vanished holder's late completion is fenced out.
  EXPECT_EQ(BlockingStore(store)
                .complete(CompleteRequest{Fence{RecordId{"auth:ab", "key/with?odd#chars"}, holder.record.fencing_token},
                                          StoredResponse{201, {}, "late"}, clock.now(), clock.now() + 1h})
                .value(),
            FenceStatus::lost);
  EXPECT_NE(out.str().find("resolved"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("1 resolved"), std::string::npos) << out.str();
}

TEST_F(ReconcileTest, NeverHappenedMakesTheKeyRetryableWithItsCountKept) {
  stuck("t", "key-never-happened-1");
  clock.advance(11s);
  upstream.answers.push_back(answer(404, {{"Idempotency-Lookup", "not_found"}, {"Idempotency-Key", "key-never-happened-1"}}));
  EXPECT_EQ(run(), kExitOk) << err.str();
  EXPECT_EQ(record("t", "key-never-happened-1").state, RecordState::failed_retryable);
  const ClaimResult next = retry("t", "key-never-happened-1");
  EXPECT_EQ(next.status, ClaimStatus::claimed);
  EXPECT_EQ(next.kind, ClaimKind::after_failure);
  EXPECT_EQ(next.record.attempt, 3u);  // above the 2 the lookup told the upstream
}

TEST_F(ReconcileTest, AnAnswerThatDecidesNothingLeavesTheKeyToAskAgain) {
  stuck("t", "key-unknown-000001");
  clock.advance(11s);
  upstream.answers.push_back(answer(500, {{"Idempotency-Key", "key-unknown-000001"}}));
  EXPECT_EQ(run(), kExitFailure);
  EXPECT_NE(err.str().find("still unknown"), std::string::npos);
  Record r = record("t", "key-unknown-000001");
  EXPECT_EQ(r.state, RecordState::in_progress);
  EXPECT_LE(r.lease_expires, clock.now());
  EXPECT_EQ(r.attempt, 2u);
  // 404 without the marker, an answer about another key, no answer at all: the same.
  upstream.answers.push_back(answer(404, {{"Idempotency-Key", "key-unknown-000001"}}, "Not Found"));
  EXPECT_EQ(run(), kExitFailure);
  upstream.answers.push_back(answer(200, {{"Idempotency-Key", "another-key-00000001"}}, "{}"));
  EXPECT_EQ(run(), kExitFailure);
  EXPECT_NE(out.str().find("mismatch"), std::string::npos) << out.str();
  EXPECT_EQ(run(), kExitFailure);  // the script is empty: a transport error
  EXPECT_NE(out.str().find("the lookup failed"), std::string::npos) << out.str();
  r = record("t", "key-unknown-000001");
  EXPECT_EQ(r.state, RecordState::in_progress);
  EXPECT_EQ(r.attempt, 5u);  // every ask was a takeover: each fenced the ones before out
  EXPECT_EQ(upstream.asked.back().headers.back(), (Header{"Idempotency-Attempt", "5"}));
  upstream.answers.push_back(answer(200, {{"Idempotency-Key", "key-unknown-000001"}}, "ok"));
  EXPECT_EQ(run(), kExitOk);
  EXPECT_EQ(record("t", "key-unknown-000001").state, RecordState::completed);
}

TEST_F(ReconcileTest, OnlyKeysWithAVanishedHolderAndALookupAreAsked) {
  stuck("t", "key-still-running-1");
  clock.advance(5s);
  stuck("t", "key-no-lookup-00001", "");
  stuck("u", "key-other-tenant-01");
  clock.advance(6s);  // the first's lease is over; the others' not yet
  upstream.answers.push_back(answer(200, {{"Idempotency-Key", "key-still-running-1"}}, "done"));
  EXPECT_EQ(run(), kExitOk) << err.str();
  EXPECT_EQ(upstream.asked.size(), 1u);
  clock.advance(10s);
  args.tenant = "t";
  EXPECT_EQ(run(), kExitOk) << err.str();  // no lookup: reported, never asked; tenant u left alone
  EXPECT_EQ(upstream.asked.size(), 1u);
  EXPECT_NE(out.str().find("no_lookup"), std::string::npos) << out.str();
  EXPECT_EQ(record("u", "key-other-tenant-01").state, RecordState::in_progress);
  EXPECT_EQ(record("t", "key-no-lookup-00001").attempt, 1u);
}

TEST_F(ReconcileTest, ADryRunAsksNothingAndChangesNothing) {
  stuck("t", "key-dry-run-000001");
  clock.advance(11s);
  args.dry_run = true;
  json = true;
  EXPECT_EQ(run(), kExitOk);
  EXPECT_TRUE(upstream.asked.empty());
  EXPECT_EQ(record("t", "key-dry-run-000001").attempt, 1u);
  const auto doc = nlohmann::json::parse(out.str());
  EXPECT_EQ(doc["counts"]["would_ask"], 1);
  EXPECT_EQ(doc["keys"][0]["result"], "would_ask");
  EXPECT_EQ(doc["keys"][0]["detail"], "would ask GET /v1/payments/by-idempotency-key/key-dry-run-000001?t=t");
}

TEST_F(ReconcileTest, AnOversizedAnswerIsStoredAsTheResponseNotStored) {
  stuck("t", "key-oversized-00001");
  clock.advance(11s);
  args.max_stored_response = 4;
  upstream.answers.push_back(answer(200, {{"Idempotency-Key", "key-oversized-00001"}}, "far too long"));
  EXPECT_EQ(run(), kExitOk) << err.str();
  const Record r = record("t", "key-oversized-00001");
  ASSERT_TRUE(r.response);
  EXPECT_EQ(r.response->status, 410);
  EXPECT_NE(r.response->body.find("idempotency_response_not_stored"), std::string::npos);
}

}  // namespace
}  // namespace idem::cli
