#pragma once

// Building blocks of the Store's batch calls (store.hpp), for stores and store wrappers: one that
// makes single calls one after the other, and one that gathers per-item answers arriving in any
// order, on any thread.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "idem/store.hpp"

namespace idem {

/// Gathers the answers of a batch's items, each by its position, and reports the whole batch
/// once the last one arrived (on the thread that delivered it). Items may answer in any order
/// and on any thread.
template <class T>
class BatchCollector {
 public:
  /// A collector for `size` items; with none, `done` runs at once with an empty batch.
  static std::shared_ptr<BatchCollector> make(std::size_t size, BatchCallback<T> done) {
    auto collector = std::shared_ptr<BatchCollector>(new BatchCollector(size, std::move(done)));
    if (size == 0) collector->finish();
    return collector;
  }

  /// Records item `index`'s answer; each index exactly once.
  void set(std::size_t index, StoreResult<T> result) {
    results_[index] = std::move(result);
    // acq_rel: the last item's thread sees every other item's answer before it reports.
    if (left_.fetch_sub(1, std::memory_order_acq_rel) == 1) finish();
  }

  /// A single call's callback that records its answer as item `index`.
  static Callback<T> slot(std::shared_ptr<BatchCollector> collector, std::size_t index) {
    return [collector = std::move(collector), index](StoreResult<T> result) mutable {
      collector->set(index, std::move(result));
    };
  }

 private:
  BatchCollector(std::size_t size, BatchCallback<T> done) : results_(size), left_(size), done_(std::move(done)) {}

  void finish() {
    auto done = std::move(done_);
    done(std::move(results_));
  }

  BatchResults<T> results_;
  std::atomic<std::size_t> left_;
  BatchCallback<T> done_;
};

/// Runs `single(item, callback)` for each item in order, each one only after the previous one
/// answered, and reports their answers together: the batch decided exactly as the same calls
/// made one after the other. Stores that answer inline (the memory store) run the whole batch in
/// this call, in a loop rather than a recursion; stores that answer on their own threads continue
/// it there.
template <class Item, class T>
void one_by_one(std::vector<Item> items, BatchCallback<T> done,
                std::move_only_function<void(Item, Callback<T>)> single) {
  // The caller and the callback race to see who comes second: that one carries on with the next
  // item. `turn` says who got there first.
  struct Run : std::enable_shared_from_this<Run> {
    std::vector<Item> items;
    BatchResults<T> results;
    BatchCallback<T> done;
    std::move_only_function<void(Item, Callback<T>)> single;
    std::size_t next = 0;
    std::atomic<std::uint8_t> turn{0};  // 0: both pending; 1: answered; 2: the call returned

    void step() {
      for (;;) {
        if (next == items.size()) {
          auto report = std::move(done);
          report(std::move(results));
          return;
        }
        const std::size_t i = next++;
        turn.store(0, std::memory_order_relaxed);
        single(std::move(items[i]), [self = this->shared_from_this()](StoreResult<T> result) {
          self->results.push_back(std::move(result));
          if (self->turn.exchange(1, std::memory_order_acq_rel) == 2) self->step();
        });
        if (turn.exchange(2, std::memory_order_acq_rel) != 1) return;  // the callback carries on
      }
    }
  };
  auto run = std::make_shared<Run>();
  run->results.reserve(items.size());
  run->items = std::move(items);
  run->done = std::move(done);
  run->single = std::move(single);
  run->step();
}

}  // namespace idem
