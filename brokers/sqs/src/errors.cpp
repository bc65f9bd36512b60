#include "errors.hpp"

#include <curl/curl.h>

#include <algorithm>

namespace idem::sqs_detail {
namespace {

// SQS's words are cut here: SignatureDoesNotMatch quotes the whole canonical request.
constexpr std::size_t kMaxWords = 300;

bool is_one_of(std::string_view code, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), code) != names.end();
}

std::string prefix(const Failure& f) {
  std::string out = f.where.empty() ? std::string("sqs") : f.where;
  if (!f.doing.empty()) out += ": " + f.doing;
  return out + ": ";
}

std::string queue_name(const Failure& f) { return f.queue.empty() ? std::string("the queue") : "queue \"" + f.queue + "\""; }

// What SQS said: its code, its words and the request id.
std::string aws_words(const Failure& f) {
  std::string words;
  const std::string code = short_code(f.aws_code);
  if (!code.empty()) words = code;
  if (!f.aws_message.empty()) {
    std::string message = scrubbed(f.aws_message, f.secrets);
    if (message.size() > kMaxWords) message = message.substr(0, kMaxWords) + "...";
    words += (words.empty() ? "" : ": ") + message;
  }
  if (f.status != 0) {
    if (!words.empty()) words += ' ';
    words.append("(HTTP ").append(std::to_string(f.status)).append(")");
  }
  if (!f.request_id.empty()) words += " (request id " + scrubbed(f.request_id, f.secrets) + ")";
  return words;
}

std::string curl_words(const Failure& f) {
  std::string words = curl_easy_strerror(static_cast<CURLcode>(f.curl_code));
  if (!f.curl_detail.empty()) words += ": " + scrubbed(f.curl_detail, f.secrets);
  return words;
}

BrokerError make(const Failure& f, BrokerErrc code, const std::string& text, bool in_doubt = false) {
  return BrokerError{code, prefix(f) + text, in_doubt};
}

BrokerError map_curl(const Failure& f) {
  switch (static_cast<CURLcode>(f.curl_code)) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
      // Nothing was sent: not in doubt.
      return make(f, BrokerErrc::unavailable, "cannot reach the SQS endpoint: " + curl_words(f));
    case CURLE_SSL_CONNECT_ERROR:
      return make(f, BrokerErrc::unavailable, "the TLS handshake with the SQS endpoint failed: " + curl_words(f));
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
      return make(f, BrokerErrc::unavailable,
                  "the connection to the SQS endpoint broke" +
                      std::string(f.sends ? " after the request went out (the messages may have been taken)" : "") + ": " +
                      curl_words(f),
                  f.sends);
    case CURLE_OPERATION_TIMEDOUT:
      return make(f, BrokerErrc::timeout,
                  "the SQS endpoint did not answer in time" +
                      std::string(f.sends ? " (the messages may have been taken)" : "") + ": " + curl_words(f),
                  f.sends);
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
      return make(f, BrokerErrc::refused, "TLS with the SQS endpoint failed (its certificate is not trusted here): " + curl_words(f));
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
      return make(f, BrokerErrc::invalid, "curl refuses the endpoint URL: " + curl_words(f));
    default:
      break;
  }
  return make(f, BrokerErrc::internal, "unexpected curl failure: " + curl_words(f), f.sends);
}

}  // namespace

std::string short_code(std::string_view code) {
  if (const auto semicolon = code.find(';'); semicolon != std::string_view::npos) code = code.substr(0, semicolon);
  if (const auto hash = code.rfind('#'); hash != std::string_view::npos) code = code.substr(hash + 1);
  for (std::string_view prefix : {"AWS.SimpleQueueService.", "AWS.", "Sender.", "Receiver."}) {
    if (code.starts_with(prefix)) code.remove_prefix(prefix.size());
  }
  return std::string(code);
}

std::string scrubbed(std::string_view text, const std::vector<std::string>& secrets) {
  std::string out(text);
  std::vector<std::string> sorted = secrets;
  // Longest first, so that a secret holding another is replaced whole.
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  for (const std::string& secret : sorted) {
    if (secret.empty()) continue;
    for (auto pos = out.find(secret); pos != std::string::npos; pos = out.find(secret, pos + 3)) out.replace(pos, secret.size(), "***");
  }
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return out;
}

bool is_access_denied(const Failure& f) {
  return f.curl_code == 0 && is_one_of(short_code(f.aws_code), {"AccessDenied", "AccessDeniedException"});
}

BrokerError map_error(const Failure& f) {
  if (f.curl_code != 0) return map_curl(f);
  const std::string code = short_code(f.aws_code);
  const std::string said = aws_words(f);

  if (is_one_of(code, {"QueueDoesNotExist", "NonExistentQueue"})) {
    return make(f, BrokerErrc::refused,
                queue_name(f) + " does not exist on this endpoint and account (idem never creates queues): " + said);
  }
  if (is_one_of(code, {"InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch", "IncompleteSignature",
                       "InvalidSignatureException", "MissingAuthenticationToken", "MissingAuthenticationTokenException",
                       "ExpiredToken", "ExpiredTokenException", "InvalidAccessKeyId", "InvalidSecurity", "AuthFailure",
                       "InvalidToken"})) {
    return make(f, BrokerErrc::refused,
                "SQS refused the credentials" + (f.key_id.empty() ? std::string() : " of access key " + f.key_id) +
                    " (wrong key id or secret, an expired session token, or the wrong region): " + said);
  }
  if (is_one_of(code, {"RequestExpired", "RequestTimeTooSkewed", "SignatureExpired"})) {
    return make(f, BrokerErrc::refused, "SQS refused the request's signing time: check this machine's clock: " + said);
  }
  if (is_one_of(code, {"AccessDenied", "AccessDeniedException", "KmsAccessDenied", "KmsDisabled", "KmsNotFound", "KmsInvalidState",
                       "KmsInvalidKeyUsage", "KmsOptInRequired", "OptInRequired"}) ||
      (f.status == 403 && code.empty())) {
    return make(f, BrokerErrc::refused,
                "SQS denied access to " + queue_name(f) +
                    (f.key_id.empty() ? std::string() : " for access key " + f.key_id) +
                    " (an IAM or queue policy, or its KMS key): " + said);
  }
  if (is_one_of(code, {"ReceiptHandleIsInvalid", "MessageNotInflight", "InvalidReceiptHandle"})) {
    return make(f, BrokerErrc::stale,
                "SQS no longer knows this receipt (the message became visible again and may be with another consumer): " + said);
  }
  if (is_one_of(code, {"ThrottlingException", "Throttling", "RequestThrottled", "KmsThrottled", "TooManyRequestsException",
                       "OverLimit", "ServiceUnavailable", "InternalError", "InternalFailure", "ServiceUnavailableException",
                       "RequestCanceled", "PurgeQueueInProgress"}) ||
      (!f.sender_fault && !code.empty() && f.status < 400) || f.status == 429) {
    // Throttled or refused before anything was done: not in doubt. SQS's own 500s below are.
    const bool maybe_taken = f.sends && (f.status >= 500 || is_one_of(code, {"InternalError", "InternalFailure"}));
    return make(f, BrokerErrc::unavailable, "SQS could not take it now: " + said, maybe_taken);
  }
  if (f.status >= 500) {
    return make(f, BrokerErrc::unavailable, "the SQS endpoint failed: " + said, f.sends);
  }
  if (f.sends && (is_one_of(code, {"InvalidMessageContents", "InvalidParameterValue", "MissingParameter", "InvalidAttributeName",
                                   "InvalidAttributeValue", "BatchRequestTooLong", "InvalidParameterCombination",
                                   "UnsupportedOperation"}) ||
                  f.status == 413)) {
    return make(f, BrokerErrc::rejected, "SQS refused the message: " + said);
  }
  return make(f, BrokerErrc::internal, "unexpected answer from SQS: " + (said.empty() ? std::string("no error code") : said));
}

}  // namespace idem::sqs_detail
