// The MessageSink on a stream: one connection; a publish pipelines one XADD per message (all
// written, then every reply read), and an XADD's reply is its confirmation.
#include <optional>

#include "channel.hpp"
#include "endpoint.hpp"
#include "entry_codec.hpp"
#include "errors.hpp"
#include "idem/redis_stream_broker.hpp"

namespace idem::redis_streams {
namespace {

using redis_detail::Failure;
using redis_detail::Reply;

class StreamSink final : public MessageSink {
 public:
  StreamSink(RedisStreamUrl url, Endpoint endpoint, SinkSettings settings)
      : url_(std::move(url)), endpoint_(std::move(endpoint)), settings_(settings) {}

  /// Opens the connection (open() and every publish after a lost one).
  BrokerResult<Done> connect() {
    if (channel_) return Done{};
    auto channel = Channel::open(endpoint_.address, endpoint_.settings);
    if (!channel) return std::unexpected(endpoint_.outgoing(map_error(channel.error(), {url_.stream})));
    channel_.emplace(std::move(*channel));
    return Done{};
  }

  std::vector<BrokerResult<Done>> publish(std::span<const OutgoingMessage> messages) override {
    std::vector<BrokerResult<Done>> results;
    results.reserve(messages.size());
    if (messages.empty()) return results;
    if (auto ok = connect(); !ok) {
      results.assign(messages.size(), std::unexpected(ok.error()));
      return results;
    }
    // What is refused before sending: an ordering key a source would not take back.
    std::vector<std::optional<BrokerError>> refused(messages.size());
    for (std::size_t i = 0; i < messages.size(); ++i) {
      const OutgoingMessage& m = messages[i];
      if (!m.ordering_key.empty() && !valid_ordering_key(m.ordering_key)) {
        refused[i] = endpoint_.outgoing(
            {BrokerErrc::rejected, "the message's ordering key is not 1-128 visible ASCII characters", false});
        continue;
      }
      std::vector<std::string> args{"XADD", m.destination.empty() ? url_.stream : m.destination};
      if (url_.maxlen) args.insert(args.end(), {"MAXLEN", "~", std::to_string(*url_.maxlen)});
      args.emplace_back("*");
      append_fields(m, args);
      channel_->send(args);
    }
    // One deadline for the batch: confirm_timeout is how long a publish waits for the broker.
    const auto deadline = Steady::now() + settings_.confirm_timeout;
    std::optional<BrokerError> lost;  // what broke the connection, for the messages after
    for (std::size_t i = 0; i < messages.size(); ++i) {
      const OutgoingMessage& m = messages[i];
      if (refused[i]) {
        results.push_back(std::unexpected(*refused[i]));
        continue;
      }
      const std::string_view key =
          m.destination.empty() ? std::string_view(url_.stream) : std::string_view(m.destination);
      if (!channel_) {
        // The connection broke on an earlier reply: this one was written, or not; it may have
        // been appended.
        results.push_back(std::unexpected(*lost));
        continue;
      }
      auto event = channel_->wait(deadline);
      if (!event || event->kind != Event::Kind::reply) {
        const Failure failure =
            event ? Failure{Failure::Kind::timeout, "no XADD reply within confirm_timeout", channel_->node()}
                  : event.error();
        // Its replies are out of step now: the next publish opens a new connection.
        channel_.reset();
        lost = endpoint_.outgoing(map_error(failure, {key, /*appends=*/true}));
        results.push_back(std::unexpected(*lost));
        continue;
      }
      results.push_back(confirmation(event->reply, key));
    }
    return results;
  }

  BrokerResult<Done> ping() override {
    if (auto ok = connect(); !ok) return ok;
    auto reply = channel_->call({"PING"}, Steady::now() + settings_.connect_timeout);
    if (!reply) {
      channel_.reset();
      return std::unexpected(endpoint_.outgoing(map_error(reply.error(), {url_.stream})));
    }
    if (reply->is_error()) {
      return std::unexpected(
          endpoint_.outgoing(map_error(reply_failure(reply->str, endpoint_.address.str()), {url_.stream})));
    }
    return Done{};
  }

  std::string name() const override { return endpoint_.name; }

 private:
  // An XADD's reply: the new entry's id, or why Redis refused this one message.
  BrokerResult<Done> confirmation(const Reply& reply, std::string_view key) const {
    if (reply.type == Reply::Type::string) return Done{};
    if (!reply.is_error()) {
      return std::unexpected(endpoint_.outgoing({BrokerErrc::internal, "unexpected reply to XADD", false}));
    }
    BrokerError e = map_error(reply_failure(reply.str, endpoint_.address.str()), {key});
    // An error reply about this XADD alone (not the server's state, the login or the key's
    // type): the broker refused this message; the others may go.
    if (e.code == BrokerErrc::internal) e.code = BrokerErrc::rejected;
    return std::unexpected(endpoint_.outgoing(std::move(e)));
  }

  RedisStreamUrl url_;
  Endpoint endpoint_;
  SinkSettings settings_;
  std::optional<Channel> channel_;
};

}  // namespace
}  // namespace idem::redis_streams

namespace idem {

BrokerResult<std::unique_ptr<MessageSink>> open_redis_stream_sink(std::string_view url, const SinkSettings& settings) {
  auto parsed = parse_redis_stream_url(url, RedisStreamRole::sink);
  if (!parsed) return std::unexpected(parsed.error());
  if (settings.connect_timeout <= Millis::zero() || settings.confirm_timeout <= Millis::zero()) {
    return std::unexpected(
        BrokerError{BrokerErrc::invalid, "connect_timeout and confirm_timeout must be positive", false});
  }
  redis_streams::Endpoint endpoint(*parsed, url, settings.connect_timeout);
  auto sink = std::make_unique<redis_streams::StreamSink>(std::move(*parsed), std::move(endpoint), settings);
  if (auto ok = sink->connect(); !ok) return std::unexpected(ok.error());
  return std::unique_ptr<MessageSink>(std::move(sink));
}

}  // namespace idem
