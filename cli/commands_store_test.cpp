#include "store_commands.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <unistd.h>

#include "idem/memory_store.hpp"
#include "idem/open_store.hpp"

namespace idem::cli {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr TimePoint kNow = from_epoch_ms(1'767'225'600'000);  // 2026-01-01T00:00:00.000Z

// Captures what one command printed.
struct Capture {
  std::ostringstream out, err;
  Output text() { return Output{out, err, false}; }
  Output json() { return Output{out, err, true}; }
  nlohmann::json parsed() const { return nlohmann::json::parse(out.str()); }
};

class StoreCommandsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      auto memory = std::make_unique<MemoryStore>();
      admin_ = memory.get();
      store_ = std::move(memory);
    } else {
      std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
      std::replace(name.begin(), name.end(), '/', '-');
      dir_ = std::filesystem::temp_directory_path() / ("idemctl-test-" + std::to_string(::getpid()) + "-" + name);
      std::filesystem::remove_all(dir_);
      std::filesystem::create_directories(dir_);
      auto opened = open_store("sqlite:" + (dir_ / "store.db").string());
      ASSERT_TRUE(opened) << opened.error().message;
      admin_ = opened->admin;
      store_ = std::move(opened->store);
    }
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // A record as the gateway leaves it: claimed at `at`, then completed / failed / left running.
  void seed(const std::string& tenant, const std::string& key, RecordState state, TimePoint at = kNow,
            Millis retention = 24h) {
    BlockingStore blocking(*store_);
    ClaimRequest claim;
    claim.id = {tenant, key};
    claim.request_hash = std::string(64, 'b');
    claim.token = 42;
    claim.now = at;
    claim.lease_expires = at + 60s;
    claim.expires = at + retention;
    auto claimed = blocking.claim(claim);
    ASSERT_TRUE(claimed);
    ASSERT_EQ(claimed->status, ClaimStatus::claimed);
    const Fence fence{claim.id, claim.token};
    if (state == RecordState::completed) {
      StoredResponse response{201, {{"Content-Type", "application/json"}, {"X-Execution-Id", "ex-1"}}, "{\"id\":1}\n"};
      ASSERT_EQ(blocking.complete({fence, response, at, claim.expires}).value(), FenceStatus::ok);
    } else if (state == RecordState::failed_retryable) {
      ASSERT_EQ(blocking.fail({fence, at, claim.expires}).value(), FenceStatus::ok);
    }
  }

  std::optional<Record> read(const std::string& tenant, const std::string& key) {
    BlockingStore blocking(*store_);
    return blocking.get({tenant, key}).value();
  }

  std::filesystem::path dir_;
  std::unique_ptr<Store> store_;
  StoreAdmin* admin_ = nullptr;
};

TEST_P(StoreCommandsTest, GetAbsentIsExitOneWithAMessage) {
  Capture c;
  EXPECT_EQ(run_get(*store_, {"acme", "missing-key-0000001"}, false, kNow, c.text()), kExitFailure);
  EXPECT_THAT(c.out.str(), IsEmpty());
  EXPECT_EQ(c.err.str(), "idemctl: no record for tenant \"acme\" key \"missing-key-0000001\"\n");
}

TEST_P(StoreCommandsTest, GetPrintsTheRecord) {
  seed("acme", "key-completed-00001", RecordState::completed);
  Capture c;
  ASSERT_EQ(run_get(*store_, {"acme", "key-completed-00001"}, false, kNow + 1s, c.text()), kExitOk) << c.err.str();
  const std::string out = c.out.str();
  EXPECT_THAT(out, HasSubstr("state          completed\n"));
  EXPECT_THAT(out, HasSubstr("request_hash   " + std::string(64, 'b') + "\n"));
  EXPECT_THAT(out, HasSubstr("created        2026-01-01T00:00:00.000Z\n"));
  EXPECT_THAT(out, HasSubstr("expires        2026-01-02T00:00:00.000Z\n"));
  EXPECT_THAT(out, HasSubstr("status         201\n"));
  EXPECT_THAT(out, HasSubstr("header         X-Execution-Id: ex-1\n"));
  EXPECT_THAT(out, HasSubstr("body           9 bytes"));
  EXPECT_THAT(c.err.str(), IsEmpty());
}

TEST_P(StoreCommandsTest, GetBodyPrintsTheRawBody) {
  seed("", "key-completed-00001", RecordState::completed);
  Capture c;
  ASSERT_EQ(run_get(*store_, {"", "key-completed-00001"}, true, kNow, c.text()), kExitOk);
  EXPECT_EQ(c.out.str(), "{\"id\":1}\n");
}

TEST_P(StoreCommandsTest, GetBodyOfARunningRecordIsExitOne) {
  seed("", "key-in-progress-001", RecordState::in_progress);
  Capture c;
  EXPECT_EQ(run_get(*store_, {"", "key-in-progress-001"}, true, kNow, c.text()), kExitFailure);
  EXPECT_THAT(c.err.str(), HasSubstr("has no stored response (state in_progress)"));
}

TEST_P(StoreCommandsTest, GetJson) {
  seed("acme", "key-completed-00001", RecordState::completed);
  seed("acme", "key-in-progress-001", RecordState::in_progress);
  Capture c;
  ASSERT_EQ(run_get(*store_, {"acme", "key-completed-00001"}, false, kNow, c.json()), kExitOk);
  const auto j = c.parsed();
  EXPECT_EQ(j["tenant"], "acme");
  EXPECT_EQ(j["state"], "completed");
  EXPECT_EQ(j["fencing_token"], "42");
  EXPECT_EQ(j["created"], "2026-01-01T00:00:00.000Z");
  EXPECT_EQ(j["completed"], "2026-01-01T00:00:00.000Z");
  EXPECT_TRUE(j["lease_expires"].is_null());
  EXPECT_EQ(j["expired"], false);
  EXPECT_EQ(j["response"]["status"], 201);
  EXPECT_EQ(j["response"]["headers"][1], nlohmann::json({"X-Execution-Id", "ex-1"}));
  EXPECT_EQ(j["response"]["body_size"], 9);
  EXPECT_EQ(j["response"]["body_base64"], "eyJpZCI6MX0K");

  Capture running;
  ASSERT_EQ(run_get(*store_, {"acme", "key-in-progress-001"}, false, kNow, running.json()), kExitOk);
  EXPECT_EQ(running.parsed()["lease_expires"], "2026-01-01T00:01:00.000Z");
  EXPECT_TRUE(running.parsed()["response"].is_null());
}

TEST_P(StoreCommandsTest, ListFiltersAndPages) {
  seed("a", "key-0000000000001", RecordState::completed);
  seed("a", "key-0000000000002", RecordState::in_progress);
  seed("b", "key-0000000000003", RecordState::completed);
  seed("b", "key-0000000000004", RecordState::failed_retryable);

  Capture all;
  ASSERT_EQ(run_list(*admin_, {}, kNow, all.json()), kExitOk);
  ASSERT_EQ(all.parsed()["records"].size(), 4u);
  EXPECT_TRUE(all.parsed()["next_after"].is_null());
  EXPECT_FALSE(all.parsed()["records"][0]["response"].contains("body_base64"));

  Capture completed;
  ListArgs only_completed;
  only_completed.state = RecordState::completed;
  ASSERT_EQ(run_list(*admin_, only_completed, kNow, completed.json()), kExitOk);
  const auto records = completed.parsed()["records"];
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["key"], "key-0000000000001");
  EXPECT_EQ(records[1]["key"], "key-0000000000003");

  ListArgs page;
  page.limit = 3;
  Capture first;
  ASSERT_EQ(run_list(*admin_, page, kNow, first.text()), kExitOk);
  EXPECT_THAT(first.err.str(), HasSubstr("--after 'b' 'key-0000000000003'"));
  EXPECT_THAT(first.out.str(), HasSubstr("in_progress      -      2026-01-01T00:00:00.000Z"));
  page.after = RecordId{"b", "key-0000000000003"};
  Capture second;
  ASSERT_EQ(run_list(*admin_, page, kNow, second.json()), kExitOk);
  ASSERT_EQ(second.parsed()["records"].size(), 1u);
  EXPECT_EQ(second.parsed()["records"][0]["state"], "failed_retryable");

  ListArgs every;
  every.limit = 1;
  every.all = true;
  Capture paged;
  ASSERT_EQ(run_list(*admin_, every, kNow, paged.json()), kExitOk);
  EXPECT_EQ(paged.parsed()["records"].size(), 4u);
  EXPECT_THAT(paged.err.str(), IsEmpty());
}

TEST_P(StoreCommandsTest, ListEmpty) {
  Capture c;
  ASSERT_EQ(run_list(*admin_, {}, kNow, c.text()), kExitOk);
  EXPECT_EQ(c.out.str(), "no records\n");
}

TEST_P(StoreCommandsTest, PurgeDeletesExpiredInBatches) {
  for (int i = 0; i < 5; ++i) seed("", "expired-key-00000" + std::to_string(i), RecordState::completed, kNow - 48h, 1h);
  seed("", "live-key-0000000001", RecordState::completed);
  Capture c;
  ASSERT_EQ(run_purge(*store_, kNow, 2, c.text()), kExitOk);
  EXPECT_EQ(c.out.str(), "purged 5 expired records\n");
  EXPECT_TRUE(read("", "live-key-0000000001"));
  EXPECT_FALSE(read("", "expired-key-000000"));

  Capture again;
  ASSERT_EQ(run_purge(*store_, kNow, 1000, again.json()), kExitOk);
  EXPECT_EQ(again.parsed()["purged"], 0);
}

TEST_P(StoreCommandsTest, ReleaseMakesARunningRecordRetryable) {
  seed("t", "key-in-progress-001", RecordState::in_progress);
  Capture c;
  ASSERT_EQ(run_release(*admin_, {"t", "key-in-progress-001"}, kNow, c.text()), kExitOk) << c.err.str();
  EXPECT_THAT(c.out.str(), HasSubstr("now failed_retryable"));
  auto r = read("t", "key-in-progress-001");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state, RecordState::failed_retryable);
  EXPECT_NE(r->fencing_token, 42u);  // the holder, if still running, is fenced out
}

TEST_P(StoreCommandsTest, ReleaseRefusesCompletedAndAbsent) {
  seed("t", "key-completed-00001", RecordState::completed);
  Capture completed;
  EXPECT_EQ(run_release(*admin_, {"t", "key-completed-00001"}, kNow, completed.text()), kExitFailure);
  EXPECT_THAT(completed.err.str(), HasSubstr("is completed"));
  EXPECT_EQ(read("t", "key-completed-00001")->state, RecordState::completed);

  Capture absent;
  EXPECT_EQ(run_release(*admin_, {"t", "no-such-key-000001"}, kNow, absent.text()), kExitFailure);
  EXPECT_THAT(absent.err.str(), HasSubstr("no record for tenant \"t\" key \"no-such-key-000001\""));
}

TEST_P(StoreCommandsTest, ResolveRecordsTheOutcome) {
  seed("t", "key-in-progress-001", RecordState::in_progress);
  StoredResponse response{200, {{"Content-Type", "text/plain"}}, "done by hand"};
  Capture c;
  ASSERT_EQ(run_resolve(*admin_, {"t", "key-in-progress-001"}, response, kNow, 2h, c.json()), kExitOk) << c.err.str();
  EXPECT_EQ(c.parsed()["expires"], "2026-01-01T02:00:00.000Z");
  auto r = read("t", "key-in-progress-001");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state, RecordState::completed);
  ASSERT_TRUE(r->response);
  EXPECT_EQ(*r->response, response);

  Capture again;
  EXPECT_EQ(run_resolve(*admin_, {"t", "key-in-progress-001"}, response, kNow, 2h, again.text()), kExitFailure);
  EXPECT_THAT(again.err.str(), HasSubstr("already completed"));
}

TEST_P(StoreCommandsTest, ResolveAFailedRecord) {
  seed("t", "key-failed-0000001", RecordState::failed_retryable);
  Capture c;
  ASSERT_EQ(run_resolve(*admin_, {"t", "key-failed-0000001"}, {204, {}, ""}, kNow, 24h, c.text()), kExitOk);
  EXPECT_THAT(c.out.str(), HasSubstr("completed with status 204 (0 bytes)"));
}

TEST_P(StoreCommandsTest, Stats) {
  seed("", "key-0000000000001", RecordState::completed);
  seed("", "key-0000000000002", RecordState::completed);
  seed("", "key-0000000000003", RecordState::in_progress);
  seed("", "key-0000000000004", RecordState::failed_retryable);
  seed("", "key-0000000000005", RecordState::completed, kNow - 48h, 1h);
  Capture c;
  ASSERT_EQ(run_stats(*admin_, kNow, c.json()), kExitOk);
  EXPECT_EQ(c.parsed(), nlohmann::json::parse(
                            R"({"in_progress":1,"completed":2,"failed_retryable":1,"expired":1,"total":5})"));
  Capture text;
  ASSERT_EQ(run_stats(*admin_, kNow, text.text()), kExitOk);
  EXPECT_THAT(text.out.str(), HasSubstr("completed         2\n"));
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreCommandsTest, ::testing::Values("memory", "sqlite"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace idem::cli
