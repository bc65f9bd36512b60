#include "publisher.hpp"

#include <charconv>

namespace idem::amqp_detail {
namespace {

// RabbitMQ's words for a body over max_message_size: "PRECONDITION_FAILED - message size 2000
// is larger than configured max size 1024". The limit it names, if it does.
std::optional<std::uint64_t> max_size_in(const std::string& text) {
  constexpr std::string_view marker = "max size ";
  const auto at = text.find(marker);
  if (at == std::string::npos) return std::nullopt;
  const char* begin = text.data() + at + marker.size();
  std::uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(begin, text.data() + text.size(), value);
  if (ec != std::errc{} || ptr == begin) return std::nullopt;
  return value;
}

BrokerError not_sent(const BrokerError& cause) {
  return BrokerError{cause.code == BrokerErrc::timeout ? BrokerErrc::timeout : BrokerErrc::unavailable,
                     "not sent: " + cause.message, false};
}

}  // namespace

struct ConfirmPublisher::Batch {
  enum class State : std::uint8_t { unsent, pending, settled };
  std::span<const Outgoing> messages;
  std::vector<PublishResult>& results;
  std::vector<State> state;
  std::map<std::uint64_t, std::size_t> pending;  // delivery tag -> message index
  std::vector<std::optional<Failure>> returned;
  bool broken = false;  // the channel or connection went: nothing more to wait for
  std::optional<BrokerError> channel_error;  // why the broker closed the channel, if it did

  Batch(std::span<const Outgoing> m, std::vector<PublishResult>& r)
      : messages(m), results(r), state(m.size(), State::unsent), returned(m.size()) {}

  void fail_unsent(const BrokerError& e) {
    for (std::size_t i = 0; i < state.size(); ++i) {
      if (state[i] == State::unsent) set(i, std::unexpected(e));
    }
  }

  void set(std::size_t i, BrokerResult<Done> result, bool was_returned = false) {
    results[i].result = std::move(result);
    results[i].returned = was_returned;
    state[i] = State::settled;
  }
};

ConfirmPublisher::ConfirmPublisher(Endpoint endpoint, Setup setup) : endpoint_(std::move(endpoint)), setup_(std::move(setup)) {}

BrokerResult<Done> ConfirmPublisher::ready() {
  if (conn_ && !conn_->dead()) {
    const auto interval = conn_->heartbeat();
    if (interval.count() > 0 && Steady::now() - conn_->last_sent() > interval) {
      // Silent for more than an interval: the broker may be closing it for missed heartbeats
      // right now. A new connection, rather than a publish racing that close into doubt.
      conn_.reset();
    } else if (auto r = drain(nullptr); !r) {
      // Nothing read this connection since the last call: what the broker sent meanwhile (late
      // confirms, a connection.close, EOF) is taken in, so a dead one is replaced first.
      conn_.reset();
    }
  }
  if (conn_ && conn_->dead()) conn_.reset();
  if (!conn_) {
    auto opened = Connection::open(endpoint_);
    if (!opened) return std::unexpected(map_error(opened.error()));
    auto conn = std::move(*opened);
    // Declares first: a passive declare that finds nothing closes the channel, and the one
    // opened after it would not be in confirm mode.
    if (setup_) {
      if (auto r = setup_(*conn); !r) return std::unexpected(map_error(r.error()));
    }
    if (auto r = conn->confirm_select(); !r) return std::unexpected(map_error(r.error()));
    conn_ = std::move(conn);
    next_tag_ = 1;
    returns_.reset();
    max_message_size_.reset();  // a restarted broker may have another limit
  }
  if (!conn_->channel_open()) {
    // The broker closed the channel (a refused publish); the connection is fine.
    if (auto r = conn_->reopen_channel(); !r) {
      conn_.reset();
      return std::unexpected(map_error(r.error()));
    }
    if (auto r = conn_->confirm_select(); !r) {
      conn_.reset();
      return std::unexpected(map_error(r.error()));
    }
    next_tag_ = 1;
    returns_.reset();
  }
  return Done{};
}

std::vector<PublishResult> ConfirmPublisher::publish(std::span<const Outgoing> messages, Millis confirm_timeout) {
  std::vector<PublishResult> results(messages.size());
  if (messages.empty()) return results;
  Batch batch(messages, results);
  if (auto r = ready(); !r) {
    batch.fail_unsent(r.error());
    return results;
  }
  if (conn_->blocked()) {
    batch.fail_unsent(BrokerError{BrokerErrc::unavailable,
                                  endpoint_.where + ": RabbitMQ is blocking publishers (a memory or disk alarm): " + conn_->blocked_reason(),
                                  false});
    return results;
  }

  const auto deadline = Steady::now() + confirm_timeout;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (batch.broken && !recover(batch)) break;
    const Outgoing& m = messages[i];
    const std::uint32_t frame_max = conn_->frame_max();
    if (auto why = unpublishable(m, frame_max)) {
      batch.set(i, std::unexpected(BrokerError{BrokerErrc::rejected, endpoint_.where + ": cannot publish the message: " + *why, false}));
      continue;
    }
    if (max_message_size_ && m.body.size() > *max_message_size_) {
      batch.set(i, std::unexpected(BrokerError{BrokerErrc::rejected,
                                               endpoint_.where + ": the message's " + std::to_string(m.body.size()) +
                                                   " bytes are more than RabbitMQ's max_message_size (" +
                                                   std::to_string(*max_message_size_) + ")",
                                               false}));
      continue;
    }
    // A body past one frame may be past the broker's max_message_size, and the broker answers
    // that by closing the channel, losing the confirms in flight. Such a message goes alone:
    // after the confirms of those before it, and confirmed before the next is sent, so that only
    // it fails (and the broker's limit, learned then, keeps the next ones from being sent).
    const bool alone = m.body.size() > frame_max;
    if (alone) {
      await_confirms(batch, deadline);
      if (batch.broken && !recover(batch)) break;
    }
    auto writable = conn_->wait_writable(deadline);
    if (!writable) {
      connection_lost(batch, writable.error());
      break;
    }
    if (!*writable) break;  // the broker stopped reading (flow control): the rest is not sent; below
    if (auto a = conn_->keep_alive(); !a) {  // never send to a silent broker (connection.hpp)
      connection_lost(batch, a.error());
      break;
    }
    const Properties props(m);
    const int st = amqp_basic_publish(conn_->state(), kChannel, bytes_of(m.exchange), bytes_of(m.routing_key),
                                      /*mandatory=*/1, /*immediate=*/0, props.get(), bytes_of(m.body));
    conn_->note_sent();
    batch.pending.emplace(next_tag_++, i);
    batch.state[i] = Batch::State::pending;
    if (st != AMQP_STATUS_OK) {
      connection_lost(batch, conn_->library_failure(st, "publishing"));
      break;
    }
    if (alone) {
      await_confirms(batch, deadline);
    } else if (i % 64 == 63) {
      // Read confirms as they come, so a large batch never waits on a full socket buffer.
      if (auto r = drain(&batch); !r) connection_lost(batch, r.error());
    }
  }
  if (batch.broken) recover(batch);  // settles what is unsent with the reason
  await_confirms(batch, deadline);

  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (batch.state[i] == Batch::State::pending) {
      batch.set(i, std::unexpected(BrokerError{BrokerErrc::timeout,
                                               endpoint_.where + ": no confirm from RabbitMQ within " +
                                                   std::to_string(confirm_timeout.count()) + " ms: the message may have been taken",
                                               true}));
    } else if (batch.state[i] == Batch::State::unsent) {
      batch.set(i, std::unexpected(BrokerError{BrokerErrc::timeout,
                                               endpoint_.where + ": not sent: RabbitMQ stopped reading within the confirm timeout "
                                                                 "(flow control, or a blocked connection)",
                                               false}));
    }
  }
  return results;
}

void ConfirmPublisher::await_confirms(Batch& batch, Steady::time_point deadline) {
  while (!batch.broken && !batch.pending.empty()) {
    if (auto r = drain(&batch); !r) {
      connection_lost(batch, r.error());
      return;
    }
    if (batch.broken || batch.pending.empty()) return;
    auto w = conn_->wait(deadline);
    if (!w) {
      connection_lost(batch, w.error());
      return;
    }
    if (*w == Connection::Wait::timeout) return;
  }
}

bool ConfirmPublisher::recover(Batch& batch) {
  if (!batch.broken) return true;
  if (!batch.channel_error) return false;  // the connection went: connection_lost settled everything
  const BrokerError cause = *batch.channel_error;
  if (cause.code == BrokerErrc::rejected) {
    // One message was refused; the others may go on a new channel.
    if (auto r = ready(); r) {
      batch.broken = false;
      batch.channel_error.reset();
      return true;
    } else {
      batch.fail_unsent(not_sent(r.error()));
    }
  } else {
    batch.fail_unsent(cause);  // the same cause stops the rest (no such exchange, no permission)
  }
  batch.channel_error.reset();
  return false;
}

std::expected<void, Failure> ConfirmPublisher::drain(Batch* batch) {
  if (auto alive = conn_->keep_alive(); !alive) return alive;
  amqp_frame_t frame;
  for (;;) {
    auto got = conn_->next_frame(frame);
    if (!got) return std::unexpected(got.error());
    if (!*got) return {};
    if (auto r = handle(frame, batch); !r) return r;
    if (batch && batch->broken) return {};
  }
}

std::expected<void, Failure> ConfirmPublisher::handle(const amqp_frame_t& frame, Batch* batch) {
  auto step = returns_.feed(frame);
  if (!step) {
    conn_->release();
    return std::unexpected(step.error());
  }
  if (*step == Assembler::Step::complete) {
    const Incoming back = returns_.take();
    conn_->release();
    if (!batch) return {};  // a message of a batch that timed out
    for (const auto& [tag, i] : batch->pending) {
      const Outgoing& m = batch->messages[i];
      if (batch->returned[i] || m.exchange != back.exchange || m.routing_key != back.routing_key ||
          m.message_id != back.message_id) {
        continue;
      }
      Failure f;
      f.kind = Failure::Kind::returned;
      f.reply_code = back.reply_code;
      f.reply_text = back.reply_text;
      f.exchange = back.exchange;
      f.routing_key = back.routing_key;
      f.where = endpoint_.where;
      batch->returned[i] = std::move(f);
      break;
    }
    return {};
  }
  if (*step == Assembler::Step::more) {
    conn_->release();
    return {};
  }
  switch (frame.payload.method.id) {
    case AMQP_BASIC_ACK_METHOD: {
      const auto* m = static_cast<const amqp_basic_ack_t*>(frame.payload.method.decoded);
      const std::uint64_t tag = m->delivery_tag;
      const bool multiple = m->multiple != 0;
      conn_->release();
      if (batch) settle(*batch, tag, multiple, true);
      return {};
    }
    case AMQP_BASIC_NACK_METHOD: {
      const auto* m = static_cast<const amqp_basic_nack_t*>(frame.payload.method.decoded);
      const std::uint64_t tag = m->delivery_tag;
      const bool multiple = m->multiple != 0;
      conn_->release();
      if (batch) settle(*batch, tag, multiple, false);
      return {};
    }
    case AMQP_CHANNEL_CLOSE_METHOD: {
      const Failure f = conn_->channel_closed(frame, "publishing");
      returns_.reset();
      if (batch) channel_lost(*batch, f);
      return {};
    }
    default:
      conn_->release();  // nothing else is expected on a publishing channel; harmless
      return {};
  }
}

void ConfirmPublisher::settle(Batch& batch, std::uint64_t tag, bool multiple, bool acked) {
  auto begin = multiple ? batch.pending.begin() : batch.pending.find(tag);
  const auto end = multiple ? batch.pending.upper_bound(tag) : (begin == batch.pending.end() ? begin : std::next(begin));
  for (auto it = begin; it != end; ++it) {
    const std::size_t i = it->second;
    if (!acked) {
      Failure f;
      f.kind = Failure::Kind::nacked;
      f.where = endpoint_.where;
      batch.set(i, std::unexpected(map_error(f)));
    } else if (batch.returned[i]) {
      batch.set(i, std::unexpected(map_error(*batch.returned[i])), true);
    } else {
      batch.set(i, Done{});
    }
  }
  batch.pending.erase(begin, end);
}

void ConfirmPublisher::channel_lost(Batch& batch, const Failure& failure) {
  // The broker closed the channel at one message and discarded every frame after it: the
  // messages before it may have been taken (their confirms are lost), those after it were not.
  const BrokerError error = map_error(failure);
  std::optional<std::size_t> culprit;
  if (error.code == BrokerErrc::rejected) {
    if (auto limit = max_size_in(failure.reply_text)) {
      max_message_size_ = *limit;
      for (const auto& [tag, i] : batch.pending) {
        if (batch.messages[i].body.size() > *limit) {
          culprit = i;
          break;
        }
      }
    }
  }
  if (!culprit && !batch.pending.empty()) culprit = batch.pending.begin()->second;
  bool after = false;
  for (const auto& [tag, i] : batch.pending) {
    if (culprit && i == *culprit) {
      batch.set(i, std::unexpected(error));
      after = true;
    } else if (!after) {
      batch.set(i, std::unexpected(BrokerError{BrokerErrc::unavailable,
                                               "the channel closed before its confirm: " + error.message, true}));
    } else if (error.code == BrokerErrc::rejected) {
      // Fine messages behind a refused one: try them again.
      batch.set(i, std::unexpected(BrokerError{BrokerErrc::unavailable,
                                               "not taken: the channel closed at an earlier message: " + error.message, false}));
    } else {
      batch.set(i, std::unexpected(error));  // the same cause (no such exchange, no permission)
    }
  }
  batch.pending.clear();
  batch.channel_error = error;
  batch.broken = true;
}

void ConfirmPublisher::connection_lost(Batch& batch, Failure failure) {
  failure.sent = true;
  const BrokerError in_doubt = map_error(failure);
  failure.sent = false;
  const BrokerError unsent = not_sent(map_error(failure));
  for (const auto& [tag, i] : batch.pending) batch.set(i, std::unexpected(in_doubt));
  batch.pending.clear();
  batch.fail_unsent(unsent);
  batch.broken = true;
  conn_.reset();
}

BrokerResult<Done> ConfirmPublisher::ping() {
  if (auto r = ready(); !r) return r;
  if (auto r = conn_->qos(0); !r) {
    conn_.reset();
    return std::unexpected(map_error(r.error()));
  }
  return Done{};
}

void ConfirmPublisher::service() {
  if (!conn_) return;
  if (auto r = drain(nullptr); !r || conn_->dead()) conn_.reset();
}

}  // namespace idem::amqp_detail
