#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "holds_commands.hpp"
#include "idem/memory_store.hpp"

namespace idem::cli {
namespace {

using ::testing::HasSubstr;

struct Capture {
  std::ostringstream out, err;
  Output text() { return Output{out, err, false}; }
  Output json() { return Output{out, err, true}; }
};

class HoldsCommandsTest : public ::testing::Test {
 protected:
  MemoryStore store_;
  StoreKeyHolds holds_{store_, "ledger"};
  void SetUp() override {
    ASSERT_TRUE(holds_.park("pay_1", "evt-1"));
    ASSERT_TRUE(holds_.park("pay_1", "evt-2"));
    ASSERT_TRUE(holds_.park("pay_2", "evt-9"));
    StoreKeyHolds other(store_, "mailer");
    ASSERT_TRUE(other.park("pay_3", "evt-5"));
  }
};

TEST_F(HoldsCommandsTest, ListShowsTheConsumersHeldKeysOnly) {
  Capture c;
  ASSERT_EQ(run_holds_list(store_, "ledger", c.text()), kExitOk);
  EXPECT_THAT(c.out.str(), HasSubstr("evt-1"));
  EXPECT_THAT(c.out.str(), HasSubstr("pay_2"));
  EXPECT_EQ(c.out.str().find("pay_3"), std::string::npos);
  Capture j;
  ASSERT_EQ(run_holds_list(store_, "ledger", j.json()), kExitOk);
  const auto parsed = nlohmann::json::parse(j.out.str());
  ASSERT_EQ(parsed["held_keys"].size(), 2u);
  EXPECT_EQ(parsed["held_keys"][0]["key"], "pay_1");
  EXPECT_EQ(parsed["held_keys"][0]["parked"], 2);
  EXPECT_EQ(parsed["held_keys"][0]["first"], "evt-1");
  Capture none;
  ASSERT_EQ(run_holds_list(store_, "nobody", none.text()), kExitOk);
  EXPECT_THAT(none.out.str(), HasSubstr("no keys held"));
}

TEST_F(HoldsCommandsTest, ShowListsTheParkedIdsInReplayOrder) {
  Capture c;
  ASSERT_EQ(run_holds_show(holds_, "pay_1", c.json()), kExitOk);
  EXPECT_EQ(nlohmann::json::parse(c.out.str())["parked"], (nlohmann::json{"evt-1", "evt-2"}));
  Capture missing;
  EXPECT_EQ(run_holds_show(holds_, "pay_404", missing.text()), kExitFailure);
  EXPECT_THAT(missing.err.str(), HasSubstr("is not held"));
}

TEST_F(HoldsCommandsTest, DropTakesOnlyTheFirstAndTheLastEndsTheHold) {
  Capture wrong;
  EXPECT_EQ(run_holds_drop(holds_, "pay_1", "evt-2", wrong.text()), kExitFailure);
  EXPECT_THAT(wrong.err.str(), HasSubstr("only the first can be dropped"));
  Capture first;
  ASSERT_EQ(run_holds_drop(holds_, "pay_1", "evt-1", first.text()), kExitOk);
  EXPECT_THAT(first.out.str(), HasSubstr("from evt-2 on"));
  Capture last;
  ASSERT_EQ(run_holds_drop(holds_, "pay_1", "evt-2", last.text()), kExitOk);
  EXPECT_THAT(last.out.str(), HasSubstr("no longer held"));
  EXPECT_TRUE(holds_.parked("pay_1")->empty());
}

TEST_F(HoldsCommandsTest, ForgetEndsAHoldAndSaysWhenThereWasNone) {
  Capture c;
  ASSERT_EQ(run_holds_forget(holds_, "pay_2", c.text()), kExitOk);
  EXPECT_TRUE(holds_.parked("pay_2")->empty());
  Capture again;
  EXPECT_EQ(run_holds_forget(holds_, "pay_2", again.text()), kExitFailure);
}

}  // namespace
}  // namespace idem::cli
