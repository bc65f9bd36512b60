#pragma once

// The Amazon SQS broker module: a MessageSource that long-polls a queue and keeps the messages it
// holds invisible until they are settled, and a MessageSink that sends in batches
// (idem/broker.hpp). It speaks SQS's JSON protocol over libcurl, signed with AWS Signature V4 by
// libcurl itself (CURLOPT_AWS_SIGV4); no AWS SDK. curl stays private: curl.h is included only
// under src/.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/broker.hpp"

namespace idem {

/// What an sqs+https:// URL is for: the parameters each takes differ.
enum class SqsUrlRole : std::uint8_t {
  source,  ///< receive from the queue
  sink,    ///< send to the queue
};

/// An SQS URL, parsed:
///   sqs+https://[ACCESS_KEY_ID:SECRET_ACCESS_KEY@]HOST[:PORT]/ACCOUNT_ID/QUEUE_NAME[?PARAMETERS]
///   sqs+http://...   (plain HTTP: for local emulators; never for AWS itself)
/// That is the queue's URL as SQS gives it (https://sqs.eu-west-1.amazonaws.com/123456789012/orders)
/// with `sqs+` in front. Requests go to the endpoint's root (https://HOST[:PORT]/), naming the
/// queue by that URL. User, password and parameter values are percent-decoded.
///
/// Parameters (any order; an unknown one is an error naming it):
///   region=             the signing region. Default: an AWS host's (sqs.REGION.amazonaws.com,
///                       sqs-fips.REGION.amazonaws.com, sqs.REGION.amazonaws.com.cn,
///                       sqs.REGION.api.aws, REGION.queue.amazonaws.com, queue.amazonaws.com);
///                       else AWS_REGION, else AWS_DEFAULT_REGION. A region= that contradicts an
///                       AWS host is an error (the signature would be refused).
///   token=              a session token (temporary credentials); else AWS_SESSION_TOKEN when
///                       the credentials come from the environment. Hidden by redact_url as
///                       every `token` parameter is.
///   id_attribute=       the message attribute holding the message id (default `message_id`).
///   Source only:
///   dead_letter=        where dead_letter() sends its copy: a queue name on the same endpoint
///                       and account, or a queue URL (https://HOST/ACCOUNT_ID/NAME, percent-
///                       encoded or not). Default: the sibling queue `QUEUE-dead-letter`
///                       (`BASE-dead-letter.fifo` for BASE.fifo). It must exist (opening the
///                       source checks): the module never creates queues. A FIFO queue's dead-
///                       letter queue may be either kind.
///   visibility_timeout= seconds a received message stays invisible to other consumers
///                       (2-43200, default 30). While this source holds a message it extends
///                       that before it runs out, so a slow handler keeps its message; it is
///                       how long a crashed consumer's messages take to come back.
///   wait_seconds=       the long poll of each ReceiveMessage (1-20, default 20).
///
/// Credentials: USER:PASSWORD in the URL (access key id and secret access key, percent-encoded:
/// secret keys often hold '/', written %2F; both or neither), else AWS_ACCESS_KEY_ID and
/// AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN). No
/// instance, container or SSO credentials: give keys. The secret key and the session token
/// never appear in a name(), a log line or an error message; the access key id does (AWS does
/// not treat it as a secret, and it says which credentials were refused).
struct SqsUrl {
  bool https = true;
  std::string host;  ///< as written: a name, an IPv4 address or [IPv6]
  int port = 0;      ///< 0: the scheme's default
  std::string account;  ///< the path's first segment (AWS: 12 digits)
  std::string queue;    ///< the queue's name (FIFO when it ends in ".fifo")
  std::string region;
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;
  std::string id_attribute = "message_id";

  /// Source: the dead-letter queue: its name and its queue URL (http(s)://...).
  std::string dead_letter_queue;
  std::string dead_letter_url;
  /// Source: `visibility_timeout=`, `wait_seconds=`.
  std::chrono::seconds visibility_timeout{30};
  std::chrono::seconds wait_seconds{20};

  /// "https://HOST[:PORT]/": where every request is POSTed.
  std::string endpoint() const;
  /// "https://HOST[:PORT]/ACCOUNT/QUEUE": the QueueUrl every request names.
  std::string queue_url() const;
  bool fifo() const;
  /// What opening needs that neither the URL nor the environment gave (the region, the
  /// credentials), or values there that cannot be right; nullopt when nothing is missing.
  std::optional<std::string> missing() const;
};

/// Parses an sqs+https:// or sqs+http:// URL for `role`, taking the region and credentials from
/// the environment where the URL has none. Unknown or misplaced parameters, bad escapes, ports,
/// queue names SQS would refuse, numbers out of range, a region= that contradicts the host:
/// BrokerErrc::invalid, the message naming what is wrong in one line (the URL in it goes through
/// redact_url, and no message quotes the password or the token). A region or credentials that
/// are nowhere are not the URL's fault: SqsUrl::missing() says so, and opening fails with it.
BrokerResult<SqsUrl> parse_sqs_url(std::string_view url, SqsUrlRole role);

/// parse_sqs_url, and missing() as an error (BrokerErrc::invalid): what opening checks first.
BrokerResult<SqsUrl> parse_complete_sqs_url(std::string_view url, SqsUrlRole role);

/// What an SQS source tells besides its results; optional.
struct SqsEvents {
  /// A line for the log, from the source's thread or its I/O thread (so it must be
  /// thread-safe): a held message whose visibility could not be extended (another consumer may
  /// get it), a release at close that failed.
  std::function<void(std::string_view line)> on_warning;
};

/// Opens a source on `sqs+https://HOST/ACCOUNT/QUEUE`: checks that the queue and its dead-letter
/// queue exist and that the credentials are taken (GetQueueAttributes on both: refused
/// otherwise, one line saying which; AccessDenied on the dead-letter queue alone is let through,
/// as a consumer may be allowed only to send there), then starts its visibility heartbeat. IAM:
/// sqs:ReceiveMessage, DeleteMessage, ChangeMessageVisibility and GetQueueAttributes on the
/// queue, sqs:SendMessage on the dead-letter queue.
///
/// receive() long-polls (ReceiveMessage, up to 10 a call and more calls to fill `max`, never
/// more than `prefetch` held at once). A poll outlives a receive() that ended (its wait ran out,
/// or wake()): its messages are handed out by the next receive(), so none is received and then
/// dropped. Delivery fields:
///  - message_id: the `id_attribute` message attribute; on a FIFO queue, when the attribute is
///    absent, the message's MessageDeduplicationId; never SQS's own MessageId. Neither:
///    has_message_id false (the consume loop dead-letters it as missing_id).
///  - content_type: the `content_type` attribute; headers: the other message attributes
///    (Binary ones decoded from base64), by name.
///  - ordering_key: the `ordering_key` attribute; on a FIFO queue, when the attribute is absent,
///    the MessageGroupId, unless it is the group the sink gives a message without an ordering key
///    (its id: that orders nothing). A value that is no valid_ordering_key is ignored (none).
///  - delivery_count: ApproximateReceiveCount; redelivered when it is above 1.
///  - broker_ref: SQS's MessageId, for logs. handle and connection: this source's own.
///
/// While a delivery is held (received, not yet acked, requeued or dead-lettered) the I/O thread
/// extends its visibility (ChangeMessageVisibilityBatch) once half of `visibility_timeout` is
/// left, whatever the source's own thread is doing. SQS limits a message's total invisibility to
/// 12 hours from its receipt: a message held longer goes back to the queue.
///
/// ack(): DeleteMessageBatch, 10 a call. requeue(): visibility 0, so the message is delivered
/// again at once (to any consumer). dead_letter(): SendMessage to the dead-letter queue with the
/// body, the id, content-type and ordering-key attributes, as many of the original's other attributes as fit
/// in SQS's 10, and x-idem-reason, x-idem-detail, x-idem-last-error (when there was one),
/// x-idem-attempts and x-idem-source (the queue's name); detail and last error are cut to 1 KiB.
/// Once SQS has the copy the original is deleted; if that delete fails the call fails, and the
/// next dead_letter() of the same delivery only deletes (no second copy). Deliveries this source
/// no longer holds (settled, or given up when their visibility could not be extended) are
/// BrokerErrc::stale.
///
/// Closing (the destructor) hands every held message back at once (visibility 0), as a closed
/// AMQP channel does; a consumer that crashes leaves them invisible for `visibility_timeout`.
/// A poll still waiting is abandoned: a message SQS gives it just then stays invisible for
/// `visibility_timeout` (SQS does not notice that nobody waits any more).
/// Errors: unavailable while the endpoint cannot be reached (receive backs off between
/// reconnect_min and reconnect_max; reconnects() counts outages that ended), refused for a
/// missing queue and refused credentials or permissions.
BrokerResult<std::unique_ptr<MessageSource>> open_sqs_source(std::string_view url, const SourceSettings& settings = {},
                                                             SqsEvents events = {});

/// Opens a sink on `sqs+https://HOST/ACCOUNT/QUEUE`, checked with GetQueueAttributes (a missing
/// queue or refused credentials: refused; a role allowed only sqs:SendMessage, AccessDenied, is
/// let through, and so is its ping()). publish() sends SendMessageBatch calls of up to 10
/// messages and 256 KiB (several at once to standard queues, one after another when a FIFO
/// queue is among them, which keeps their order); a message over 256 KiB goes alone with
/// SendMessage (the queue's MaximumMessageSize decides, at most 1 MiB).
/// Each message carries the `id_attribute` attribute (when it has an id), `content_type` (when
/// set), `ordering_key` (when set) and its headers, all as String attributes; headers with an
/// empty value are left out (SQS refuses empty attribute values), and so is a header named
/// ordering_key (OutgoingMessage::ordering_key wins). On a FIFO queue MessageGroupId is the
/// ordering key (without one, the message id) and MessageDeduplicationId the message id, an id
/// replaced by "sha256-" and its hex digest when it is not one SQS takes (1-128 of ASCII's
/// visible characters); a message without an id gets the group "idem-no-message-id" (unless it
/// has an ordering key) and a random deduplication id. OutgoingMessage::destination, when set, names another queue
/// of the same endpoint and account (FIFO when its name ends in ".fifo").
///
/// Results per message: ok once SQS answered it has it. rejected for what SQS will never take
/// (an empty body, a body that is not Unicode text SQS allows: base64-encode binary payloads;
/// more than 10 attributes, an attribute name SQS refuses, a destination that is no queue name,
/// an ordering key that is no valid_ordering_key, over the queue's size limit); refused for a missing queue or refused credentials;
/// unavailable, not in doubt, for throttling or an entry SQS failed on its side; timeout, a
/// broken connection after the request went out or a 5xx: in doubt. After a failure to a FIFO
/// queue the rest of that publish to it is not sent (unavailable, not in doubt).
BrokerResult<std::unique_ptr<MessageSink>> open_sqs_sink(std::string_view url, const SinkSettings& settings = {});

}  // namespace idem
