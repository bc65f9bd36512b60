#pragma once

// Messages between idem's types and AMQP frames: headers tables read and written, content
// (method, header, body frames) assembled per channel, and the properties of a publish.

#include <amqp.h>
#include <amqp_framing.h>

#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "errors.hpp"
#include "idem/broker.hpp"

namespace idem::amqp_detail {

/// The header carrying a message id longer than AMQP's 255-byte message_id property (idem's
/// ids go up to 256 bytes; the consume loop judges longer ones invalid, so they travel too).
inline constexpr std::string_view kLongMessageIdHeader = "x-idem-message-id";

/// AMQP's shortstr limit: message_id, content_type, header names, exchange and routing keys.
inline constexpr std::size_t kMaxShortString = 255;

/// A headers table as idem headers: string values as they are, others rendered as text
/// (numbers in decimal, booleans true/false, arrays and tables JSON-like).
MessageHeaders headers_from_table(const amqp_table_t& table);

/// The value of an integer field (any width or signedness; a decimal string too), if it is one.
std::optional<std::int64_t> integer_of(const amqp_field_value_t& value);

/// A message arriving on a channel: a delivery (basic.deliver) or a publish that came back
/// (basic.return), with its properties and body.
struct Incoming {
  bool returned = false;
  std::uint64_t delivery_tag = 0;
  bool redelivered = false;
  int reply_code = 0;
  std::string reply_text;
  std::string exchange;
  std::string routing_key;

  std::string message_id;
  bool has_message_id = false;
  std::string content_type;
  /// The `ordering_key` header's value (as text, whatever its AMQP type), taken out of the
  /// headers; empty when there is none or it is no valid_ordering_key.
  std::string ordering_key;
  MessageHeaders headers;
  /// Quorum queues count earlier deliveries in x-delivery-count.
  std::optional<std::int64_t> x_delivery_count;
  std::string body;
};

/// Puts one channel's content frames back together. AMQP sends a message as a method frame
/// (basic.deliver or basic.return), a header frame (properties, body size) and body frames,
/// contiguous on their channel but possibly interleaved with other channels' frames.
class Assembler {
 public:
  enum class Step : std::uint8_t {
    more,      ///< part of a message; more frames to come
    complete,  ///< a message is complete: take() it
    other,     ///< not content (another method): the caller's to handle
  };
  /// Takes a frame of this channel. Copies what it needs: the frame's memory may be released
  /// afterwards. Fails on frames out of order.
  std::expected<Step, Failure> feed(const amqp_frame_t& frame);
  /// The completed message.
  Incoming take() { return std::move(current_); }
  /// Forgets a message half received (its connection is gone).
  void reset();

 private:
  enum class State : std::uint8_t { idle, header, body };
  State state_ = State::idle;
  std::uint64_t body_size_ = 0;
  Incoming current_;
};

/// One header of a message to publish; integers go as AMQP long-longs, the rest as long strings.
struct OutgoingHeader {
  std::string_view name;
  std::string_view text;
  std::optional<std::int64_t> integer;
};

/// A message to publish: views into what the caller keeps alive until publish returns.
struct Outgoing {
  std::string_view exchange;
  std::string_view routing_key;
  std::string_view message_id;  ///< empty: none (an empty id is not carried)
  std::string_view content_type;
  /// Empty: none. Else the `ordering_key` header, which no header of `headers` duplicates: one of
  /// that name there is dropped (the message's ordering key wins, and without one a header of
  /// that name would pose as it).
  std::string_view ordering_key;
  std::vector<OutgoingHeader> headers;
  std::string_view body;
};

/// Why `message` cannot be published as it is (a name past 255 bytes, headers past one frame of
/// `frame_max` bytes, an ordering key that is no valid_ordering_key), or nothing. Checked before
/// sending: librabbitmq would fail after the method frame went out, leaving the channel
/// mid-message.
std::optional<std::string> unpublishable(const Outgoing& message, std::uint32_t frame_max);

/// The basic properties of a publish, persistent, and the table they point into.
class Properties {
 public:
  explicit Properties(const Outgoing& message);
  Properties(const Properties&) = delete;
  Properties& operator=(const Properties&) = delete;
  const amqp_basic_properties_t* get() const { return &props_; }

 private:
  std::vector<amqp_table_entry_t> entries_;
  amqp_basic_properties_t props_{};
};

/// A view of a string as librabbitmq bytes (it never writes through them).
inline amqp_bytes_t bytes_of(std::string_view s) {
  return amqp_bytes_t{s.size(), const_cast<char*>(s.data())};
}

/// librabbitmq bytes as a string.
inline std::string string_of(amqp_bytes_t b) {
  return b.len == 0 ? std::string() : std::string(static_cast<const char*>(b.bytes), b.len);
}

}  // namespace idem::amqp_detail
