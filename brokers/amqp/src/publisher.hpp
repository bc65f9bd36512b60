#pragma once

// Publishing with publisher confirms on a connection of its own: what a sink is, and what a
// source's dead_letter() publishes its copies with.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "connection.hpp"
#include "idem/broker.hpp"
#include "message.hpp"

namespace idem::amqp_detail {

/// What became of one message of a publish.
struct PublishResult {
  BrokerResult<Done> result = std::unexpected(BrokerError{BrokerErrc::internal, "not published", false});
  /// It came back (basic.return): no queue is bound for its routing key.
  bool returned = false;
};

/// A confirm-mode channel on its own connection, opened on first use and again after it is lost.
///
/// publish() writes the whole batch (mandatory, persistent), then reads the broker's answers
/// until every message is settled or the confirm timeout passes: basic.ack and basic.nack, each
/// possibly `multiple` (settling every tag up to its own), and basic.return, which comes
/// before the ack of a message no queue took and is matched to it by exchange, routing key
/// and id (returns come in publish order, so the first such message still unsettled is it).
/// Delivery tags count the channel's publishes from 1; a tag of an earlier batch that timed
/// out is settled by nobody and ignored.
class ConfirmPublisher {
 public:
  /// What to do on each new connection before publishing (declares).
  using Setup = std::function<std::expected<void, Failure>(Connection&)>;

  explicit ConfirmPublisher(Endpoint endpoint, Setup setup = {});

  /// Publishes `messages` and waits for their confirms up to `confirm_timeout`; one result
  /// each, in order.
  std::vector<PublishResult> publish(std::span<const Outgoing> messages, Millis confirm_timeout);
  /// Opens the connection (if needed) and makes a round trip on it.
  BrokerResult<Done> ping();
  /// Keeps an open connection alive (heartbeats, reading what the broker sent) without
  /// blocking; forgets it if it is gone. For owners that wait on something else meanwhile.
  void service();

 private:
  struct Batch;
  BrokerResult<Done> ready();
  std::expected<void, Failure> drain(Batch* batch);
  std::expected<void, Failure> handle(const amqp_frame_t& frame, Batch* batch);
  void settle(Batch& batch, std::uint64_t tag, bool multiple, bool acked);
  /// Reads answers until every message sent is settled, the channel or connection goes, or
  /// `deadline`.
  void await_confirms(Batch& batch, Steady::time_point deadline);
  /// After the broker closed the channel: a new channel if the cause was one message, so the
  /// rest of the batch goes on; false (the unsent settled with the cause) otherwise.
  bool recover(Batch& batch);
  void channel_lost(Batch& batch, const Failure& failure);
  void connection_lost(Batch& batch, Failure failure);

  Endpoint endpoint_;
  Setup setup_;
  std::unique_ptr<Connection> conn_;
  std::uint64_t next_tag_ = 1;
  Assembler returns_;
  /// RabbitMQ's max_message_size, once a 406 told it: bigger bodies are rejected unsent.
  std::optional<std::uint64_t> max_message_size_;
};

}  // namespace idem::amqp_detail
