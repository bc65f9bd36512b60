#include "idem/client/journal.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>

#include "fakes.hpp"
#include "idem/client/client.hpp"
#include "idem/client/key.hpp"

namespace idem::client {
namespace {

using std::chrono::seconds;
using testing::failure;
using testing::FakeTimer;
using testing::problem;
using testing::response;
using testing::ScriptedTransport;
using testing::sent_key;

HttpRequest transfer(std::string body = R"({"amount":250,"to":"acct_2"})") {
  return HttpRequest{"POST",
                     "https://api.example.com/v1/transfers",
                     {{"Content-Type", "application/json"}, {"X-Trace", std::string("a\0b", 3)}},
                     std::move(body)};
}

class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("idem-client-test-" + new_key().value());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "journal.db").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::shared_ptr<Journal> open_journal() {
    auto journal = Journal::open(path_);
    EXPECT_TRUE(journal.has_value()) << journal.error().message;
    return std::shared_ptr<Journal>(std::move(*journal));
  }

  // A client over fakes and a journal on path_.
  struct Rig {
    std::shared_ptr<ScriptedTransport> transport = std::make_shared<ScriptedTransport>();
    std::shared_ptr<FakeTimer> timer = std::make_shared<FakeTimer>();
    std::shared_ptr<Journal> journal;
    std::unique_ptr<Client> client;
  };
  Rig rig(std::vector<testing::Outcome> script = {}, ClientOptions options = {}) {
    Rig r;
    r.transport = std::make_shared<ScriptedTransport>(std::move(script));
    r.journal = open_journal();
    options.jitter_seed = 5;
    r.client = std::make_unique<Client>(std::move(options), r.transport, r.journal, r.timer);
    return r;
  }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(JournalTest, IsWalWithAPrivateFile) {
  open_journal();
  struct stat st{};
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)), "wal");
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

TEST_F(JournalTest, RefusesAJournalFromANewerVersion) {
  open_journal();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto journal = Journal::open(path_);
  ASSERT_FALSE(journal.has_value());
  EXPECT_NE(journal.error().message.find("newer"), std::string::npos);
}

TEST_F(JournalTest, CannotOpenInAMissingDirectory) {
  auto journal = Journal::open((dir_ / "missing" / "journal.db").string());
  ASSERT_FALSE(journal.has_value());
  EXPECT_EQ(journal.error().code, JournalErrc::storage);
}

TEST_F(JournalTest, TheOperationIsDurableBeforeTheFirstAttempt) {
  auto r = rig();
  std::vector<Operation> seen;
  std::string path = path_;
  r.transport->on_perform = [&](const HttpRequest&) {
    // Read through a separate connection: what a restarted process would find.
    auto other = Journal::open(path);
    ASSERT_TRUE(other.has_value());
    seen = (*other)->pending().value();
  };
  const SendResult result = r.client->send(transfer());
  ASSERT_EQ(result.stop, StopReason::success);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].key, result.key);
  EXPECT_EQ(seen[0].request, transfer());  // exactly the caller's request, without the key header
  EXPECT_EQ(seen[0].attempts, 1);
  EXPECT_EQ(seen[0].created, r.timer->wall_now());
}

TEST_F(JournalTest, AFinalAnswerRemovesTheOperation) {
  auto r = rig({response(503, {{"Retry-After", "1"}}), response(201), problem(422, "idempotency_key_mismatch")});
  EXPECT_EQ(r.client->send(transfer()).stop, StopReason::success);
  EXPECT_EQ(r.client->send(transfer()).stop, StopReason::non_retryable);
  EXPECT_TRUE(r.journal->pending().value().empty());
  EXPECT_TRUE(r.journal->dead_letters().value().empty());
}

TEST_F(JournalTest, CountsAttempts) {
  auto r = rig({response(503, {{"Retry-After", "1"}}), response(503, {{"Retry-After", "1"}}), response(201)});
  std::vector<int> counted;
  r.transport->on_perform = [&](const HttpRequest&) { counted.push_back(r.journal->pending().value().at(0).attempts); };
  r.client->send(transfer());
  EXPECT_EQ(counted, (std::vector<int>{1, 2, 3}));
}

TEST_F(JournalTest, ExhaustedOperationsBecomeDeadLettersWithTheirLastAnswer) {
  auto r = rig();
  r.transport->fallback = response(503, {{"Retry-After", "1"}, {"X-Why", "maintenance"}}, "down for maintenance");
  const SendResult result = r.client->send(transfer());
  ASSERT_EQ(result.stop, StopReason::attempts_exhausted);
  EXPECT_TRUE(r.journal->pending().value().empty());
  const auto letters = r.client->dead_letters().value();
  ASSERT_EQ(letters.size(), 1u);
  const DeadLetter& letter = letters[0];
  EXPECT_EQ(letter.operation.key, result.key);
  EXPECT_EQ(letter.operation.request, transfer());
  EXPECT_EQ(letter.operation.attempts, 5);
  EXPECT_EQ(letter.reason, "attempts_exhausted");
  ASSERT_TRUE(letter.last_response);
  EXPECT_EQ(letter.last_response->status, 503);
  EXPECT_EQ(letter.last_response->body, "down for maintenance");
  EXPECT_EQ(find_header(letter.last_response->headers, "X-Why"), "maintenance");
  EXPECT_TRUE(letter.last_error.empty());
  EXPECT_EQ(letter.failed, r.timer->wall_now());
}

TEST_F(JournalTest, ADeadLetterKeepsTheLastTransportError) {
  ClientOptions options;
  options.retry.max_attempts = 2;
  auto r = rig({response(502, {{"Retry-After", "1"}}, "bad gateway"), failure(TransportErrc::no_answer)}, options);
  EXPECT_EQ(r.client->send(transfer()).stop, StopReason::attempts_exhausted);
  const auto letters = r.client->dead_letters().value();
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].last_error, "fake: no_answer");
  ASSERT_TRUE(letters[0].last_response);  // the last answer that did come
  EXPECT_EQ(letters[0].last_response->status, 502);
}

TEST_F(JournalTest, DeadlineBudgetAndOutcomeUnknownAlsoGoToTheDeadLetters) {
  ClientOptions options;
  options.budget = {.enabled = true, .retry_ratio = 0, .min_retries_per_second = 0, .max_tokens = 0};
  auto r = rig({response(503, {{"Retry-After", "86400"}}), response(503), problem(409, "idempotency_outcome_unknown")},
               options);
  EXPECT_EQ(r.client->send(transfer("1")).stop, StopReason::deadline);
  EXPECT_EQ(r.client->send(transfer("2")).stop, StopReason::budget_exhausted);
  EXPECT_EQ(r.client->send(transfer("3")).stop, StopReason::outcome_unknown);
  const auto letters = r.client->dead_letters().value();
  ASSERT_EQ(letters.size(), 3u);
  EXPECT_EQ(letters[0].reason, "deadline");
  EXPECT_EQ(letters[1].reason, "budget_exhausted");
  EXPECT_EQ(letters[2].reason, "outcome_unknown");
  EXPECT_TRUE(r.journal->pending().value().empty());
}

TEST_F(JournalTest, CredentialsAddedBeforeEachAttemptAreNotJournaled) {
  ClientOptions options;
  options.before_attempt = [](HttpRequest& request) { request.headers.push_back({"Authorization", "Bearer s3cret"}); };
  auto r = rig({}, options);
  std::vector<Operation> seen;
  r.transport->on_perform = [&](const HttpRequest& sent) {
    EXPECT_EQ(find_header(sent.headers, "Authorization"), "Bearer s3cret");
    seen = r.journal->pending().value();
  };
  r.client->send(transfer());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_FALSE(find_header(seen[0].request.headers, "Authorization"));
  EXPECT_FALSE(find_header(seen[0].request.headers, "Idempotency-Key"));
}

TEST_F(JournalTest, ResumeAfterACrashUsesTheOriginalKey) {
  std::string key;
  {
    auto r = rig({response(503, {{"Retry-After", "1"}})});
    // The second attempt "crashes the process": the exception unwinds out of send().
    r.transport->on_perform = [&](const HttpRequest& sent) {
      if (r.transport->calls() == 2) {
        key = sent_key(sent);
        throw std::runtime_error("simulated crash");
      }
    };
    EXPECT_THROW(r.client->send(transfer()), std::runtime_error);
  }
  ASSERT_FALSE(key.empty());

  auto r = rig({response(201, {{"Idempotent-Replayed", "true"}}, "transferred")});  // a new process
  const auto pending = r.client->pending().value();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].key, key);
  EXPECT_EQ(pending[0].attempts, 2);

  const auto results = r.client->resume();
  ASSERT_TRUE(results.has_value()) << results.error().message;
  ASSERT_EQ(results->size(), 1u);
  const SendResult& result = results->at(0);
  EXPECT_EQ(result.key, key);
  EXPECT_EQ(result.stop, StopReason::success);
  EXPECT_TRUE(result.replayed);
  EXPECT_EQ(result.response->body, "transferred");
  const auto sent = r.transport->requests();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent_key(sent[0]), key);
  EXPECT_EQ(sent[0].body, transfer().body);
  EXPECT_EQ(find_header(sent[0].headers, "X-Trace"), std::string("a\0b", 3));
  EXPECT_TRUE(r.client->pending().value().empty());
}

TEST_F(JournalTest, ResumeAfterTheProcessDiesForReal) {
  // The child journals an operation and dies inside its first attempt, with no unwinding at all.
  const std::string path = path_;
  EXPECT_EXIT(
      {
        auto journal = std::shared_ptr<Journal>(Journal::open(path).value());
        auto transport = std::make_shared<ScriptedTransport>();
        transport->on_perform = [](const HttpRequest&) { std::_Exit(42); };
        Client client({}, transport, journal, std::make_shared<FakeTimer>());
        client.send(transfer(), "killed-mid-flight-0001");
      },
      ::testing::ExitedWithCode(42), "");

  auto r = rig();
  const auto results = r.client->resume().value();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].key, "killed-mid-flight-0001");
  EXPECT_EQ(results[0].stop, StopReason::success);
  EXPECT_EQ(sent_key(r.transport->requests().at(0)), "killed-mid-flight-0001");
  EXPECT_TRUE(r.client->pending().value().empty());
}

TEST_F(JournalTest, ResumeReturnsEveryPendingOperationOldestFirst) {
  {
    auto journal = open_journal();
    FakeTimer timer;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(journal->begin({"pending-operation-000" + std::to_string(i), transfer(std::to_string(i)), 0,
                                  timer.wall_now()}));
      timer.advance(seconds(1));
    }
  }
  auto r = rig({response(201), problem(422, "idempotency_key_mismatch"), response(503)});
  r.transport->fallback = response(503);
  const auto results = r.client->resume().value();
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].key, "pending-operation-0000");
  EXPECT_EQ(results[0].stop, StopReason::success);
  EXPECT_EQ(results[1].stop, StopReason::non_retryable);
  EXPECT_EQ(results[2].stop, StopReason::attempts_exhausted);
  EXPECT_TRUE(r.client->pending().value().empty());
  const auto letters = r.client->dead_letters().value();
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].operation.key, "pending-operation-0002");
  EXPECT_EQ(letters[0].operation.attempts, 6);  // one before the "crash", five in resume
}

TEST_F(JournalTest, ResumeSkipsOperationsThisClientIsSending) {
  auto r = rig();
  JournalResult<std::vector<SendResult>> during = std::vector<SendResult>{};
  r.transport->on_perform = [&](const HttpRequest&) {
    r.transport->on_perform = nullptr;
    during = r.client->resume();
  };
  r.client->send(transfer());
  ASSERT_TRUE(during.has_value());
  EXPECT_TRUE(during->empty());
  EXPECT_EQ(r.transport->calls(), 1u);
}

TEST_F(JournalTest, ResumeDoesNotResendOperationsTheServerMayHaveForgotten) {
  {
    auto journal = open_journal();
    FakeTimer timer;
    ASSERT_TRUE(journal->begin({"an-old-operation-0001", transfer(), 0, timer.wall_now()}));
  }
  auto r = rig();
  r.timer->advance(std::chrono::hours(13));
  const auto results = r.client->resume().value();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].stop, StopReason::expired);
  EXPECT_EQ(results[0].attempts, 0);
  EXPECT_EQ(r.transport->calls(), 0u);
  const auto letters = r.client->dead_letters().value();
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].reason, "expired");
  EXPECT_EQ(letters[0].operation.created, FakeTimer().wall_now());
}

TEST_F(JournalTest, ADeadLetterCanBeRetriedWithItsKey) {
  auto r = rig();
  r.transport->fallback = response(503, {{"Retry-After", "1"}});
  const SendResult failed = r.client->send(transfer());
  ASSERT_EQ(failed.stop, StopReason::attempts_exhausted);

  r.transport->fallback = response(201, {}, "done");
  bool pending_during_retry = false;
  r.transport->on_perform = [&](const HttpRequest&) {
    const auto pending = r.journal->pending().value();
    pending_during_retry = pending.size() == 1 && pending[0].key == failed.key;
    EXPECT_TRUE(r.journal->dead_letters().value().empty());
  };
  const auto retried = r.client->retry_dead_letter(failed.key);
  ASSERT_TRUE(retried.has_value()) << retried.error().message;
  EXPECT_EQ(retried->key, failed.key);
  EXPECT_EQ(retried->stop, StopReason::success);
  EXPECT_EQ(retried->attempts, 1);
  EXPECT_TRUE(pending_during_retry);
  EXPECT_EQ(sent_key(r.transport->requests().back()), failed.key);
  EXPECT_EQ(r.transport->requests().back().body, transfer().body);
  EXPECT_TRUE(r.client->pending().value().empty());
  EXPECT_TRUE(r.client->dead_letters().value().empty());
}

TEST_F(JournalTest, ADeadLetterCanBeDropped) {
  auto r = rig({problem(409, "idempotency_outcome_unknown")});
  const SendResult failed = r.client->send(transfer());
  ASSERT_EQ(r.client->dead_letters().value().size(), 1u);
  EXPECT_TRUE(r.client->drop_dead_letter(failed.key).has_value());
  EXPECT_TRUE(r.client->dead_letters().value().empty());
  EXPECT_EQ(r.client->drop_dead_letter(failed.key).error().code, JournalErrc::not_found);
  EXPECT_EQ(r.client->retry_dead_letter("no-such-dead-letter").error().code, JournalErrc::not_found);
  EXPECT_EQ(r.journal->drop_pending("no-such-operation").error().code, JournalErrc::not_found);
}

TEST_F(JournalTest, SendingADeadLettersKeyAgainTakesItOutOfTheDeadLetters) {
  auto r = rig({problem(409, "idempotency_outcome_unknown"), response(201)});
  EXPECT_EQ(r.client->send(transfer(), "operator-resolved-0001").stop, StopReason::outcome_unknown);
  EXPECT_EQ(r.client->send(transfer(), "operator-resolved-0001").stop, StopReason::success);
  EXPECT_TRUE(r.client->dead_letters().value().empty());
  EXPECT_TRUE(r.client->pending().value().empty());
}

TEST_F(JournalTest, AnUnwritableJournalStopsTheSendBeforeAnythingLeaves) {
  auto r = rig();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "DROP TABLE pending", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  const SendResult result = r.client->send(transfer());
  EXPECT_EQ(result.stop, StopReason::journal_failed);
  EXPECT_FALSE(result.detail.empty());
  EXPECT_EQ(r.transport->calls(), 0u);
}

TEST_F(JournalTest, ManyThreadsShareOneJournaledClient) {
  ClientOptions options;
  options.budget.enabled = false;
  auto r = rig({}, options);
  std::mutex mutex;
  std::set<std::string> seen;
  std::atomic<int> calls{0};
  // Every operation's first attempt is lost after sending; the retry must find it still journaled.
  r.transport->responder = [&](const HttpRequest& request) -> testing::Outcome {
    ++calls;
    std::lock_guard lock(mutex);
    if (seen.insert(sent_key(request)).second) return failure(TransportErrc::no_answer);
    return response(201);
  };
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        const SendResult result = r.client->send(transfer());
        EXPECT_EQ(result.stop, StopReason::success) << to_string(result.stop);
        EXPECT_EQ(result.attempts, 2);
        ok += result.ok() ? 1 : 0;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(ok.load(), 100);
  EXPECT_EQ(calls.load(), 200);
  EXPECT_TRUE(r.client->pending().value().empty());
  EXPECT_TRUE(r.client->dead_letters().value().empty());
}

}  // namespace
}  // namespace idem::client
