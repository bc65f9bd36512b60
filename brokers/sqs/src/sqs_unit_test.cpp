// The parts of the SQS module that need no emulator: URLs and their redaction, the error mapping,
// the JSON requests and answers, SQS's rules for messages, and the AWS Signature V4 that curl
// computes, recomputed here on the request a local listener captured.

#include "idem/fingerprint.hpp"  // sha256_hex
#include "idem/sqs_broker.hpp"

#include <curl/curl.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "client.hpp"
#include "errors.hpp"
#include "idem/redact.hpp"
#include "idem/testing/loopback_listener.hpp"
#include "protocol.hpp"

namespace idem {
namespace {

using namespace sqs_detail;
using nlohmann::json;

constexpr const char* kSecret = "Zq9xWsecretKEY/abc+def";
constexpr const char* kToken = "Zq9xWtokenFQoGZXIvYXdzEJr";

// Sets environment variables for one test and puts back what was there.
class Env {
 public:
  Env(std::initializer_list<std::pair<const char*, const char*>> values) {
    for (const char* name : {"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old == nullptr ? std::nullopt : std::optional<std::string>(old));
      ::unsetenv(name);
    }
    for (const auto& [name, value] : values) ::setenv(name, value, 1);
  }
  ~Env() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

SqsUrl parsed(const std::string& url, SqsUrlRole role = SqsUrlRole::source) {
  auto u = parse_sqs_url(url, role);
  EXPECT_TRUE(u) << url << ": " << u.error().message;
  return u.value_or(SqsUrl{});
}

// The error for a bad URL: invalid, one line, and it never holds the secret or the token.
std::string bad(const std::string& url, SqsUrlRole role = SqsUrlRole::source) {
  auto u = parse_sqs_url(url, role);
  EXPECT_FALSE(u) << url;
  if (u) return {};
  EXPECT_EQ(u.error().code, BrokerErrc::invalid) << u.error().message;
  EXPECT_FALSE(u.error().retryable());
  EXPECT_EQ(u.error().message.find('\n'), std::string::npos) << u.error().message;
  EXPECT_EQ(u.error().message.find("Zq9xW"), std::string::npos) << u.error().message;
  return u.error().message;
}

// ---- URLs ---------------------------------------------------------------------------------

TEST(SqsUrl, ASourceWithEveryOption) {
  const Env env({});
  const auto u = parsed(
      "sqs+https://AKIAEXAMPLE:Zq9xWsecretKEY%2Fabc%2Bdef@sqs.eu-west-1.amazonaws.com/123456789012/orders"
      "?region=eu-west-1&token=Zq9xWtokenFQoGZXIvYXdzEJr&id_attribute=idem-id&dead_letter=orders-dlq"
      "&visibility_timeout=120&wait_seconds=5");
  EXPECT_TRUE(u.https);
  EXPECT_EQ(u.host, "sqs.eu-west-1.amazonaws.com");
  EXPECT_EQ(u.port, 0);
  EXPECT_EQ(u.account, "123456789012");
  EXPECT_EQ(u.queue, "orders");
  EXPECT_EQ(u.region, "eu-west-1");
  EXPECT_EQ(u.access_key_id, "AKIAEXAMPLE");
  EXPECT_EQ(u.secret_access_key, kSecret);
  EXPECT_EQ(u.session_token, kToken);
  EXPECT_EQ(u.id_attribute, "idem-id");
  EXPECT_EQ(u.dead_letter_queue, "orders-dlq");
  EXPECT_EQ(u.dead_letter_url, "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq");
  EXPECT_EQ(u.visibility_timeout, std::chrono::seconds(120));
  EXPECT_EQ(u.wait_seconds, std::chrono::seconds(5));
  EXPECT_EQ(u.endpoint(), "https://sqs.eu-west-1.amazonaws.com/");
  EXPECT_EQ(u.queue_url(), "https://sqs.eu-west-1.amazonaws.com/123456789012/orders");
  EXPECT_FALSE(u.fifo());
}

TEST(SqsUrl, DefaultsComeFromTheHostAndTheEnvironment) {
  const Env env({{"AWS_ACCESS_KEY_ID", "AKIAENV"}, {"AWS_SECRET_ACCESS_KEY", kSecret}, {"AWS_SESSION_TOKEN", kToken},
                 {"AWS_REGION", "us-west-2"}});
  // An AWS host names its region, whatever AWS_REGION says.
  auto u = parsed("sqs+https://sqs.eu-central-1.amazonaws.com/123456789012/jobs.fifo");
  EXPECT_EQ(u.region, "eu-central-1");
  EXPECT_EQ(u.access_key_id, "AKIAENV");
  EXPECT_EQ(u.secret_access_key, kSecret);
  EXPECT_EQ(u.session_token, kToken);
  EXPECT_EQ(u.id_attribute, "message_id");
  EXPECT_EQ(u.visibility_timeout, std::chrono::seconds(30));
  EXPECT_EQ(u.wait_seconds, std::chrono::seconds(20));
  EXPECT_TRUE(u.fifo());
  EXPECT_EQ(u.dead_letter_queue, "jobs-dead-letter.fifo");
  EXPECT_EQ(u.dead_letter_url, "https://sqs.eu-central-1.amazonaws.com/123456789012/jobs-dead-letter.fifo");

  // A local endpoint: AWS_REGION; the URL's own credentials, without the environment's token.
  u = parsed("sqs+http://AKIAURL:other@127.0.0.1:4566/000000000000/orders");
  EXPECT_FALSE(u.https);
  EXPECT_EQ(u.region, "us-west-2");
  EXPECT_EQ(u.port, 4566);
  EXPECT_EQ(u.access_key_id, "AKIAURL");
  EXPECT_EQ(u.secret_access_key, "other");
  EXPECT_EQ(u.session_token, "");
  EXPECT_EQ(u.dead_letter_queue, "orders-dead-letter");
  EXPECT_EQ(u.queue_url(), "http://127.0.0.1:4566/000000000000/orders");
  EXPECT_EQ(u.endpoint(), "http://127.0.0.1:4566/");

  // IPv6, and AWS_DEFAULT_REGION when AWS_REGION is not set.
  const Env env2({{"AWS_ACCESS_KEY_ID", "AKIAENV"}, {"AWS_SECRET_ACCESS_KEY", kSecret}, {"AWS_DEFAULT_REGION", "ap-south-1"}});
  u = parsed("sqs+http://[::1]:9324/queue/orders", SqsUrlRole::sink);
  EXPECT_EQ(u.host, "[::1]");
  EXPECT_EQ(u.region, "ap-south-1");
  EXPECT_EQ(u.queue_url(), "http://[::1]:9324/queue/orders");
}

TEST(SqsUrl, TheRegionOfEachFormOfAwsHost) {
  const Env env({{"AWS_ACCESS_KEY_ID", "AKIAENV"}, {"AWS_SECRET_ACCESS_KEY", kSecret}});
  const std::pair<const char*, const char*> cases[] = {
      {"sqs.eu-west-1.amazonaws.com", "eu-west-1"},      {"sqs-fips.us-gov-west-1.amazonaws.com", "us-gov-west-1"},
      {"sqs.cn-north-1.amazonaws.com.cn", "cn-north-1"}, {"sqs.ap-southeast-2.api.aws", "ap-southeast-2"},
      {"eu-west-3.queue.amazonaws.com", "eu-west-3"},     {"queue.amazonaws.com", "us-east-1"},
      {"SQS.EU-WEST-1.AMAZONAWS.COM", "eu-west-1"},
  };
  for (const auto& [host, region] : cases) {
    EXPECT_EQ(parsed(std::string("sqs+https://") + host + "/123456789012/q").region, region) << host;
  }
  EXPECT_NE(bad("sqs+https://sqs.eu-west-1.amazonaws.com/123456789012/q?region=us-east-1").find("eu-west-1"), std::string::npos);
}

TEST(SqsUrl, ADeadLetterQueueByUrl) {
  const Env env({{"AWS_ACCESS_KEY_ID", "AKIAENV"}, {"AWS_SECRET_ACCESS_KEY", kSecret}});
  const auto u = parsed(
      "sqs+https://sqs.eu-west-1.amazonaws.com/123456789012/orders?dead_letter="
      "https%3A%2F%2Fsqs.eu-west-1.amazonaws.com%2F210987654321%2Fshared-dlq");
  EXPECT_EQ(u.dead_letter_queue, "shared-dlq");
  EXPECT_EQ(u.dead_letter_url, "https://sqs.eu-west-1.amazonaws.com/210987654321/shared-dlq");
  EXPECT_NE(bad("sqs+https://sqs.eu-west-1.amazonaws.com/123456789012/orders?dead_letter=orders").find("cannot be the queue"),
            std::string::npos);
  EXPECT_NE(bad("sqs+https://sqs.eu-west-1.amazonaws.com/123456789012/o?dead_letter=ftp://h/1/q").find("dead_letter"),
            std::string::npos);
  EXPECT_NE(bad("sqs+https://sqs.eu-west-1.amazonaws.com/123456789012/o?dead_letter=https://h/q").find("/ACCOUNT_ID/NAME"),
            std::string::npos);
  EXPECT_NE(bad("sqs+https://sqs.eu-west-1.amazonaws.com/123456789012/o?dead_letter=bad%20name").find("not a queue name"),
            std::string::npos);
}

TEST(SqsUrl, ASinkTakesNoSourceParameters) {
  const Env env({{"AWS_ACCESS_KEY_ID", "AKIAENV"}, {"AWS_SECRET_ACCESS_KEY", kSecret}});
  const std::string base = "sqs+https://sqs.eu-west-1.amazonaws.com/123456789012/orders";
  for (const char* p : {"?dead_letter=x", "?visibility_timeout=60", "?wait_seconds=10"}) {
    EXPECT_NE(bad(base + p, SqsUrlRole::sink).find("is for source URLs"), std::string::npos) << p;
  }
  const auto u = parsed(base + "?id_attribute=mid&region=eu-west-1", SqsUrlRole::sink);
  EXPECT_EQ(u.id_attribute, "mid");
  EXPECT_TRUE(u.dead_letter_queue.empty());
}

TEST(SqsUrl, BadUrlsSayWhatIsWrong) {
  const Env env({{"AWS_ACCESS_KEY_ID", "AKIAENV"}, {"AWS_SECRET_ACCESS_KEY", kSecret}, {"AWS_REGION", "eu-west-1"}});
  const std::pair<std::string, std::string> cases[] = {
      {"https://sqs.eu-west-1.amazonaws.com/123456789012/q", "must start with sqs+https://"},
      {"sqs://h/1/q", "must start with sqs+https://"},
      {"sqs+https:///123456789012/q", "no host"},
      {"sqs+https://h:0/1/q", "bad port"},
      {"sqs+https://h:99999/1/q", "bad port"},
      {"sqs+https://h:/1/q", "empty port"},
      {"sqs+https://[::1/1/q", "unclosed '['"},
      {"sqs+https://h", "/ACCOUNT_ID/QUEUE_NAME"},
      {"sqs+https://h/q", "/ACCOUNT_ID/QUEUE_NAME"},
      {"sqs+https://h/1/q/more", "/ACCOUNT_ID/QUEUE_NAME"},
      {"sqs+https://h//q", "account"},
      {"sqs+https://h/1/", "queue name is empty"},
      {"sqs+https://h/1/bad.name", "not a queue name"},
      {"sqs+https://h/1/" + std::string(81, 'q'), "longer than SQS's 80"},
      {"sqs+https://h/1/.fifo", "not a queue name"},
      {"sqs+https://h/1/q#frag", "fragment"},
      {"sqs+https://h/1/q?colour=red", "unknown parameter colour"},
      {"sqs+https://h/1/q?region=eu-west-1&region=eu-west-1", "given twice"},
      {"sqs+https://h/1/q?region=EU_WEST", "region=EU_WEST"},
      {"sqs+https://h/1/q?visibility_timeout=1", "visibility_timeout=1: give whole seconds, 2-43200"},
      {"sqs+https://h/1/q?visibility_timeout=43201", "2-43200"},
      {"sqs+https://h/1/q?visibility_timeout=ten", "give whole seconds"},
      {"sqs+https://h/1/q?wait_seconds=0", "wait_seconds=0: give whole seconds, 1-20"},
      {"sqs+https://h/1/q?wait_seconds=21", "1-20"},
      {"sqs+https://h/1/q?id_attribute=", "id_attribute"},
      {"sqs+https://h/1/q?token=", "token is empty"},
      {"sqs+https://h/1/q?dead_letter=", "dead_letter is empty"},
      {"sqs+https://h/1/q?region=%zz", "bad percent-escape"},
      {"sqs+https://onlyuser@h/1/q", "need both parts"},
      {"sqs+https://:secret@h/1/q", "need both parts"},
  };
  for (const auto& [url, expected] : cases) {
    const std::string message = bad(url);
    EXPECT_NE(message.find(expected), std::string::npos) << url << " -> " << message;
  }
  // The default dead-letter queue must fit SQS's 80 characters.
  EXPECT_NE(bad("sqs+https://h/1/" + std::string(75, 'q')).find("longer than 80"), std::string::npos);
}

// What the environment lacks is not wrong with the URL (its form checks, and source_identity
// works, wherever they run), but opening says what is missing, before it connects.
std::string incomplete(const std::string& url) {
  EXPECT_TRUE(parse_sqs_url(url, SqsUrlRole::source)) << url;
  auto u = parse_complete_sqs_url(url, SqsUrlRole::source);
  EXPECT_FALSE(u) << url;
  if (u) return {};
  EXPECT_EQ(u.error().code, BrokerErrc::invalid);
  auto opened = open_sqs_source(url);
  EXPECT_FALSE(opened) << url;
  if (opened) return {};
  EXPECT_EQ(opened.error().message, u.error().message);
  EXPECT_EQ(u.error().message.find("Zq9xW"), std::string::npos) << u.error().message;
  return u.error().message;
}

TEST(SqsUrl, NoRegionOrCredentialsSaysWhereToPutThem) {
  const Env none({});
  EXPECT_NE(incomplete("sqs+http://AKIA:Zq9xW@localhost:4566/000000000000/q").find("no region: give ?region="), std::string::npos);
  const Env region({{"AWS_REGION", "eu-west-1"}});
  EXPECT_NE(incomplete("sqs+https://h/1/q").find("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"), std::string::npos);
  const Env key_only({{"AWS_REGION", "eu-west-1"}, {"AWS_ACCESS_KEY_ID", "AKIAONLY"}});
  EXPECT_NE(incomplete("sqs+https://h/1/q").find("AWS_SECRET_ACCESS_KEY"), std::string::npos);
  const Env odd({{"AWS_REGION", "Europe"}, {"AWS_ACCESS_KEY_ID", "AKIA"}, {"AWS_SECRET_ACCESS_KEY", "Zq9xW"}});
  EXPECT_NE(incomplete("sqs+https://h/1/q").find("not a region name"), std::string::npos);
  const Env token({{"AWS_REGION", "eu-west-1"}, {"AWS_ACCESS_KEY_ID", "AKIA"}, {"AWS_SECRET_ACCESS_KEY", "Zq9xW"},
                   {"AWS_SESSION_TOKEN", "Zq9xW token"}});
  EXPECT_NE(incomplete("sqs+https://h/1/q").find("AWS_SESSION_TOKEN"), std::string::npos);
}

TEST(SqsUrl, ErrorsAndNamesNeverHoldTheSecretOrTheToken) {
  const Env env({{"AWS_REGION", "eu-west-1"}});
  // Each is wrong in some other part; the error names that part and never quotes the secrets.
  for (const char* url : {
           "sqs+https://AKIA:Zq9xWsecret@h:bad/1/q?token=Zq9xWtoken",
           "sqs+https://AKIA:Zq9xW%zzsecret@h/1/q",
           "sqs+https://AKIA:Zq9xW/secret@h/1/q",
           "sqs+https://AKIA:Zq9xWsecret@h/1/q?token=Zq9xW%zz",
           "sqs+https://AKIA:Zq9xWsecret@h/1/q?token=Zq9xWtoken&colour=red",
           "sqs+https://AKIA:Zq9xWsecret@h/1/q?token=Zq9xW%20tok",
           "sqs+https://AKIA:Zq9xWsecret@h/1/bad.queue?token=Zq9xWtoken",
       }) {
    bad(url);
  }
  // What a source or sink calls itself: redact_url hides the secret key and every token=.
  const std::string name = redact_url("sqs+https://AKIA:Zq9xWsecret@h/1/q?token=Zq9xWtoken&region=eu-west-1");
  EXPECT_EQ(name, "sqs+https://AKIA:***@h/1/q?token=***&region=eu-west-1");
}

// ---- errors -------------------------------------------------------------------------------

Failure aws(long status, const std::string& code, const std::string& message = "words", bool sends = false) {
  Failure f;
  f.status = status;
  f.aws_code = code;
  f.aws_message = message;
  f.sender_fault = status < 500;
  f.where = "sqs+https://h/1/q";
  f.doing = "doing it";
  f.queue = "q";
  f.key_id = "AKIAKEY";
  f.sends = sends;
  f.secrets = {kSecret, kToken};
  return f;
}

Failure transfer(int code, bool sends = false) {
  Failure f;
  f.curl_code = code;
  f.curl_detail = "details";
  f.sends = sends;
  return f;
}

TEST(SqsErrors, EachFailureMapsToWhatACallerMayDo) {
  const std::pair<Failure, BrokerErrc> cases[] = {
      {transfer(CURLE_COULDNT_CONNECT), BrokerErrc::unavailable},
      {transfer(CURLE_COULDNT_RESOLVE_HOST), BrokerErrc::unavailable},
      {transfer(CURLE_RECV_ERROR), BrokerErrc::unavailable},
      {transfer(CURLE_GOT_NOTHING), BrokerErrc::unavailable},
      {transfer(CURLE_SSL_CONNECT_ERROR), BrokerErrc::unavailable},
      {transfer(CURLE_OPERATION_TIMEDOUT), BrokerErrc::timeout},
      {transfer(CURLE_PEER_FAILED_VERIFICATION), BrokerErrc::refused},
      {transfer(CURLE_URL_MALFORMAT), BrokerErrc::invalid},
      {transfer(CURLE_OUT_OF_MEMORY), BrokerErrc::internal},
      {aws(400, "com.amazonaws.sqs#QueueDoesNotExist"), BrokerErrc::refused},
      {aws(400, "AWS.SimpleQueueService.NonExistentQueue;Sender"), BrokerErrc::refused},
      {aws(403, "com.amazon.coral.service#InvalidClientTokenId"), BrokerErrc::refused},
      {aws(400, "com.amazon.coral.service#UnrecognizedClientException"), BrokerErrc::refused},
      {aws(403, "SignatureDoesNotMatch"), BrokerErrc::refused},
      {aws(400, "com.amazon.coral.service#ExpiredTokenException"), BrokerErrc::refused},
      {aws(403, "com.amazon.coral.service#AccessDeniedException"), BrokerErrc::refused},
      {aws(403, "AccessDenied"), BrokerErrc::refused},
      {aws(403, ""), BrokerErrc::refused},
      {aws(400, "RequestExpired"), BrokerErrc::refused},
      {aws(400, "com.amazonaws.sqs#KmsAccessDenied"), BrokerErrc::refused},
      {aws(400, "com.amazonaws.sqs#ReceiptHandleIsInvalid"), BrokerErrc::stale},
      {aws(400, "com.amazonaws.sqs#MessageNotInflight"), BrokerErrc::stale},
      {aws(400, "com.amazon.coral.availability#ThrottlingException"), BrokerErrc::unavailable},
      {aws(400, "com.amazonaws.sqs#RequestThrottled"), BrokerErrc::unavailable},
      {aws(403, "com.amazonaws.sqs#OverLimit"), BrokerErrc::unavailable},
      {aws(400, "com.amazonaws.sqs#KmsThrottled"), BrokerErrc::unavailable},
      {aws(500, "com.amazon.coral.service#InternalFailure"), BrokerErrc::unavailable},
      {aws(503, "ServiceUnavailable"), BrokerErrc::unavailable},
      {aws(502, ""), BrokerErrc::unavailable},
      {aws(429, ""), BrokerErrc::unavailable},
      {aws(400, "com.amazonaws.sqs#InvalidMessageContents", "words", true), BrokerErrc::rejected},
      {aws(400, "InvalidParameterValue", "Message must be shorter than 262144 bytes.", true), BrokerErrc::rejected},
      {aws(413, "", "", true), BrokerErrc::rejected},
      {aws(400, "InvalidParameterValue", "words", false), BrokerErrc::internal},
      {aws(400, "SomethingNew"), BrokerErrc::internal},
  };
  for (const auto& [failure, expected] : cases) {
    const BrokerError e = map_error(failure);
    EXPECT_EQ(e.code, expected) << failure.aws_code << " / curl " << failure.curl_code << ": " << e.message;
    EXPECT_EQ(e.retryable(), expected == BrokerErrc::unavailable || expected == BrokerErrc::timeout) << e.message;
    EXPECT_EQ(e.message.find('\n'), std::string::npos) << e.message;
  }
  // A batch entry that failed on SQS's side (SenderFault false) may go again.
  Failure entry;
  entry.aws_code = "InternalError";
  entry.sender_fault = false;
  EXPECT_EQ(map_error(entry).code, BrokerErrc::unavailable);
  entry.aws_code = "AnythingElse";
  EXPECT_EQ(map_error(entry).code, BrokerErrc::unavailable);
}

TEST(SqsErrors, OnlyASendThatMayHaveGoneIsInDoubt) {
  // The request may have been taken: a send that timed out, broke after it went out, or got a 5xx.
  EXPECT_TRUE(map_error(transfer(CURLE_OPERATION_TIMEDOUT, true)).in_doubt);
  EXPECT_TRUE(map_error(transfer(CURLE_RECV_ERROR, true)).in_doubt);
  EXPECT_TRUE(map_error(transfer(CURLE_GOT_NOTHING, true)).in_doubt);
  EXPECT_TRUE(map_error(aws(500, "InternalFailure", "words", true)).in_doubt);
  EXPECT_TRUE(map_error(aws(503, "", "", true)).in_doubt);
  // Never sent, or refused before anything was done.
  EXPECT_FALSE(map_error(transfer(CURLE_COULDNT_CONNECT, true)).in_doubt);
  EXPECT_FALSE(map_error(transfer(CURLE_COULDNT_RESOLVE_HOST, true)).in_doubt);
  EXPECT_FALSE(map_error(aws(400, "ThrottlingException", "words", true)).in_doubt);
  EXPECT_FALSE(map_error(aws(400, "QueueDoesNotExist", "words", true)).in_doubt);
  EXPECT_FALSE(map_error(aws(400, "InvalidMessageContents", "words", true)).in_doubt);
  // Not a send: nothing is in doubt.
  EXPECT_FALSE(map_error(transfer(CURLE_OPERATION_TIMEDOUT)).in_doubt);
  EXPECT_FALSE(map_error(aws(500, "InternalFailure")).in_doubt);
}

// Wrong credentials cannot be tried on fauxqs (it takes any signature), so the mapping of what
// AWS answers is checked here, on answers as AWS words them.
TEST(SqsErrors, RefusedCredentialsAreOneClearLineWithoutTheSecrets) {
  const std::string canonical = std::string("The request signature we calculated does not match the signature you provided. ") +
                                "The Canonical String for this request should have been\n'POST\n/\n\ncontent-type:application/"
                                "x-amz-json-1.0\nhost:sqs.eu-west-1.amazonaws.com\nx-amz-security-token:" +
                                kToken + "\n' and the signing key was derived from " + kSecret;
  for (const Failure& f : {aws(403, "com.amazon.coral.service#InvalidClientTokenId",
                               "The security token included in the request is invalid."),
                           aws(403, "com.amazon.coral.service#SignatureDoesNotMatch", canonical),
                           aws(400, "com.amazon.coral.service#UnrecognizedClientException",
                               "The security token included in the request is invalid.")}) {
    const BrokerError e = map_error(f);
    EXPECT_EQ(e.code, BrokerErrc::refused);
    EXPECT_FALSE(e.retryable());
    EXPECT_NE(e.message.find("SQS refused the credentials of access key AKIAKEY"), std::string::npos) << e.message;
    EXPECT_EQ(e.message.find('\n'), std::string::npos) << e.message;
    EXPECT_EQ(e.message.find("Zq9xW"), std::string::npos) << e.message;
  }
  const BrokerError denied = map_error(aws(403, "AccessDenied", "User: arn:aws:iam::1:user/x is not authorized to perform: sqs:ReceiveMessage"));
  EXPECT_NE(denied.message.find("denied access to queue \"q\""), std::string::npos) << denied.message;
  EXPECT_NE(denied.message.find("sqs:ReceiveMessage"), std::string::npos) << denied.message;
  // curl's words are scrubbed as well.
  Failure t = transfer(CURLE_COULDNT_CONNECT);
  t.curl_detail = std::string("Failed to connect for ") + kSecret;
  t.secrets = {kSecret};
  EXPECT_EQ(map_error(t).message.find("Zq9xW"), std::string::npos);
}

TEST(SqsErrors, AMissingQueueNamesTheQueue) {
  const BrokerError e = map_error(aws(400, "com.amazonaws.sqs#QueueDoesNotExist", "The specified queue does not exist."));
  EXPECT_EQ(e.message,
            "sqs+https://h/1/q: doing it: queue \"q\" does not exist on this endpoint and account (idem never creates queues): "
            "QueueDoesNotExist: The specified queue does not exist. (HTTP 400)");
}

TEST(SqsErrors, ShortCodes) {
  EXPECT_EQ(short_code("com.amazonaws.sqs#QueueDoesNotExist"), "QueueDoesNotExist");
  EXPECT_EQ(short_code("AWS.SimpleQueueService.NonExistentQueue;Sender"), "NonExistentQueue");
  EXPECT_EQ(short_code("AccessDenied"), "AccessDenied");
  EXPECT_EQ(short_code(""), "");
}

// ---- the JSON protocol --------------------------------------------------------------------

TEST(SqsProtocol, RequestsCarryWhatSqsExpects) {
  const json receive = json::parse(receive_request("https://h/1/q", 25, 20, 30));
  EXPECT_EQ(receive["QueueUrl"], "https://h/1/q");
  EXPECT_EQ(receive["MaxNumberOfMessages"], 10);  // SQS's most
  EXPECT_EQ(receive["WaitTimeSeconds"], 20);
  EXPECT_EQ(receive["VisibilityTimeout"], 30);
  EXPECT_EQ(receive["MessageAttributeNames"], json::array({"All"}));
  const json system = json::array({"ApproximateReceiveCount", "MessageDeduplicationId", "MessageGroupId"});
  EXPECT_EQ(receive["MessageSystemAttributeNames"], system);
  EXPECT_EQ(receive["AttributeNames"], system);

  const json del = json::parse(delete_batch_request("https://h/1/q", {{"0", "r0"}, {"1", "r1"}}));
  EXPECT_EQ(del["Entries"], json::parse(R"([{"Id":"0","ReceiptHandle":"r0"},{"Id":"1","ReceiptHandle":"r1"}])"));
  const json vis = json::parse(change_visibility_batch_request("https://h/1/q", {{"0", "r0"}}, 60));
  EXPECT_EQ(vis["Entries"], json::parse(R"([{"Id":"0","ReceiptHandle":"r0","VisibilityTimeout":60}])"));
  EXPECT_EQ(json::parse(change_visibility_request("u", "r", 0)), json::parse(R"({"QueueUrl":"u","ReceiptHandle":"r","VisibilityTimeout":0})"));
  EXPECT_EQ(json::parse(delete_request("u", "r")), json::parse(R"({"QueueUrl":"u","ReceiptHandle":"r"})"));
  EXPECT_EQ(json::parse(get_attributes_request("u", {"QueueArn"})), json::parse(R"({"QueueUrl":"u","AttributeNames":["QueueArn"]})"));

  SendEntry e;
  e.id = "3";
  e.body = "{\"a\":\"\xc3\xa9\"}";
  e.attributes = {{"message_id", {"String", "m-1"}}, {"blob", {"Binary", std::string("\x00\xff\x10", 3)}}};
  e.group_id = "g";
  e.deduplication_id = "d";
  const json batch = json::parse(send_batch_request("u", {e}));
  EXPECT_EQ(batch["Entries"][0], json::parse(R"({"Id":"3","MessageBody":"{\"a\":\"\u00e9\"}","MessageGroupId":"g",
      "MessageDeduplicationId":"d","MessageAttributes":{"message_id":{"DataType":"String","StringValue":"m-1"},
      "blob":{"DataType":"Binary","BinaryValue":"AP8Q"}}})"));
  const json single = json::parse(send_request("u", e));
  EXPECT_FALSE(single.contains("Id"));
  EXPECT_EQ(single["QueueUrl"], "u");
  EXPECT_EQ(single["MessageBody"], batch["Entries"][0]["MessageBody"]);
  // SQS's size: the body, and each attribute's name, type and value.
  EXPECT_EQ(e.size(), e.body.size() + 10 + 6 + 3 + 4 + 6 + 3);
}

TEST(SqsProtocol, AReceivedMessageBecomesADelivery) {
  const std::string body = R"({"Messages":[
    {"MessageId":"sqs-1","ReceiptHandle":"r-1","MD5OfBody":"x","Body":"{\"n\":1}",
     "Attributes":{"ApproximateReceiveCount":"3","SentTimestamp":"1"},
     "MessageAttributes":{"message_id":{"DataType":"String","StringValue":"order-7"},
                          "content_type":{"DataType":"String","StringValue":"application/json"},
                          "trace":{"DataType":"String","StringValue":"t-1"},
                          "amount":{"DataType":"Number","StringValue":"12.5"},
                          "raw":{"DataType":"Binary","BinaryValue":"AP8Q"}}},
    {"MessageId":"sqs-2","ReceiptHandle":"r-2","Body":"plain"},
    {"MessageId":"sqs-3","ReceiptHandle":"r-3","Body":"fifo",
     "Attributes":{"ApproximateReceiveCount":"1","MessageDeduplicationId":"dedup-9","MessageGroupId":"g-1"}}]})";
  auto messages = parse_receive(body);
  ASSERT_TRUE(messages) << messages.error();
  ASSERT_EQ(messages->size(), 3u);
  EXPECT_EQ((*messages)[0].receipt_handle, "r-1");
  EXPECT_EQ((*messages)[2].group_id, "g-1");

  const Delivery d = to_delivery((*messages)[0], "message_id", false);
  EXPECT_TRUE(d.has_message_id);
  EXPECT_EQ(d.message_id, "order-7");
  EXPECT_EQ(d.content_type, "application/json");
  EXPECT_EQ(d.body, "{\"n\":1}");
  EXPECT_EQ(d.delivery_count, 3u);
  EXPECT_TRUE(d.redelivered);
  EXPECT_EQ(d.broker_ref, "sqs-1");
  const MessageHeaders expected = {{"amount", "12.5"}, {"raw", std::string("\x00\xff\x10", 3)}, {"trace", "t-1"}};
  EXPECT_EQ(d.headers, expected);

  // No id attribute: none, whatever SQS's MessageId; with another id_attribute, message_id is a header.
  const Delivery plain = to_delivery((*messages)[1], "message_id", false);
  EXPECT_FALSE(plain.has_message_id);
  EXPECT_EQ(plain.message_id, "");
  EXPECT_EQ(plain.delivery_count, 1u);
  EXPECT_FALSE(plain.redelivered);
  const Delivery other = to_delivery((*messages)[0], "idem-id", false);
  EXPECT_FALSE(other.has_message_id);

  // FIFO: the deduplication id when the attribute is absent; never on a standard queue.
  const Delivery fifo = to_delivery((*messages)[2], "message_id", true);
  EXPECT_TRUE(fifo.has_message_id);
  EXPECT_EQ(fifo.message_id, "dedup-9");
  EXPECT_FALSE(to_delivery((*messages)[2], "message_id", false).has_message_id);
  EXPECT_EQ(to_delivery((*messages)[0], "message_id", true).message_id, "order-7");  // the attribute first

  auto none = parse_receive("{}");
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
}

TEST(SqsProtocol, TheOrderingKeyIsTheAttributeElseAFifoQueuesGroup) {
  const std::string body = R"({"Messages":[
    {"MessageId":"sqs-1","ReceiptHandle":"r-1","Body":"keyed",
     "Attributes":{"MessageDeduplicationId":"order-7","MessageGroupId":"g-1"},
     "MessageAttributes":{"message_id":{"DataType":"String","StringValue":"order-7"},
                          "ordering_key":{"DataType":"String","StringValue":"pay_7"},
                          "trace":{"DataType":"String","StringValue":"t-1"}}},
    {"MessageId":"sqs-2","ReceiptHandle":"r-2","Body":"grouped",
     "Attributes":{"MessageDeduplicationId":"dedup-9","MessageGroupId":"acct_1"}},
    {"MessageId":"sqs-3","ReceiptHandle":"r-3","Body":"idem's own group",
     "Attributes":{"MessageDeduplicationId":"order-8","MessageGroupId":"order-8"},
     "MessageAttributes":{"message_id":{"DataType":"String","StringValue":"order-8"}}},
    {"MessageId":"sqs-4","ReceiptHandle":"r-4","Body":"no id",
     "Attributes":{"MessageDeduplicationId":"x","MessageGroupId":"idem-no-message-id"}},
    {"MessageId":"sqs-5","ReceiptHandle":"r-5","Body":"bad key",
     "Attributes":{"MessageGroupId":"g-5"},
     "MessageAttributes":{"ordering_key":{"DataType":"String","StringValue":"has a space"}}}]})";
  auto messages = parse_receive(body);
  ASSERT_TRUE(messages) << messages.error();
  ASSERT_EQ(messages->size(), 5u);
  const auto& m = *messages;

  // The attribute first, taken out of the headers like the id; on any queue.
  for (bool fifo : {true, false}) {
    const Delivery d = to_delivery(m[0], "message_id", fifo);
    EXPECT_EQ(d.ordering_key, "pay_7");
    EXPECT_EQ(d.headers, (MessageHeaders{{"trace", "t-1"}}));
  }
  // No attribute: a FIFO queue's group, never a standard queue's (it has none to keep order by).
  EXPECT_EQ(to_delivery(m[1], "message_id", true).ordering_key, "acct_1");
  EXPECT_EQ(to_delivery(m[1], "message_id", false).ordering_key, "");
  // The group idem's sink gives a message without an ordering key (its id) orders nothing.
  EXPECT_EQ(to_delivery(m[2], "message_id", true).ordering_key, "");
  EXPECT_EQ(to_delivery(m[3], "message_id", true).ordering_key, "");
  // A value that is no ordering key is ignored, and the group does not stand in for it.
  const Delivery bad = to_delivery(m[4], "message_id", true);
  EXPECT_EQ(bad.ordering_key, "");
  EXPECT_TRUE(bad.headers.empty());
}

TEST(SqsProtocol, MalformedAnswersAreErrorsNotCrashes) {
  for (const char* body : {"", "not json", "[]", R"({"Messages":{}})", R"({"Messages":[1]})",
                           R"({"Messages":[{"Body":"no receipt"}]})", R"({"Messages":[{"ReceiptHandle":""}]})",
                           R"({"Messages":[{"ReceiptHandle":"r","MessageAttributes":{"a":1}}]})",
                           R"({"Messages":[{"ReceiptHandle":"r","MessageAttributes":{"a":{"DataType":"Binary","BinaryValue":"!!"}}}]})",
                           "{\"Messages\":[{\"ReceiptHandle\":\"r\",\"Body\":\"\xff\"}]}"}) {
    EXPECT_FALSE(parse_receive(body)) << body;
  }
  // Odd but harmless: a receive count that is no number counts as 1.
  auto odd = parse_receive(R"({"Messages":[{"ReceiptHandle":"r","Attributes":{"ApproximateReceiveCount":"lots"}}]})");
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->front().receive_count, 1u);
  EXPECT_FALSE(parse_batch_result("nope"));
  EXPECT_FALSE(parse_batch_result(R"({"Failed":[{"Code":"X"}]})"));
  EXPECT_FALSE(parse_attributes("[1]"));
  EXPECT_EQ(parse_error("<html>").code, "");
}

TEST(SqsProtocol, BatchResultsAndErrors) {
  auto r = parse_batch_result(R"({"Successful":[{"Id":"0","MessageId":"m"},{"Id":"2"}],
      "Failed":[{"Id":"1","SenderFault":true,"Code":"InvalidMessageContents","Message":"bad"},
                {"Id":"3","SenderFault":false,"Code":"InternalError","Message":"oops"}]})");
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(r->successful, (std::vector<std::string>{"0", "2"}));
  ASSERT_EQ(r->failed.size(), 2u);
  EXPECT_EQ(r->failed["1"].code, "InvalidMessageContents");
  EXPECT_TRUE(r->failed["1"].sender_fault);
  EXPECT_FALSE(r->failed["3"].sender_fault);
  const AwsError e = parse_error(R"({"__type":"com.amazonaws.sqs#QueueDoesNotExist","message":"The specified queue does not exist."})");
  EXPECT_EQ(e.code, "com.amazonaws.sqs#QueueDoesNotExist");
  EXPECT_EQ(e.message, "The specified queue does not exist.");
  EXPECT_EQ(parse_error(R"({"code":"X","Message":"Y"})").message, "Y");
  auto attrs = parse_attributes(R"({"Attributes":{"ApproximateNumberOfMessages":"3","QueueArn":"arn"}})");
  ASSERT_TRUE(attrs);
  EXPECT_EQ(attrs->at("ApproximateNumberOfMessages"), "3");
}

OutgoingMessage outgoing(std::string id, std::string body) {
  OutgoingMessage m;
  m.message_id = std::move(id);
  m.content_type = "application/json";
  m.body = std::move(body);
  return m;
}

TEST(SqsProtocol, AnOutgoingMessageCarriesItsIdContentTypeAndHeaders) {
  OutgoingMessage m = outgoing("order-1", "{}");
  m.headers = {{"trace", "t"}, {"empty", ""}, {"message_id", "ignored"}, {"tenant.name", "acme"}};
  SendEntry e = outgoing_entry(m, "message_id", false, "4");
  EXPECT_EQ(e.id, "4");
  ASSERT_EQ(e.attributes.size(), 4u);
  EXPECT_EQ(e.attributes[0].first, "message_id");
  EXPECT_EQ(e.attributes[0].second.value, "order-1");
  EXPECT_EQ(e.attributes[1].first, "content_type");
  EXPECT_EQ(e.attributes[2].first, "trace");
  EXPECT_EQ(e.attributes[3].first, "tenant.name");
  for (const auto& [name, a] : e.attributes) EXPECT_EQ(a.type, "String") << name;
  EXPECT_TRUE(e.group_id.empty());
  EXPECT_TRUE(e.deduplication_id.empty());

  // FIFO: the id groups and deduplicates; an id SQS would refuse there is hashed, stably.
  e = outgoing_entry(m, "message_id", true, "0");
  EXPECT_EQ(e.group_id, "order-1");
  EXPECT_EQ(e.deduplication_id, "order-1");
  const std::string long_id(200, 'k');
  e = outgoing_entry(outgoing(long_id, "x"), "message_id", true, "0");
  EXPECT_EQ(e.deduplication_id.rfind("sha256-", 0), 0u);
  EXPECT_EQ(e.deduplication_id.size(), 7u + 64u);
  EXPECT_EQ(e.group_id, e.deduplication_id);
  EXPECT_EQ(outgoing_entry(outgoing(long_id, "y"), "message_id", true, "0").deduplication_id, e.deduplication_id);
  EXPECT_EQ(fifo_token("has a space").rfind("sha256-", 0), 0u);
  EXPECT_EQ(fifo_token(std::string(128, 'a')), std::string(128, 'a'));
  // No id: no id attribute; on FIFO a group of its own and a fresh deduplication id each time.
  const SendEntry a = outgoing_entry(outgoing("", "x"), "message_id", true, "0");
  const SendEntry b = outgoing_entry(outgoing("", "x"), "message_id", true, "0");
  EXPECT_EQ(a.attributes.size(), 1u);  // content_type only
  EXPECT_EQ(a.group_id, "idem-no-message-id");
  EXPECT_NE(a.deduplication_id, b.deduplication_id);
}

TEST(SqsProtocol, TheOrderingKeyIsAnAttributeAndAFifoQueuesGroup) {
  OutgoingMessage m = outgoing("order-1", "{}");
  m.ordering_key = "pay_7";
  m.headers = {{"ordering_key", "a user's"}, {"trace", "t"}};
  SendEntry e = outgoing_entry(m, "message_id", false, "0");
  ASSERT_EQ(e.attributes.size(), 4u);
  EXPECT_EQ(e.attributes[2].first, "ordering_key");
  EXPECT_EQ(e.attributes[2].second.type, "String");
  EXPECT_EQ(e.attributes[2].second.value, "pay_7");  // the message's, not the header's
  EXPECT_EQ(e.attributes[3].first, "trace");
  EXPECT_TRUE(e.group_id.empty());
  e = outgoing_entry(m, "message_id", true, "0");
  EXPECT_EQ(e.group_id, "pay_7");
  EXPECT_EQ(e.deduplication_id, "order-1");
  m.message_id.clear();
  EXPECT_EQ(outgoing_entry(m, "message_id", true, "0").group_id, "pay_7");

  // Without one: the group is the id's, as before, and a header of the name is still dropped.
  m = outgoing("order-2", "{}");
  m.headers = {{"ordering_key", "a user's"}};
  e = outgoing_entry(m, "message_id", true, "0");
  EXPECT_EQ(e.group_id, "order-2");
  EXPECT_EQ(e.group_id, sink_group("order-2"));
  for (const auto& [name, a] : e.attributes) EXPECT_NE(name, "ordering_key");

  // It counts among SQS's 10 attributes, and one that is no valid key is refused before sending.
  OutgoingMessage full = outgoing("a", "x");
  for (int i = 0; i < 8; ++i) full.headers.emplace_back("h" + std::to_string(i), "v");
  EXPECT_FALSE(outgoing_problem(full, "message_id"));
  full.ordering_key = "k";
  EXPECT_NE(outgoing_problem(full, "message_id")->find("needs 11 message attributes"), std::string::npos);
  for (const std::string& bad : {std::string("has space"), std::string(kMaxOrderingKey + 1, 'k'), std::string("caf\xc3\xa9")}) {
    OutgoingMessage odd = outgoing("a", "x");
    odd.ordering_key = bad;
    const auto problem = outgoing_problem(odd, "message_id");
    ASSERT_TRUE(problem) << bad;
    EXPECT_NE(problem->find("ordering key"), std::string::npos) << *problem;
  }
  OutgoingMessage longest = outgoing("a", "x");
  longest.ordering_key = std::string(kMaxOrderingKey, 'k');
  EXPECT_FALSE(outgoing_problem(longest, "message_id"));
}

TEST(SqsProtocol, WhatSqsWouldNeverTakeIsSaidBeforeSending) {
  EXPECT_FALSE(outgoing_problem(outgoing("a", "fine \xc3\xa9 \xf0\x9f\x98\x80"), "message_id"));
  const std::pair<OutgoingMessage, std::string> cases[] = {
      {outgoing("a", ""), "empty message body"},
      {outgoing("a", "bad \xff byte"), "invalid UTF-8 at byte 4"},
      {outgoing("a", "nul \x01 char"), "U+0001"},
      {outgoing("a", "surrogate \xed\xa0\x80"), "invalid UTF-8"},
      {outgoing("a", "\xef\xbf\xbe"), "U+FFFE"},
      {outgoing("bad \xff", "x"), "message id"},
  };
  for (const auto& [m, expected] : cases) {
    const auto problem = outgoing_problem(m, "message_id");
    ASSERT_TRUE(problem) << expected;
    EXPECT_NE(problem->find(expected), std::string::npos) << *problem;
  }
  OutgoingMessage many = outgoing("a", "x");
  for (int i = 0; i < 9; ++i) many.headers.emplace_back("h" + std::to_string(i), "v");
  EXPECT_NE(outgoing_problem(many, "message_id")->find("needs 11 message attributes"), std::string::npos);
  many.headers.pop_back();
  EXPECT_FALSE(outgoing_problem(many, "message_id"));
  for (const char* name : {"has space", "AWS.trace", "amazon.x", ".lead", "trail.", "a..b", ""}) {
    OutgoingMessage m = outgoing("a", "x");
    m.headers.emplace_back(name, "v");
    EXPECT_TRUE(outgoing_problem(m, "message_id")) << name;
  }
  // A destination is another queue of the same endpoint and account.
  OutgoingMessage routed = outgoing("a", "x");
  routed.destination = "elsewhere.fifo";
  EXPECT_FALSE(outgoing_problem(routed, "message_id"));
  routed.destination = "no such/queue";
  EXPECT_NE(outgoing_problem(routed, "message_id")->find("the destination \"no such/queue\" is not a queue name"), std::string::npos);
}

TEST(SqsProtocol, TextRules) {
  EXPECT_FALSE(text_problem(""));
  EXPECT_FALSE(text_problem("tab\tnewline\ncr\r \xf4\x8f\xbf\xbf"));
  EXPECT_TRUE(text_problem("\xc0\x80"));      // overlong
  EXPECT_TRUE(text_problem("\xf4\x90\x80\x80"));  // beyond U+10FFFF
  EXPECT_TRUE(text_problem("\xe2\x82"));      // truncated
  EXPECT_EQ(sqs_text("ok \x01 \xff end", 100), "ok \xef\xbf\xbd \xef\xbf\xbd end");
  EXPECT_EQ(sqs_text("\xc3\xa9\xc3\xa9", 3), "\xc3\xa9");  // cut on a character boundary
  EXPECT_FALSE(attribute_name_problem("x-idem-last-error"));
  EXPECT_FALSE(attribute_name_problem(std::string(256, 'a')));
  EXPECT_TRUE(attribute_name_problem(std::string(257, 'a')));
}

TEST(SqsProtocol, ADeadLetterCarriesWhyAndAsManyHeadersAsFit) {
  Delivery d;
  d.message_id = "order-7";
  d.has_message_id = true;
  d.content_type = "application/json";
  d.body = "{}";
  d.headers = {{"x-idem-reason", "old"}, {"trace", "t"}, {"raw", std::string("\xff\x00", 2)}, {"e", ""}};
  for (int i = 0; i < 4; ++i) d.headers.emplace_back("h" + std::to_string(i), "v");
  DeadLetterReason why{"poison", "failed 3 times", std::string(3000, 'e'), 3};
  const SendEntry e = dead_letter_entry(d, why, "message_id", {"orders", "sqs-1", ""}, false);
  EXPECT_EQ(e.body, "{}");
  std::map<std::string, Attribute> by_name;
  for (const auto& [name, a] : e.attributes) by_name[name] = a;
  EXPECT_EQ(e.attributes.size(), kMaxAttributes);
  EXPECT_EQ(by_name["message_id"].value, "order-7");
  EXPECT_EQ(by_name["content_type"].value, "application/json");
  EXPECT_EQ(by_name["x-idem-reason"].value, "poison");
  EXPECT_EQ(by_name["x-idem-last-error"].value, std::string(kMaxReasonBytes, 'e'));
  EXPECT_EQ(by_name["x-idem-attempts"].type, "Number");
  EXPECT_EQ(by_name["x-idem-attempts"].value, "3");
  EXPECT_EQ(by_name["x-idem-source"].value, "orders");
  EXPECT_EQ(by_name["trace"].value, "t");
  EXPECT_EQ(by_name["raw"].type, "Binary");  // not text SQS takes: as bytes
  // Three of the original's seven headers fit: the detail names the others.
  const std::string detail = by_name["x-idem-detail"].value;
  EXPECT_EQ(detail.rfind("failed 3 times (headers not copied", 0), 0u) << detail;
  for (const char* left : {"e", "h1", "h2", "h3"}) EXPECT_NE(detail.find(left), std::string::npos) << left;
  EXPECT_TRUE(e.group_id.empty());

  // No last error: no attribute for it. A FIFO dead-letter queue: the original's group, and its
  // MessageId as the deduplication id (a second copy of the same delivery is dropped).
  DeadLetterReason bare{"missing_id", "no id", "", 1};
  Delivery no_id;
  no_id.body = "x";
  SendEntry f = dead_letter_entry(no_id, bare, "message_id", {"q.fifo", "sqs-9", "g-1"}, true);
  for (const auto& [name, a] : f.attributes) {
    EXPECT_NE(name, "x-idem-last-error");
    EXPECT_NE(name, "message_id");
  }
  EXPECT_EQ(f.group_id, "g-1");
  EXPECT_EQ(f.deduplication_id, "sqs-9");
  f = dead_letter_entry(d, bare, "message_id", {"q", "sqs-9", ""}, true);
  EXPECT_EQ(f.group_id, "order-7");

  // The ordering key goes with the copy, as an attribute of ours, and groups it on a FIFO
  // dead-letter queue when the original had no group.
  Delivery keyed = no_id;
  keyed.ordering_key = "pay_7";
  keyed.headers = {{"ordering_key", "stale"}};
  f = dead_letter_entry(keyed, bare, "message_id", {"q", "sqs-9", ""}, true);
  std::vector<std::pair<std::string, std::string>> named;
  for (const auto& [name, a] : f.attributes) {
    if (name == "ordering_key") named.emplace_back(name, a.value);
  }
  EXPECT_EQ(named, (std::vector<std::pair<std::string, std::string>>{{"ordering_key", "pay_7"}}));
  EXPECT_EQ(f.group_id, "pay_7");
  EXPECT_EQ(dead_letter_entry(keyed, bare, "message_id", {"q.fifo", "sqs-9", "g-1"}, true).group_id, "g-1");
}

// ---- signing ------------------------------------------------------------------------------

std::string hex(const unsigned char* data, std::size_t size) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < size; ++i) {
    out.push_back(kHex[data[i] >> 4]);
    out.push_back(kHex[data[i] & 15]);
  }
  return out;
}

std::string hmac(std::string_view key, std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()), data.size(),
       out.data(), &size);
  return std::string(reinterpret_cast<const char*>(out.data()), size);
}

// AWS Signature V4, written from AWS's description: the canonical request over the signed
// headers, the string to sign, the derived key. `headers` by lowercase name.
std::string sigv4(const std::string& method, const std::string& path, const std::string& query,
                  const std::map<std::string, std::string>& headers, const std::string& signed_headers, const std::string& payload,
                  const std::string& secret, const std::string& amz_date, const std::string& region, const std::string& service) {
  std::string canonical_headers;
  std::size_t from = 0;
  while (from <= signed_headers.size()) {
    const auto semi = std::min(signed_headers.find(';', from), signed_headers.size());
    const std::string name = signed_headers.substr(from, semi - from);
    canonical_headers += name + ":" + headers.at(name) + "\n";
    from = semi + 1;
  }
  const std::string canonical =
      method + "\n" + path + "\n" + query + "\n" + canonical_headers + "\n" + signed_headers + "\n" + sha256_hex(payload);
  const std::string date = amz_date.substr(0, 8);
  const std::string scope = date + "/" + region + "/" + service + "/aws4_request";
  const std::string to_sign = "AWS4-HMAC-SHA256\n" + amz_date + "\n" + scope + "\n" + sha256_hex(canonical);
  std::string key = hmac("AWS4" + secret, date);
  key = hmac(key, region);
  key = hmac(key, service);
  key = hmac(key, "aws4_request");
  const std::string signature = hmac(key, to_sign);
  return hex(reinterpret_cast<const unsigned char*>(signature.data()), signature.size());
}

TEST(SqsSigning, TheVerifierAgreesWithAwsPublishedExample) {
  // AWS's worked example of Signature V4 (IAM ListUsers, 2015-08-30), so that the check below
  // rests on AWS's definition, not on this test's reading of it.
  const std::string signature =
      sigv4("GET", "/", "Action=ListUsers&Version=2010-05-08",
            {{"content-type", "application/x-www-form-urlencoded; charset=utf-8"},
             {"host", "iam.amazonaws.com"},
             {"x-amz-date", "20150830T123600Z"}},
            "content-type;host;x-amz-date", "", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20150830T123600Z", "us-east-1", "iam");
  EXPECT_EQ(signature, "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7");
}

// A request as the listener read it.
struct Captured {
  std::string request_line;
  std::vector<std::pair<std::string, std::string>> headers;  // lowercase names, values as sent
  std::string body;

  std::vector<std::string> all(const std::string& name) const {
    std::vector<std::string> out;
    for (const auto& [n, v] : headers) {
      if (n == name) out.push_back(v);
    }
    return out;
  }
};

// A tiny HTTP/1.1 server on loopback: records every request and answers each with the status
// and body set last. Several connections at once (curl keeps some alive).
class CaptureServer {
 public:
  CaptureServer() : listener_(testing::listen_on_loopback("capture server")) {
    if (::pipe(stop_) != 0) throw std::runtime_error("pipe failed");
    thread_ = std::thread([this] { run(); });
  }
  ~CaptureServer() {
    (void)!::write(stop_[1], "x", 1);
    thread_.join();
    ::close(stop_[0]);
    ::close(stop_[1]);
    ::close(listener_.fd);
  }

  int port() const { return listener_.port; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port()) + "/"; }
  void answer(int status, std::string body) {
    const std::lock_guard lock(mutex_);
    status_ = status;
    body_ = std::move(body);
    silent_ = false;
  }
  /// From now on requests are read and recorded, never answered.
  void fall_silent() {
    const std::lock_guard lock(mutex_);
    silent_ = true;
  }
  std::vector<Captured> requests() {
    const std::lock_guard lock(mutex_);
    return requests_;
  }

 private:
  struct Connection {
    int fd;
    std::string in;
  };

  void run() {
    std::vector<Connection> connections;
    while (true) {
      std::vector<pollfd> fds = {{stop_[0], POLLIN, 0}, {listener_.fd, POLLIN, 0}};
      for (const auto& c : connections) fds.push_back({c.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 1000) < 0) continue;
      if (fds[0].revents != 0) break;
      if (fds[1].revents & POLLIN) {
        const int fd = ::accept(listener_.fd, nullptr, nullptr);
        if (fd >= 0) connections.push_back({fd, {}});
      }
      for (std::size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        Connection& c = connections[i - 2];
        char buffer[65536];
        const ssize_t n = ::read(c.fd, buffer, sizeof buffer);
        if (n <= 0) {
          ::close(c.fd);
          c.fd = -1;
          continue;
        }
        c.in.append(buffer, static_cast<std::size_t>(n));
        serve(c);
      }
      std::erase_if(connections, [](const Connection& c) { return c.fd < 0; });
    }
    for (auto& c : connections) ::close(c.fd);
  }

  // Answers every complete request in c.in.
  void serve(Connection& c) {
    while (true) {
      const auto end = c.in.find("\r\n\r\n");
      if (end == std::string::npos) return;
      Captured r;
      std::size_t length = 0;
      std::size_t pos = c.in.find("\r\n");
      r.request_line = c.in.substr(0, pos);
      while (pos < end) {
        const auto next = c.in.find("\r\n", pos + 2);
        const std::string line = c.in.substr(pos + 2, next - pos - 2);
        pos = next;
        const auto colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string name = line.substr(0, colon);
        std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
        std::string value = line.substr(colon + 1);
        value.erase(0, value.find_first_not_of(' '));
        if (name == "content-length") length = std::stoul(value);
        r.headers.emplace_back(name, value);
      }
      if (c.in.size() < end + 4 + length) return;
      r.body = c.in.substr(end + 4, length);
      c.in.erase(0, end + 4 + length);
      std::string reply;
      {
        const std::lock_guard lock(mutex_);
        requests_.push_back(std::move(r));
        if (silent_) continue;
        reply = "HTTP/1.1 " + std::to_string(status_) + " X\r\nContent-Type: application/x-amz-json-1.0\r\n" +
                "x-amzn-RequestId: req-1\r\nContent-Length: " + std::to_string(body_.size()) + "\r\n\r\n" + body_;
      }
      (void)!::write(c.fd, reply.data(), reply.size());
    }
  }

  testing::LoopbackListener listener_;
  int stop_[2] = {-1, -1};
  std::thread thread_;
  std::mutex mutex_;
  int status_ = 200;
  std::string body_ = "{}";
  bool silent_ = false;
  std::vector<Captured> requests_;
};

// The parts of an Authorization header of the form
//   AWS4-HMAC-SHA256 Credential=KEY/YYYYMMDD/REGION/SERVICE/aws4_request, SignedHeaders=a;b,
//   Signature=<64 lowercase hex>
struct Authorization {
  bool well_formed = false;
  std::string key_id, date, region, service, signed_headers, signature;
};

Authorization parse_authorization(std::string_view header) {
  Authorization a;
  constexpr std::string_view kStart = "AWS4-HMAC-SHA256 Credential=";
  if (!header.starts_with(kStart)) return a;
  header.remove_prefix(kStart.size());
  const auto first = header.find(", SignedHeaders=");
  const auto second = header.find(", Signature=");
  if (first == std::string_view::npos || second == std::string_view::npos || second < first) return a;
  std::vector<std::string> scope;
  std::string_view credential = header.substr(0, first);
  for (std::size_t slash; (slash = credential.find('/')) != std::string_view::npos; credential.remove_prefix(slash + 1)) {
    scope.emplace_back(credential.substr(0, slash));
  }
  scope.emplace_back(credential);
  if (scope.size() != 5 || scope[4] != "aws4_request" || scope[1].size() != 8) return a;
  a.key_id = scope[0];
  a.date = scope[1];
  a.region = scope[2];
  a.service = scope[3];
  a.signed_headers = std::string(header.substr(first + 16, second - first - 16));
  a.signature = std::string(header.substr(second + 12));
  const auto lower_hex = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f'); };
  const auto header_name = [](char c) { return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == ';'; };
  a.well_formed = std::all_of(a.date.begin(), a.date.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) &&
                  !a.signed_headers.empty() && std::all_of(a.signed_headers.begin(), a.signed_headers.end(), header_name) &&
                  a.signature.size() == 64 && std::all_of(a.signature.begin(), a.signature.end(), lower_hex);
  return a;
}

TEST(SqsSigning, TheShapeCheckRefusesWhatIsNotSignatureV4) {
  const std::string good = "AWS4-HMAC-SHA256 Credential=AKIA/20260101/eu-west-1/sqs/aws4_request, SignedHeaders=host;x-amz-date, "
                           "Signature=" + std::string(64, 'a');
  EXPECT_TRUE(parse_authorization(good).well_formed);
  for (const std::string& bad_one : {std::string("Basic QUtJQTpzZWNyZXQ="), good.substr(0, good.size() - 1),
                                     "AWS4-HMAC-SHA256 Credential=AKIA/2026/eu-west-1/sqs/aws4_request, SignedHeaders=host, Signature=" +
                                         std::string(64, 'a'),
                                     "AWS4-HMAC-SHA256 Credential=AKIA/20260101/eu-west-1/sqs/aws4_request, SignedHeaders=Host, Signature=" +
                                         std::string(64, 'a'),
                                     "AWS4-HMAC-SHA256 Credential=AKIA/20260101/eu-west-1/sqs/aws4_request, SignedHeaders=host, Signature=" +
                                         std::string(64, 'G')}) {
    EXPECT_FALSE(parse_authorization(bad_one).well_formed) << bad_one;
  }
}

// Checks that curl's Authorization header is AWS Signature V4 over what was sent, for SQS in
// `region` as `key_id`/`secret`.
void expect_signed(const Captured& r, const std::string& key_id, const std::string& secret, const std::string& region) {
  const auto authorization = r.all("authorization");
  ASSERT_EQ(authorization.size(), 1u);
  const Authorization a = parse_authorization(authorization[0]);
  ASSERT_TRUE(a.well_formed) << authorization[0];
  EXPECT_EQ(a.key_id, key_id);
  EXPECT_EQ(a.region, region);
  EXPECT_EQ(a.service, "sqs");
  const std::string signed_headers = a.signed_headers;
  const auto date = r.all("x-amz-date");
  ASSERT_EQ(date.size(), 1u);
  EXPECT_EQ(date[0].substr(0, 8), a.date);
  // Every signed header was sent, once: one signed and not sent (curl signs an "Expect:" that
  // removes the header, for one) would make AWS refuse the signature.
  std::map<std::string, std::string> values;
  std::size_t from = 0;
  while (from <= signed_headers.size()) {
    const auto semi = std::min(signed_headers.find(';', from), signed_headers.size());
    const std::string name = signed_headers.substr(from, semi - from);
    const auto sent = r.all(name);
    EXPECT_EQ(sent.size(), 1u) << name << " signed but sent " << sent.size() << " times";
    if (!sent.empty()) values[name] = sent[0];
    from = semi + 1;
  }
  for (const char* required : {"host", "x-amz-date", "content-type", "x-amz-target"}) {
    EXPECT_TRUE(values.contains(required)) << required << " is not signed: " << signed_headers;
  }
  EXPECT_EQ(a.signature, sigv4("POST", "/", "", values, signed_headers, r.body, secret, date[0], region, "sqs"));
}

TEST(SqsSigning, CurlSignsEachRequestAsSignatureV4) {
  CaptureServer server;
  server.answer(200, R"({"Attributes":{"QueueArn":"arn"}})");
  for (const std::string& token : {std::string(), std::string(kToken)}) {
    ClientConfig c;
    c.endpoint = server.endpoint();
    c.region = "eu-west-1";
    c.access_key_id = "AKIAEXAMPLE";
    c.secret_access_key = kSecret;
    c.session_token = token;
    Client client(c);
    const std::string body = get_attributes_request("https://sqs.eu-west-1.amazonaws.com/123456789012/orders", {"All"});
    const Reply reply = client.call({"GetQueueAttributes", body, std::chrono::seconds(5)});
    ASSERT_TRUE(reply.ok()) << reply.curl_detail;
    EXPECT_EQ(reply.request_id, "req-1");
    const Captured r = server.requests().back();
    EXPECT_EQ(r.request_line, "POST / HTTP/1.1");
    EXPECT_EQ(r.body, body);
    EXPECT_EQ(r.all("content-type"), std::vector<std::string>{"application/x-amz-json-1.0"});
    EXPECT_EQ(r.all("x-amz-target"), std::vector<std::string>{"AmazonSQS.GetQueueAttributes"});
    expect_signed(r, "AKIAEXAMPLE", kSecret, "eu-west-1");
    if (token.empty()) {
      EXPECT_TRUE(r.all("x-amz-security-token").empty());
    } else {
      EXPECT_EQ(r.all("x-amz-security-token"), std::vector<std::string>{token});
      EXPECT_NE(r.all("authorization")[0].find("x-amz-security-token"), std::string::npos);
    }
  }
  // A large body (curl adds Expect: 100-continue past 1 MiB): still signed over what was sent.
  ClientConfig c;
  c.endpoint = server.endpoint();
  c.region = "eu-west-1";
  c.access_key_id = "AKIAEXAMPLE";
  c.secret_access_key = kSecret;
  Client client(c);
  SendEntry big;
  big.body = std::string(1100 * 1024, 'b');
  const Reply reply = client.call({"SendMessage", send_request("https://h/1/q", big), std::chrono::seconds(5)});
  ASSERT_TRUE(reply.ok()) << reply.curl_detail;
  const Captured r = server.requests().back();
  EXPECT_EQ(r.body.size(), send_request("https://h/1/q", big).size());
  expect_signed(r, "AKIAEXAMPLE", kSecret, "eu-west-1");
}

// ---- the module against a canned endpoint --------------------------------------------------

TEST(SqsSource, WhatTheEndpointAnswersReachesTheCallerMappedAndWithoutSecrets) {
  CaptureServer server;
  const Env env({});
  const std::string url = "sqs+http://AKIAKEY:Zq9xWsecretKEY%2Fabc%2Bdef@127.0.0.1:" + std::to_string(server.port()) +
                          "/000000000000/orders?region=eu-west-1&token=" + kToken;
  SourceSettings settings;
  settings.connect_timeout = std::chrono::seconds(2);
  const struct {
    int status;
    std::string body;
    BrokerErrc code;
    std::string says;
  } cases[] = {
      {400, R"({"__type":"com.amazonaws.sqs#QueueDoesNotExist","message":"The specified queue does not exist."})",
       BrokerErrc::refused, "queue \"orders\" does not exist"},
      {403, std::string(R"({"__type":"com.amazon.coral.service#SignatureDoesNotMatch","message":"canonical x-amz-security-token:)") + kToken +
                " secret " + kSecret + R"("})",
       BrokerErrc::refused, "SQS refused the credentials of access key AKIAKEY"},
      {500, "<html>oops</html>", BrokerErrc::unavailable, "the SQS endpoint failed"},
  };
  for (const auto& c : cases) {
    server.answer(c.status, c.body);
    for (int role = 0; role < 2; ++role) {
      std::string message;
      BrokerErrc code{};
      if (role == 0) {
        auto source = open_sqs_source(url, settings);
        ASSERT_FALSE(source);
        message = source.error().message;
        code = source.error().code;
      } else {
        auto sink = open_sqs_sink(url, {});
        ASSERT_FALSE(sink);
        message = sink.error().message;
        code = sink.error().code;
      }
      EXPECT_EQ(code, c.code) << message;
      EXPECT_NE(message.find(c.says), std::string::npos) << message;
      EXPECT_NE(message.find("(request id req-1)"), std::string::npos) << message;
      EXPECT_EQ(message.find("Zq9xW"), std::string::npos) << message;
      EXPECT_EQ(message.rfind("sqs+http://AKIAKEY:***@127.0.0.1:", 0), 0u) << message;
    }
  }
  // A sink allowed only to send: AccessDenied on the check is let through, and its name hides
  // the secrets.
  server.answer(403, R"({"__type":"com.amazon.coral.service#AccessDenied","message":"not authorized"})");
  auto sink = open_sqs_sink(url, {});
  ASSERT_TRUE(sink) << sink.error().message;
  EXPECT_EQ((*sink)->name().find("Zq9xW"), std::string::npos) << (*sink)->name();
  // A source needs to read its queue's attributes.
  auto source = open_sqs_source(url, settings);
  ASSERT_FALSE(source);
  EXPECT_NE(source.error().message.find("denied access"), std::string::npos) << source.error().message;

  // Nothing listening: unavailable at once, not in doubt.
  const testing::LoopbackListener closed = testing::listen_on_loopback("closed port");
  const int port = closed.port;
  ::close(closed.fd);
  auto nowhere = open_sqs_source("sqs+http://AKIAKEY:Zq9xWsecretKEY%2Fabc%2Bdef@127.0.0.1:" + std::to_string(port) +
                                     "/000000000000/orders?region=eu-west-1",
                                 settings);
  ASSERT_FALSE(nowhere);
  EXPECT_EQ(nowhere.error().code, BrokerErrc::unavailable) << nowhere.error().message;
  EXPECT_TRUE(nowhere.error().retryable());
  EXPECT_FALSE(nowhere.error().in_doubt);
  EXPECT_EQ(nowhere.error().message.find("Zq9xW"), std::string::npos);
}

TEST(SqsClient, TimeoutsCancelAndStopAlwaysAnswer) {
  CaptureServer server;
  server.fall_silent();
  ClientConfig c;
  c.endpoint = server.endpoint();
  c.region = "eu-west-1";
  c.access_key_id = "AKIAEXAMPLE";
  c.secret_access_key = kSecret;
  Client client(c);
  const Reply timed_out = client.call({"ReceiveMessage", "{}", std::chrono::milliseconds(200)});
  EXPECT_EQ(timed_out.curl_code, CURLE_OPERATION_TIMEDOUT);
  EXPECT_EQ(map_error(timed_out.failure()).code, BrokerErrc::timeout);

  std::promise<Reply> cancelled;
  const std::uint64_t id = client.start({"ReceiveMessage", "{}", std::chrono::seconds(30)},
                                        [&](Reply r) { cancelled.set_value(std::move(r)); });
  client.cancel(id);
  EXPECT_EQ(cancelled.get_future().get().curl_code, CURLE_ABORTED_BY_CALLBACK);

  std::promise<Reply> stopped;
  client.start({"ReceiveMessage", "{}", std::chrono::seconds(30)}, [&](Reply r) { stopped.set_value(std::move(r)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  client.stop();
  EXPECT_EQ(stopped.get_future().get().curl_code, CURLE_ABORTED_BY_CALLBACK);
  // After stop: answered at once, on the caller's thread.
  EXPECT_EQ(client.call({"ReceiveMessage", "{}", std::chrono::seconds(30)}).curl_code, CURLE_ABORTED_BY_CALLBACK);
}

TEST(SqsSink, APublishThatGetsNoAnswerIsATimeoutInDoubt) {
  CaptureServer server;
  const Env env({});
  const std::string url = "sqs+http://AKIAKEY:Zq9xWkey@127.0.0.1:" + std::to_string(server.port()) + "/000000000000/orders?region=eu-west-1";
  SinkSettings settings;
  settings.confirm_timeout = std::chrono::milliseconds(300);
  auto sink = open_sqs_sink(url, settings);
  ASSERT_TRUE(sink) << sink.error().message;
  server.fall_silent();
  std::vector<OutgoingMessage> messages;
  for (int i = 0; i < 12; ++i) messages.push_back(outgoing("m-" + std::to_string(i), "x"));
  const auto results = (*sink)->publish(messages);
  ASSERT_EQ(results.size(), 12u);
  for (const auto& r : results) {
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, BrokerErrc::timeout) << r.error().message;
    EXPECT_TRUE(r.error().in_doubt);
    EXPECT_TRUE(r.error().retryable());
  }
  // Two batches went out: 10 and 2.
  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 3u);  // the check at open, then the two batches
  std::size_t entries = 0;
  for (std::size_t i = 1; i < requests.size(); ++i) {
    EXPECT_EQ(requests[i].all("x-amz-target"), std::vector<std::string>{"AmazonSQS.SendMessageBatch"});
    entries += json::parse(requests[i].body)["Entries"].size();
  }
  EXPECT_EQ(entries, 12u);
}

TEST(SqsSource, AReceiveThatGetsNoAnswerIsATimeoutNotInDoubt) {
  CaptureServer server;
  const Env env({});
  const std::string url = "sqs+http://AKIAKEY:Zq9xWkey@127.0.0.1:" + std::to_string(server.port()) +
                          "/000000000000/orders?region=eu-west-1&wait_seconds=1";
  SourceSettings settings;
  settings.connect_timeout = std::chrono::milliseconds(300);
  auto source = open_sqs_source(url, settings);
  ASSERT_TRUE(source) << source.error().message;
  server.fall_silent();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  BrokerResult<std::vector<Delivery>> got;
  do {
    got = (*source)->receive(10, std::chrono::milliseconds(500));
  } while (got && std::chrono::steady_clock::now() < deadline);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, BrokerErrc::timeout) << got.error().message;
  EXPECT_FALSE(got.error().in_doubt);
  EXPECT_NE(got.error().message.find("receiving (ReceiveMessage)"), std::string::npos) << got.error().message;
}

}  // namespace
}  // namespace idem
