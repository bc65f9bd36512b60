#pragma once

// What the tests of process_batch_in_transaction share (SQLite and PostgreSQL): batches of
// messages that own their ids, a clock that can act between a batch's claims and its transaction,
// and a random mix of batches for the equivalence of the batch form with the single one.

#include <cstddef>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "idem/clock.hpp"
#include "idem/consumer.hpp"
#include "idem/testing/manual_clock.hpp"

namespace idem::testing {

/// Messages of one batch; owns the bytes the Consumer::Message views point into.
struct MessageBatch {
  std::vector<std::string> ids;
  std::vector<std::string> payloads;
  /// Whether the work of each message declines (an application failure), by index.
  std::vector<bool> fails;

  void add(std::string id, std::string payload = "p", bool fail = false) {
    ids.push_back(std::move(id));
    payloads.push_back(std::move(payload));
    fails.push_back(fail);
  }
  std::vector<Consumer::Message> messages() const {
    std::vector<Consumer::Message> out;
    for (std::size_t i = 0; i < ids.size(); ++i) out.push_back(Consumer::Message{ids[i], payloads[i]});
    return out;
  }
};

/// Reads `base`, and runs `hook` once, at the reading `countdown` readings after arm(). A
/// Consumer reads its clock once per message it claims and once per completion it builds, so
/// arm(n + 1) before a batch of n valid messages runs the hook after the batch's claims and before
/// its transaction: where another consumer takes a lease over, or another process takes the lock.
class HookClock final : public Clock {
 public:
  explicit HookClock(ManualClock& base) : base_(base) {}
  TimePoint now() const override {
    if (countdown_ > 0 && --countdown_ == 0) {
      auto hook = std::move(hook_);
      hook();
    }
    return base_.now();
  }
  void arm(int countdown, std::function<void()> hook) {
    countdown_ = countdown;
    hook_ = std::move(hook);
  }

 private:
  ManualClock& base_;
  mutable int countdown_ = 0;
  mutable std::function<void()> hook_;
};

/// `rounds` batches of up to `size` messages drawn from `pool` ids ("mix-000".."mix-NNN"), no id
/// twice in one batch (the batch form answers in_progress there, the single form duplicate),
/// with ids of earlier batches again (duplicates, or a retry of a failed one), now and then
/// another payload (a conflict), an invalid id, and a work that declines.
inline std::vector<MessageBatch> random_batches(unsigned seed, int rounds, int size, int pool) {
  std::mt19937 rng(seed);
  std::vector<MessageBatch> batches(static_cast<std::size_t>(rounds));
  for (MessageBatch& batch : batches) {
    std::vector<bool> taken(static_cast<std::size_t>(pool), false);
    for (int k = 0; k < size; ++k) {
      const int n = static_cast<int>(rng() % static_cast<unsigned>(pool));
      const unsigned dice = rng() % 20;
      if (dice == 0) {
        batch.add(std::string("bad id ") + std::to_string(k));  // a space: invalid_id
        continue;
      }
      if (taken[static_cast<std::size_t>(n)]) continue;
      taken[static_cast<std::size_t>(n)] = true;
      std::string id = std::string("mix-") + std::to_string(1000 + n);
      batch.add(std::move(id), dice == 1 ? "other payload" : "p", dice == 2 || dice == 3);
    }
  }
  return batches;
}

}  // namespace idem::testing
