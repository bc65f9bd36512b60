#include "record_table.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <string>

namespace idem::memory_detail {
namespace {

Record record(std::string key, std::uint64_t token = 1) {
  Record r;
  r.tenant = "t";
  r.key = std::move(key);
  r.fencing_token = token;
  return r;
}

// The table must agree with a std::map on every key, present or not.
void expect_same(RecordTable& table, const std::map<std::string, std::pair<std::size_t, std::uint64_t>>& model,
                 std::size_t universe, const std::function<std::size_t(std::size_t)>& hash_of) {
  ASSERT_EQ(table.size(), model.size());
  for (std::size_t i = 0; i < universe; ++i) {
    const std::string key = "k" + std::to_string(i);
    Record* found = table.find(hash_of(i), "t", key);
    auto it = model.find(key);
    if (it == model.end()) {
      EXPECT_EQ(found, nullptr) << key;
    } else {
      ASSERT_NE(found, nullptr) << key;
      EXPECT_EQ(found->fencing_token, it->second.second) << key;
    }
  }
}

// Random inserts and erases, checked against a std::map, with hashes drawn from a small range so
// that runs are long, wrap around the end of the array, and share hashes (collisions).
void churn(const std::function<std::size_t(std::size_t)>& hash_of, unsigned seed) {
  RecordTable table;
  std::map<std::string, std::pair<std::size_t, std::uint64_t>> model;
  std::mt19937 rng(seed);
  constexpr std::size_t kUniverse = 600;
  for (int step = 0; step < 20000; ++step) {
    const std::size_t i = rng() % kUniverse;
    const std::string key = "k" + std::to_string(i);
    if (model.contains(key)) {
      ASSERT_TRUE(table.erase(hash_of(i), "t", key)) << key;
      model.erase(key);
    } else {
      table.insert(hash_of(i), record(key, static_cast<std::uint64_t>(step)));
      model[key] = {hash_of(i), static_cast<std::uint64_t>(step)};
    }
    if (step % 997 == 0) expect_same(table, model, kUniverse, hash_of);
  }
  expect_same(table, model, kUniverse, hash_of);
}

TEST(RecordTable, FindsWhatWasInsertedAndNothingElse) {
  RecordTable table;
  EXPECT_EQ(table.find(7, "t", "a"), nullptr);  // empty: no array yet
  EXPECT_FALSE(table.erase(7, "t", "a"));
  table.insert(7, record("a"));
  EXPECT_NE(table.find(7, "t", "a"), nullptr);
  EXPECT_EQ(table.find(7, "t", "b"), nullptr);     // same hash, other key
  EXPECT_EQ(table.find(7, "other", "a"), nullptr);  // same key, other tenant
  EXPECT_EQ(table.find(8, "t", "a"), nullptr);     // the hash decides where to look
}

TEST(RecordTable, ChurnWithWellSpreadHashes) {
  churn([](std::size_t i) { return std::hash<std::string>{}("k" + std::to_string(i)); }, 1);
}

TEST(RecordTable, ChurnWithLongRunsAndWrapAround) {
  // Every hash lands on the last few slots of whatever the array's size: runs wrap to the start.
  churn([](std::size_t i) { return static_cast<std::size_t>(-1) - i % 5; }, 2);
}

TEST(RecordTable, ChurnWhereARunWrapsOntoKeysThatLiveAtTheStart) {
  // Homes at both ends of the array: a run from the end wraps over slots that are other keys'
  // homes, which erasing must not move before their home.
  churn([](std::size_t i) { return i % 2 ? static_cast<std::size_t>(-1) - i % 3 : i % 3; }, 4);
}

TEST(RecordTable, ChurnWhereManyKeysShareOneHash) {
  churn([](std::size_t i) { return i % 3 == 0 ? std::size_t{42} : i; }, 3);
}

TEST(RecordTable, ErasesEveryRecordOfAHashThatIsDueAndOnlyThose) {
  RecordTable table;
  for (int i = 0; i < 10; ++i) table.insert(99, record("same" + std::to_string(i), static_cast<std::uint64_t>(i)));
  for (int i = 0; i < 10; ++i) table.insert(100 + i, record("other" + std::to_string(i)));
  std::size_t seen = 0;
  const std::size_t erased = table.erase_hash_if(99, [&](const Record& r) {
    ++seen;
    return r.fencing_token % 2 == 0;
  });
  EXPECT_EQ(erased, 5u);
  EXPECT_GE(seen, 10u);  // every record of the hash was offered
  EXPECT_EQ(table.size(), 15u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(table.find(99, "t", "same" + std::to_string(i)) != nullptr, i % 2 == 1) << i;
    EXPECT_NE(table.find(100 + i, "t", "other" + std::to_string(i)), nullptr) << i;
  }
  EXPECT_EQ(table.erase_hash_if(12345, [](const Record&) { return true; }), 0u);
}

TEST(RecordTable, ForEachVisitsEveryRecordOnce) {
  RecordTable table;
  for (int i = 0; i < 1000; ++i) table.insert(std::hash<int>{}(i) * 0x9e3779b97f4a7c15ULL, record(std::to_string(i)));
  std::map<std::string, int> visits;
  table.for_each([&](const Record& r) { ++visits[r.key]; });
  ASSERT_EQ(visits.size(), 1000u);
  for (const auto& [key, n] : visits) EXPECT_EQ(n, 1) << key;
}

}  // namespace
}  // namespace idem::memory_detail
