#pragma once

// The HTTP side of the SQS module: one I/O thread running a curl multi handle, which every call
// goes through. Calls are queued to it from any thread and answered by a callback on it (start)
// or by waiting (call, call_all); several run at once on keep-alive connections. Each request is
// a POST of the JSON protocol to the endpoint's root, signed by curl (CURLOPT_AWS_SIGV4). The
// thread also runs an optional ticker: the source's visibility heartbeat. curl.h stays in
// client.cpp.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "idem/broker.hpp"
#include "idem/sqs_broker.hpp"
#include "errors.hpp"

namespace idem::sqs_detail {

using Steady = std::chrono::steady_clock;

/// Where and as whom requests go.
struct ClientConfig {
  std::string endpoint;  ///< "https://host[:port]/"
  std::string region;
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  ///< sent as X-Amz-Security-Token when not empty
  Millis connect_timeout{5000};

  /// The endpoint, region and credentials of a parsed URL.
  static ClientConfig of(const SqsUrl& url, Millis connect_timeout) {
    return ClientConfig{url.endpoint(), url.region, url.access_key_id, url.secret_access_key, url.session_token,
                        connect_timeout};
  }
};

/// One request: the action (X-Amz-Target: AmazonSQS.ACTION), its JSON body, and how long the
/// whole exchange may take.
struct Request {
  std::string action;
  std::string body;
  Millis timeout{10000};
};

/// What came back: a transfer error (curl_code != 0), or an HTTP status and body.
struct Reply {
  int curl_code = 0;  ///< a CURLcode
  std::string curl_detail;
  long status = 0;
  std::string body;
  std::string query_error;  ///< the x-amzn-query-error header (the legacy error code), if any
  std::string request_id;   ///< x-amzn-RequestId

  bool ok() const { return curl_code == 0 && status >= 200 && status < 300; }
  /// The Failure describing a reply that is not ok(): curl's error, or SQS's error body; the
  /// caller fills in where, doing, queue and sends.
  Failure failure() const;
};

class Client {
 public:
  using Callback = std::function<void(Reply)>;

  /// Starts the I/O thread.
  explicit Client(ClientConfig config);
  /// stop().
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Queues a request; `done` runs on the I/O thread with its reply (after stop(): at once, on
  /// this thread, with an aborted reply). Any thread, the I/O thread included. Returns an id for
  /// cancel().
  std::uint64_t start(Request request, Callback done);

  /// Ends the request `id` if it is still queued or running: its callback runs with an aborted
  /// reply (or has run already with its real one). Any thread; returns at once.
  void cancel(std::uint64_t id);

  /// Runs a request and waits for its reply. Not from the I/O thread.
  Reply call(Request request);

  /// Runs the requests, at most `parallel` at a time, and waits for every reply (in order).
  std::vector<Reply> call_all(std::vector<Request> requests, std::size_t parallel);

  /// Called on the I/O thread when the time it last returned has come (first: at once); returns
  /// when to call it next. Set before the first start().
  void set_ticker(std::function<Steady::time_point()> tick);

  /// Aborts what is in flight and queued (their callbacks run with CURLE_ABORTED_BY_CALLBACK)
  /// and ends the I/O thread. Idempotent; not from the I/O thread.
  void stop();

  /// The secrets a message must never hold: for Failure::secrets.
  std::vector<std::string> secrets() const;

 private:
  struct Transfer;
  void run();
  void begin(std::unique_ptr<Transfer> transfer);
  void finish(Transfer* transfer, int code);

  ClientConfig config_;
  void* multi_ = nullptr;  // CURLM*
  std::mutex mutex_;
  std::deque<std::unique_ptr<Transfer>> queued_;
  std::vector<std::uint64_t> cancels_;
  std::uint64_t next_id_ = 1;
  bool stopping_ = false;
  std::function<Steady::time_point()> ticker_;
  std::vector<std::unique_ptr<Transfer>> running_;  // the I/O thread's own
  std::thread thread_;
};

}  // namespace idem::sqs_detail
