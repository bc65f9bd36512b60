#include "idem/gateway/metrics.hpp"

#include <gtest/gtest.h>

#include "idem/gateway/log.hpp"

namespace idem::gateway {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}

TEST(Metrics, SumsShardsPerOutcome) {
  Metrics m(2);
  m.shard(0).count(Outcome::executed);
  m.shard(1).count(Outcome::executed);
  m.shard(1).count(Outcome::replayed);
  m.shard(0).count(FinishResult::stored);
  m.shard(1).count(UpstreamError::unreachable);
  m.shard(0).lease_takeovers.fetch_add(3);
  m.shard(1).reaper_deleted.fetch_add(7);
  m.shard(0).in_flight.fetch_add(2);
  m.shard(1).in_flight.fetch_sub(1);
  m.shard(0).count(WebhookRefusal::signature_invalid);
  m.shard(1).count(WebhookRefusal::signature_invalid);
  m.shard(1).webhooks_verified.fetch_add(5);
  const std::string text = m.render();
  EXPECT_TRUE(has_line(text, "idem_requests_total{outcome=\"executed\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "idem_requests_total{outcome=\"replayed\"} 1"));
  for (const auto* o : {"in_use", "mismatch", "missing", "invalid", "store_unavailable", "outcome_unknown",
                        "passed_through", "unauthorized", "record_unreadable", "webhook_refused"}) {
    EXPECT_TRUE(has_line(text, std::string("idem_requests_total{outcome=\"") + o + "\"} 0")) << o;
  }
  EXPECT_TRUE(has_line(text, "idem_finish_total{result=\"stored\"} 1"));
  EXPECT_TRUE(has_line(text, "idem_upstream_errors_total{kind=\"unreachable\"} 1"));
  EXPECT_TRUE(has_line(text, "idem_lease_takeovers_total 3"));
  EXPECT_TRUE(has_line(text, "idem_reaper_deleted_total 7"));
  EXPECT_TRUE(has_line(text, "idem_webhook_refusals_total{reason=\"signature_invalid\"} 2"));
  for (const auto* r : {"signature_missing", "timestamp_outside_tolerance", "webhook_id_missing"}) {
    EXPECT_TRUE(has_line(text, std::string("idem_webhook_refusals_total{reason=\"") + r + "\"} 0")) << r;
  }
  EXPECT_TRUE(has_line(text, "idem_webhooks_verified_total 5"));
  EXPECT_TRUE(has_line(text, "idem_requests_in_flight 1"));
  EXPECT_TRUE(has_line(text, "# TYPE idem_requests_total counter"));
  EXPECT_TRUE(has_line(text, "# TYPE idem_store_call_duration_seconds histogram"));
}

TEST(Metrics, HistogramsAreCumulative) {
  Metrics m(1);
  auto& h = m.shard(0).store_call(StoreCall::begin);
  h.observe(std::chrono::microseconds(50));    // <= 0.0001
  h.observe(std::chrono::microseconds(700));   // <= 0.001
  h.observe(std::chrono::seconds(20));         // +Inf
  const std::string text = m.render();
  EXPECT_TRUE(has_line(text, "idem_store_call_duration_seconds_bucket{call=\"begin\",le=\"0.0001\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "idem_store_call_duration_seconds_bucket{call=\"begin\",le=\"0.001\"} 2"));
  EXPECT_TRUE(has_line(text, "idem_store_call_duration_seconds_bucket{call=\"begin\",le=\"10\"} 2"));
  EXPECT_TRUE(has_line(text, "idem_store_call_duration_seconds_bucket{call=\"begin\",le=\"+Inf\"} 3"));
  EXPECT_TRUE(has_line(text, "idem_store_call_duration_seconds_count{call=\"begin\"} 3"));
  EXPECT_TRUE(has_line(text, "idem_store_call_duration_seconds_sum{call=\"begin\"} 20.00075"));
  EXPECT_TRUE(has_line(text, "idem_upstream_duration_seconds_count 0"));
}

TEST(Metrics, VerdictsMapToOutcomes) {
  EXPECT_EQ(outcome_of(Verdict::execute), Outcome::executed);
  EXPECT_EQ(outcome_of(Verdict::replay), Outcome::replayed);
  EXPECT_EQ(outcome_of(Verdict::key_missing), Outcome::missing);
  EXPECT_EQ(outcome_of(Verdict::key_invalid), Outcome::invalid);
  EXPECT_EQ(outcome_of(Verdict::pass_through), Outcome::passed_through);
  EXPECT_EQ(outcome_of(Verdict::record_unreadable), Outcome::record_unreadable);
  EXPECT_EQ(to_string(Outcome::record_unreadable), "record_unreadable");
  EXPECT_EQ(to_string(Outcome::store_unavailable), "store_unavailable");
}

TEST(Log, QuotesWhatClientsSend) {
  std::string out;
  log::append_quoted(out, "a\"b\\c\n\x7f");
  EXPECT_EQ(out, "\"a\\\"b\\\\c\\x0a\\x7f\"");
}

}  // namespace
}  // namespace idem::gateway
