#pragma once

// Every way an SQS call can fail, and the one function that turns it into a BrokerError. The
// curl code is a plain int here (a CURLcode) so that this header needs no curl.h; errors.cpp
// names the codes with curl.h's constants.

#include <string>
#include <string_view>
#include <vector>

#include "idem/broker.hpp"

namespace idem::sqs_detail {

/// What went wrong, before it becomes a BrokerError: a transfer that failed (curl_code), an
/// HTTP error status with SQS's error body, or one entry of a batch that SQS refused.
struct Failure {
  int curl_code = 0;        ///< a CURLcode; 0 when the exchange itself worked
  std::string curl_detail;  ///< curl's error buffer, if any
  long status = 0;          ///< the HTTP status (0: no answer)
  std::string aws_code;     ///< SQS's error code: `__type` ("com.amazonaws.sqs#QueueDoesNotExist"), a batch
                            ///< entry's Code, or the x-amzn-query-error header's
  std::string aws_message;  ///< SQS's words about it
  bool sender_fault = true;  ///< a batch entry's SenderFault
  std::string request_id;   ///< x-amzn-RequestId, for AWS support
  std::string doing;        ///< "sending to queue orders", "receiving", ...
  std::string queue;        ///< the queue concerned, for the no-such-queue message
  std::string key_id;       ///< the access key id, for the credentials message
  std::string where;        ///< the redacted URL, prefixed to the message
  /// The call sends messages (SendMessage, SendMessageBatch): a request that went out and got no
  /// clear answer may have been taken, so it is in doubt.
  bool sends = false;
  /// Secrets to remove from anything SQS or curl said (the secret key, the session token).
  std::vector<std::string> secrets;
};

/// The one mapping from an SQS failure to the broker error model:
///   curl: cannot connect or resolve, connection reset, nothing received, TLS I/O   -> unavailable
///         (in doubt for a send whose request may have gone out)
///   curl: timed out                                                                 -> timeout
///         (in doubt for a send)
///   curl: the peer's certificate or TLS setup refused                               -> refused
///   HTTP 5xx; ServiceUnavailable, InternalError, throttling (ThrottlingException,
///   RequestThrottled, KmsThrottled, OverLimit: too many messages in flight), a batch
///   entry that failed on SQS's side                                                 -> unavailable
///         (a 5xx to a send is in doubt)
///   QueueDoesNotExist / AWS.SimpleQueueService.NonExistentQueue                     -> refused, "no such queue"
///   InvalidClientTokenId, UnrecognizedClientException, SignatureDoesNotMatch,
///   IncompleteSignature, MissingAuthenticationToken, ExpiredToken, InvalidAccessKeyId -> refused, "credentials refused"
///   RequestExpired / clock skew                                                     -> refused, "check the clock"
///   AccessDenied (no permission), KmsAccessDenied, KmsDisabled, KmsNotFound,
///   any other 403                                                                   -> refused
///   ReceiptHandleIsInvalid, MessageNotInflight, InvalidReceiptHandle                -> stale
///   a send's InvalidMessageContents, InvalidParameterValue, MissingParameter,
///   InvalidAttributeName/Value, BatchRequestTooLong, a 413                          -> rejected
///   anything else                                                                   -> internal
/// The message is one line an operator can act on, prefixed with `where` and `doing`; it never
/// holds a secret.
BrokerError map_error(const Failure& failure);

/// Whether SQS refused for want of permission alone (AccessDenied): the credentials were taken.
bool is_access_denied(const Failure& failure);

/// SQS's error code without its namespace: "com.amazonaws.sqs#QueueDoesNotExist" and
/// "AWS.SimpleQueueService.NonExistentQueue;Sender" become "QueueDoesNotExist" and
/// "NonExistentQueue".
std::string short_code(std::string_view code);

/// `text` with every secret replaced by "***" and control characters by spaces: safe for one
/// log line.
std::string scrubbed(std::string_view text, const std::vector<std::string>& secrets);

}  // namespace idem::sqs_detail
