#pragma once

// idem-consume's processor: a message goes to the handler as an HTTP POST, once per message id
// (process_once on the configured store); the handler's answer decides the delivery's fate.
//
//   2xx                                   processed: recorded, acked
//   408, 409, 425, 429, 5xx, no answer    retried with backoff (Retry-After honoured), up to
//                                         max_attempts, then dead-lettered ("poison")
//   any other status                      dead-lettered at once ("rejected"), with the answer
//
// The request carries Idempotency-Key: <message id>, so that a handler can dedupe in its own
// database the one delivery no sidecar can: one whose 2xx came back just before the sidecar died;
// and Idem-Ordering-Key: <ordering key> when the message has one. With a signer (sign_secret_file),
// it is signed per Standard Webhooks (webhook-id: the message id), so the handler can check that
// it came from the sidecar.

#include <expected>
#include <memory>
#include <string>

#include "idem/client/transport.hpp"
#include "idem/clock.hpp"
#include "idem/consume_loop.hpp"
#include "idem/consumer.hpp"
#include "idem/sidecar/message_http.hpp"
#include "idem/webhook/signing.hpp"

namespace idem::consume {

/// The headers idem-consume sends with each message (docs/idem-consume.md).
inline constexpr std::string_view kSourceHeader = "Idem-Source";
inline constexpr std::string_view kAttemptHeader = "Idem-Delivery-Attempt";
inline constexpr std::string_view kRedeliveredHeader = "Idem-Redelivered";
using sidecar::kOrderingKeyHttpHeader;  // sent only when the delivery has an ordering key

/// Where and how messages are delivered.
struct HttpDeliveryOptions {
  std::string url;          ///< the handler
  Millis timeout{30'000};   ///< one POST, sent to answered
  std::string source_name;  ///< the source's URL without its password (Idem-Source)
  /// Signs every POST with its secrets (webhook-id, webhook-timestamp, webhook-signature); none:
  /// unsigned.
  std::shared_ptr<const webhook::StandardSigner> signer = nullptr;
  const Clock* clock = &SystemClock::instance();  ///< webhook-timestamp's time
};

/// POSTs each message to the handler: as the batched ConsumeLoop's MessageEffect (effect(), what
/// idem-consume runs: the loop claims and records), or as a DeliveryProcessor through
/// process_once (operator()).
class HttpDelivery {
 public:
  HttpDelivery(Consumer& consumer, client::Transport& transport, HttpDeliveryOptions options);

  /// One POST: the result to remember on a 2xx, else what to do with the delivery (the table
  /// above). Runs on the loop's workers; thread-safe.
  std::expected<std::string, MessageDisposition> effect(const Delivery& delivery, const DeliveryAttempt& attempt) const;

  /// The same through process_once: claim, POST, record. Thread-safe.
  MessageDisposition operator()(const Delivery& delivery, const DeliveryAttempt& attempt) const;

  /// The request the handler gets for a delivery (tests, logs).
  client::HttpRequest request_for(const Delivery& delivery, const DeliveryAttempt& attempt) const;

 private:
  Consumer& consumer_;
  client::Transport& transport_;
  HttpDeliveryOptions options_;
};

}  // namespace idem::consume
