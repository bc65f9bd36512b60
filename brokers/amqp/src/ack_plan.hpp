#pragma once

// Which basic.ack frames acknowledge a set of deliveries. `multiple = true` acknowledges every
// delivery up to a tag, so it is used only where that is exactly what was asked: the acked tags
// cover a contiguous run of all tags outstanding on the channel, from the lowest up. Anything
// else gets one ack per tag; acking more than asked would let the broker forget a message whose
// outcome is not yet durable.

#include <cstdint>
#include <optional>
#include <set>
#include <vector>

namespace idem::amqp_detail {

/// The acks to send, in order.
struct AckPlan {
  /// One basic.ack(tag, multiple = true) covering every outstanding tag up to this one.
  std::optional<std::uint64_t> multiple_up_to;
  /// One basic.ack(tag, multiple = false) each.
  std::vector<std::uint64_t> singles;
};

/// Plans acks for `tags` (any order, duplicates ignored), all of which must be in `outstanding`
/// (the tags delivered on this channel and not yet acked or requeued); tags not in it are left
/// out of the plan. A run of two or more goes as one multiple ack.
AckPlan plan_acks(const std::set<std::uint64_t>& outstanding, std::vector<std::uint64_t> tags);

}  // namespace idem::amqp_detail
