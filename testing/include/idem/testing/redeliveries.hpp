#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "idem/consumer.hpp"

namespace idem::testing {

/// The id of message `i` in a redelivery storm: "msg-000042".
inline std::string redelivered_id(int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "msg-%06d", i);
  return buf;
}

/// What a redelivery storm ended with, per message id: the final outcome of every delivery
/// (in_progress answers are retried, not kept), and the store errors met.
struct Redeliveries {
  std::map<std::string, std::vector<MessageOutcome>> outcomes;
  std::vector<std::string> errors;
  int in_progress_answers = 0;

  /// How many deliveries of `id` ended with `status`.
  int count(const std::string& id, MessageStatus status) const {
    const auto it = outcomes.find(id);
    if (it == outcomes.end()) return 0;
    return static_cast<int>(std::count_if(it->second.begin(), it->second.end(),
                                          [status](const MessageOutcome& o) { return o.status == status; }));
  }
};

/// A queue's redeliveries, hammered: `threads` threads each deliver every one of `messages`
/// messages `deliveries` times, in an order of their own; `deliver(thread, id)` processes one
/// delivery. A delivery answered in_progress is delivered again after a millisecond (the queue
/// redelivering what was not acked), so every delivery ends processed, duplicate or otherwise.
inline Redeliveries redeliver_concurrently(
    int threads, int messages, int deliveries,
    const std::function<StoreResult<MessageOutcome>(int thread, const std::string& id)>& deliver) {
  Redeliveries tally;
  std::mutex mutex;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::vector<int> order;
      for (int d = 0; d < deliveries; ++d)
        for (int i = 0; i < messages; ++i) order.push_back(i);
      std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(t)));
      for (int i : order) {
        const std::string id = redelivered_id(i);
        for (;;) {
          auto outcome = deliver(t, id);
          bool again = false;
          {
            std::lock_guard lock(mutex);
            if (!outcome) {
              tally.errors.push_back(id + ": " + outcome.error().message);
            } else if (outcome->status == MessageStatus::in_progress) {
              ++tally.in_progress_answers;
              again = true;
            } else {
              tally.outcomes[id].push_back(std::move(*outcome));
            }
          }
          if (!again) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  return tally;
}

/// The storm's verdict: no store errors, and every message ended processed by exactly one of its
/// `per_message` deliveries and duplicate for all the others.
inline void expect_each_processed_once(const Redeliveries& tally, int messages, int per_message) {
  EXPECT_TRUE(tally.errors.empty()) << tally.errors.size() << " store errors, the first: " << tally.errors.front();
  for (int i = 0; i < messages; ++i) {
    const std::string id = redelivered_id(i);
    EXPECT_EQ(tally.count(id, MessageStatus::processed), 1) << id;
    EXPECT_EQ(tally.count(id, MessageStatus::duplicate), per_message - 1) << id;
  }
}

}  // namespace idem::testing
