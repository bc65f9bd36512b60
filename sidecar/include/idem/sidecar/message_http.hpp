#pragma once

// How idem-consume and idem-relay carry a message over HTTP (docs/idem-consume.md, docs/outbox.md):
// a POST of its body with Idempotency-Key: <message id>, its content type, and each of its
// headers as Idem-Header-<name>; and how they read the answer.

#include <cstdint>
#include <string>
#include <string_view>

#include "idem/broker.hpp"
#include "idem/client/http.hpp"
#include "idem/webhook/signing.hpp"

namespace idem::sidecar {

/// The prefix of the message's own headers in the POST: none can pose as one of the request's
/// (Host, Content-Length, Idempotency-Key).
inline constexpr std::string_view kMessageHeaderPrefix = "Idem-Header-";

/// The message's ordering key (OutgoingMessage / Delivery ordering_key), sent only when it has one.
inline constexpr std::string_view kOrderingKeyHttpHeader = "Idem-Ordering-Key";

/// The POST of one message: Idempotency-Key, Content-Type (application/octet-stream when the
/// message has none), then the message's headers that HTTP can carry unchanged (a token name, a
/// value without control characters), prefixed; others are left out.
client::HttpRequest message_post(std::string url, std::string_view message_id, std::string_view content_type,
                                 const MessageHeaders& headers, std::string body);

/// Signs a message's POST per Standard Webhooks (docs/webhooks.md, "Sending"): appends
/// webhook-id (the message id), webhook-timestamp (`now`, Unix seconds) and webhook-signature
/// ("v1,<base64>" for every secret of `signer`, over "id.timestamp.body" with the request's body
/// exactly as sent). A receiver that knows any one of the secrets can tell the request is ours.
void sign_message(client::HttpRequest& request, const webhook::StandardSigner& signer, std::string_view message_id,
                  std::int64_t now);

/// Whether an answer may change if the message is sent again (SPEC §10: 408, 409, 425, 429, 5xx).
bool retryable_status(int status);

/// "the handler answered 400: {...}": the status and the start of the body on one line, bounded.
std::string describe_answer(std::string_view who, int status, std::string_view body);

}  // namespace idem::sidecar
