#pragma once

// The webhook sink of idem-relay: each message is POSTed to an HTTP endpoint as idem-consume
// delivers one (sidecar/message_http.hpp), with Idempotency-Key: <message id>, so that the endpoint (idem-gateway in front of a service, or a
// handler deduping by key) runs it once however often it arrives; and Idem-Ordering-Key: <its
// ordering key> when it has one. With secrets (webhook_secret_file), each POST is signed per
// Standard Webhooks (webhook-id: the message id, webhook-timestamp, webhook-signature with every
// secret; docs/webhooks.md, "Sending"), so the endpoint can tell our events from anyone's.
//
//   2xx                                 sent
//   408, 409, 425, 429, 5xx, no answer  unavailable: published again later (Retry-After kept)
//   any other status                    rejected: the row is dead, with the answer

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/broker.hpp"
#include "idem/client/transport.hpp"
#include "idem/clock.hpp"
#include "idem/sidecar/message_http.hpp"
#include "idem/webhook/signing.hpp"

namespace idem::relay {

using sidecar::kOrderingKeyHttpHeader;  // as idem-consume sends it

/// A MessageSink that POSTs each message to one URL. A message's ordering key goes as
/// Idem-Ordering-Key, after Content-Type; a header of the message's own named ordering_key is
/// not sent (as Idem-Header-ordering_key it would be a second value, or pose as one when the
/// message has none). A message whose ordering key is no valid_ordering_key is rejected, unsent.
class WebhookSink final : public MessageSink {
 public:
  /// With a `signer`, every POST is signed with its secrets at `clock`'s time (Unix seconds);
  /// without, it is sent unsigned.
  WebhookSink(std::string url, client::Transport& transport, Millis timeout,
              std::shared_ptr<const webhook::StandardSigner> signer = nullptr,
              const Clock& clock = SystemClock::instance());

  std::vector<BrokerResult<Done>> publish(std::span<const OutgoingMessage> messages) override;
  /// An endpoint has no ping: its last answer tells. Unavailable when the last POST got no HTTP
  /// answer at all (refused, reset, timed out): the endpoint is away, and the relay counts no
  /// attempt against the row. Ok when it answered, whatever the status.
  BrokerResult<Done> ping() override;
  std::string name() const override;

  /// The wait the last answer's Retry-After asked for, if any (then cleared).
  std::optional<Millis> take_retry_after();

  /// The POST of one message (signed now, with a signer).
  client::HttpRequest request_for(const OutgoingMessage& message) const;

 private:
  std::string url_;
  client::Transport& transport_;
  Millis timeout_;
  std::shared_ptr<const webhook::StandardSigner> signer_;
  const Clock& clock_;
  std::optional<Millis> retry_after_;
  std::optional<std::string> away_;  // why the last POST got no answer; nullopt once one did
};

}  // namespace idem::relay
