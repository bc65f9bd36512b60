#include "client_commands.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "idem/client/key.hpp"

namespace idem::cli {
namespace {

using namespace std::chrono_literals;
using client::HttpRequest;
using client::HttpResponse;
using client::TransportErrc;
using client::TransportError;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;

using Outcome = std::expected<HttpResponse, TransportError>;

// Time that moves only when the client sleeps: no test waits through a backoff.
class FakeTimer final : public client::Timer {
 public:
  client::SteadyTime now() const override {
    std::lock_guard lock(mutex_);
    return client::SteadyTime{} + 1h + elapsed_;
  }
  TimePoint wall_now() const override {
    std::lock_guard lock(mutex_);
    return from_epoch_ms(1'767'225'600'000) + elapsed_;
  }
  void sleep_for(Millis d) override {
    std::lock_guard lock(mutex_);
    elapsed_ += d;
  }

 private:
  mutable std::mutex mutex_;
  Millis elapsed_{0};
};

// Answers from a script (then `fallback`) and records the requests it saw.
class ScriptedTransport final : public client::Transport {
 public:
  Outcome perform(const HttpRequest& request, Millis) override {
    std::lock_guard lock(mutex_);
    requests.push_back(request);
    if (script.empty()) return fallback;
    Outcome next = script.front();
    script.pop_front();
    return next;
  }
  std::string key_of(std::size_t i) const {
    return std::string(client::find_header(requests.at(i).headers, "Idempotency-Key").value_or(""));
  }

  std::mutex mutex_;
  std::deque<Outcome> script;
  Outcome fallback = HttpResponse{200, {}, "ok"};
  std::vector<HttpRequest> requests;
};

HttpResponse answer(int status, std::string body, Headers headers = {}) {
  return HttpResponse{status, std::move(headers), std::move(body)};
}
Outcome lost() { return std::unexpected(TransportError{TransportErrc::no_answer, "curl: Empty reply from server (52)"}); }

struct Capture {
  std::ostringstream out, err;
  Output text() { return Output{out, err, false}; }
  Output json() { return Output{out, err, true}; }
};

class ClientCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("idemctl-client-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    journal_path_ = (dir_ / "journal.db").string();
  }
  void TearDown() override {
    client_.reset();
    journal_.reset();
    std::filesystem::remove_all(dir_);
  }

  client::Client& make(bool with_journal) {
    client::ClientOptions options;
    options.retry.max_attempts = 3;
    options.jitter_seed = 7;
    if (with_journal) {
      auto journal = client::Journal::open(journal_path_);
      EXPECT_TRUE(journal);
      journal_ = std::shared_ptr<client::Journal>(std::move(*journal));
    }
    client_ = std::make_unique<client::Client>(options, transport_, journal_, std::make_shared<FakeTimer>());
    return *client_;
  }

  static HttpRequest post() { return HttpRequest{"POST", "http://127.0.0.1:1/v1/payments", {}, "{\"amount\":5}"}; }

  std::filesystem::path dir_;
  std::string journal_path_;
  std::shared_ptr<ScriptedTransport> transport_ = std::make_shared<ScriptedTransport>();
  std::shared_ptr<client::Journal> journal_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(ClientCommandsTest, SendPrintsTheBodyAndOneLine) {
  transport_->script = {answer(201, "{\"id\":\"pay_1\"}")};
  Capture c;
  EXPECT_EQ(run_send(make(false), post(), std::nullopt, "", c.text()), kExitOk);
  EXPECT_EQ(c.out.str(), "{\"id\":\"pay_1\"}");
  const std::string key = transport_->key_of(0);
  EXPECT_TRUE(client::is_uuid_v4(key)) << key;
  EXPECT_EQ(c.err.str(), "idemctl: key=" + key + " attempts=1 replayed=false status=201 stop=success\n");
}

TEST_F(ClientCommandsTest, SendRetriesALostAnswerWithTheSameKeyAndReportsTheReplay) {
  transport_->script = {lost(), answer(503, "busy"), answer(201, "first", {{"Idempotent-Replayed", "true"}})};
  Capture c;
  EXPECT_EQ(run_send(make(false), post(), "my-own-key-0000001", "", c.text()), kExitOk);
  ASSERT_EQ(transport_->requests.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(transport_->key_of(i), "my-own-key-0000001");
  EXPECT_EQ(c.out.str(), "first");
  EXPECT_EQ(c.err.str(), "idemctl: key=my-own-key-0000001 attempts=3 replayed=true status=201 stop=success\n");
}

TEST_F(ClientCommandsTest, SendDoesNotRetryA422AndExitsOne) {
  transport_->script = {answer(422, "{\"code\":\"idempotency_key_mismatch\"}")};
  Capture c;
  EXPECT_EQ(run_send(make(false), post(), "my-own-key-0000001", "", c.text()), kExitFailure);
  EXPECT_EQ(transport_->requests.size(), 1u);
  EXPECT_EQ(c.out.str(), "{\"code\":\"idempotency_key_mismatch\"}");
  EXPECT_EQ(c.err.str(), "idemctl: key=my-own-key-0000001 attempts=1 replayed=false status=422 stop=non_retryable\n");
}

TEST_F(ClientCommandsTest, SendWithABadKeyIsAUsageError) {
  Capture c;
  EXPECT_EQ(run_send(make(false), post(), "short", "", c.text()), kExitUsage);
  EXPECT_TRUE(transport_->requests.empty());
  EXPECT_THAT(c.err.str(), MatchesRegex("idemctl: key=short attempts=0 replayed=false status=none "
                                        "stop=invalid_request detail=\".*\"\n"));
}

TEST_F(ClientCommandsTest, ExhaustedWithoutAJournalSaysWhichKeyToReuse) {
  transport_->fallback = lost();
  Capture c;
  EXPECT_EQ(run_send(make(false), post(), "my-own-key-0000001", "", c.text()), kExitFailure);
  EXPECT_THAT(c.out.str(), IsEmpty());
  EXPECT_THAT(c.err.str(),
              HasSubstr("idemctl: key=my-own-key-0000001 attempts=3 replayed=false status=none "
                        "stop=attempts_exhausted error=\"no_answer: curl: Empty reply from server (52)\"\n"));
  EXPECT_THAT(c.err.str(), HasSubstr("send the same request with --key 'my-own-key-0000001'"));
}

TEST_F(ClientCommandsTest, SendJson) {
  transport_->script = {answer(200, "hi", {{"X-A", "1"}})};
  Capture c;
  EXPECT_EQ(run_send(make(false), post(), "my-own-key-0000001", "", c.json()), kExitOk);
  const auto j = nlohmann::json::parse(c.out.str());
  EXPECT_EQ(j["key"], "my-own-key-0000001");
  EXPECT_EQ(j["attempts"], 1);
  EXPECT_EQ(j["status"], 200);
  EXPECT_EQ(j["stop"], "success");
  EXPECT_EQ(j["body_base64"], "aGk=");
  EXPECT_EQ(j["headers"][0], nlohmann::json({"X-A", "1"}));
  EXPECT_TRUE(j["error"].is_null());
}

TEST_F(ClientCommandsTest, DeadLettersListRetryAndDrop) {
  transport_->fallback = answer(503, "{\"code\":\"down\"}");
  client::Client& client = make(true);
  Capture sent;
  EXPECT_EQ(run_send(client, post(), "dead-letter-key-0001", journal_path_, sent.text()), kExitFailure);
  EXPECT_THAT(sent.err.str(), HasSubstr("kept in the dead letters; to send it again with the same key: idemctl "
                                        "dead-letters --journal '" + journal_path_ + "' retry 'dead-letter-key-0001'"));
  EXPECT_EQ(run_send(client, post(), "dead-letter-key-0002", journal_path_, sent.text()), kExitFailure);

  Capture listed;
  ASSERT_EQ(run_dead_letters(*journal_, listed.json()), kExitOk);
  const auto letters = nlohmann::json::parse(listed.out.str())["dead_letters"];
  ASSERT_EQ(letters.size(), 2u);
  EXPECT_EQ(letters[0]["key"], "dead-letter-key-0001");
  EXPECT_EQ(letters[0]["reason"], "attempts_exhausted");
  EXPECT_EQ(letters[0]["attempts"], 3);
  EXPECT_EQ(letters[0]["last_response"]["status"], 503);
  EXPECT_EQ(letters[0]["request"]["url"], "http://127.0.0.1:1/v1/payments");

  Capture text;
  ASSERT_EQ(run_dead_letters(*journal_, text.text()), kExitOk);
  EXPECT_THAT(text.out.str(), HasSubstr("attempts_exhausted  3         503       POST http://127.0.0.1:1/v1/payments"));

  transport_->script = {answer(201, "stored", {{"Idempotent-Replayed", "true"}})};
  const std::size_t before = transport_->requests.size();
  Capture retried;
  EXPECT_EQ(run_retry_dead_letter(client, "dead-letter-key-0001", journal_path_, retried.text()), kExitOk);
  EXPECT_EQ(transport_->key_of(before), "dead-letter-key-0001");
  EXPECT_EQ(retried.out.str(), "stored");
  EXPECT_THAT(retried.err.str(), HasSubstr("key=dead-letter-key-0001 attempts=1 replayed=true status=201"));

  Capture dropped;
  EXPECT_EQ(run_drop_dead_letter(*journal_, "dead-letter-key-0002", dropped.text()), kExitOk);
  EXPECT_EQ(dropped.out.str(), "dropped dead letter dead-letter-key-0002\n");
  Capture again;
  EXPECT_EQ(run_drop_dead_letter(*journal_, "dead-letter-key-0002", again.text()), kExitFailure);
  EXPECT_EQ(again.err.str(), "idemctl: no dead letter with key \"dead-letter-key-0002\"\n");
  Capture missing;
  EXPECT_EQ(run_retry_dead_letter(client, "dead-letter-key-0002", journal_path_, missing.text()), kExitFailure);

  Capture empty;
  ASSERT_EQ(run_dead_letters(*journal_, empty.text()), kExitOk);
  EXPECT_EQ(empty.out.str(), "no dead letters\n");
}

TEST_F(ClientCommandsTest, PendingAndResumeAfterACrash) {
  client::Client& client = make(true);
  // What a process killed mid-send leaves: operations journaled, never answered.
  ASSERT_TRUE(journal_->begin({"crashed-key-00000001", post(), 1, from_epoch_ms(1'767'225'600'000)}));
  ASSERT_TRUE(journal_->begin({"crashed-key-00000002", post(), 1, from_epoch_ms(1'767'225'600'000)}));
  ASSERT_TRUE(journal_->count_attempt("crashed-key-00000002"));

  Capture pending;
  ASSERT_EQ(run_pending(*journal_, pending.text()), kExitOk);
  EXPECT_THAT(pending.out.str(), HasSubstr("crashed-key-00000001"));
  EXPECT_THAT(pending.out.str(), HasSubstr("2026-01-01T00:00:00.000Z  POST http://127.0.0.1:1/v1/payments (12 bytes)"));
  Capture pending_json;
  ASSERT_EQ(run_pending(*journal_, pending_json.json()), kExitOk);
  EXPECT_EQ(nlohmann::json::parse(pending_json.out.str())["pending"][1]["attempts"], 2);

  transport_->script = {answer(201, "a", {{"Idempotent-Replayed", "true"}}), lost(), answer(201, "b")};
  Capture resumed;
  EXPECT_EQ(run_resume(client, journal_path_, resumed.text()), kExitOk);
  EXPECT_EQ(resumed.out.str(), "resumed 2 pending operations: 2 succeeded\n");
  ASSERT_EQ(transport_->requests.size(), 3u);
  EXPECT_EQ(transport_->key_of(0), "crashed-key-00000001");
  EXPECT_EQ(transport_->key_of(1), "crashed-key-00000002");
  EXPECT_EQ(transport_->key_of(2), "crashed-key-00000002");
  EXPECT_THAT(resumed.err.str(), HasSubstr("key=crashed-key-00000001 attempts=1 replayed=true status=201"));

  Capture none;
  ASSERT_EQ(run_pending(*journal_, none.text()), kExitOk);
  EXPECT_EQ(none.out.str(), "no pending operations\n");
  Capture nothing;
  EXPECT_EQ(run_resume(client, journal_path_, nothing.json()), kExitOk);
  EXPECT_EQ(nlohmann::json::parse(nothing.out.str())["resumed"], 0);
}

TEST_F(ClientCommandsTest, ResumeThatFailsExitsOne) {
  client::Client& client = make(true);
  ASSERT_TRUE(journal_->begin({"crashed-key-00000001", post(), 1, from_epoch_ms(1'767'225'600'000)}));
  transport_->fallback = answer(500, "boom");
  Capture c;
  EXPECT_EQ(run_resume(client, journal_path_, c.json()), kExitFailure);
  const auto j = nlohmann::json::parse(c.out.str());
  EXPECT_EQ(j["succeeded"], 0);
  EXPECT_EQ(j["results"][0]["stop"], "attempts_exhausted");
}

TEST_F(ClientCommandsTest, DropPending) {
  make(true);
  ASSERT_TRUE(journal_->begin({"crashed-key-00000001", post(), 1, from_epoch_ms(1'767'225'600'000)}));
  Capture c;
  EXPECT_EQ(run_drop_pending(*journal_, "crashed-key-00000001", c.text()), kExitOk);
  Capture again;
  EXPECT_EQ(run_drop_pending(*journal_, "crashed-key-00000001", again.text()), kExitFailure);
  EXPECT_EQ(again.err.str(), "idemctl: no pending operation with key \"crashed-key-00000001\"\n");
}

}  // namespace
}  // namespace idem::cli
