#include "ack_plan.hpp"

#include <algorithm>

namespace idem::amqp_detail {

AckPlan plan_acks(const std::set<std::uint64_t>& outstanding, std::vector<std::uint64_t> tags) {
  std::sort(tags.begin(), tags.end());
  tags.erase(std::unique(tags.begin(), tags.end()), tags.end());
  std::erase_if(tags, [&](std::uint64_t t) { return !outstanding.contains(t); });

  // Walk the outstanding tags from the lowest while they match the asked ones: that prefix is
  // what a multiple ack up to its last tag acknowledges, and nothing else.
  std::size_t run = 0;
  for (auto it = outstanding.begin(); it != outstanding.end() && run < tags.size() && *it == tags[run]; ++it) ++run;

  AckPlan plan;
  std::size_t first_single = 0;
  if (run >= 2) {
    plan.multiple_up_to = tags[run - 1];
    first_single = run;
  }
  plan.singles.assign(tags.begin() + static_cast<std::ptrdiff_t>(first_single), tags.end());
  return plan;
}

}  // namespace idem::amqp_detail
