// Server-free tests of the Redis Streams broker: URLs (good and bad), the entry encoding with
// arbitrary bytes, entry ids and reply shapes, the one error mapping, the settings checks, and
// the sink against a scripted fake server that drops its connection mid-batch.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "endpoint.hpp"
#include "entry_codec.hpp"
#include "errors.hpp"
#include "idem/redis_stream_broker.hpp"
#include "idem/redis_wire/failure.hpp"
#include "idem/testing/loopback_listener.hpp"

namespace idem::redis_streams {
namespace {

using redis_detail::Failure;
using redis_detail::Reply;

constexpr std::string_view kSecret = "Sup3r-S3cret-pw";

// ---- URLs ---------------------------------------------------------------------------------------

TEST(StreamUrl, SourceWithEverything) {
  auto u = parse_redis_stream_url(
      "redis+stream://app:p%40ss@cache.internal:6380/orders%3Aeu?group=billing&db=3&dead_letter=orders%3Adlq&start=%24",
      RedisStreamRole::source);
  ASSERT_TRUE(u) << u.error().message;
  EXPECT_EQ(u->host, "cache.internal");
  EXPECT_EQ(u->port, 6380);
  EXPECT_EQ(u->user, "app");
  EXPECT_EQ(u->password, "p@ss");
  EXPECT_EQ(u->stream, "orders:eu");
  EXPECT_EQ(u->group, "billing");
  EXPECT_EQ(u->db, 3);
  EXPECT_EQ(u->dead_letter, "orders:dlq");
  EXPECT_EQ(u->start, "$");
  EXPECT_FALSE(u->maxlen);
}

TEST(StreamUrl, SourceDefaults) {
  auto u = parse_redis_stream_url("redis+stream://127.0.0.1/events?group=g", RedisStreamRole::source);
  ASSERT_TRUE(u) << u.error().message;
  EXPECT_EQ(u->port, 6379);
  EXPECT_EQ(u->db, 0);
  EXPECT_EQ(u->dead_letter, "events:dead-letter");
  EXPECT_EQ(u->start, "0");  // entries published before the first consumer are delivered
  EXPECT_TRUE(u->user.empty());
  EXPECT_TRUE(u->password.empty());
}

TEST(StreamUrl, ALoneUserinfoIsThePasswordAndARawAtBelongsToIt) {
  auto lone = parse_redis_stream_url("redis+stream://s%3Acret@h:1/s?group=g", RedisStreamRole::source);
  ASSERT_TRUE(lone) << lone.error().message;
  EXPECT_EQ(lone->user, "");
  EXPECT_EQ(lone->password, "s:cret");
  auto empty_user = parse_redis_stream_url("redis+stream://:pw@h:1/s?group=g", RedisStreamRole::source);
  ASSERT_TRUE(empty_user);
  EXPECT_EQ(empty_user->password, "pw");
  auto raw_at = parse_redis_stream_url("redis+stream://u:a@b@h:1/s?group=g", RedisStreamRole::source);
  ASSERT_TRUE(raw_at);
  EXPECT_EQ(raw_at->password, "a@b");
  EXPECT_EQ(raw_at->host, "h");
}

TEST(StreamUrl, SinkWithMaxlenAndIpv6) {
  auto u = parse_redis_stream_url("redis+stream://[::1]:7000/out?maxlen=100000&db=1", RedisStreamRole::sink);
  ASSERT_TRUE(u) << u.error().message;
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 7000);
  EXPECT_EQ(u->stream, "out");
  ASSERT_TRUE(u->maxlen);
  EXPECT_EQ(*u->maxlen, 100000u);
  EXPECT_EQ(u->db, 1);
  auto plain = parse_redis_stream_url("redis+stream://h/out", RedisStreamRole::sink);
  ASSERT_TRUE(plain);
  EXPECT_FALSE(plain->maxlen);
}

TEST(StreamUrl, BadUrlsAreInvalidSayWhyAndNeverQuoteThePassword) {
  const std::string auth = "redis+stream://app:" + std::string(kSecret) + "@h:6379";
  struct Case {
    std::string url;
    RedisStreamRole role;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"redis://h/s?group=g", RedisStreamRole::source, "redis+stream://"},
      {"rediss+stream://h/s?group=g", RedisStreamRole::source, "TLS"},
      {auth, RedisStreamRole::source, "missing /STREAM"},
      {auth + "/", RedisStreamRole::source, "missing stream name"},
      {auth + "/s", RedisStreamRole::source, "group"},
      {auth + "/s?group=", RedisStreamRole::source, "group is empty"},
      {auth + "/s?group=g&colour=blue", RedisStreamRole::source, "unknown parameter 'colour'"},
      {auth + "/s?group=g&password=x", RedisStreamRole::source, "unknown parameter 'password'"},
      {auth + "/s?group=g&group=h", RedisStreamRole::source, "given twice"},
      {auth + "/s?group=g&db=-1", RedisStreamRole::source, "db"},
      {auth + "/s?group=g&db=x", RedisStreamRole::source, "db"},
      {auth + "/s?group=g&start=1-0", RedisStreamRole::source, "start must be"},
      {auth + "/s?group=g&maxlen=5", RedisStreamRole::source, "'maxlen' is for a sink"},
      {auth + "/s?group=g&dead_letter=s", RedisStreamRole::source, "dead_letter names the stream itself"},
      {auth + "/s?group=g&flag", RedisStreamRole::source, "'flag' has no value"},
      {auth + "/s?group=%zz", RedisStreamRole::source, "percent-escape in parameter 'group'"},
      {auth + "/s?maxlen=0", RedisStreamRole::sink, "maxlen must be"},
      {auth + "/s?maxlen=ten", RedisStreamRole::sink, "maxlen must be"},
      {auth + "/s?group=g", RedisStreamRole::sink, "'group' is for a source"},
      {auth + "/s?start=0", RedisStreamRole::sink, "'start' is for a source"},
      {"redis+stream://app:" + std::string(kSecret) + "@h:99999/s?group=g", RedisStreamRole::source, "bad port"},
      {"redis+stream://app:" + std::string(kSecret) + "@:1/s?group=g", RedisStreamRole::source, "missing host"},
      {"redis+stream://app:" + std::string(kSecret) + "%4@h/s?group=g", RedisStreamRole::source, "percent-escape"},
      {"redis+stream://app:@h/s?group=g", RedisStreamRole::source, "empty password"},
      {"redis+stream://app:" + std::string(kSecret) + "@h/%2/?group=g", RedisStreamRole::source, "stream name"},
  };
  for (const auto& c : cases) {
    auto u = parse_redis_stream_url(c.url, c.role);
    ASSERT_FALSE(u) << c.url;
    EXPECT_EQ(u.error().code, BrokerErrc::invalid) << c.url;
    EXPECT_NE(u.error().message.find(c.says), std::string::npos) << c.url << " -> " << u.error().message;
    EXPECT_EQ(u.error().message.find(kSecret), std::string::npos) << c.url << " -> " << u.error().message;
    EXPECT_FALSE(u.error().retryable());
  }
}

// ---- the entry encoding -----------------------------------------------------------------------

// The field list Redis would return for an XADD's field arguments (everything after "*").
std::vector<Reply> as_entry(const std::vector<std::string>& args) {
  std::vector<Reply> fields;
  bool past_id = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (!past_id) {
      past_id = args[i] == "*";
      continue;
    }
    Reply r;
    r.type = Reply::Type::string;
    r.str = args[i];
    fields.push_back(std::move(r));
  }
  return fields;
}

std::string random_bytes(std::mt19937& random, std::size_t max_len) {
  std::string s(random() % (max_len + 1), '\0');
  for (char& c : s) c = static_cast<char>(random() % 256);
  return s;
}

TEST(StreamEntryCodec, HeadersAndBodiesOfArbitraryBytesRoundTrip) {
  std::mt19937 random(20260407);  // seeded: the same cases every run
  for (int round = 0; round < 500; ++round) {
    OutgoingMessage m;
    m.message_id = "id-" + std::to_string(round) + random_bytes(random, 8);
    m.content_type = round % 3 == 0 ? "" : random_bytes(random, 20);
    m.body = random_bytes(random, 300);
    const std::size_t n = random() % 6;
    for (std::size_t i = 0; i < n; ++i) m.headers.emplace_back(random_bytes(random, 12), random_bytes(random, 40));
    std::vector<std::string> args{"XADD", "s", "*"};
    append_fields(m, args);
    Delivery d;
    ASSERT_TRUE(decode_fields(as_entry(args), d));
    EXPECT_TRUE(d.has_message_id);
    EXPECT_EQ(d.message_id, m.message_id);
    EXPECT_EQ(d.content_type, m.content_type);
    EXPECT_EQ(d.body, m.body);
    EXPECT_EQ(d.headers, m.headers) << "round " << round;
  }
}

TEST(StreamEntryCodec, NamesThatLookLikeTheEncodingAndRepeatsSurvive) {
  OutgoingMessage m;
  m.message_id = "m-1";
  m.content_type = "text/plain";
  m.headers = {{"body", "not the body"},
               {"message_id", "not the id"},
               {"h:x", "prefixed already"},
               {"", "empty name"},
               {"dup", "1"},
               {"dup", "2"},
               {"crlf\r\n", std::string("nul\0inside", 10)}};
  m.body = std::string("\0\xff\r\n", 4);
  std::vector<std::string> args{"XADD", "s", "*"};
  append_fields(m, args);
  // The documented field names, in order: message_id, content_type, h:NAME..., body.
  ASSERT_GE(args.size(), 7u);
  EXPECT_EQ(args[3], "message_id");
  EXPECT_EQ(args[5], "content_type");
  EXPECT_EQ(args[7], "h:body");
  EXPECT_EQ(args[args.size() - 2], "body");
  Delivery d;
  ASSERT_TRUE(decode_fields(as_entry(args), d));
  EXPECT_EQ(d.message_id, "m-1");
  EXPECT_EQ(d.body, m.body);
  EXPECT_EQ(d.headers, m.headers);
}

TEST(StreamEntryCodec, AnEmptyIdIsNoIdAndADeliveryKeepsWhichItWas) {
  OutgoingMessage m;
  m.body = "b";
  std::vector<std::string> args{"XADD", "s", "*"};
  append_fields(m, args);
  EXPECT_EQ(args, (std::vector<std::string>{"XADD", "s", "*", "body", "b"}));
  Delivery d;
  ASSERT_TRUE(decode_fields(as_entry(args), d));
  EXPECT_FALSE(d.has_message_id);
  EXPECT_EQ(d.message_id, "");

  // A delivery with an empty (present) id is copied with its empty id: has_message_id holds.
  Delivery with_empty;
  with_empty.has_message_id = true;
  with_empty.body = "b";
  std::vector<std::string> copy{"XADD", "dl", "*"};
  append_fields(with_empty, copy);
  Delivery back;
  ASSERT_TRUE(decode_fields(as_entry(copy), back));
  EXPECT_TRUE(back.has_message_id);
  EXPECT_EQ(back.message_id, "");
}

TEST(StreamEntryCodec, ForeignFieldsBecomeHeadersAndTheFirstOfEachFieldCounts) {
  Delivery d;
  ASSERT_TRUE(decode_fields(as_entry({"*", "order", "42", "body", "first", "body", "second", "message_id", "a",
                                      "message_id", "b", "reason", "poison"}),
                            d));
  EXPECT_TRUE(d.has_message_id);
  EXPECT_EQ(d.message_id, "a");
  EXPECT_EQ(d.body, "first");
  EXPECT_EQ(d.headers,
            (MessageHeaders{{"order", "42"}, {"body", "second"}, {"message_id", "b"}, {"reason", "poison"}}));
}

TEST(StreamEntryCodec, TheOrderingKeyIsAFieldOfItsOwnThatNoHeaderDuplicates) {
  OutgoingMessage m;
  m.message_id = "evt-1";
  m.content_type = "application/json";
  m.ordering_key = "pay_7";
  m.headers = {{"ordering_key", "a user's"}, {"tenant", "acme"}};
  m.body = "{}";
  std::vector<std::string> args{"XADD", "s", "*"};
  append_fields(m, args);
  EXPECT_EQ(args, (std::vector<std::string>{"XADD", "s", "*", "message_id", "evt-1", "content_type", "application/json",
                                            "ordering_key", "pay_7", "h:tenant", "acme", "body", "{}"}));
  Delivery d;
  ASSERT_TRUE(decode_fields(as_entry(args), d));
  EXPECT_EQ(d.ordering_key, "pay_7");
  EXPECT_EQ(d.headers, (MessageHeaders{{"tenant", "acme"}}));

  // A dead letter's copy keeps it; without one there is no field, and a header of the name is
  // still not written.
  std::vector<std::string> copy{"XADD", "dl", "*"};
  append_fields(d, copy);
  Delivery back;
  ASSERT_TRUE(decode_fields(as_entry(copy), back));
  EXPECT_EQ(back.ordering_key, "pay_7");
  m.ordering_key.clear();
  args = {"XADD", "s", "*"};
  append_fields(m, args);
  EXPECT_EQ(args, (std::vector<std::string>{"XADD", "s", "*", "message_id", "evt-1", "content_type", "application/json",
                                            "h:tenant", "acme", "body", "{}"}));
  ASSERT_TRUE(decode_fields(as_entry(args), d));
  EXPECT_EQ(d.ordering_key, "");
}

TEST(StreamEntryCodec, AnOrderingKeyFieldThatIsNoKeyIsIgnored) {
  Delivery d;
  for (const std::string& bad : {std::string(), std::string("has space"), std::string(kMaxOrderingKey + 1, 'k'),
                                 std::string("caf\xc3\xa9")}) {
    ASSERT_TRUE(decode_fields(as_entry({"*", "ordering_key", bad, "ordering_key", "second", "body", "b"}), d));
    EXPECT_EQ(d.ordering_key, "") << bad;  // the first counts, even when it is no key
    EXPECT_EQ(d.headers, (MessageHeaders{{"ordering_key", "second"}})) << bad;  // repeats kept, as for the others
    EXPECT_EQ(d.body, "b");
  }
  // A foreign producer's field of that name is the ordering key.
  ASSERT_TRUE(decode_fields(as_entry({"*", "order", "42", "ordering_key", "order-42", "body", "b"}), d));
  EXPECT_EQ(d.ordering_key, "order-42");
  EXPECT_EQ(d.headers, (MessageHeaders{{"order", "42"}}));
}

TEST(StreamEntryCodec, MalformedFieldListsAreErrors) {
  Delivery d;
  EXPECT_FALSE(decode_fields(as_entry({"*", "body"}), d));
  std::vector<Reply> not_strings(2);
  not_strings[0].type = Reply::Type::string;
  not_strings[0].str = "body";
  not_strings[1].type = Reply::Type::integer;
  EXPECT_FALSE(decode_fields(not_strings, d));
}

// ---- entry ids and reply shapes -------------------------------------------------------------------

TEST(StreamEntryIds, ParseAndPrevious) {
  auto id = parse_entry_id("1700000000000-7");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->ms, 1700000000000u);
  EXPECT_EQ(id->seq, 7u);
  for (const char* bad : {"", "12", "-1", "1-", "a-1", "1-b", "1-2-3", "1 -2"})
    EXPECT_FALSE(parse_entry_id(bad)) << bad;
  EXPECT_EQ(previous_id("5-3"), "5-2");
  EXPECT_EQ(previous_id("5-0"), "4-18446744073709551615");
  EXPECT_EQ(previous_id("0-1"), "0-0");
  EXPECT_FALSE(previous_id("0-0"));
  EXPECT_FALSE(previous_id("nonsense"));
}

Reply text(std::string s) {
  Reply r;
  r.type = Reply::Type::string;
  r.str = std::move(s);
  return r;
}
Reply array(std::vector<Reply> elements) {
  Reply r;
  r.type = Reply::Type::array;
  r.elements = std::move(elements);
  return r;
}
Reply integer(long long n) {
  Reply r;
  r.type = Reply::Type::integer;
  r.integer = n;
  return r;
}
Reply nil() { return Reply{}; }

TEST(StreamReplyShapes, ReadGroupEntriesWithDeletedOnes) {
  auto none = parse_read_reply(nil());
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
  const Reply reply =
      array({array({text("s"), array({array({text("1-1"), array({text("body"), text("x")})}),
                                      array({text("1-2"), nil()}), array({text("1-3"), array({})})})})});
  auto entries = parse_read_reply(reply);
  ASSERT_TRUE(entries) << entries.error();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].id, "1-1");
  ASSERT_TRUE((*entries)[0].fields);
  EXPECT_EQ((*entries)[0].fields->size(), 2u);
  EXPECT_FALSE((*entries)[1].fields);
  EXPECT_FALSE((*entries)[2].fields);
  EXPECT_FALSE(parse_read_reply(text("x")));
  EXPECT_FALSE(parse_read_reply(array({array({text("s")})})));
  EXPECT_FALSE(parse_read_reply(array({array({text("s"), array({array({text("not-an-id"), nil()})})})})));
  EXPECT_FALSE(parse_read_reply(array({array({text("s"), array({array({text("1-1"), text("flat")})})})})));
}

TEST(StreamReplyShapes, AutoclaimOfRedis7AndOf62) {
  auto seven = parse_claim_reply(array({text("0-0"), array({array({text("2-0"), array({text("body"), text("b")})})}),
                                        array({text("1-0"), text("1-5")})}));
  ASSERT_TRUE(seven) << seven.error();
  EXPECT_EQ(seven->cursor, "0-0");
  ASSERT_EQ(seven->entries.size(), 1u);
  EXPECT_EQ(seven->deleted, (std::vector<std::string>{"1-0", "1-5"}));
  auto six = parse_claim_reply(array({text("3-0"), array({array({text("2-0"), nil()})})}));
  ASSERT_TRUE(six) << six.error();
  EXPECT_EQ(six->cursor, "3-0");
  EXPECT_TRUE(six->deleted.empty());
  EXPECT_FALSE(six->entries[0].fields);
  EXPECT_FALSE(parse_claim_reply(array({text("zero"), array({})})));
  EXPECT_FALSE(parse_claim_reply(array({text("0-0")})));
  EXPECT_FALSE(parse_claim_reply(array({text("0-0"), array({}), array({integer(1)})})));
}

TEST(StreamReplyShapes, PendingCounts) {
  auto rows = parse_pending_counts(array({array({text("1-0"), text("c"), integer(10), integer(3)}),
                                          array({text("1-1"), text("c"), integer(10), integer(1LL << 40)})}));
  ASSERT_TRUE(rows) << rows.error();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0], (std::pair<std::string, std::uint32_t>{"1-0", 3}));
  EXPECT_EQ((*rows)[1].second, 0xFFFFFFFFu);  // capped, not wrapped
  EXPECT_FALSE(parse_pending_counts(array({array({text("1-0"), text("c"), integer(10)})})));
  EXPECT_FALSE(parse_pending_counts(array({array({text("1-0"), text("c"), integer(10), integer(-1)})})));
}

// ---- the error mapping ----------------------------------------------------------------------------

TEST(StreamErrors, OneMappingForEveryFailure) {
  using K = Failure::Kind;
  struct Case {
    Failure failure;
    bool appends;
    BrokerErrc code;
    bool in_doubt;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{K::connect, "Connection refused", "h:1"}, false, BrokerErrc::unavailable, false, "cannot connect"},
      {{K::connect, "AUTH: WRONGPASS invalid username-password pair or user is disabled.", "h:1"},
       false,
       BrokerErrc::refused,
       false,
       "Redis refused the login: check the user and password"},
      {{K::connect, "AUTH: ERR AUTH <password> called without any password configured for the default user.", "h:1"},
       false,
       BrokerErrc::refused,
       false,
       "check the user and password"},
      {{K::connect, "AUTH: LOADING Redis is loading the dataset in memory", "h:1"},
       false,
       BrokerErrc::unavailable,
       false,
       "LOADING"},
      {{K::connect, "SELECT: ERR DB index is out of range", "h:1"}, false, BrokerErrc::refused, false, "SELECT"},
      {{K::connect_timeout, "Connection timed out", "h:1"}, false, BrokerErrc::timeout, false, "connect timed out"},
      {{K::down, "reconnecting", "h:1"}, false, BrokerErrc::unavailable, false, "unreachable"},
      {{K::io, "Connection reset by peer", "h:1"}, false, BrokerErrc::unavailable, false, "connection lost"},
      {{K::io, "Server closed the connection", "h:1"}, true, BrokerErrc::unavailable, true, "connection lost"},
      {{K::timeout, "", "h:1"}, false, BrokerErrc::timeout, false, "no reply in time"},
      {{K::timeout, "", "h:1"}, true, BrokerErrc::timeout, true, "no reply in time"},
      {{K::protocol, "bad bytes", "h:1"}, true, BrokerErrc::internal, true, "protocol error"},
      {{K::reply, "LOADING Redis is loading the dataset in memory", "h:1"},
       true,
       BrokerErrc::unavailable,
       false,
       "LOADING"},
      {{K::reply, "MASTERDOWN Link with MASTER is down", "h:1"}, false, BrokerErrc::unavailable, false, "MASTERDOWN"},
      {{K::reply, "BUSY Redis is busy running a script", "h:1"}, false, BrokerErrc::unavailable, false, "BUSY"},
      {{K::reply, "OOM command not allowed when used memory > 'maxmemory'.", "h:1"},
       true,
       BrokerErrc::unavailable,
       false,
       "OOM"},
      {{K::reply, "READONLY You can't write against a read only replica.", "h:1"},
       true,
       BrokerErrc::unavailable,
       false,
       "READONLY"},
      {{K::reply, "NOGROUP No such key 's' or consumer group 'g'", "h:1"},
       false,
       BrokerErrc::unavailable,
       false,
       "is gone"},
      {{K::reply, "UNBLOCKED the stream key no longer exists", "h:1"}, false, BrokerErrc::unavailable, false,
       "is gone"},
      {{K::reply, "NOAUTH Authentication required.", "h:1"},
       false,
       BrokerErrc::refused,
       false,
       "Redis refused the login: check the user and password"},
      {{K::reply, "WRONGPASS invalid username-password pair", "h:1"},
       false,
       BrokerErrc::refused,
       false,
       "check the user and password"},
      {{K::reply, "NOPERM this user has no permissions to run the 'xadd' command", "h:1"},
       true,
       BrokerErrc::refused,
       false,
       "check its ACL"},
      {{K::reply, "MOVED 3999 127.0.0.1:7002", "h:1"}, false, BrokerErrc::refused, false, "standalone Redis"},
      {{K::reply, "CROSSSLOT Keys in request don't hash to the same slot", "h:1"},
       false,
       BrokerErrc::refused,
       false,
       "does not route cluster slots"},
      {{K::reply, "WRONGTYPE Operation against a key holding the wrong kind of value", "h:1"},
       true,
       BrokerErrc::refused,
       false,
       "\"orders\" is not a stream"},
      {{K::reply, "ERR unknown command 'XAUTOCLAIM'", "h:1"}, false, BrokerErrc::internal, false, "XAUTOCLAIM"},
      {{K::retries, "TRYAGAIN", "h:1"}, false, BrokerErrc::unavailable, false, "TRYAGAIN"},
      {{K::closing, "", ""}, false, BrokerErrc::unavailable, false, "redis"},
      {{K::wrong_kind, "a cluster node", "h:1"}, false, BrokerErrc::refused, false, "cluster node"},
  };
  for (const auto& c : cases) {
    const BrokerError e = map_error(c.failure, {"orders", c.appends});
    EXPECT_EQ(e.code, c.code) << c.failure.detail;
    EXPECT_EQ(e.in_doubt, c.in_doubt) << c.failure.detail;
    EXPECT_NE(e.message.find(c.says), std::string::npos) << c.failure.detail << " -> " << e.message;
    if (!c.failure.node.empty()) {
      EXPECT_NE(e.message.find(c.failure.node), std::string::npos) << e.message;
    }
    EXPECT_EQ(e.retryable(), c.code == BrokerErrc::unavailable || c.code == BrokerErrc::timeout);
  }
}

TEST(StreamErrors, HandshakeRefusalsAreReadFromTheWireFailure) {
  const Failure failure{Failure::Kind::connect, "AUTH: WRONGPASS nope", "h:1"};
  auto auth = redis_detail::handshake_refusal(failure);  // views into `failure`
  ASSERT_TRUE(auth);
  EXPECT_EQ(auth->command, "AUTH");
  EXPECT_EQ(auth->reply, "WRONGPASS nope");
  EXPECT_FALSE(redis_detail::handshake_refusal({Failure::Kind::connect, "Connection refused", "h:1"}));
  EXPECT_FALSE(redis_detail::handshake_refusal({Failure::Kind::reply, "AUTH: WRONGPASS nope", "h:1"}));
  EXPECT_EQ(error_code("NOGROUP No such key"), "NOGROUP");
  EXPECT_EQ(error_code("OOM"), "OOM");
}

TEST(StreamErrors, OutgoingMessagesAreScrubbedOfTheUrlsSecrets) {
  const std::string url = "redis+stream://app:" + std::string(kSecret) + "@h:1/s?group=g";
  auto parsed = parse_redis_stream_url(url, RedisStreamRole::source);
  ASSERT_TRUE(parsed);
  const Endpoint endpoint(*parsed, url, Millis{100});
  EXPECT_EQ(endpoint.name, "redis+stream://app:***@h:1/s?group=g");
  const auto e = endpoint.outgoing({BrokerErrc::internal, "a server quoting " + std::string(kSecret), false});
  EXPECT_EQ(e.message.find(kSecret), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("redis+stream://app:***@h:1/s?group=g: "), std::string::npos) << e.message;
}

// ---- opening ----------------------------------------------------------------------------------------

TEST(StreamOpen, SettingsOutOfRangeAreInvalidBeforeAnyConnect) {
  // Port 9 (discard) on loopback: nothing is contacted when the settings are refused first.
  const std::string url = "redis+stream://127.0.0.1:9/s?group=g";
  auto check = [&](SourceSettings s, const std::string& says) {
    auto source = open_redis_stream_source(url, s);
    ASSERT_FALSE(source) << says;
    EXPECT_EQ(source.error().code, BrokerErrc::invalid) << source.error().message;
    EXPECT_NE(source.error().message.find(says), std::string::npos) << source.error().message;
  };
  SourceSettings s;
  s.prefetch = 0;
  check(s, "prefetch");
  s.prefetch = 65536;
  check(s, "prefetch");
  s = {};
  s.claim_idle = Millis{0};
  check(s, "claim_idle");
  s = {};
  s.connect_timeout = Millis{0};
  check(s, "connect_timeout");
  s = {};
  s.reconnect_min = Millis{500};
  s.reconnect_max = Millis{100};
  check(s, "reconnect_min");
  SinkSettings sink;
  sink.confirm_timeout = Millis{0};
  auto opened = open_redis_stream_sink("redis+stream://127.0.0.1:9/s", sink);
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.error().code, BrokerErrc::invalid);
  auto wrong_role = open_redis_stream_sink("redis+stream://127.0.0.1:9/s?group=g", {});
  ASSERT_FALSE(wrong_role);
  EXPECT_EQ(wrong_role.error().code, BrokerErrc::invalid);
}

TEST(StreamOpen, NothingListeningIsUnavailableAndTheMessageHidesThePassword) {
  // A port that was just free: connecting is refused at once.
  int port = 0;
  {
    const auto l = testing::listen_on_loopback("probe");
    port = l.port;
    ::close(l.fd);
  }
  const std::string url = "redis+stream://app:" + std::string(kSecret) + "@127.0.0.1:" + std::to_string(port) + "/s";
  auto sink = open_redis_stream_sink(url, {});
  ASSERT_FALSE(sink);
  EXPECT_EQ(sink.error().code, BrokerErrc::unavailable) << sink.error().message;
  EXPECT_EQ(sink.error().message.find(kSecret), std::string::npos) << sink.error().message;
  auto source = open_redis_stream_source(url + "?group=g", {});
  ASSERT_FALSE(source);
  EXPECT_EQ(source.error().code, BrokerErrc::unavailable) << source.error().message;
  EXPECT_EQ(source.error().message.find(kSecret), std::string::npos) << source.error().message;
}

// ---- the sink against a fake server ---------------------------------------------------------------

// Accepts connections one after the other; answers each connection's first `answer` XADDs with
// an id (and PINGs with PONG), then closes it, unanswered commands pending.
class FakeRedis {
 public:
  explicit FakeRedis(int answer) : answer_(answer), listener_(testing::listen_on_loopback("fake redis")) {
    thread_ = std::thread([this] { run(); });
  }
  ~FakeRedis() {
    stop_ = true;
    thread_.join();
    ::close(listener_.fd);
  }
  int port() const { return listener_.port; }
  int connections() const { return connections_; }

 private:
  void run() {
    while (!stop_) {
      pollfd p{listener_.fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int fd = ::accept(listener_.fd, nullptr, nullptr);
      if (fd < 0) continue;
      ++connections_;
      serve(fd);
      ::close(fd);
    }
  }
  // One whole command (RESP: *N then N $LEN bulks) from the front of `in`, if it has arrived.
  static std::optional<std::vector<std::string>> take_command(std::string& in) {
    if (in.empty() || in[0] != '*') return std::nullopt;
    auto eol = in.find("\r\n");
    if (eol == std::string::npos) return std::nullopt;
    const int n = std::stoi(in.substr(1, eol - 1));
    std::size_t pos = eol + 2;
    std::vector<std::string> args;
    for (int i = 0; i < n; ++i) {
      if (pos >= in.size()) return std::nullopt;
      eol = in.find("\r\n", pos);
      if (eol == std::string::npos) return std::nullopt;
      const std::size_t len = std::stoul(in.substr(pos + 1, eol - pos - 1));
      pos = eol + 2;
      if (in.size() < pos + len + 2) return std::nullopt;
      args.push_back(in.substr(pos, len));
      pos += len + 2;
    }
    in.erase(0, pos);
    return args;
  }

  void serve(int fd) {
    std::string in;
    int answered = 0;
    char buf[65536];
    while (!stop_) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) return;
      in.append(buf, static_cast<std::size_t>(n));
      while (auto command = take_command(in)) {
        if (command->front() == "PING") {
          ::send(fd, "+PONG\r\n", 7, MSG_NOSIGNAL);
        } else if (command->front() == "XADD") {
          if (answered == answer_) return;  // hang up with this one and the later ones unanswered
          const std::string id = "1-" + std::to_string(answered++);
          const std::string reply = "$" + std::to_string(id.size()) + "\r\n" + id + "\r\n";
          ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
        } else {
          ::send(fd, "-ERR unknown command\r\n", 22, MSG_NOSIGNAL);
        }
      }
    }
  }

  int answer_;
  testing::LoopbackListener listener_;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

TEST(StreamSinkFake, AConnectionLostMidBatchLeavesTheUnansweredInDoubtAndTheNextPublishReconnects) {
  FakeRedis fake(2);
  auto sink = open_redis_stream_sink("redis+stream://127.0.0.1:" + std::to_string(fake.port()) + "/s", {});
  ASSERT_TRUE(sink) << sink.error().message;
  std::vector<OutgoingMessage> batch(5);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    batch[i].message_id = "m-" + std::to_string(i);
    batch[i].body = "x";
  }
  auto results = (*sink)->publish(batch);
  ASSERT_EQ(results.size(), 5u);
  EXPECT_TRUE(results[0]);
  EXPECT_TRUE(results[1]);
  for (std::size_t i = 2; i < 5; ++i) {
    ASSERT_FALSE(results[i]);
    EXPECT_EQ(results[i].error().code, BrokerErrc::unavailable) << results[i].error().message;
    EXPECT_TRUE(results[i].error().in_doubt);
  }
  // The next publish opens a new connection (the fake answers two XADDs on each).
  auto again = (*sink)->publish(std::span(batch).subspan(0, 2));
  ASSERT_EQ(again.size(), 2u);
  EXPECT_TRUE(again[0]) << again[0].error().message;
  EXPECT_TRUE(again[1]) << again[1].error().message;
  EXPECT_EQ(fake.connections(), 2);
}

}  // namespace
}  // namespace idem::redis_streams
