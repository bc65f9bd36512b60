#include "encryption_at_rest_test.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <thread>

#include "idem/consumer.hpp"
#include "idem/encrypted_store.hpp"
#include "idem/engine.hpp"
#include "idem/testing/test_keys.hpp"

namespace idem::testing {

std::string run_command(const std::vector<std::string>& argv) {
  int out[2];
  if (::pipe(out) != 0) {
    ADD_FAILURE() << "pipe failed";
    return {};
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::perror(args[0]);
    ::_exit(127);
  }
  ::close(out[1]);
  std::string text;
  std::array<char, 65536> buffer;
  for (;;) {
    const ssize_t n = ::read(out[0], buffer.data(), buffer.size());
    if (n <= 0) break;
    text.append(buffer.data(), static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << argv[0] << " failed (status " << status << ")";
  return text;
}

std::string hex_of(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 0xf]);
  }
  return out;
}

std::size_t occurrences(std::string_view haystack, std::string_view needle) {
  std::size_t n = 0;
  for (auto at = haystack.find(needle); at != std::string_view::npos; at = haystack.find(needle, at + needle.size())) ++n;
  return n;
}

namespace {

using namespace std::chrono_literals;

// What the records carry: a card number and an id, the kind of thing encryption at rest is for.
constexpr std::string_view kMarker = "MARKER-7d1e0c-4111111111111111";
// What a plaintext record written straight to the backend carries: proves the raw scan sees data.
constexpr std::string_view kControl = "CONTROL-PLAINTEXT-55b2e1";

struct Request {
  explicit Request(std::string k) : key(std::move(k)) {}
  std::string key;
  std::string body = R"({"amount":100,"currency":"EUR"})";
  std::vector<HeaderView> headers;
  RequestView view() {
    headers = {{"Idempotency-Key", key}, {"Content-Type", "application/json"}};
    return RequestView{"POST", "/v1/payments", "", headers, body};
  }
};

std::string key_of(const std::string& prefix, int i) { return prefix + "-" + std::to_string(100000 + i); }

// A store wrapped for encryption, owning its backend.
std::unique_ptr<EncryptedStore> encrypted(std::unique_ptr<Store> backend, std::shared_ptr<const KeyRing> keys) {
  auto* admin = dynamic_cast<StoreAdmin*>(backend.get());
  return std::make_unique<EncryptedStore>(std::move(backend), admin, std::move(keys));
}

// Executes `request` through `engine` with a response carrying `body` (and the marker in a
// header); the response as sent.
StoredResponse execute(Engine& engine, Request request, const std::string& body) {
  Policy policy;
  auto d = engine.begin_and_wait(policy, request.view(), "acme");
  EXPECT_EQ(d.verdict, Verdict::execute) << request.key << ": " << to_string(d.verdict) << " " << d.detail;
  StoredResponse response{201, {{"Content-Type", "application/json"}, {"X-Header-Name-3c9e1f", "card"}, {"X-Card", std::string(kMarker)}}, body};
  if (d.verdict != Verdict::execute) return response;
  auto finished = engine.finish_and_wait(*d.ticket, response);
  EXPECT_EQ(finished.value_or(FinishStatus::fenced_out), FinishStatus::stored) << request.key;
  return response;
}

Decision retry(Engine& engine, Request request) {
  Policy policy;
  return engine.begin_and_wait(policy, request.view(), "acme");
}

}  // namespace

TEST_P(EncryptionAtRest, NoMarkerReachesTheStorage) {
  auto backend = GetParam().make();
  auto store = encrypted(backend->open(), test_key_ring(test_key_line("k1", 1)));
  Engine engine(*store);
  std::map<std::string, StoredResponse> sent;
  for (int i = 0; i < 20; ++i) {
    Request r{key_of("marker-record", i)};
    sent[r.key] = execute(engine, r, "{\"card\":\"" + std::string(kMarker) + "\",\"n\":" + std::to_string(i) + "}");
  }
  // An operator's resolve and a consumer's remembered result go through the same decorator.
  {
    ClaimRequest claim;
    claim.id = RecordId{"acme", "resolved-by-operator-1"};
    claim.request_hash = "h";
    claim.token = new_fencing_token();
    claim.now = SystemClock::instance().now();
    claim.lease_expires = claim.now + 1min;
    claim.expires = claim.now + 1h;
    ASSERT_EQ(BlockingStore(*store).claim(claim)->status, ClaimStatus::claimed);
    auto resolved = wait_for<AdminStatus>([&](auto cb) {
      store->resolve(claim.id, StoredResponse{200, {}, std::string(kMarker)}, claim.now, claim.expires, std::move(cb));
    });
    ASSERT_EQ(resolved.value_or(AdminStatus::not_found), AdminStatus::done);
    ConsumerOptions options;
    options.name = "ledger";
    auto consumer = Consumer::create(*store, options);
    ASSERT_TRUE(consumer);
    auto processed = consumer->process_once("message-0000000001", "payload",
                                            []() -> std::expected<std::string, std::string> { return std::string(kMarker); });
    ASSERT_TRUE(processed && processed->status == MessageStatus::processed);
  }
  // The control: one plaintext record written straight to the backend.
  {
    auto raw = backend->open();
    Engine plain(*raw);
    Request r{"control-record-000001"};
    Policy policy;
    auto d = plain.begin_and_wait(policy, r.view(), "acme");
    ASSERT_EQ(d.verdict, Verdict::execute);
    ASSERT_TRUE(plain.finish_and_wait(*d.ticket, StoredResponse{200, {}, std::string(kControl)}));
  }
  // Every record replays, decrypted.
  for (const auto& [key, response] : sent) {
    auto d = retry(engine, Request{key});
    ASSERT_EQ(d.verdict, Verdict::replay) << key;
    EXPECT_EQ(*d.replay, response);
  }
  EXPECT_EQ(backend->count_in_storage(kMarker), 0u) << "a stored response in plaintext, store open";
  store.reset();  // closed: SQLite's write-ahead log checkpointed into the database file
  EXPECT_GE(backend->count_in_storage(kControl), 1u) << "the raw scan does not see the records";
  EXPECT_EQ(backend->count_in_storage(kMarker), 0u) << "a stored response in plaintext";
  EXPECT_EQ(backend->count_in_storage("4111111111111111"), 0u);
  EXPECT_EQ(backend->count_in_storage("X-Header-Name-3c9e1f"), 0u) << "stored headers in plaintext";
}

TEST_P(EncryptionAtRest, OneAlteredByteIsRefusedAndNothingExecutes) {
  auto backend = GetParam().make();
  auto store = encrypted(backend->open(), test_key_ring(test_key_line("k1", 1)));
  Engine engine(*store);
  Request r{"altered-record-000001"};
  execute(engine, r, std::string(kMarker));
  ASSERT_EQ(retry(engine, r).verdict, Verdict::replay);
  const Record before = *BlockingStore(store->inner()).get(RecordId{"acme", r.key}).value();

  backend->alter_one_byte(RecordId{"acme", r.key});
  for (int i = 0; i < 3; ++i) {
    auto d = retry(engine, r);
    EXPECT_EQ(d.verdict, Verdict::record_unreadable);
    ASSERT_TRUE(d.store_error);
    EXPECT_NE(d.store_error->message.find("key id \"k1\""), std::string::npos) << d.store_error->message;
  }
  // Refused by a replica that opens the storage afresh too.
  auto other = encrypted(backend->open(), test_key_ring(test_key_line("k1", 1)));
  Engine other_engine(*other);
  EXPECT_EQ(retry(other_engine, r).verdict, Verdict::record_unreadable);
  const Record after = *BlockingStore(store->inner()).get(RecordId{"acme", r.key}).value();
  EXPECT_EQ(after.state, RecordState::completed);
  EXPECT_EQ(after.fencing_token, before.fencing_token);  // never claimed again
  EXPECT_NE(after.response->body, before.response->body);
}

TEST_P(EncryptionAtRest, ACiphertextMovedToAnotherKeyIsRefused) {
  auto backend = GetParam().make();
  auto store = encrypted(backend->open(), test_key_ring(test_key_line("k1", 1)));
  Engine engine(*store);
  Request a{"moved-from-00000001"}, b{"moved-onto-00000001"};
  const StoredResponse a_response = execute(engine, a, "a: " + std::string(kMarker));
  execute(engine, b, "b: " + std::string(kMarker));
  backend->copy_response(RecordId{"acme", a.key}, RecordId{"acme", b.key});
  EXPECT_EQ(retry(engine, b).verdict, Verdict::record_unreadable);
  auto replay = retry(engine, a);
  ASSERT_EQ(replay.verdict, Verdict::replay);
  EXPECT_EQ(*replay.replay, a_response);
}

TEST_P(EncryptionAtRest, PlaintextRecordsFromBeforeStillReplay) {
  auto backend = GetParam().make();
  Request r{"plaintext-before-0001"};
  {
    auto raw = backend->open();
    Engine plain(*raw);
    Policy policy;
    auto d = plain.begin_and_wait(policy, r.view(), "acme");
    ASSERT_EQ(d.verdict, Verdict::execute);
    ASSERT_TRUE(plain.finish_and_wait(*d.ticket, StoredResponse{200, {{"X-A", "1"}}, "before"}));
  }
  auto store = encrypted(backend->open(), test_key_ring(test_key_line("k1", 1)));
  Engine engine(*store);
  auto d = retry(engine, r);
  ASSERT_EQ(d.verdict, Verdict::replay);
  EXPECT_EQ(*d.replay, (StoredResponse{200, {{"X-A", "1"}}, "before"}));
}

TEST_P(EncryptionAtRest, RotationUnderLoadFailsNoRequest) {
  auto backend = GetParam().make();
  const std::string k1 = test_key_line("k1", 1), k2 = test_key_line("k2", 2);
  auto store = encrypted(backend->open(), test_key_ring(k1));
  Engine engine(*store);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0}, executed{0}, replayed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::string> mine;
      for (int i = 0; !stop.load() || i < 20; ++i) {
        Request r{key_of("rotation-" + std::to_string(t), i)};
        Policy policy;
        auto d = engine.begin_and_wait(policy, r.view(), "acme");
        if (d.verdict != Verdict::execute || !engine.finish_and_wait(*d.ticket, StoredResponse{201, {}, r.key})) {
          failures.fetch_add(1);
          continue;
        }
        executed.fetch_add(1);
        mine.push_back(r.key);
        // A retry of this one and of an older one, whichever key sealed them.
        for (const std::string& key : {mine.back(), mine[mine.size() / 2]}) {
          auto again = engine.begin_and_wait(policy, Request{key}.view(), "acme");
          if (again.verdict != Verdict::replay || again.replay->body != key) {
            failures.fetch_add(1);
          } else {
            replayed.fetch_add(1);
          }
        }
      }
    });
  }
  // The two-step rotation of docs/security.md: the new key first opens only, then seals.
  for (const std::string& keys : {k1 + test_key_line("k2", 2, "decrypt-only"), k1 + k2,
                                  test_key_line("k1", 1, "decrypt-only") + k2}) {
    std::this_thread::sleep_for(150ms);
    store->set_keys(test_key_ring(keys));
  }
  std::this_thread::sleep_for(150ms);
  stop.store(true);
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(executed.load(), 80);
  EXPECT_EQ(replayed.load(), 2 * executed.load());

  // Records sealed by both keys; `keys usage` would now show which ones still need k1.
  std::map<std::string, int> by_key;
  ListQuery query;
  query.limit = 100000;
  auto* admin = dynamic_cast<StoreAdmin*>(&store->inner());
  ASSERT_NE(admin, nullptr);
  auto listed = wait_for<std::vector<Record>>([&](auto cb) { admin->list(query, std::move(cb)); });
  ASSERT_TRUE(listed) << listed.error().message;
  for (const Record& rec : *listed) {
    if (rec.response) ++by_key[std::string(sealed_key_id(*rec.response).value_or("plaintext"))];
  }
  EXPECT_GT(by_key["k1"], 0);
  EXPECT_GT(by_key["k2"], 0);
  EXPECT_EQ(by_key.count("plaintext"), 0u);
}

}  // namespace idem::testing
