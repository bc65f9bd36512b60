// The parts of the Kafka module that need no cluster: URLs and their redaction, the error
// mapping, the commit ledger (what may be committed), and how messages map onto records.

#include "idem/kafka_broker.hpp"

#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>

#include "commit_ledger.hpp"
#include "errors.hpp"
#include "record_headers.hpp"

namespace idem {
namespace {

using kafka_detail::CommitLedger;
using kafka_detail::Failure;
using kafka_detail::map_error;
using Mark = CommitLedger::Mark;
using Commit = CommitLedger::Commit;

KafkaUrl source(const std::string& url) {
  auto parsed = parse_kafka_url(url, KafkaUrlRole::source);
  EXPECT_TRUE(parsed) << url << ": " << parsed.error().message;
  return parsed.value_or(KafkaUrl{});
}

KafkaUrl sink(const std::string& url) {
  auto parsed = parse_kafka_url(url, KafkaUrlRole::sink);
  EXPECT_TRUE(parsed) << url << ": " << parsed.error().message;
  return parsed.value_or(KafkaUrl{});
}

// The error for a bad URL: invalid, one line, and it never holds `secret`.
std::string bad(const std::string& url, KafkaUrlRole role = KafkaUrlRole::source, const std::string& secret = "Zq9xW") {
  auto parsed = parse_kafka_url(url, role);
  EXPECT_FALSE(parsed) << url;
  if (parsed) return {};
  EXPECT_EQ(parsed.error().code, BrokerErrc::invalid) << parsed.error().message;
  EXPECT_FALSE(parsed.error().retryable());
  EXPECT_EQ(parsed.error().message.find('\n'), std::string::npos) << parsed.error().message;
  EXPECT_EQ(parsed.error().message.find(secret), std::string::npos) << parsed.error().message;
  return parsed.error().message;
}

TEST(KafkaUrl, ASourceWithEveryOption) {
  const auto u = source(
      "kafka://idem:Zq9xW%40pass@k1.example:9093,k2.example,[::1]:9094/orders.v1?group=billing"
      "&dead_letter_topic=orders.dlq&client_id=billing-1&id_header=x-id&id_from=key&start=latest"
      "&security_protocol=SASL_SSL&sasl_mechanism=scram-sha-512&ssl_ca_location=/etc/ca.pem"
      "&ssl_certificate_location=/etc/c.pem&ssl_key_location=/etc/k.pem&ssl_key_password=Zq9xWkey"
      "&session_timeout_ms=6000&heartbeat_interval_ms=500&commit_interval_ms=0&revoke_timeout_ms=2000"
      "&requeue_delay_ms=250");
  ASSERT_EQ(u.brokers.size(), 3u);
  EXPECT_EQ(u.brokers[0], (std::pair<std::string, int>{"k1.example", 9093}));
  EXPECT_EQ(u.brokers[1], (std::pair<std::string, int>{"k2.example", 9092}));
  EXPECT_EQ(u.brokers[2], (std::pair<std::string, int>{"::1", 9094}));
  EXPECT_EQ(u.bootstrap_servers(), "k1.example:9093,k2.example:9092,[::1]:9094");
  EXPECT_EQ(u.topic, "orders.v1");
  EXPECT_EQ(u.group, "billing");
  EXPECT_EQ(u.dead_letter_topic, "orders.dlq");
  EXPECT_EQ(u.client_id, "billing-1");
  EXPECT_EQ(u.id_header, "x-id");
  EXPECT_EQ(u.id_from, KafkaIdFrom::key);
  EXPECT_FALSE(u.start_at_earliest);
  EXPECT_EQ(u.security_protocol, "sasl_ssl");
  EXPECT_EQ(u.sasl_mechanism, "SCRAM-SHA-512");
  EXPECT_EQ(u.sasl_username, "idem");
  EXPECT_EQ(u.sasl_password, "Zq9xW@pass");
  EXPECT_EQ(u.ssl_ca_location, "/etc/ca.pem");
  EXPECT_EQ(u.ssl_certificate_location, "/etc/c.pem");
  EXPECT_EQ(u.ssl_key_location, "/etc/k.pem");
  EXPECT_EQ(u.ssl_key_password, "Zq9xWkey");
  EXPECT_EQ(u.session_timeout, std::chrono::milliseconds(6000));
  EXPECT_EQ(u.heartbeat_interval, std::chrono::milliseconds(500));
  EXPECT_EQ(u.commit_interval, std::chrono::milliseconds(0));
  EXPECT_EQ(u.revoke_timeout, std::chrono::milliseconds(2000));
  EXPECT_EQ(u.requeue_delay, std::chrono::milliseconds(250));
}

TEST(KafkaUrl, Defaults) {
  const auto u = source("kafka://localhost/events?group=g");
  EXPECT_EQ(u.bootstrap_servers(), "localhost:9092");
  EXPECT_EQ(u.dead_letter_topic, "events.dead-letter");
  EXPECT_EQ(u.id_header, "message_id");
  EXPECT_EQ(u.id_from, KafkaIdFrom::header);
  EXPECT_TRUE(u.start_at_earliest);
  EXPECT_EQ(u.security_protocol, "plaintext");
  EXPECT_TRUE(u.sasl_mechanism.empty());
  EXPECT_EQ(u.commit_interval, std::chrono::milliseconds(1000));
  EXPECT_EQ(u.revoke_timeout, std::chrono::milliseconds(5000));
  EXPECT_TRUE(u.client_id.empty());
}

TEST(KafkaUrl, CredentialsAsParametersDefaultToSaslSslAndPlain) {
  const auto u = source("kafka://k:9092/t?group=g&sasl_username=svc&sasl_password=Zq9xW%26x");
  EXPECT_EQ(u.sasl_username, "svc");
  EXPECT_EQ(u.sasl_password, "Zq9xW&x");
  EXPECT_EQ(u.security_protocol, "sasl_ssl");
  EXPECT_EQ(u.sasl_mechanism, "PLAIN");
  const auto plain = source("kafka://svc:pw@k/t?group=g&security_protocol=sasl_plaintext");
  EXPECT_EQ(plain.security_protocol, "sasl_plaintext");
}

TEST(KafkaUrl, ASinkTakesNoSourceParameters) {
  const auto u = sink("kafka://k1:1,k2:2/out?client_id=relay&id_header=mid");
  EXPECT_EQ(u.topic, "out");
  EXPECT_EQ(u.client_id, "relay");
  EXPECT_EQ(u.id_header, "mid");
  for (const char* p : {"group=g", "dead_letter_topic=d", "id_from=key", "start=latest", "session_timeout_ms=6000",
                        "commit_interval_ms=0", "revoke_timeout_ms=1", "requeue_delay_ms=1", "heartbeat_interval_ms=500"}) {
    EXPECT_NE(bad(std::string("kafka://k/out?") + p, KafkaUrlRole::sink).find("for source URLs"), std::string::npos) << p;
  }
}

TEST(KafkaUrl, BadUrlsSayWhatIsWrong) {
  EXPECT_NE(bad("amqp://k/t?group=g").find("must start with kafka://"), std::string::npos);
  EXPECT_NE(bad("kafka:///t?group=g").find("no broker"), std::string::npos);
  EXPECT_NE(bad("kafka://k?group=g").find("no topic"), std::string::npos);
  EXPECT_NE(bad("kafka://k/?group=g").find("no topic"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t").find("needs ?group="), std::string::npos);
  EXPECT_NE(bad("kafka://k:0/t?group=g").find("bad port"), std::string::npos);
  EXPECT_NE(bad("kafka://k:x/t?group=g").find("bad port"), std::string::npos);
  EXPECT_NE(bad("kafka://k:/t?group=g").find("empty port"), std::string::npos);
  EXPECT_NE(bad("kafka://k1,,k2/t?group=g").find("empty broker address"), std::string::npos);
  EXPECT_NE(bad("kafka://k1,/t?group=g").find("empty broker address"), std::string::npos);
  EXPECT_NE(bad("kafka://[::1/t?group=g").find("unclosed '['"), std::string::npos);
  EXPECT_NE(bad("kafka://k/a b?group=g").find("characters Kafka does not allow"), std::string::npos);
  EXPECT_NE(bad("kafka://k/" + std::string(250, 'a') + "?group=g").find("249"), std::string::npos);
  EXPECT_NE(bad("kafka://k/..?group=g").find("\"..\""), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&group=h").find("given twice"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&colour=red").find("unknown parameter colour"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&id_from=body").find("header or key"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&start=now").find("earliest or latest"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&session_timeout_ms=abc").find("whole milliseconds"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&revoke_timeout_ms=-1").find("whole milliseconds"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&session_timeout_ms=6000&heartbeat_interval_ms=6000").find("shorter than"),
            std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&dead_letter_topic=t").find("cannot be the topic"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&dead_letter_topic=a%2Fb").find("does not allow"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&security_protocol=tls").find("plaintext, ssl"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&security_protocol=sasl_ssl").find("needs a user"), std::string::npos);
  EXPECT_NE(bad("kafka://u:p@k/t?group=g&security_protocol=ssl").find("credentials need"), std::string::npos);
  EXPECT_NE(bad("kafka://u:p@k/t?group=g&sasl_mechanism=GSSAPI").find("PLAIN, SCRAM-SHA-256"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&sasl_mechanism=PLAIN").find("sasl_* security_protocol"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&ssl_ca_location=/ca.pem").find("need security_protocol=ssl"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&security_protocol=ssl&ssl_key_location=/k.pem").find("both"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g#frag").find("fragment"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=a%zz").find("percent-escape"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=").find("1-255 visible"), std::string::npos);
  EXPECT_NE(bad("kafka://k/t?group=g&sasl_password=Zq9xW").find("without a user name"), std::string::npos);
}

TEST(KafkaUrl, ErrorsNeverHoldThePassword) {
  // Each is wrong somewhere else; the password must not appear in the message.
  const std::string userinfo = "kafka://svc:Zq9xW@k:9092/t?group=g&colour=red";
  EXPECT_NE(bad(userinfo).find("svc:***@k:9092"), std::string::npos) << bad(userinfo);
  const std::string param = "kafka://k:9092/t?group=g&sasl_username=svc&sasl_password=Zq9xW&colour=red";
  EXPECT_NE(bad(param).find("sasl_password=***"), std::string::npos) << bad(param);
  bad("kafka://k:9092/t?group=g&sasl_username=svc&sasl_password=Zq9xW%zz");  // the bad escape is in the password
  bad("kafka://k:9092/t?group=g&SASL_PASSWORD=Zq9xW&sasl_username=svc&start=x");
  bad("kafka://k:9092/t?group=g&ssl_key_password=Zq9xW&security_protocol=plaintext");
  bad("kafka://svc:Zq9xW/t@k:9092/t?group=g");  // a raw '/' in the password
  bad("kafka://svc:Zq9xW@k:9092/t?group=g&sasl_username=other");
}

TEST(KafkaUrl, RedactionHidesBothPasswordForms) {
  EXPECT_EQ(redact_kafka_url("kafka://svc:Zq9xW@k:9092/t?group=g"), "kafka://svc:***@k:9092/t?group=g");
  EXPECT_EQ(redact_kafka_url("kafka://k/t?group=g&sasl_password=Zq9xW&client_id=c"),
            "kafka://k/t?group=g&sasl_password=***&client_id=c");
  EXPECT_EQ(redact_kafka_url("kafka://k/t?Sasl_Password=Zq9xW"), "kafka://k/t?Sasl_Password=***");
  EXPECT_EQ(redact_kafka_url("kafka://k/t?%73asl_password=Zq9xW"), "kafka://k/t?%73asl_password=***");
  EXPECT_EQ(redact_kafka_url("kafka://k/t?ssl_key_password=Zq9xW"), "kafka://k/t?ssl_key_password=***");
  EXPECT_EQ(redact_kafka_url("kafka://k/t?group=g"), "kafka://k/t?group=g");
}

TEST(KafkaSource, ItsNameAndOpenErrorsNeverHoldThePassword) {
  // Nothing listens on port 1: opening fails quickly, and neither the error nor anything else
  // quotes the password.
  SourceSettings settings;
  settings.connect_timeout = std::chrono::milliseconds(300);
  auto opened = open_kafka_source("kafka://127.0.0.1:1/t?group=g&sasl_username=svc&sasl_password=Zq9xWsecret"
                                  "&security_protocol=sasl_plaintext",
                                  settings);
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.error().code, BrokerErrc::unavailable) << opened.error().message;
  EXPECT_EQ(opened.error().message.find("Zq9xWsecret"), std::string::npos) << opened.error().message;
  EXPECT_NE(opened.error().message.find("sasl_password=***"), std::string::npos) << opened.error().message;
  SinkSettings sink_settings;
  sink_settings.connect_timeout = std::chrono::milliseconds(300);
  auto sink = open_kafka_sink("kafka://svc:Zq9xWsecret@127.0.0.1:1/t?security_protocol=sasl_plaintext", sink_settings);
  ASSERT_FALSE(sink);
  EXPECT_EQ(sink.error().message.find("Zq9xWsecret"), std::string::npos) << sink.error().message;
  EXPECT_NE(sink.error().message.find("svc:***@"), std::string::npos) << sink.error().message;
}

Failure failure(rd_kafka_resp_err_t code, bool maybe_sent = false) {
  Failure f;
  f.code = code;
  f.where = "kafka://k/t";
  f.doing = "publishing to topic t";
  f.topic = "t";
  f.user = "svc";
  f.maybe_sent = maybe_sent;
  return f;
}

TEST(KafkaErrors, EachCodeMapsToWhatACallerMayDo) {
  const std::pair<rd_kafka_resp_err_t, BrokerErrc> cases[] = {
      {RD_KAFKA_RESP_ERR__TRANSPORT, BrokerErrc::unavailable},
      {RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN, BrokerErrc::unavailable},
      {RD_KAFKA_RESP_ERR__RESOLVE, BrokerErrc::unavailable},
      {RD_KAFKA_RESP_ERR__QUEUE_FULL, BrokerErrc::unavailable},
      {RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, BrokerErrc::unavailable},
      {RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE, BrokerErrc::unavailable},
      {RD_KAFKA_RESP_ERR_NOT_COORDINATOR, BrokerErrc::unavailable},
      {RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS, BrokerErrc::unavailable},
      {RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, BrokerErrc::unavailable},
      {RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS, BrokerErrc::unavailable},
      {RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, BrokerErrc::timeout},
      {RD_KAFKA_RESP_ERR__TIMED_OUT, BrokerErrc::timeout},
      {RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, BrokerErrc::timeout},
      {RD_KAFKA_RESP_ERR__AUTHENTICATION, BrokerErrc::refused},
      {RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED, BrokerErrc::refused},
      {RD_KAFKA_RESP_ERR_UNSUPPORTED_SASL_MECHANISM, BrokerErrc::refused},
      {RD_KAFKA_RESP_ERR__SSL, BrokerErrc::refused},
      {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, BrokerErrc::refused},
      {RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED, BrokerErrc::refused},
      {RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED, BrokerErrc::refused},
      {RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, BrokerErrc::refused},
      {RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC, BrokerErrc::refused},
      {RD_KAFKA_RESP_ERR_INCONSISTENT_GROUP_PROTOCOL, BrokerErrc::refused},
      {RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, BrokerErrc::rejected},
      {RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE, BrokerErrc::rejected},
      {RD_KAFKA_RESP_ERR_INVALID_RECORD, BrokerErrc::rejected},
      {RD_KAFKA_RESP_ERR_POLICY_VIOLATION, BrokerErrc::rejected},
      {RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION, BrokerErrc::stale},
      {RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID, BrokerErrc::stale},
      {RD_KAFKA_RESP_ERR__ASSIGNMENT_LOST, BrokerErrc::stale},
      {RD_KAFKA_RESP_ERR__INVALID_ARG, BrokerErrc::invalid},
      {RD_KAFKA_RESP_ERR_INVALID_SESSION_TIMEOUT, BrokerErrc::invalid},
      {RD_KAFKA_RESP_ERR__FATAL, BrokerErrc::internal},
      {RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, BrokerErrc::internal},
  };
  for (const auto& [code, expected] : cases) {
    const BrokerError e = map_error(failure(code));
    EXPECT_EQ(e.code, expected) << rd_kafka_err2name(code) << ": " << e.message;
    EXPECT_EQ(e.message.rfind("kafka://k/t: publishing to topic t: ", 0), 0u) << e.message;
    EXPECT_NE(e.message.find(rd_kafka_err2name(code)), std::string::npos) << e.message;
    EXPECT_FALSE(e.in_doubt) << rd_kafka_err2name(code);
  }
}

TEST(KafkaErrors, OnlyAnUnknownOutcomeOfASentRecordIsInDoubt) {
  EXPECT_TRUE(map_error(failure(RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, true)).in_doubt);
  EXPECT_TRUE(map_error(failure(RD_KAFKA_RESP_ERR__TRANSPORT, true)).in_doubt);
  EXPECT_TRUE(map_error(failure(RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, true)).in_doubt);
  EXPECT_FALSE(map_error(failure(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, true)).in_doubt);  // refused: not written
  EXPECT_FALSE(map_error(failure(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, true)).in_doubt);
  EXPECT_FALSE(map_error(failure(RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, false)).in_doubt);  // never sent
  EXPECT_TRUE(map_error(failure(RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, true)).retryable());
}

TEST(KafkaErrors, MessagesSayWhatToDo) {
  EXPECT_NE(map_error(failure(RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)).message.find("topic \"t\" does not exist"), std::string::npos);
  EXPECT_NE(map_error(failure(RD_KAFKA_RESP_ERR__AUTHENTICATION)).message.find("refused the login for user svc"),
            std::string::npos);
  Failure fatal = failure(RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER);
  fatal.fatal = true;
  EXPECT_NE(map_error(fatal).message.find("fatal"), std::string::npos);
  Failure detailed = failure(RD_KAFKA_RESP_ERR__TRANSPORT);
  detailed.detail = "127.0.0.1:9092/bootstrap: Connection refused";
  EXPECT_NE(map_error(detailed).message.find("Connection refused"), std::string::npos);
}

// The commit ledger: what may be committed is the first offset not done.

TEST(CommitLedger, NothingIsCommittableBeforeAMessageIsHandedOut) {
  CommitLedger ledger;
  ledger.assign(0);
  EXPECT_FALSE(ledger.committable(0));
  EXPECT_TRUE(ledger.to_commit().empty());
  EXPECT_FALSE(ledger.committable(7));  // not ours
}

TEST(CommitLedger, OutOfOrderAcksMoveTheCommitOnlyPastTheContiguousDonePrefix) {
  CommitLedger ledger;
  const auto a = ledger.assign(3);
  for (std::int64_t offset = 10; offset < 15; ++offset) EXPECT_EQ(ledger.hand_out(3, offset), a);
  EXPECT_EQ(ledger.held(3), 5u);
  EXPECT_EQ(ledger.committable(3), 10);  // nothing done: the first held offset

  EXPECT_EQ(ledger.done(a, 12), Mark::ok);
  EXPECT_EQ(ledger.done(a, 14), Mark::ok);
  EXPECT_EQ(ledger.committable(3), 10);  // 10 and 11 still running
  EXPECT_EQ(ledger.done(a, 10), Mark::ok);
  EXPECT_EQ(ledger.committable(3), 11);  // 11 holds it back, though 12 and 14 are done
  EXPECT_EQ(ledger.done(a, 11), Mark::ok);
  EXPECT_EQ(ledger.committable(3), 13);  // 10, 11, 12 done; 13 running
  EXPECT_EQ(ledger.done(a, 13), Mark::ok);
  EXPECT_EQ(ledger.committable(3), 15);  // all done: one past the last
  EXPECT_EQ(ledger.held(3), 0u);
  EXPECT_EQ(ledger.done(a, 13), Mark::settled);  // twice
  EXPECT_EQ(ledger.done(a, 99), Mark::settled);  // never handed out
}

TEST(CommitLedger, GapsInOffsetsDoNotHoldTheCommitBack) {
  // Offsets need not be contiguous (compaction, transaction markers): 21 and 22 never come.
  CommitLedger ledger;
  const auto a = ledger.assign(0);
  ledger.hand_out(0, 20);
  ledger.hand_out(0, 23);
  EXPECT_EQ(ledger.done(a, 20), Mark::ok);
  EXPECT_EQ(ledger.committable(0), 23);
  EXPECT_EQ(ledger.done(a, 23), Mark::ok);
  EXPECT_EQ(ledger.committable(0), 24);
}

TEST(CommitLedger, CommitsAreSentOnceAndAgainAfterAFailure) {
  CommitLedger ledger;
  const auto a = ledger.assign(0);
  const auto b = ledger.assign(1);
  ledger.hand_out(0, 0);
  ledger.hand_out(0, 1);
  ledger.hand_out(1, 5);
  ledger.done(a, 0);
  ledger.done(b, 5);
  auto commits = ledger.to_commit();
  ASSERT_EQ(commits, (std::vector<Commit>{{0, 1}, {1, 6}}));
  ledger.sent(commits);
  EXPECT_TRUE(ledger.to_commit().empty());  // nothing moved since
  EXPECT_EQ(ledger.to_commit(/*unconfirmed=*/true).size(), 2u);  // not confirmed yet

  ledger.committed(0, 1);
  ledger.commit_failed(1, 6);  // refused (a rebalance in progress, say)
  EXPECT_EQ(ledger.confirmed(0), 1);
  EXPECT_EQ(ledger.confirmed(1), -1);
  EXPECT_EQ(ledger.to_commit(), (std::vector<Commit>{{1, 6}}));  // sent again
  EXPECT_EQ(ledger.to_commit(true), (std::vector<Commit>{{1, 6}}));

  ledger.done(a, 1);
  EXPECT_EQ(ledger.to_commit(), (std::vector<Commit>{{0, 2}, {1, 6}}));
}

TEST(CommitLedger, ALateFailureDoesNotUndoALaterCommit) {
  CommitLedger ledger;
  const auto a = ledger.assign(0);
  ledger.hand_out(0, 0);
  ledger.hand_out(0, 1);
  ledger.done(a, 0);
  ledger.sent(ledger.to_commit());  // 1
  ledger.done(a, 1);
  ledger.sent(ledger.to_commit());  // 2
  ledger.commit_failed(0, 1);       // the first one failed after the second was sent
  EXPECT_TRUE(ledger.to_commit().empty());
  ledger.committed(0, 2);
  EXPECT_EQ(ledger.confirmed(0), 2);
}

TEST(CommitLedger, ARequeuedDeliveryHoldsTheCommitAndCountsItsDeliveries) {
  CommitLedger ledger;
  const auto a = ledger.assign(0);
  ledger.hand_out(0, 0);
  ledger.hand_out(0, 1);
  EXPECT_EQ(ledger.delivery_count(a, 0), 1u);
  EXPECT_EQ(ledger.park(a, 0), Mark::ok);
  EXPECT_EQ(ledger.held(0), 1u);  // parked is not held (a revocation does not wait for it)
  EXPECT_EQ(ledger.park(a, 0), Mark::settled);
  EXPECT_EQ(ledger.done(a, 1), Mark::ok);
  EXPECT_EQ(ledger.committable(0), 0);  // 0 waits for its retry: nothing past it
  EXPECT_EQ(ledger.redeliver(a, 0), 2u);
  EXPECT_FALSE(ledger.redeliver(a, 0));  // held again, not parked
  EXPECT_EQ(ledger.park(a, 0), Mark::ok);
  EXPECT_EQ(ledger.redeliver(a, 0), 3u);
  EXPECT_EQ(ledger.delivery_count(a, 0), 3u);
  EXPECT_EQ(ledger.done(a, 0), Mark::ok);
  EXPECT_EQ(ledger.committable(0), 2);
  EXPECT_EQ(ledger.delivery_count(a, 0), 0u);
}

TEST(CommitLedger, ARevokedPartitionHandsOutNothingDrainsThenGoesStale) {
  CommitLedger ledger;
  const auto a = ledger.assign(0);
  ledger.hand_out(0, 0);
  ledger.hand_out(0, 1);
  ledger.hand_out(0, 2);
  ledger.park(a, 2);

  ledger.start_revoke(0);
  EXPECT_TRUE(ledger.revoking(0));
  EXPECT_FALSE(ledger.active(0));
  EXPECT_FALSE(ledger.hand_out(0, 3));      // stopped handing out
  EXPECT_FALSE(ledger.redeliver(a, 2));     // and retrying
  EXPECT_EQ(ledger.held(0), 2u);            // 0 and 1 may still finish
  EXPECT_EQ(ledger.done(a, 1), Mark::ok);   // acks still count while it drains
  EXPECT_EQ(ledger.committable(0), 0);
  EXPECT_EQ(ledger.done(a, 0), Mark::ok);
  EXPECT_EQ(ledger.held(0), 0u);            // drained (2 is parked, not held)
  EXPECT_EQ(ledger.to_commit(true), (std::vector<Commit>{{0, 2}}));  // up to the parked one

  ledger.revoke(0);
  EXPECT_EQ(ledger.done(a, 2), Mark::stale);
  EXPECT_EQ(ledger.park(a, 2), Mark::stale);
  EXPECT_FALSE(ledger.partition_of(a));
  EXPECT_TRUE(ledger.to_commit(true).empty());
}

TEST(CommitLedger, APartitionAssignedAgainIsANewAssignment) {
  CommitLedger ledger;
  const auto first = ledger.assign(4);
  ledger.hand_out(4, 7);
  ledger.revoke(4);
  const auto second = ledger.assign(4);
  EXPECT_NE(first, second);
  EXPECT_EQ(ledger.done(first, 7), Mark::stale);  // a delivery of the first assignment
  // The next owner (us again) reads from the last commit: 7 comes back, counted from 1.
  EXPECT_EQ(ledger.hand_out(4, 7), second);
  EXPECT_EQ(ledger.delivery_count(second, 7), 1u);
  EXPECT_EQ(ledger.partition_of(second), 4);
  EXPECT_EQ(ledger.done(second, 7), Mark::ok);
  EXPECT_EQ(ledger.committable(4), 8);
}

TEST(CommitLedger, AnOffsetFetchedTwiceIsHandedOutOnce) {
  CommitLedger ledger;
  const auto a = ledger.assign(0);
  EXPECT_TRUE(ledger.hand_out(0, 5));
  EXPECT_TRUE(ledger.hand_out(0, 6));
  EXPECT_FALSE(ledger.hand_out(0, 5));
  EXPECT_FALSE(ledger.hand_out(0, 6));
  ledger.done(a, 5);
  EXPECT_FALSE(ledger.hand_out(0, 5));  // done: not again either
  EXPECT_EQ(ledger.held(), 1u);
}

TEST(CommitLedger, AssignmentIdsAreUniqueAcrossLedgers) {
  CommitLedger one, two;
  EXPECT_NE(one.assign(0), two.assign(0));
  const auto a = one.assign(1);
  one.hand_out(1, 0);
  EXPECT_EQ(two.done(a, 0), Mark::stale);  // another source's delivery
}

// Records.

TEST(KafkaRecords, OutgoingHeadersCarryTheIdAndContentTypeFirst) {
  OutgoingMessage m;
  m.message_id = "pay-1";
  m.content_type = "application/json";
  m.headers = {{"tenant", "acme"}, {"message_id", "forged"}, {"content_type", "text/plain"}, {"trace", "t1"}};
  const auto h = kafka_detail::outgoing_headers(m, "message_id");
  ASSERT_EQ(h.size(), 4u);
  EXPECT_EQ(h[0], (std::pair<std::string_view, std::string_view>{"message_id", "pay-1"}));
  EXPECT_EQ(h[1], (std::pair<std::string_view, std::string_view>{"content_type", "application/json"}));
  EXPECT_EQ(h[2].first, "tenant");
  EXPECT_EQ(h[3].first, "trace");

  OutgoingMessage none;
  none.body = "x";
  EXPECT_TRUE(kafka_detail::outgoing_headers(none, "message_id").empty());  // no id: no id header
}

TEST(KafkaRecords, TheOrderingKeyIsTheRecordKeyAndAHeaderThatNoOtherHeaderDuplicates) {
  OutgoingMessage m;
  m.message_id = "evt-1";
  m.content_type = "application/json";
  m.ordering_key = "pay_7";
  m.headers = {{"ordering_key", "forged"}, {"tenant", "acme"}};
  const auto h = kafka_detail::outgoing_headers(m, "message_id");
  using Header = std::pair<std::string_view, std::string_view>;
  EXPECT_EQ(h, (std::vector<Header>{{"message_id", "evt-1"}, {"content_type", "application/json"}, {"ordering_key", "pay_7"},
                                    {"tenant", "acme"}}));
  EXPECT_EQ(kafka_detail::record_key(m), "pay_7");

  // Without an ordering key: the id is the key, and a header of the name is still not written
  // (the record key would not be it).
  m.ordering_key.clear();
  EXPECT_EQ(kafka_detail::record_key(m), "evt-1");
  EXPECT_EQ(kafka_detail::outgoing_headers(m, "message_id"),
            (std::vector<Header>{{"message_id", "evt-1"}, {"content_type", "application/json"}, {"tenant", "acme"}}));
  m.message_id.clear();
  EXPECT_FALSE(kafka_detail::record_key(m));
}

TEST(KafkaRecords, DecodingTakesTheOrderingKeyFromTheHeaderElseTheRecordKey) {
  kafka_detail::IncomingRecord r;
  r.key = "key-1";
  r.headers = {{"ordering_key", std::nullopt}, {"message_id", "m-1"}, {"ordering_key", "pay_7"}, {"ordering_key", "again"}};
  Delivery d;
  kafka_detail::decode_record(r, "message_id", KafkaIdFrom::header, d);
  EXPECT_EQ(d.ordering_key, "pay_7");  // the first with a value, taken out of the headers like the id
  EXPECT_EQ(d.headers, (MessageHeaders{{"ordering_key", ""}, {"ordering_key", "again"}}));
  kafka_detail::decode_record(r, "message_id", KafkaIdFrom::key, d);
  EXPECT_EQ(d.ordering_key, "pay_7");

  // No header: the record key (a foreign producer keying by aggregate), unless the key is the id.
  kafka_detail::IncomingRecord keyed;
  keyed.key = "order-42";
  keyed.headers = {{"message_id", "evt-9"}};
  kafka_detail::decode_record(keyed, "message_id", KafkaIdFrom::header, d);
  EXPECT_EQ(d.ordering_key, "order-42");
  EXPECT_TRUE(d.headers.empty());
  kafka_detail::decode_record(keyed, "message_id", KafkaIdFrom::key, d);
  EXPECT_EQ(d.message_id, "order-42");
  EXPECT_EQ(d.ordering_key, "");  // the key is the id there
  keyed.key = "evt-9";             // what idem's sink writes for a message without an ordering key
  kafka_detail::decode_record(keyed, "message_id", KafkaIdFrom::header, d);
  EXPECT_EQ(d.ordering_key, "");
  keyed.headers.clear();  // no id at all: the key orders
  kafka_detail::decode_record(keyed, "message_id", KafkaIdFrom::header, d);
  EXPECT_EQ(d.ordering_key, "evt-9");

  // A value that cannot be an ordering key is ignored, never an error; the header still decides.
  for (const std::string& bad : {std::string(), std::string("has space"), std::string(129, 'k'), std::string("caf\xc3\xa9")}) {
    kafka_detail::IncomingRecord odd;
    odd.key = "key-1";
    odd.headers = {{"ordering_key", bad}};
    kafka_detail::decode_record(odd, "message_id", KafkaIdFrom::header, d);
    EXPECT_EQ(d.ordering_key, "") << bad;
    EXPECT_TRUE(d.headers.empty()) << bad;
    odd.headers.clear();
    odd.key = bad;
    kafka_detail::decode_record(odd, "message_id", KafkaIdFrom::header, d);
    EXPECT_EQ(d.ordering_key, "") << bad;
  }
  const std::string longest_key(kMaxOrderingKey, 'k');
  kafka_detail::IncomingRecord longest;
  longest.key = longest_key;
  kafka_detail::decode_record(longest, "message_id", KafkaIdFrom::header, d);
  EXPECT_EQ(d.ordering_key, longest_key);
}

TEST(KafkaRecords, DecodingReadsTheIdFromTheHeaderOrTheKey) {
  kafka_detail::IncomingRecord r;
  r.key = "key-1";
  r.value = "body";
  r.headers = {{"tenant", "acme"}, {"message_id", "hdr-1"}, {"content_type", "application/json"}, {"message_id", "second"},
               {"nulled", std::nullopt}};
  Delivery d;
  kafka_detail::decode_record(r, "message_id", KafkaIdFrom::header, d);
  EXPECT_TRUE(d.has_message_id);
  EXPECT_EQ(d.message_id, "hdr-1");
  EXPECT_EQ(d.content_type, "application/json");
  EXPECT_EQ(d.body, "body");
  EXPECT_EQ(d.headers, (MessageHeaders{{"tenant", "acme"}, {"message_id", "second"}, {"nulled", ""}}));

  kafka_detail::decode_record(r, "message_id", KafkaIdFrom::key, d);
  EXPECT_TRUE(d.has_message_id);
  EXPECT_EQ(d.message_id, "key-1");

  kafka_detail::IncomingRecord bare;
  bare.headers = {{"message_id", std::nullopt}};  // a null id is no id
  kafka_detail::decode_record(bare, "message_id", KafkaIdFrom::header, d);
  EXPECT_FALSE(d.has_message_id);
  EXPECT_TRUE(d.message_id.empty());
  kafka_detail::decode_record(bare, "message_id", KafkaIdFrom::key, d);
  EXPECT_FALSE(d.has_message_id);  // no key

  kafka_detail::IncomingRecord empty_id;
  empty_id.headers = {{"message_id", ""}};  // an empty id is an id (that the loop refuses)
  kafka_detail::decode_record(empty_id, "message_id", KafkaIdFrom::header, d);
  EXPECT_TRUE(d.has_message_id);
}

TEST(KafkaRecords, ADeadLetterCarriesWhyAndDropsOldReasons) {
  Delivery d;
  d.message_id = "pay-1";
  d.has_message_id = true;
  d.content_type = "application/json";
  d.ordering_key = "acct_9";
  d.headers = {{"tenant", "acme"}, {"x-idem-reason", "an old one"}, {"ordering_key", "stale"}};
  const auto h = kafka_detail::dead_letter_headers(d, DeadLetterReason{"poison", "failed 3 times", "handler said no", 3},
                                                   "message_id", {"orders", 2, 41});
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"message_id", "pay-1"},        {"content_type", "application/json"}, {"ordering_key", "acct_9"},
      {"tenant", "acme"},             {"x-idem-reason", "poison"},          {"x-idem-detail", "failed 3 times"},
      {"x-idem-last-error", "handler said no"}, {"x-idem-attempts", "3"},   {"x-idem-source", "orders"},
      {"x-idem-partition", "2"},      {"x-idem-offset", "41"}};
  EXPECT_EQ(h, expected);
}

}  // namespace
}  // namespace idem
