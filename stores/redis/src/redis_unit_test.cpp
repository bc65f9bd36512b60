// Server-free tests of the Redis store's parts: slots, URLs, key and header encodings, replies
// decoding, the one error mapping, and the claim's fallback for a Redis older than 7.0 (against a
// scripted fake server).
#include "slot.hpp"

#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <random>
#include <set>
#include <thread>

#include "idem/redis_wire/connection.hpp"
#include "errors.hpp"
#include "idem/headers_codec.hpp"
#include "idem/redis_store.hpp"
#include "idem/testing/loopback_listener.hpp"
#include "record_codec.hpp"
#include "scripts.hpp"
#include "idem/redis_wire/url.hpp"

namespace idem::redis_detail {
namespace {

// ---- CRC16 and slots ---------------------------------------------------------------------------

TEST(Slot, Crc16MatchesTheXmodemCheckValue) {
  EXPECT_EQ(crc16("123456789"), 0x31C3);  // the published check value of CRC-16/XMODEM
  EXPECT_EQ(crc16(""), 0);
}

TEST(Slot, MatchesRedisClusterKeyslot) {
  // Values from `redis-cli CLUSTER KEYSLOT` on Redis 7.0.
  EXPECT_EQ(key_slot("foo"), 12182);
  EXPECT_EQ(key_slot("bar"), 5061);
  EXPECT_EQ(key_slot("hello"), 866);
  EXPECT_EQ(key_slot("{user1000}.following"), 3443);
  EXPECT_EQ(key_slot("{user1000}.followers"), 3443);
  EXPECT_EQ(key_slot("123456789"), 0x31C3 & 16383);
}

TEST(Slot, HashTagRules) {
  EXPECT_EQ(key_slot("a{tag}b"), key_slot("tag"));
  EXPECT_EQ(key_slot("x{tag}y{other}"), key_slot("tag"));   // only the first tag counts
  EXPECT_EQ(key_slot("{}tag"), key_slot("{}tag"));           // empty tag: the whole key
  EXPECT_NE(key_slot("{}tag"), key_slot("tag"));
  EXPECT_EQ(key_slot("{{tag}}"), key_slot("{tag"));          // up to the first '}' after '{'
  EXPECT_EQ(key_slot("no{close"), crc16("no{close") & 16383);
}

TEST(Slot, RecordsOfOneIdentityShareASlotAndIdentitiesSpread) {
  std::set<int> slots;
  for (int i = 0; i < 1000; ++i) {
    const auto k = record_key("idem:", RecordId{"tenant", "key-" + std::to_string(i)});
    slots.insert(key_slot(k));
    EXPECT_EQ(key_slot(k), key_slot(record_key("other-prefix:", RecordId{"tenant", "key-" + std::to_string(i)})));
  }
  EXPECT_GT(slots.size(), 900u);
}

// ---- URLs --------------------------------------------------------------------------------------

TEST(Url, Standalone) {
  auto u = parse_redis_url("redis://127.0.0.1:6380/2");
  ASSERT_TRUE(u) << u.error();
  EXPECT_FALSE(u->cluster);
  ASSERT_EQ(u->nodes.size(), 1u);
  EXPECT_EQ(u->nodes[0].str(), "127.0.0.1:6380");
  EXPECT_EQ(u->db, 2);
  auto d = parse_redis_url("redis://cache.internal");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->nodes[0].port, 6379);
  EXPECT_EQ(d->db, 0);
}

TEST(Url, Credentials) {
  auto a = parse_redis_url("redis://:s%40cret@h:1/0");
  ASSERT_TRUE(a) << a.error();
  EXPECT_EQ(a->user, "");
  EXPECT_EQ(a->password, "s@cret");
  auto b = parse_redis_url("redis://app:pw@h");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->user, "app");
  EXPECT_EQ(b->password, "pw");
}

TEST(Url, Cluster) {
  auto u = parse_redis_url("redis+cluster://h1:7000,h2:7001,[::1]:7002");
  ASSERT_TRUE(u) << u.error();
  EXPECT_TRUE(u->cluster);
  ASSERT_EQ(u->nodes.size(), 3u);
  EXPECT_EQ(u->nodes[1].str(), "h2:7001");
  EXPECT_EQ(u->nodes[2].host, "::1");
  EXPECT_EQ(u->nodes[2].str(), "[::1]:7002");
}

TEST(Url, Rejections) {
  for (const char* bad : {"", "http://h", "rediss://h", "redis://", "redis://h:0", "redis://h:99999", "redis://h:x",
                          "redis://h/x", "redis://h1,h2", "redis+cluster://h1", "redis+cluster://h:1/3",
                          "redis://:bad%zz@h"}) {
    EXPECT_FALSE(parse_redis_url(bad)) << bad;
  }
}

// ---- keys --------------------------------------------------------------------------------------

TEST(RecordKey, ReadableForPlainIdentities) {
  EXPECT_EQ(record_key("idem:", RecordId{"acme", "key-0001"}), "idem:{acme:key-0001}");
}

TEST(RecordKey, EscapesBracesColonsPercentAndInvisibleBytes) {
  const RecordId id{"t{1}:%", std::string("k}{ \x00\xff", 6)};
  const auto k = record_key("p:", id);
  EXPECT_EQ(k, "p:{t%7B1%7D%3A%25:k%7D%7B%20%00%FF}");
  auto back = parse_record_key("p:", k);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->tenant, id.tenant);
  EXPECT_EQ(back->key, id.key);
}

TEST(RecordKey, NoTwoIdentitiesShareAKey) {
  // The conformance suite's concatenation case, and the separator itself in either part.
  EXPECT_NE(record_key("p:", {"ab", "c"}), record_key("p:", {"a", "bc"}));
  EXPECT_NE(record_key("p:", {"a:b", "c"}), record_key("p:", {"a", "b:c"}));
  EXPECT_NE(record_key("p:", {"a%3Ab", "c"}), record_key("p:", {"a:b", "c"}));
}

TEST(RecordKey, RoundTripsRandomIdentities) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> byte(0, 255), len(0, 40);
  for (int i = 0; i < 2000; ++i) {
    RecordId id;
    for (int n = len(rng); n > 0; --n) id.tenant.push_back(static_cast<char>(byte(rng)));
    for (int n = len(rng); n > 0; --n) id.key.push_back(static_cast<char>(byte(rng)));
    const auto k = record_key("x:", id);
    // The hash tag is exactly the identity: nothing inside it ends it early.
    EXPECT_EQ(k.find('}'), k.size() - 1);
    auto back = parse_record_key("x:", k);
    ASSERT_TRUE(back);
    EXPECT_EQ(back->tenant, id.tenant);
    EXPECT_EQ(back->key, id.key);
  }
}

TEST(RecordKey, ForeignKeysDoNotParse) {
  for (const char* k : {"other:{a:b}", "p:a:b", "p:{ab}", "p:{a:b", "p:{a%3ab:c}", "p:{a%41:b}", "p:{a b:c}"}) {
    EXPECT_FALSE(parse_record_key("p:", k)) << k;
  }
}

TEST(RecordKey, ScanPatternEscapesGlobCharacters) {
  EXPECT_EQ(scan_pattern("idem:"), "idem:{*");
  EXPECT_EQ(scan_pattern("a*b?[c]\\:"), "a\\*b\\?\\[c\\]\\\\:{*");
}

// ---- records -----------------------------------------------------------------------

Reply text(std::string s) { return Reply{Reply::Type::string, std::move(s), 0, {}}; }
Reply fields(std::initializer_list<std::pair<std::string, std::string>> kv) {
  Reply r;
  r.type = Reply::Type::array;
  for (const auto& [k, v] : kv) {
    r.elements.push_back(text(k));
    r.elements.push_back(text(v));
  }
  return r;
}

TEST(DecodeLegacyRecord, CompletedRecord) {
  auto r = decode_legacy_record({"t", "k"}, fields({{"state", "completed"},
                                            {"hash", "h1"},
                                            {"token", "18446744073709551615"},
                                            {"lease_expires", "1000"},
                                            {"created", "900"},
                                            {"completed", "950"},
                                            {"expires", "5000"},
                                            {"status", "201"},
                                            {"headers", idem::encode_headers({{"A", "b"}})},
                                            {"body", std::string("x\0y", 3)}}));
  ASSERT_TRUE(r);
  ASSERT_TRUE(*r);
  const Record& rec = **r;
  EXPECT_EQ(rec.tenant, "t");
  EXPECT_EQ(rec.state, RecordState::completed);
  EXPECT_EQ(rec.fencing_token, 18446744073709551615ull);
  EXPECT_EQ(rec.created, from_epoch_ms(900));
  EXPECT_EQ(rec.completed, from_epoch_ms(950));
  EXPECT_EQ(rec.expires, from_epoch_ms(5000));
  ASSERT_TRUE(rec.response);
  EXPECT_EQ(rec.response->status, 201);
  EXPECT_EQ(rec.response->body, std::string("x\0y", 3));
}

TEST(DecodeLegacyRecord, AbsentAndCorrupt) {
  Reply empty;
  empty.type = Reply::Type::array;
  auto none = decode_legacy_record({"t", "k"}, empty);
  ASSERT_TRUE(none);
  EXPECT_FALSE(*none);
  auto bad_state = decode_legacy_record({"t", "k"}, fields({{"state", "weird"}, {"hash", "h"}, {"token", "1"},
                                                    {"created", "1"}, {"expires", "2"}}));
  ASSERT_FALSE(bad_state);
  EXPECT_EQ(bad_state.error().code, StoreErrc::corrupt);
  auto missing = decode_legacy_record({"t", "k"}, fields({{"state", "in_progress"}}));
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, StoreErrc::corrupt);
}

Record completed_record() {
  Record r;
  r.tenant = "t";
  r.key = "k";
  r.state = RecordState::completed;
  r.request_hash = std::string("h|1\0\n", 5);  // the hash is length-prefixed: any bytes
  r.fencing_token = 18446744073709551615ull;
  r.lease_expires = from_epoch_ms(1000);
  r.created = from_epoch_ms(900);
  r.completed = from_epoch_ms(950);
  r.expires = from_epoch_ms(1764547200000);
  r.response = StoredResponse{201, {{"Content-Type", "a|b"}, {"X", std::string("\0|", 2)}}, std::string("x|\0y", 4)};
  r.attempt = 4294967295u;
  r.lookup = "GET /p/{key}|x";
  return r;
}

TEST(RecordValue, RoundTripsEveryField) {
  const Record in = completed_record();
  const std::string value = encode_record(in);
  EXPECT_TRUE(value.starts_with("C4294967295|18446744073709551615|1000|900|1764547200000|950|201|5|")) << value;
  auto out = decode_record({"t", "k"}, value);
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_EQ(out->tenant, "t");
  EXPECT_EQ(out->key, "k");
  EXPECT_EQ(out->state, in.state);
  EXPECT_EQ(out->request_hash, in.request_hash);
  EXPECT_EQ(out->fencing_token, in.fencing_token);
  EXPECT_EQ(out->lease_expires, in.lease_expires);
  EXPECT_EQ(out->created, in.created);
  EXPECT_EQ(out->completed, in.completed);
  EXPECT_EQ(out->expires, in.expires);
  EXPECT_EQ(out->attempt, in.attempt);
  EXPECT_EQ(out->lookup, in.lookup);
  ASSERT_TRUE(out->response);
  EXPECT_EQ(out->response->status, 201);
  EXPECT_EQ(out->response->headers, in.response->headers);
  EXPECT_EQ(out->response->body, in.response->body);

  Record progress = in;
  progress.state = RecordState::in_progress;
  progress.completed.reset();
  progress.response.reset();
  const std::string claimed = encode_record(progress);
  EXPECT_EQ(claimed, "I4294967295|18446744073709551615|1000|900|1764547200000|||5|0|14|" + in.request_hash + in.lookup);
  auto back = decode_record({"t", "k"}, claimed);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->state, RecordState::in_progress);
  EXPECT_FALSE(back->completed);
  EXPECT_FALSE(back->response);

  auto head = parse_record_head(value.substr(0, kHeadBytes));
  ASSERT_TRUE(head);
  EXPECT_EQ(head->state, RecordState::completed);
  EXPECT_EQ(head->expires_ms, 1764547200000);
}

// Values written before attempt numbers (no digits after the state, no lookup_len) read as
// attempt 1 without a lookup.
TEST(RecordValue, TheLayoutBeforeAttemptNumbersStillReads) {
  const std::string hash("h|1\0\n", 5);
  auto progress = decode_record({"t", "k"}, "I|77|1000|900|1764547200000|||5|0|" + hash);
  ASSERT_TRUE(progress) << progress.error().message;
  EXPECT_EQ(progress->attempt, 1u);
  EXPECT_EQ(progress->lookup, "");
  EXPECT_EQ(progress->fencing_token, 77u);
  EXPECT_EQ(progress->request_hash, hash);
  const std::string headers = idem::encode_headers({{"A", "b"}});
  auto done = decode_record({"t", "k"}, "C|77|1000|900|1764547200000|950|201|5|" + std::to_string(headers.size()) +
                                            "|" + hash + headers + "body");
  ASSERT_TRUE(done) << done.error().message;
  EXPECT_EQ(done->attempt, 1u);
  ASSERT_TRUE(done->response);
  EXPECT_EQ(done->response->body, "body");
  auto head = parse_record_head("F|77|1000|900|1764547200000|||5|0|" + hash);
  ASSERT_TRUE(head);
  EXPECT_EQ(head->state, RecordState::failed_retryable);
  EXPECT_EQ(head->expires_ms, 1764547200000);
}

TEST(RecordValue, CorruptValuesAreRefusedNotGuessed) {
  const std::string good = encode_record(completed_record());
  std::vector<std::string> bad = {
      "",
      "X|1|2|3|4|||1|0|h",                 // unknown state
      "I|1|2|3|4|||1|0",                   // header cut short
      "I|1|2|3|4|||9|0|h",                 // the hash is shorter than its length
      "I|x|2|3|4|||1|0|h",                 // a token that is not a number
      "C|1|2|3|4|5||1|0|h",                // completed without a status
      "C|1|2|3|4|5|200|1|2|h\x09\x09",     // headers that do not decode
      "I|1|2|3|4|||1|18446744073709551615|h",  // a length that would overflow
      "I0|1|2|3|4|||1|0|0|h",              // attempt 0 (attempts start at 1)
      "I4294967296|1|2|3|4|||1|0|0|h",     // an attempt beyond 32 bits
      "Ix|1|2|3|4|||1|0|0|h",              // an attempt that is not a number
      "I2|1|2|3|4|||1|0|5|hab",            // the lookup is shorter than its length
      "I2|1|2|3|4|||1|0|h",                // the new layout without lookup_len
      good.substr(0, good.size() - 10),    // truncated inside the headers
  };
  for (const auto& value : bad) {
    auto r = decode_record({"t", "k"}, value);
    ASSERT_FALSE(r) << value;
    EXPECT_EQ(r.error().code, StoreErrc::corrupt) << value;
  }
  EXPECT_FALSE(parse_record_head("I|1|2|3"));
  EXPECT_FALSE(parse_record_head("Z|1|2|3|4|"));
}

// ---- errors ------------------------------------------------------------------------------------

TEST(Errors, OneMappingForEveryFailure) {
  using K = Failure::Kind;
  struct Case {
    Failure f;
    StoreErrc code;
    bool in_doubt;
  };
  const Case cases[] = {
      {{K::connect, "Connection refused", "h:1"}, StoreErrc::unavailable, false},
      {{K::connect_timeout, "Connection timed out", "h:1"}, StoreErrc::timeout, false},
      {{K::down, "Connection refused", "h:1"}, StoreErrc::unavailable, false},
      {{K::io, "Server closed the connection", "h:1"}, StoreErrc::unavailable, true},
      {{K::timeout, "", "h:1"}, StoreErrc::timeout, true},
      {{K::protocol, "bad", "h:1"}, StoreErrc::internal, true},
      {{K::replication, "0 of 1", "h:1"}, StoreErrc::unavailable, true},
      {{K::retries, "CLUSTERDOWN The cluster is down", "h:1"}, StoreErrc::unavailable, false},
      {{K::redirects, "MOVED 1 h:2", "h:1"}, StoreErrc::unavailable, false},
      {{K::no_route, "slot 7", ""}, StoreErrc::unavailable, false},
      {{K::closing, "", ""}, StoreErrc::unavailable, false},
      {{K::wrong_kind, "this Redis is a Redis Cluster node", "h:1"}, StoreErrc::unavailable, false},
      {{K::reply, "LOADING Redis is loading the dataset in memory", "h:1"}, StoreErrc::unavailable, false},
      {{K::reply, "OOM command not allowed", "h:1"}, StoreErrc::unavailable, false},
      {{K::reply, "NOAUTH Authentication required.", "h:1"}, StoreErrc::unavailable, false},
      {{K::reply, "NOREPLICAS Not enough good replicas to write.", "h:1"}, StoreErrc::unavailable, false},
      {{K::reply, "MISCONF Errors writing to the AOF file: No space left on device", "h:1"}, StoreErrc::unavailable, false},
      {{K::reply, "WRONGTYPE Operation against a key holding the wrong kind of value", "h:1"}, StoreErrc::corrupt, false},
      {{K::reply, "IDEMCORRUPT unknown state", "h:1"}, StoreErrc::corrupt, false},
      {{K::reply, "ERR Error running script (call to f_x): @user_script:1: oops", "h:1"}, StoreErrc::internal, false},
  };
  for (const auto& c : cases) {
    const StoreError e = map_error(c.f);
    EXPECT_EQ(e.code, c.code) << c.f.detail;
    EXPECT_EQ(e.in_doubt, c.in_doubt) << c.f.detail;
    EXPECT_FALSE(e.message.empty());
  }
}

TEST(Errors, ClassifiesRedirectsAndTransientReplies) {
  EXPECT_EQ(classify_error_reply("MOVED 3999 127.0.0.1:6381"), ErrorAction::moved);
  EXPECT_EQ(classify_error_reply("ASK 3999 127.0.0.1:6381"), ErrorAction::ask);
  EXPECT_EQ(classify_error_reply("NOSCRIPT No matching script. Please use EVAL."), ErrorAction::noscript);
  for (const char* t : {"TRYAGAIN Multiple keys request during rehashing of slot", "CLUSTERDOWN The cluster is down",
                        "LOADING Redis is loading", "MASTERDOWN Link with MASTER is down",
                        "READONLY You can't write against a read only replica."}) {
    EXPECT_EQ(classify_error_reply(t), ErrorAction::retry) << t;
  }
  EXPECT_EQ(classify_error_reply("ERR unknown command"), ErrorAction::report);
  EXPECT_EQ(classify_error_reply("MOVEDX"), ErrorAction::report);
}

TEST(Errors, ParsesRedirects) {
  auto r = parse_redirect("MOVED 3999 127.0.0.1:6381");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->slot, 3999);
  EXPECT_EQ(r->to.str(), "127.0.0.1:6381");
  auto no_host = parse_redirect("ASK 1 :7000");
  ASSERT_TRUE(no_host);
  EXPECT_EQ(no_host->to.host, "");
  EXPECT_EQ(no_host->to.port, 7000);
  EXPECT_FALSE(parse_redirect("MOVED 99999 h:1"));
  EXPECT_FALSE(parse_redirect("MOVED x h:1"));
  EXPECT_FALSE(parse_redirect("MOVED 1"));
}

// ---- scripts -----------------------------------------------------------------------------------

TEST(Scripts, Sha1IsWhatRedisNamesScriptsBy) {
  EXPECT_EQ(sha1_hex(""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  EXPECT_EQ(sha1_hex("return 1"), "e0e1f9fabfc9d4800c877a703b823ac0578ff8db");  // SCRIPT LOAD "return 1"
  for (auto id : {ScriptId::claim, ScriptId::complete, ScriptId::fail, ScriptId::release, ScriptId::mark_retryable,
                  ScriptId::resolve, ScriptId::purge}) {
    const Script& s = script(id);
    EXPECT_EQ(s.sha1.size(), 40u) << s.name;
    EXPECT_NE(s.source.find("KEYS[1]"), std::string_view::npos) << s.name;
    EXPECT_EQ(s.source.find("KEYS[2]"), std::string_view::npos) << s.name << " must touch one key";
    EXPECT_EQ(s.source.find("TIME"), std::string_view::npos) << s.name << " must not read Redis's clock";
  }
}

// ---- a server that goes away ---------------------------------------------------------------------

// Writes to a Redis that reset the connection (a restart) fail; they must not raise SIGPIPE,
// which kills a process that does not ignore it. hiredis stops at a connection's first error, so
// SIGPIPE comes when that first error is a write's EPIPE: the reset arrived, and its error was
// already taken by something else (hiredis's own SO_ERROR check after a connect does that, when
// the server goes away during the connect). The test builds that state. SIGPIPE keeps its default
// action here, so without the guard this test dies instead of failing.
void expect_writes_to_a_reset_connection_fail_quietly(bool sigpipe_blocked_for_good) {
  const auto listener = testing::listen_on_loopback("resetting fake redis");
  std::atomic<bool> opened{false};
  std::thread resetter([fd = listener.fd, &opened] {
    const int client = ::accept(fd, nullptr, nullptr);
    if (client < 0) return;
    // Only once open() has returned: a reset during it fails the open (its own SO_ERROR check).
    while (!opened.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const linger reset{1, 0};  // close with RST
    ::setsockopt(client, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    ::close(client);
  });
  auto conn = Connection::open(Address{"127.0.0.1", listener.port}, ConnectSettings{}, /*nonblocking=*/false);
  opened = true;
  resetter.join();
  ::close(listener.fd);
  ASSERT_TRUE(conn.has_value());
  pollfd p{conn->fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1) << "the reset did not arrive";
  int error = 0;
  socklen_t len = sizeof error;
  ASSERT_EQ(::getsockopt(conn->fd(), SOL_SOCKET, SO_ERROR, &error, &len), 0);
  EXPECT_EQ(error, ECONNRESET);  // taken: the next write fails with EPIPE
  auto reply = conn->call({"PING"});
  EXPECT_FALSE(reply.has_value());
  if (sigpipe_blocked_for_good) return;  // a SIGPIPE may stay pending there, harmlessly
  sigset_t pending;
  sigpending(&pending);
  EXPECT_EQ(sigismember(&pending, SIGPIPE), 0) << "a SIGPIPE was left pending";
}

TEST(ResetConnection, WritesFailWithoutSigpipeOnACallersThread) {
  ASSERT_NE(::signal(SIGPIPE, SIG_DFL), SIG_ERR);
  expect_writes_to_a_reset_connection_fail_quietly(/*sigpipe_blocked_for_good=*/false);
  sigset_t mask;
  pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  EXPECT_EQ(sigismember(&mask, SIGPIPE), 0) << "the caller's signal mask was changed";
}

TEST(ResetConnection, WritesFailWithoutSigpipeOnAStoreThread) {
  ASSERT_NE(::signal(SIGPIPE, SIG_DFL), SIG_ERR);
  std::thread([] {
    block_sigpipe_on_this_thread();
    expect_writes_to_a_reset_connection_fail_quietly(/*sigpipe_blocked_for_good=*/true);
  }).join();
}

// ---- a Redis before 7.0 -------------------------------------------------------------------------

// A RESP server on loopback that answers like Redis 6.2 as far as a claim goes: `SET ... NX GET`
// is a syntax error, and the claim script claims. It counts what it was sent.
class OldRedis {
 public:
  OldRedis() {
    const auto listener = testing::listen_on_loopback("fake redis");
    listener_ = listener.fd;
    port_ = listener.port;
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~OldRedis() {
    ::shutdown(listener_, SHUT_RDWR);
    ::close(listener_);
    accept_thread_.join();
    for (auto& t : clients_) t.join();
  }
  int port() const { return port_; }
  std::atomic<int> sets{0}, evalshas{0};

 private:
  void accept_loop() {
    for (;;) {
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0) return;
      clients_.emplace_back([this, fd] { serve(fd); });
    }
  }
  // Reads RESP arrays of bulk strings; answers each; returns when the client goes away.
  void serve(int fd) {
    std::string buffer;
    char chunk[4096];
    for (;;) {
      std::vector<std::string> args;
      while (!parse(buffer, args)) {
        const auto n = ::read(fd, chunk, sizeof chunk);
        if (n <= 0) {
          ::close(fd);
          return;
        }
        buffer.append(chunk, static_cast<std::size_t>(n));
      }
      const std::string reply = answer(args);
      if (::write(fd, reply.data(), reply.size()) != static_cast<ssize_t>(reply.size())) {
        ::close(fd);
        return;
      }
    }
  }
  static bool parse(std::string& buffer, std::vector<std::string>& args) {
    std::size_t at = 0;
    auto line = [&]() -> std::optional<std::string> {
      const auto end = buffer.find("\r\n", at);
      if (end == std::string::npos) return std::nullopt;
      std::string text = buffer.substr(at, end - at);
      at = end + 2;
      return text;
    };
    auto count = line();
    if (!count || count->empty() || (*count)[0] != '*') return false;
    args.clear();
    for (int i = 0, n = std::stoi(count->substr(1)); i < n; ++i) {
      auto size = line();
      if (!size) return false;
      const auto bytes = static_cast<std::size_t>(std::stoi(size->substr(1)));
      if (buffer.size() < at + bytes + 2) return false;
      args.push_back(buffer.substr(at, bytes));
      at += bytes + 2;
    }
    buffer.erase(0, at);
    return true;
  }
  std::string answer(const std::vector<std::string>& args) {
    if (args.front() == "PING") return "+PONG\r\n";
    if (args.front() == "SET") {
      ++sets;
      return "-ERR syntax error\r\n";
    }
    if (args.front() == "EVALSHA" && args.size() > 4) {  // EVALSHA sha 1 key now ...: a fresh claim
      ++evalshas;
      const std::string& now = args[4];
      return "*4\r\n$7\r\nclaimed\r\n$5\r\nfresh\r\n$" + std::to_string(now.size()) + "\r\n" + now +
             "\r\n$1\r\n1\r\n";
    }
    return "-ERR unexpected command\r\n";
  }

  int listener_ = -1;
  int port_ = 0;
  std::thread accept_thread_;
  std::vector<std::thread> clients_;  // only the accept thread adds, before the destructor joins it
};

TEST(OldRedis, ClaimsByTheScriptOnceSetNxGetIsRefused) {
  OldRedis server;
  RedisOptions options;
  options.url = "redis://127.0.0.1:" + std::to_string(server.port());
  auto store = RedisStore::open(options);
  ASSERT_TRUE(store) << store.error().message;
  BlockingStore b(**store);
  for (int i = 0; i < 3; ++i) {
    ClaimRequest r;
    r.id = {"t", "key-000000000" + std::to_string(i)};
    r.request_hash = "h";
    r.token = 100 + static_cast<std::uint64_t>(i);
    r.now = from_epoch_ms(1764547200000);
    r.lease_expires = r.now + std::chrono::seconds(60);
    r.expires = r.now + std::chrono::hours(24);
    auto c = b.claim(r);
    ASSERT_TRUE(c) << c.error().message;
    EXPECT_EQ(c->status, ClaimStatus::claimed);
    EXPECT_EQ(c->record.fencing_token, r.token);
    EXPECT_EQ(c->record.created, r.now);
    EXPECT_EQ(c->record.attempt, 1u);
  }
  // The first claim met the refusal and went on by the script; the next ones went there at once.
  EXPECT_EQ(server.sets.load(), 1);
  EXPECT_EQ(server.evalshas.load(), 3);
  store->reset();  // closes the connection before the server goes
}

}  // namespace
}  // namespace idem::redis_detail
