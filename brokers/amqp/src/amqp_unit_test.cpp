// The parts of the AMQP module that need no server: URLs, the error mapping, the multiple-ack
// plan, headers and message assembly.

#include "idem/amqp_broker.hpp"

#include <gtest/gtest.h>

#include <cerrno>

#include "ack_plan.hpp"
#include "errors.hpp"
#include "message.hpp"

namespace idem {
namespace {

using amqp_detail::AckPlan;
using amqp_detail::Failure;
using amqp_detail::map_error;
using amqp_detail::plan_acks;

AmqpUrl source(const std::string& url) {
  auto parsed = parse_amqp_url(url, AmqpUrlRole::source);
  EXPECT_TRUE(parsed) << url << ": " << parsed.error().message;
  return parsed.value_or(AmqpUrl{});
}

AmqpUrl sink(const std::string& url) {
  auto parsed = parse_amqp_url(url, AmqpUrlRole::sink);
  EXPECT_TRUE(parsed) << url << ": " << parsed.error().message;
  return parsed.value_or(AmqpUrl{});
}

// The error for a bad URL: invalid, and it never holds `secret`.
std::string bad(const std::string& url, AmqpUrlRole role = AmqpUrlRole::source, const std::string& secret = "Zq9") {
  auto parsed = parse_amqp_url(url, role);
  EXPECT_FALSE(parsed) << url;
  if (parsed) return {};
  EXPECT_EQ(parsed.error().code, BrokerErrc::invalid) << parsed.error().message;
  EXPECT_EQ(parsed.error().message.find(secret), std::string::npos) << parsed.error().message;
  return parsed.error().message;
}

TEST(AmqpUrl, ASourceUrlWithPercentEncodedCredentialsAndVhost) {
  const auto u = source("amqp://idem:S3cr3t-p%40ss%3Aw%2Frd@broker.example:5673/%2f?queue=orders");
  EXPECT_EQ(u.user, "idem");
  EXPECT_EQ(u.password, "S3cr3t-p@ss:w/rd");
  EXPECT_EQ(u.host, "broker.example");
  EXPECT_EQ(u.port, 5673);
  EXPECT_EQ(u.vhost, "/");
  EXPECT_EQ(u.queue, "orders");
  EXPECT_EQ(u.dead_letter_exchange, "idem.dead-letter");
  EXPECT_EQ(u.dead_letter_queue, "orders.dead-letter");
  EXPECT_TRUE(u.declare);
  EXPECT_EQ(u.heartbeat, std::chrono::seconds(30));
}

TEST(AmqpUrl, DefaultsAndVhosts) {
  auto u = source("amqp://rabbit?queue=q");
  EXPECT_EQ(u.user, "guest");
  EXPECT_EQ(u.password, "guest");
  EXPECT_EQ(u.port, 5672);
  EXPECT_EQ(u.vhost, "/");
  EXPECT_EQ(source("amqp://rabbit/?queue=q").vhost, "/");
  EXPECT_EQ(source("amqp://rabbit/prod?queue=q").vhost, "prod");
  EXPECT_EQ(source("amqp://rabbit/%2Fprod%20eu?queue=q").vhost, "/prod eu");
  EXPECT_EQ(source("amqp:///?queue=q").host, "localhost");
  // Userinfo present: no guest defaults.
  u = source("amqp://alice@rabbit?queue=q");
  EXPECT_EQ(u.user, "alice");
  EXPECT_EQ(u.password, "");
  u = source("amqp://alice:@rabbit?queue=q");
  EXPECT_EQ(u.password, "");
  u = source("amqp://[::1]:5674/v?queue=q");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 5674);
  EXPECT_EQ(source("amqp://u:p@h?queue=a%40b").queue, "a@b");  // '@' in a value is a value
}

TEST(AmqpUrl, SourceParameters) {
  const auto u = source("amqp://h?queue=q&dead_letter_exchange=dlx&dead_letter_queue=parked&declare=false&heartbeat=5");
  EXPECT_EQ(u.dead_letter_exchange, "dlx");
  EXPECT_EQ(u.dead_letter_queue, "parked");
  EXPECT_FALSE(u.declare);
  EXPECT_EQ(u.heartbeat, std::chrono::seconds(5));
  EXPECT_EQ(source("amqp://h?queue=q&heartbeat=0").heartbeat, std::chrono::seconds(0));
  EXPECT_FALSE(u.single_active_consumer);
  EXPECT_TRUE(source("amqp://h?queue=q&single_active_consumer=true").single_active_consumer);
  EXPECT_FALSE(parse_amqp_url("amqp://h?exchange=e&single_active_consumer=true", AmqpUrlRole::sink));
}

TEST(AmqpUrl, SinkParameters) {
  auto u = sink("amqp://h?exchange=payments&routing_key=settled&declare=true");
  EXPECT_EQ(u.exchange, "payments");
  EXPECT_EQ(u.routing_key, "settled");
  u = sink("amqp://h?exchange=&routing_key=orders");
  EXPECT_EQ(u.exchange, "");
  EXPECT_EQ(u.routing_key, "orders");
  EXPECT_EQ(sink("amqp://h").exchange, "");
}

TEST(AmqpUrl, AmqpsIsTlsOnPort5671WithRabbitMQsFileParameters) {
  auto u = source("amqps://idem:Zq9@rabbit.example/%2f?queue=q");
  EXPECT_TRUE(u.tls);
  EXPECT_EQ(u.port, 5671);
  EXPECT_EQ(u.host, "rabbit.example");
  EXPECT_TRUE(u.ca_file.empty());  // the system's trust store
  EXPECT_TRUE(u.cert_file.empty());
  EXPECT_FALSE(source("amqp://rabbit/?queue=q").tls);
  u = sink("amqps://localhost:5679/?exchange=e&cacertfile=%2Fetc%2Fidem%2Fca.pem&certfile=/etc/idem/relay.pem"
           "&keyfile=/etc/idem/relay.key&passphrasefile=/etc/idem/relay.pass");
  EXPECT_TRUE(u.tls);
  EXPECT_EQ(u.port, 5679);
  EXPECT_EQ(u.ca_file, "/etc/idem/ca.pem");
  EXPECT_EQ(u.cert_file, "/etc/idem/relay.pem");
  EXPECT_EQ(u.key_file, "/etc/idem/relay.key");
  EXPECT_EQ(u.key_passphrase_file, "/etc/idem/relay.pass");
  EXPECT_EQ(u.exchange, "e");
  // TLS files on a plain URL, half a pair, a passphrase without a key, an empty path: refused.
  EXPECT_NE(bad("amqp://h?queue=q&cacertfile=/ca.pem").find("cacertfile= is for amqps://"), std::string::npos);
  EXPECT_NE(bad("amqps://h?queue=q&certfile=/c.pem").find("give both or neither"), std::string::npos);
  EXPECT_NE(bad("amqps://h?queue=q&keyfile=/c.key").find("give both or neither"), std::string::npos);
  EXPECT_NE(bad("amqps://h?queue=q&passphrasefile=/p").find("passphrasefile= needs keyfile="), std::string::npos);
  EXPECT_NE(bad("amqps://h?queue=q&cacertfile=").find("needs a file path"), std::string::npos);
  // The password stays out of an amqps:// URL's errors too.
  const auto e = parse_amqp_url("amqps://idem:Zq9secret@h/?queue=q&keyfile=/k", AmqpUrlRole::source);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("amqps://idem:***@h/"), std::string::npos) << e.error().message;
  EXPECT_EQ(e.error().message.find("Zq9secret"), std::string::npos) << e.error().message;
}

TEST(AmqpUrl, BadUrlsAreInvalidAndNameTheProblem) {
  EXPECT_NE(bad("amqp://h?queue=q&prefetch=3").find("unknown parameter prefetch"), std::string::npos);
  EXPECT_NE(bad("amqp://h").find("queue"), std::string::npos);
  EXPECT_NE(bad("amqp://h?queue=q&exchange=x").find("parameter exchange is for sink URLs"), std::string::npos);
  EXPECT_NE(bad("amqp://h?queue=q", AmqpUrlRole::sink).find("parameter queue is for source URLs"), std::string::npos);
  EXPECT_NE(bad("amqp://h?queue=q&queue=r").find("given twice"), std::string::npos);
  EXPECT_NE(bad("amqp://h?queue=q&declare=yes").find("declare=yes"), std::string::npos);
  EXPECT_NE(bad("amqp://h?queue=q&heartbeat=abc").find("heartbeat"), std::string::npos);
  bad("amqp://h?queue=q&heartbeat=-1");
  bad("amqp://h?queue=q&heartbeat=70000");
  EXPECT_NE(bad("amqp://h:0?queue=q").find("bad port"), std::string::npos);
  bad("amqp://h:99999?queue=q");
  bad("amqp://h:5x?queue=q");
  bad("amqp://h:?queue=q");
  bad("http://h?queue=q");
  bad("amqp://h?queue=" + std::string(256, 'q'));
  bad("amqp://h?queue=q&dead_letter_queue=q");
  bad("amqp://h?queue=q&dead_letter_exchange=");
  bad("amqp://h/a/b?queue=q");
  bad("amqp://h/%zz?queue=q");
  bad("amqp://h?queue=q#frag");
}

TEST(AmqpUrl, ErrorsNeverQuoteThePassword) {
  // A stray '%', a raw '/', '?' or a NUL in the password: the error says what to fix, without it.
  EXPECT_NE(bad("amqp://idem:Zq9%zz@h/?queue=q").find("password"), std::string::npos);
  EXPECT_NE(bad("amqp://idem:Zq9/x@h/?queue=q").find("percent-encode"), std::string::npos);
  EXPECT_NE(bad("amqp://idem:Zq9?x@h/?queue=q").find("percent-encode"), std::string::npos);
  bad("amqp://idem:Zq9%00@h/?queue=q");
  bad("amqp://idem:Zq9@h:0/?queue=q");
  const auto e = parse_amqp_url("amqp://idem:Zq9secret@h/?queue=q&nope=1", AmqpUrlRole::source);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("amqp://idem:***@h/"), std::string::npos) << e.error().message;
}

// ---- the error mapping -------------------------------------------------------------------------

Failure library(int status, bool sent = false) {
  Failure f;
  f.kind = Failure::Kind::library;
  f.status = status;
  f.sent = sent;
  f.where = "amqp://idem:***@h:5672/%2f";
  f.user = "idem";
  f.vhost = "/";
  return f;
}

Failure closed(int code, std::string text, bool channel = true, bool during_login = false) {
  Failure f = library(0);
  f.kind = channel ? Failure::Kind::channel_close : Failure::Kind::connection_close;
  f.reply_code = code;
  f.reply_text = std::move(text);
  f.during_login = during_login;
  return f;
}

TEST(AmqpErrors, SocketFailuresAreUnavailableAndRetryable) {
  for (int status : {AMQP_STATUS_CONNECTION_CLOSED, AMQP_STATUS_SOCKET_ERROR, AMQP_STATUS_SOCKET_CLOSED,
                     AMQP_STATUS_HOSTNAME_RESOLUTION_FAILED, AMQP_STATUS_HEARTBEAT_TIMEOUT, AMQP_STATUS_TCP_ERROR}) {
    const auto e = map_error(library(status));
    EXPECT_EQ(e.code, BrokerErrc::unavailable) << status << ": " << e.message;
    EXPECT_TRUE(e.retryable());
    EXPECT_FALSE(e.in_doubt);
    EXPECT_TRUE(map_error(library(status, true)).in_doubt) << "a publish written before the connection broke";
  }
  Failure refused = library(AMQP_STATUS_SOCKET_ERROR);
  refused.sys_errno = ECONNREFUSED;
  refused.doing = "connecting to h:5672";
  const auto e = map_error(refused);
  EXPECT_NE(e.message.find("connecting to h:5672"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("Connection refused"), std::string::npos) << e.message;
  EXPECT_EQ(e.message.rfind("amqp://idem:***@h:5672/%2f: ", 0), 0u) << e.message;
}

TEST(AmqpErrors, TlsFailuresSayWhy) {
  // The broker's certificate not accepted (unknown CA, expired, another host name): refused, an
  // operator's matter, with OpenSSL's reason.
  Failure f = library(AMQP_STATUS_SSL_CONNECTION_FAILED);
  f.doing = "TLS connecting to h:5671";
  f.tls_verify_failed = true;
  f.tls_detail = "certificate verify failed: hostname mismatch (certificate /CN=other.example)";
  auto e = map_error(f);
  EXPECT_EQ(e.code, BrokerErrc::refused) << e.message;
  EXPECT_FALSE(e.retryable());
  EXPECT_NE(e.message.find("TLS: RabbitMQ's certificate was not accepted: certificate verify failed: hostname mismatch"),
            std::string::npos)
      << e.message;
  EXPECT_NE(e.message.find("TLS connecting to h:5671"), std::string::npos) << e.message;
  // Any other failed handshake (a plain port, our certificate refused): unavailable, retried.
  for (int status : {AMQP_STATUS_SSL_ERROR, AMQP_STATUS_SSL_CONNECTION_FAILED}) {
    Failure g = library(status);
    g.tls_detail = "wrong version number";
    e = map_error(g);
    EXPECT_EQ(e.code, BrokerErrc::unavailable) << e.message;
    EXPECT_NE(e.message.find("TLS handshake with RabbitMQ failed: wrong version number"), std::string::npos) << e.message;
  }
  // A key file other users can read, a CA file that is no PEM: invalid, the message as given.
  Failure files = library(0);
  files.kind = Failure::Kind::tls_files;
  files.reply_text = "/k.pem: the key file (keyfile=)'s mode 0644 lets other users read or change it";
  e = map_error(files);
  EXPECT_EQ(e.code, BrokerErrc::invalid);
  EXPECT_NE(e.message.find("mode 0644"), std::string::npos) << e.message;
}

TEST(AmqpErrors, TimeoutsAreTimeoutsInDoubtForPublishes) {
  EXPECT_EQ(map_error(library(AMQP_STATUS_TIMEOUT)).code, BrokerErrc::timeout);
  EXPECT_FALSE(map_error(library(AMQP_STATUS_TIMEOUT)).in_doubt);
  EXPECT_TRUE(map_error(library(AMQP_STATUS_TIMEOUT, true)).in_doubt);
}

TEST(AmqpErrors, LibraryOddities) {
  EXPECT_EQ(map_error(library(AMQP_STATUS_TABLE_TOO_BIG)).code, BrokerErrc::rejected);
  EXPECT_EQ(map_error(library(AMQP_STATUS_BROKER_UNSUPPORTED_SASL_METHOD)).code, BrokerErrc::refused);
  for (int status : {AMQP_STATUS_BAD_AMQP_DATA, AMQP_STATUS_UNEXPECTED_STATE, AMQP_STATUS_WRONG_METHOD, AMQP_STATUS_NO_MEMORY,
                     AMQP_STATUS_INCOMPATIBLE_AMQP_VERSION}) {
    EXPECT_EQ(map_error(library(status)).code, BrokerErrc::internal) << status;
  }
}

TEST(AmqpErrors, AFailedLoginIsRefusedWithASentenceAndNoPassword) {
  const auto e = map_error(closed(AMQP_ACCESS_REFUSED,
                                  "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the "
                                  "broker logfile.",
                                  false, true));
  EXPECT_EQ(e.code, BrokerErrc::refused);
  EXPECT_FALSE(e.retryable());
  EXPECT_NE(e.message.find("RabbitMQ refused the login for user idem: check the user and password"), std::string::npos) << e.message;
}

TEST(AmqpErrors, PermissionsVhostsAndMissingThingsAreRefused) {
  auto e = map_error(closed(AMQP_ACCESS_REFUSED, "ACCESS_REFUSED - access to vhost '/' refused for user 'idem'", false, true));
  EXPECT_EQ(e.code, BrokerErrc::refused);
  EXPECT_NE(e.message.find("access to vhost /"), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find("password"), std::string::npos) << "a right password is not the problem: " << e.message;
  e = map_error(closed(AMQP_ACCESS_REFUSED, "ACCESS_REFUSED - access to queue 'q' in vhost '/' refused for user 'idem'"));
  EXPECT_EQ(e.code, BrokerErrc::refused);
  e = map_error(closed(AMQP_NOT_ALLOWED, "NOT_ALLOWED - vhost nope not found", false, true));
  EXPECT_EQ(e.code, BrokerErrc::refused);
  EXPECT_NE(e.message.find("has no vhost"), std::string::npos) << e.message;
  e = map_error(closed(AMQP_NOT_FOUND, "NOT_FOUND - no queue 'q' in vhost '/'"));
  EXPECT_EQ(e.code, BrokerErrc::refused);
  EXPECT_NE(e.message.find("no queue 'q'"), std::string::npos);
  e = map_error(closed(AMQP_PRECONDITION_FAILED, "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q'"));
  EXPECT_EQ(e.code, BrokerErrc::refused);
  EXPECT_NE(e.message.find("other arguments"), std::string::npos);
  EXPECT_EQ(map_error(closed(AMQP_RESOURCE_LOCKED, "RESOURCE_LOCKED - cannot obtain exclusive access")).code, BrokerErrc::refused);
}

TEST(AmqpErrors, MessagesTooLargeAreRejected) {
  Failure f = closed(AMQP_PRECONDITION_FAILED, "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1024");
  f.sent = true;
  const auto e = map_error(f);
  EXPECT_EQ(e.code, BrokerErrc::rejected);
  EXPECT_FALSE(e.in_doubt) << "refused for sure: not in doubt";
  EXPECT_EQ(map_error(closed(AMQP_CONTENT_TOO_LARGE, "CONTENT_TOO_LARGE")).code, BrokerErrc::rejected);
  EXPECT_EQ(map_error(closed(AMQP_FRAME_ERROR, "FRAME_ERROR - type 3: {frame_too_large,140000,131064}", false)).code,
            BrokerErrc::rejected);
  EXPECT_EQ(map_error(closed(AMQP_FRAME_ERROR, "FRAME_ERROR - bad frame", false)).code, BrokerErrc::internal);
}

TEST(AmqpErrors, BrokerShutdownIsUnavailableAndProtocolErrorsInternal) {
  EXPECT_EQ(map_error(closed(AMQP_CONNECTION_FORCED, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'", false)).code,
            BrokerErrc::unavailable);
  EXPECT_EQ(map_error(closed(AMQP_RESOURCE_ERROR, "RESOURCE_ERROR")).code, BrokerErrc::unavailable);
  EXPECT_EQ(map_error(closed(AMQP_INTERNAL_ERROR, "INTERNAL_ERROR", false)).code, BrokerErrc::internal);
  EXPECT_EQ(map_error(closed(503, "COMMAND_INVALID - unknown delivery tag 7")).code, BrokerErrc::internal);
  Failure p = library(0);
  p.kind = Failure::Kind::protocol;
  EXPECT_EQ(map_error(p).code, BrokerErrc::internal);
  Failure h = library(0);
  h.kind = Failure::Kind::heartbeat;
  EXPECT_EQ(map_error(h).code, BrokerErrc::unavailable);
  Failure c = library(0);
  c.kind = Failure::Kind::cancelled;
  EXPECT_EQ(map_error(c).code, BrokerErrc::unavailable);
}

TEST(AmqpErrors, ReturnsAndNacksAreRejected) {
  Failure r = library(0);
  r.kind = Failure::Kind::returned;
  r.reply_code = AMQP_NO_ROUTE;
  r.reply_text = "NO_ROUTE";
  r.routing_key = "orders";
  auto e = map_error(r);
  EXPECT_EQ(e.code, BrokerErrc::rejected);
  EXPECT_NE(e.message.find("no queue is bound for routing key \"orders\" on the default exchange"), std::string::npos) << e.message;
  Failure n = library(0);
  n.kind = Failure::Kind::nacked;
  n.sent = true;
  e = map_error(n);
  EXPECT_EQ(e.code, BrokerErrc::rejected);
  EXPECT_FALSE(e.in_doubt);
}

// ---- multiple acks -----------------------------------------------------------------------------

AckPlan plan(std::set<std::uint64_t> outstanding, std::vector<std::uint64_t> tags) { return plan_acks(outstanding, std::move(tags)); }

TEST(AmqpAckPlan, AContiguousRunFromTheLowestGoesAsOneMultipleAck) {
  auto p = plan({1, 2, 3}, {1, 2, 3});
  EXPECT_EQ(p.multiple_up_to, 3u);
  EXPECT_TRUE(p.singles.empty());
  p = plan({1, 2, 3}, {3, 1, 2, 2});  // any order, duplicates
  EXPECT_EQ(p.multiple_up_to, 3u);
  EXPECT_TRUE(p.singles.empty());
  p = plan({1, 2, 3, 4}, {1, 2});
  EXPECT_EQ(p.multiple_up_to, 2u);
  EXPECT_TRUE(p.singles.empty());
  // Gaps left by earlier acks do not matter: the run is over what is outstanding.
  p = plan({4, 7, 9}, {4, 7});
  EXPECT_EQ(p.multiple_up_to, 7u);
  EXPECT_TRUE(p.singles.empty());
  p = plan({4, 7, 9, 10}, {10, 4, 7});
  EXPECT_EQ(p.multiple_up_to, 7u);
  EXPECT_EQ(p.singles, (std::vector<std::uint64_t>{10}));
}

TEST(AmqpAckPlan, AnythingElseGoesOneByOne) {
  auto p = plan({1, 2, 3}, {1, 3});  // 2 is still held: a multiple ack of 3 would ack it
  EXPECT_FALSE(p.multiple_up_to);
  EXPECT_EQ(p.singles, (std::vector<std::uint64_t>{1, 3}));
  p = plan({1, 2, 3}, {2, 3});  // 1 is still held
  EXPECT_FALSE(p.multiple_up_to);
  EXPECT_EQ(p.singles, (std::vector<std::uint64_t>{2, 3}));
  p = plan({1, 2, 3}, {1});
  EXPECT_FALSE(p.multiple_up_to);
  EXPECT_EQ(p.singles, (std::vector<std::uint64_t>{1}));
}

TEST(AmqpAckPlan, TagsNotOutstandingAreLeftOut) {
  auto p = plan({1, 2}, {5});
  EXPECT_FALSE(p.multiple_up_to);
  EXPECT_TRUE(p.singles.empty());
  p = plan({2, 3}, {1, 2, 3});  // 1 was acked before
  EXPECT_EQ(p.multiple_up_to, 3u);
  EXPECT_TRUE(p.singles.empty());
  p = plan({}, {1});
  EXPECT_TRUE(p.singles.empty());
}

// ---- headers, content, properties --------------------------------------------------------------

amqp_field_value_t utf8(const char* s) {
  amqp_field_value_t v{};
  v.kind = AMQP_FIELD_KIND_UTF8;
  v.value.bytes = amqp_cstring_bytes(s);
  return v;
}

TEST(AmqpHeaders, StringsAsTheyAreOthersAsText) {
  amqp_field_value_t items[3] = {utf8("a\"b"), {}, {}};
  items[1].kind = AMQP_FIELD_KIND_I8;
  items[1].value.i8 = -3;
  items[2].kind = AMQP_FIELD_KIND_VOID;
  amqp_table_entry_t inner[1];
  inner[0].key = amqp_cstring_bytes("k");
  inner[0].value.kind = AMQP_FIELD_KIND_BOOLEAN;
  inner[0].value.value.boolean = 0;
  amqp_table_entry_t e[9]{};
  const char* keys[9] = {"s", "i", "u", "b", "d", "dec", "arr", "tbl", "small"};
  for (int i = 0; i < 9; ++i) e[i].key = amqp_cstring_bytes(keys[i]);
  e[0].value = utf8("héllo");
  e[1].value.kind = AMQP_FIELD_KIND_I64;
  e[1].value.value.i64 = -9000000000;
  e[2].value.kind = AMQP_FIELD_KIND_U32;
  e[2].value.value.u32 = 4000000000u;
  e[3].value.kind = AMQP_FIELD_KIND_BOOLEAN;
  e[3].value.value.boolean = 1;
  e[4].value.kind = AMQP_FIELD_KIND_F64;
  e[4].value.value.f64 = 2.5;
  e[5].value.kind = AMQP_FIELD_KIND_DECIMAL;
  e[5].value.value.decimal = amqp_decimal_t{3, 5};
  e[6].value.kind = AMQP_FIELD_KIND_ARRAY;
  e[6].value.value.array = amqp_array_t{3, items};
  e[7].value.kind = AMQP_FIELD_KIND_TABLE;
  e[7].value.value.table = amqp_table_t{1, inner};
  e[8].value.kind = AMQP_FIELD_KIND_U8;
  e[8].value.value.u8 = 200;
  const auto headers = amqp_detail::headers_from_table(amqp_table_t{9, e});
  const MessageHeaders want = {{"s", "héllo"},  {"i", "-9000000000"},         {"u", "4000000000"},
                               {"b", "true"},   {"d", "2.5"},                 {"dec", "0.005"},
                               {"arr", R"(["a\"b",-3,null])"}, {"tbl", R"({"k":false})"}, {"small", "200"}};
  EXPECT_EQ(headers, want);
}

TEST(AmqpHeaders, IntegersOfAnyKind) {
  amqp_field_value_t v{};
  v.kind = AMQP_FIELD_KIND_I16;
  v.value.i16 = 3;
  EXPECT_EQ(amqp_detail::integer_of(v), 3);
  v.kind = AMQP_FIELD_KIND_U64;
  v.value.u64 = 7;
  EXPECT_EQ(amqp_detail::integer_of(v), 7);
  EXPECT_EQ(amqp_detail::integer_of(utf8("12")), 12);
  EXPECT_FALSE(amqp_detail::integer_of(utf8("12x")));
  v.kind = AMQP_FIELD_KIND_BOOLEAN;
  EXPECT_FALSE(amqp_detail::integer_of(v));
}

amqp_frame_t method_frame(amqp_method_number_t id, void* decoded) {
  amqp_frame_t f{};
  f.frame_type = AMQP_FRAME_METHOD;
  f.channel = 1;
  f.payload.method.id = id;
  f.payload.method.decoded = decoded;
  return f;
}

amqp_frame_t header_frame(amqp_basic_properties_t* props, std::uint64_t size) {
  amqp_frame_t f{};
  f.frame_type = AMQP_FRAME_HEADER;
  f.channel = 1;
  f.payload.properties.class_id = AMQP_BASIC_CLASS;
  f.payload.properties.body_size = size;
  f.payload.properties.decoded = props;
  return f;
}

amqp_frame_t body_frame(const char* part) {
  amqp_frame_t f{};
  f.frame_type = AMQP_FRAME_BODY;
  f.channel = 1;
  f.payload.body_fragment = amqp_cstring_bytes(part);
  return f;
}

TEST(AmqpAssembler, PutsADeliveryBackTogether) {
  using Step = amqp_detail::Assembler::Step;
  amqp_detail::Assembler a;
  amqp_basic_deliver_t deliver{};
  deliver.delivery_tag = 42;
  deliver.redelivered = 1;
  amqp_table_entry_t h[2]{};
  h[0].key = amqp_cstring_bytes("x-delivery-count");
  h[0].value.kind = AMQP_FIELD_KIND_I64;
  h[0].value.value.i64 = 2;
  h[1].key = amqp_cstring_bytes("x-idem-message-id");
  h[1].value = utf8("a-long-id");
  amqp_basic_properties_t props{};
  props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_HEADERS_FLAG;
  props.content_type = amqp_cstring_bytes("text/plain");
  props.headers = amqp_table_t{2, h};
  EXPECT_EQ(a.feed(method_frame(AMQP_BASIC_DELIVER_METHOD, &deliver)), Step::more);
  EXPECT_EQ(a.feed(header_frame(&props, 10)), Step::more);
  EXPECT_EQ(a.feed(body_frame("hello")), Step::more);
  EXPECT_EQ(a.feed(body_frame("world")), Step::complete);
  const auto in = a.take();
  EXPECT_EQ(in.delivery_tag, 42u);
  EXPECT_TRUE(in.redelivered);
  EXPECT_EQ(in.content_type, "text/plain");
  EXPECT_EQ(in.body, "helloworld");
  EXPECT_EQ(in.x_delivery_count, 2);
  EXPECT_TRUE(in.has_message_id);
  EXPECT_EQ(in.message_id, "a-long-id");
  EXPECT_EQ(in.headers, (MessageHeaders{{"x-delivery-count", "2"}})) << "the transport header is not the producer's";
  // An empty body ends at the header; a method that is not content is the caller's.
  amqp_basic_properties_t none{};
  EXPECT_EQ(a.feed(method_frame(AMQP_BASIC_DELIVER_METHOD, &deliver)), Step::more);
  EXPECT_EQ(a.feed(header_frame(&none, 0)), Step::complete);
  EXPECT_FALSE(a.take().has_message_id);
  amqp_basic_ack_t ack{};
  EXPECT_EQ(a.feed(method_frame(AMQP_BASIC_ACK_METHOD, &ack)), Step::other);
}

// The ordering_key header of the delivery `entries` make up, and what is left of its headers.
amqp_detail::Incoming delivered_with(amqp_table_t headers) {
  amqp_detail::Assembler a;
  amqp_basic_deliver_t deliver{};
  amqp_basic_properties_t props{};
  props._flags = AMQP_BASIC_HEADERS_FLAG;
  props.headers = headers;
  EXPECT_EQ(a.feed(method_frame(AMQP_BASIC_DELIVER_METHOD, &deliver)), amqp_detail::Assembler::Step::more);
  EXPECT_EQ(a.feed(header_frame(&props, 0)), amqp_detail::Assembler::Step::complete);
  return a.take();
}

TEST(AmqpAssembler, TheOrderingKeyHeaderIsTakenOutOfTheHeaders) {
  amqp_table_entry_t h[3]{};
  h[0].key = amqp_cstring_bytes("tenant");
  h[0].value = utf8("acme");
  h[1].key = amqp_cstring_bytes("ordering_key");
  h[1].value = utf8("pay_7");
  h[2].key = amqp_cstring_bytes("ordering_key");
  h[2].value = utf8("second");
  auto in = delivered_with(amqp_table_t{3, h});
  EXPECT_EQ(in.ordering_key, "pay_7");
  EXPECT_EQ(in.headers, (MessageHeaders{{"tenant", "acme"}}));

  // A foreign producer's numeric aggregate id is a key, as text.
  h[1].value.kind = AMQP_FIELD_KIND_I64;
  h[1].value.value.i64 = 42;
  EXPECT_EQ(delivered_with(amqp_table_t{2, h}).ordering_key, "42");

  // A value that is no ordering key is ignored (and still not a header of the message's).
  for (const char* bad : {"", "has space", "caf\xc3\xa9"}) {
    h[1].value = utf8(bad);
    in = delivered_with(amqp_table_t{2, h});
    EXPECT_EQ(in.ordering_key, "") << bad;
    EXPECT_EQ(in.headers, (MessageHeaders{{"tenant", "acme"}})) << bad;
  }
  const std::string too_long(kMaxOrderingKey + 1, 'k');
  h[1].value = utf8(too_long.c_str());
  EXPECT_EQ(delivered_with(amqp_table_t{2, h}).ordering_key, "");
  EXPECT_EQ(delivered_with(amqp_table_t{1, h}).ordering_key, "");  // none at all
}

TEST(AmqpAssembler, FramesOutOfOrderAreProtocolErrors) {
  amqp_detail::Assembler a;
  amqp_basic_properties_t props{};
  auto r = a.feed(header_frame(&props, 3));
  ASSERT_FALSE(r);
  EXPECT_EQ(map_error(r.error()).code, BrokerErrc::internal);
  EXPECT_FALSE(a.feed(body_frame("x")));
  amqp_basic_deliver_t deliver{};
  ASSERT_TRUE(a.feed(method_frame(AMQP_BASIC_DELIVER_METHOD, &deliver)));
  ASSERT_TRUE(a.feed(header_frame(&props, 3)));
  EXPECT_FALSE(a.feed(body_frame("toolong"))) << "a body longer than announced";
  ASSERT_TRUE(a.feed(method_frame(AMQP_BASIC_DELIVER_METHOD, &deliver)));  // reset by the error
  EXPECT_FALSE(a.feed(method_frame(AMQP_BASIC_DELIVER_METHOD, &deliver))) << "a deliver inside a message";
}

TEST(AmqpOutgoing, WhatCannotBePublishedIsSaidBeforeSending) {
  amqp_detail::Outgoing m;
  m.routing_key = "q";
  m.message_id = "id-1";
  EXPECT_FALSE(amqp_detail::unpublishable(m, 131072));
  const std::string long_id(256, 'i');
  m.message_id = long_id;
  EXPECT_FALSE(amqp_detail::unpublishable(m, 131072)) << "a long id goes in a header";
  const std::string long_name(256, 'n');
  m.routing_key = long_name;
  EXPECT_TRUE(amqp_detail::unpublishable(m, 131072));
  m.routing_key = "q";
  m.headers.push_back({long_name, "v", std::nullopt});
  EXPECT_TRUE(amqp_detail::unpublishable(m, 131072));
  m.headers.clear();
  const std::string big(200000, 'v');
  m.headers.push_back({"big", big, std::nullopt});
  const auto why = amqp_detail::unpublishable(m, 131072);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("one AMQP frame"), std::string::npos);

  m.headers.clear();
  m.message_id = "id-1";
  EXPECT_FALSE(amqp_detail::unpublishable(m, 150));
  const std::string longest(kMaxOrderingKey, 'k');
  m.ordering_key = longest;
  EXPECT_FALSE(amqp_detail::unpublishable(m, 131072));
  EXPECT_TRUE(amqp_detail::unpublishable(m, 150)) << "the ordering key's header counts in the frame";
  const std::string too_long(kMaxOrderingKey + 1, 'k');
  for (const std::string& bad : {std::string("has space"), too_long, std::string("caf\xc3\xa9")}) {
    m.ordering_key = bad;
    const auto refused = amqp_detail::unpublishable(m, 131072);
    ASSERT_TRUE(refused) << bad;
    EXPECT_NE(refused->find("ordering key"), std::string::npos) << *refused;
  }
}

TEST(AmqpOutgoing, PropertiesArePersistentAndCarryLongIdsInAHeader) {
  amqp_detail::Outgoing m;
  m.message_id = "short";
  m.content_type = "application/json";
  m.headers.push_back({"a", "1", std::nullopt});
  m.headers.push_back({"n", "", 5});
  {
    amqp_detail::Properties p(m);
    const auto* props = p.get();
    EXPECT_EQ(props->delivery_mode, 2);
    EXPECT_TRUE(props->_flags & AMQP_BASIC_MESSAGE_ID_FLAG);
    EXPECT_EQ(amqp_detail::string_of(props->message_id), "short");
    EXPECT_EQ(amqp_detail::string_of(props->content_type), "application/json");
    ASSERT_EQ(props->headers.num_entries, 2);
    EXPECT_EQ(props->headers.entries[1].value.kind, AMQP_FIELD_KIND_I64);
    EXPECT_EQ(props->headers.entries[1].value.value.i64, 5);
  }
  const std::string long_id(256, 'i');
  m.message_id = long_id;
  amqp_detail::Properties p(m);
  EXPECT_FALSE(p.get()->_flags & AMQP_BASIC_MESSAGE_ID_FLAG);
  ASSERT_EQ(p.get()->headers.num_entries, 3);
  EXPECT_EQ(amqp_detail::string_of(p.get()->headers.entries[2].key), "x-idem-message-id");
  EXPECT_EQ(amqp_detail::string_of(p.get()->headers.entries[2].value.value.bytes), long_id);
  m.message_id = "";
  EXPECT_FALSE(amqp_detail::Properties(m).get()->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) << "no id: no property";
}

TEST(AmqpOutgoing, TheOrderingKeyIsAHeaderNoneOfTheMessagesOwnDuplicates) {
  amqp_detail::Outgoing m;
  m.message_id = "evt-1";
  m.ordering_key = "pay_7";
  m.headers.push_back({"ordering_key", "a user's", std::nullopt});
  m.headers.push_back({"a", "1", std::nullopt});
  const auto table = [](const amqp_detail::Properties& p) {
    MessageHeaders out;
    for (int i = 0; i < p.get()->headers.num_entries; ++i) {
      const auto& e = p.get()->headers.entries[i];
      out.emplace_back(amqp_detail::string_of(e.key), amqp_detail::string_of(e.value.value.bytes));
    }
    return out;
  };
  EXPECT_EQ(table(amqp_detail::Properties(m)), (MessageHeaders{{"a", "1"}, {"ordering_key", "pay_7"}}));
  m.ordering_key = "";  // none: a header of the name is still not written (it would pose as one)
  EXPECT_EQ(table(amqp_detail::Properties(m)), (MessageHeaders{{"a", "1"}}));
}

}  // namespace
}  // namespace idem
