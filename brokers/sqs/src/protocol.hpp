#pragma once

// SQS's JSON protocol (AWS JSON 1.0, X-Amz-Target: AmazonSQS.ACTION): the request bodies this
// module sends and the answers it reads, and SQS's rules for what a message may hold. Pure
// functions: no I/O, so the unit test checks them on canned answers.

#include <cstddef>
#include <cstdint>
#include <expected>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/broker.hpp"

namespace idem::sqs_detail {

/// SQS's limits.
inline constexpr std::size_t kMaxBatchEntries = 10;          // every *Batch call, and ReceiveMessage
inline constexpr std::size_t kMaxBatchBytes = 256 * 1024;    // a SendMessageBatch's payload
inline constexpr std::size_t kMaxMessageBytes = 1024 * 1024;  // one message, attributes included
inline constexpr std::size_t kMaxAttributes = 10;             // message attributes per message
inline constexpr std::size_t kMaxReasonBytes = 1024;          // x-idem-detail, x-idem-last-error: cut here
inline constexpr std::size_t kMaxQueueName = 80;              // a queue's name, ".fifo" included

/// The attribute a message's content type travels in.
inline constexpr std::string_view kContentTypeAttribute = "content_type";

/// One message attribute: DataType "String", "Number", "Binary" or "String.xyz"...; the value
/// as bytes (a Binary one decoded from base64).
struct Attribute {
  std::string type;
  std::string value;
};

/// A message as ReceiveMessage returned it.
struct ReceivedMessage {
  std::string sqs_message_id;  ///< SQS's MessageId: for logs only
  std::string receipt_handle;
  std::string body;
  std::map<std::string, Attribute> attributes;  ///< MessageAttributes, by name
  std::uint32_t receive_count = 1;              ///< ApproximateReceiveCount
  std::optional<std::string> deduplication_id;  ///< MessageDeduplicationId (FIFO)
  std::optional<std::string> group_id;          ///< MessageGroupId (FIFO)
};

/// A message to send: one entry of SendMessageBatch, or a SendMessage.
struct SendEntry {
  std::string id;  ///< the entry's Id within its batch
  std::string body;
  std::vector<std::pair<std::string, Attribute>> attributes;
  std::string group_id;          ///< FIFO only
  std::string deduplication_id;  ///< FIFO only
  /// SQS's size of it: the body and each attribute's name, DataType and value.
  std::size_t size() const;
};

/// SQS's error answer: `__type` and `message` (either case).
struct AwsError {
  std::string code;
  std::string message;
};

/// One entry of a batch call's answer that failed.
struct EntryFailure {
  std::string code;
  std::string message;
  bool sender_fault = true;
};

/// A batch call's answer: the entry ids that succeeded, and those that failed with why.
struct BatchResult {
  std::vector<std::string> successful;
  std::map<std::string, EntryFailure> failed;
};

// ---- requests ------------------------------------------------------------------------------

std::string receive_request(std::string_view queue_url, std::size_t max, int wait_seconds, int visibility_seconds);
std::string send_batch_request(std::string_view queue_url, const std::vector<SendEntry>& entries);
std::string send_request(std::string_view queue_url, const SendEntry& entry);
/// DeleteMessageBatch: (entry id, receipt handle) pairs.
std::string delete_batch_request(std::string_view queue_url, const std::vector<std::pair<std::string, std::string>>& receipts);
std::string delete_request(std::string_view queue_url, std::string_view receipt);
/// ChangeMessageVisibilityBatch: every entry to the same timeout.
std::string change_visibility_batch_request(std::string_view queue_url,
                                            const std::vector<std::pair<std::string, std::string>>& receipts, int seconds);
std::string change_visibility_request(std::string_view queue_url, std::string_view receipt, int seconds);
std::string get_attributes_request(std::string_view queue_url, const std::vector<std::string>& names);

// ---- answers -------------------------------------------------------------------------------

/// ReceiveMessage's answer; an error saying what is malformed.
std::expected<std::vector<ReceivedMessage>, std::string> parse_receive(std::string_view body);
/// A *Batch call's answer.
std::expected<BatchResult, std::string> parse_batch_result(std::string_view body);
/// GetQueueAttributes's answer: name to value.
std::expected<std::map<std::string, std::string>, std::string> parse_attributes(std::string_view body);
/// An error answer; empty fields when the body is not one.
AwsError parse_error(std::string_view body);

// ---- messages ------------------------------------------------------------------------------

/// A received message as a Delivery: the id from `id_attribute` (or, on a FIFO queue, the
/// MessageDeduplicationId when the attribute is absent), the content type from `content_type`,
/// the ordering key from `ordering_key` (or, on a FIFO queue, the MessageGroupId when the
/// attribute is absent and the group is not one sink_group makes: the id's, or the group of
/// messages without an id; a value that is no valid_ordering_key is ignored), the other attributes as headers,
/// ApproximateReceiveCount as the delivery count. handle and connection are left to the source.
Delivery to_delivery(ReceivedMessage message, std::string_view id_attribute, bool fifo);

/// Why SQS would never take this message (an empty body, characters SQS refuses, more than
/// `kMaxAttributes` attributes, an attribute name SQS refuses, an empty header name, a
/// destination that is no queue name, an ordering key that is no valid_ordering_key), or nullopt.
std::optional<std::string> outgoing_problem(const OutgoingMessage& m, std::string_view id_attribute);

/// The entry for an OutgoingMessage that passed outgoing_problem: the id attribute (when the
/// id is not empty), content_type (when set), ordering_key (when set), then the headers with a
/// value (but one named ordering_key), all String; on a FIFO queue the MessageGroupId is the
/// ordering key, else sink_group(id), and the MessageDeduplicationId comes from the id
/// (fifo_token).
SendEntry outgoing_entry(const OutgoingMessage& m, std::string_view id_attribute, bool fifo, std::string entry_id);

/// The MessageGroupId of a message without an ordering key on a FIFO queue: its id's fifo_token,
/// or "idem-no-message-id" for a message without an id.
std::string sink_group(std::string_view message_id);

/// Where a dead letter comes from, for its attributes.
struct DeadLetterOrigin {
  std::string queue;           ///< the queue's name: x-idem-source
  std::string sqs_message_id;  ///< the original's MessageId: the dead-letter FIFO queue's deduplication id
  std::string group_id;        ///< the original's MessageGroupId, if it had one
};

/// The dead-letter copy of a delivery: its body; the id attribute (when it has an id),
/// content_type and ordering_key (when it has them); x-idem-reason, x-idem-detail, x-idem-last-error (when not empty; both cut to
/// kMaxReasonBytes), x-idem-attempts, x-idem-source; then as many of the delivery's other
/// headers as fit in kMaxAttributes (old x-idem-* ones dropped; the detail names those left out).
/// A header value that is not text SQS allows goes as a Binary attribute. For a FIFO
/// dead-letter queue: the original's group (else its ordering key, else its id, else
/// "idem-dead-letters") and its MessageId as the deduplication id.
SendEntry dead_letter_entry(const Delivery& d, const DeadLetterReason& why, std::string_view id_attribute,
                            const DeadLetterOrigin& origin, bool fifo_dead_letter_queue);

/// Where SQS refuses this text as a message body or String attribute: invalid UTF-8, or a
/// character outside #x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF.
std::optional<std::string> text_problem(std::string_view text);

/// `text` made acceptable to SQS (what is not, replaced by U+FFFD) and cut to at most
/// `max_bytes` on a character boundary.
std::string sqs_text(std::string_view text, std::size_t max_bytes);

/// Why SQS refuses this queue name (1-80 of A-Z a-z 0-9 - _, a FIFO queue's ending in ".fifo"),
/// the message starting with `what`; or nullopt.
std::optional<std::string> queue_name_problem(std::string_view name, std::string_view what);

/// Why SQS refuses this message attribute name (A-Z a-z 0-9 _ - ., up to 256, no leading,
/// trailing or doubled '.', not starting with AWS. or Amazon.), or nullopt.
std::optional<std::string> attribute_name_problem(std::string_view name);

/// A MessageGroupId / MessageDeduplicationId for `id`: the id itself when SQS takes it (1-128
/// visible ASCII characters), else "sha256-" and its SHA-256 in hex (stable: the same id gives
/// the same token).
std::string fifo_token(std::string_view id);

}  // namespace idem::sqs_detail
