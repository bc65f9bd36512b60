#include "client.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <future>
#include <mutex>

#include "protocol.hpp"

namespace idem::sqs_detail {
namespace {

// The most an answer may hold: ReceiveMessage's ten 1 MiB messages, escaped, fit well within it.
constexpr std::size_t kMaxResponseBytes = 64 * 1024 * 1024;
constexpr Millis kIdlePoll{1000};

void global_init() {
  // Once per process, before any handle; curl_global_init is not itself safe to race.
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

bool header_is(std::string_view line, std::string_view name) {
  if (line.size() <= name.size() || line[name.size()] != ':') return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) return false;
  }
  return true;
}

std::string header_value(std::string_view line, std::size_t name_size) {
  std::string_view v = line.substr(name_size + 1);
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.remove_suffix(1);
  return std::string(v);
}

Reply aborted() {
  Reply r;
  r.curl_code = CURLE_ABORTED_BY_CALLBACK;
  r.curl_detail = "the SQS client was closed";
  return r;
}

}  // namespace

struct Client::Transfer {
  std::uint64_t id = 0;
  Request request;
  Callback done;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  std::string response;
  std::string query_error;
  std::string request_id;
  bool too_big = false;
  char error[CURL_ERROR_SIZE] = {};

  Transfer(Request r, Callback d) : request(std::move(r)), done(std::move(d)) {}
  ~Transfer() {
    if (headers != nullptr) curl_slist_free_all(headers);
    if (easy != nullptr) curl_easy_cleanup(easy);
  }
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;

  static std::size_t on_body(char* data, std::size_t size, std::size_t count, void* user) {
    auto* t = static_cast<Transfer*>(user);
    const std::size_t n = size * count;
    if (t->response.size() + n > kMaxResponseBytes) {
      t->too_big = true;
      return 0;  // curl ends the transfer with CURLE_WRITE_ERROR
    }
    t->response.append(data, n);
    return n;
  }

  static std::size_t on_header(char* data, std::size_t size, std::size_t count, void* user) {
    auto* t = static_cast<Transfer*>(user);
    const std::string_view line(data, size * count);
    if (header_is(line, "x-amzn-query-error")) t->query_error = header_value(line, 18);
    if (header_is(line, "x-amzn-requestid")) t->request_id = header_value(line, 16);
    return size * count;
  }
};

Failure Reply::failure() const {
  Failure f;
  f.curl_code = curl_code;
  f.curl_detail = curl_detail;
  f.request_id = request_id;
  if (curl_code != 0) return f;
  f.status = status;
  const AwsError e = parse_error(body);
  f.aws_code = !e.code.empty() ? e.code : query_error;
  f.aws_message = e.message;
  if (f.aws_code.empty() && f.aws_message.empty() && !body.empty()) f.aws_message = body.substr(0, 200);
  f.sender_fault = status < 500;
  return f;
}

Client::Client(ClientConfig config) : config_(std::move(config)) {
  global_init();
  CURLM* multi = curl_multi_init();
  multi_ = multi;
  if (multi != nullptr) {
    curl_multi_setopt(multi, CURLMOPT_MAX_HOST_CONNECTIONS, 16L);
    curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, 16L);
  }
  thread_ = std::thread([this] { run(); });
}

Client::~Client() {
  stop();
  if (multi_ != nullptr) curl_multi_cleanup(static_cast<CURLM*>(multi_));
}

std::vector<std::string> Client::secrets() const { return {config_.secret_access_key, config_.session_token}; }

void Client::set_ticker(std::function<Steady::time_point()> tick) {
  const std::lock_guard lock(mutex_);
  ticker_ = std::move(tick);
}

std::uint64_t Client::start(Request request, Callback done) {
  {
    const std::lock_guard lock(mutex_);
    if (!stopping_ && multi_ != nullptr) {
      auto t = std::make_unique<Transfer>(std::move(request), std::move(done));
      t->id = next_id_++;
      const std::uint64_t id = t->id;
      queued_.push_back(std::move(t));
      curl_multi_wakeup(static_cast<CURLM*>(multi_));
      return id;
    }
  }
  done(aborted());
  return 0;
}

void Client::cancel(std::uint64_t id) {
  const std::lock_guard lock(mutex_);
  if (stopping_ || multi_ == nullptr || id == 0) return;
  cancels_.push_back(id);
  curl_multi_wakeup(static_cast<CURLM*>(multi_));
}

Reply Client::call(Request request) {
  std::promise<Reply> promise;
  auto future = promise.get_future();
  start(std::move(request), [&promise](Reply reply) { promise.set_value(std::move(reply)); });
  return future.get();
}

std::vector<Reply> Client::call_all(std::vector<Request> requests, std::size_t parallel) {
  parallel = std::max<std::size_t>(parallel, 1);
  std::vector<Reply> replies(requests.size());
  std::mutex mutex;
  std::condition_variable changed;
  std::size_t next = 0, finished = 0, in_flight = 0;
  std::unique_lock lock(mutex);
  while (finished < requests.size()) {
    while (in_flight < parallel && next < requests.size()) {
      const std::size_t i = next++;
      ++in_flight;
      lock.unlock();  // after stop() the callback runs at once, on this thread
      start(std::move(requests[i]), [&, i](Reply reply) {
        const std::lock_guard inner(mutex);
        replies[i] = std::move(reply);
        ++finished;
        --in_flight;
        changed.notify_all();
      });
      lock.lock();
    }
    changed.wait(lock, [&] { return finished == requests.size() || (in_flight < parallel && next < requests.size()); });
  }
  return replies;
}

void Client::stop() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
    if (multi_ != nullptr) curl_multi_wakeup(static_cast<CURLM*>(multi_));
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void Client::begin(std::unique_ptr<Transfer> t) {
  CURL* easy = curl_easy_init();
  if (easy == nullptr) {
    Reply r;
    r.curl_code = CURLE_OUT_OF_MEMORY;
    t->done(std::move(r));
    return;
  }
  t->easy = easy;
  const std::string target = "X-Amz-Target: AmazonSQS." + t->request.action;
  t->headers = curl_slist_append(t->headers, "Content-Type: application/x-amz-json-1.0");
  t->headers = curl_slist_append(t->headers, target.c_str());
  if (!config_.session_token.empty()) {
    const std::string token = "X-Amz-Security-Token: " + config_.session_token;
    t->headers = curl_slist_append(t->headers, token.c_str());
  }
  const std::string sigv4 = "aws:amz:" + config_.region + ":sqs";
  curl_easy_setopt(easy, CURLOPT_URL, config_.endpoint.c_str());
  curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(easy, CURLOPT_POST, 1L);
  curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t->request.body.size()));
  curl_easy_setopt(easy, CURLOPT_POSTFIELDS, t->request.body.data());
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, t->headers);
  // curl signs the request (AWS Signature V4) with these; it copies the strings.
  curl_easy_setopt(easy, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(easy, CURLOPT_USERNAME, config_.access_key_id.c_str());
  curl_easy_setopt(easy, CURLOPT_PASSWORD, config_.secret_access_key.c_str());
  curl_easy_setopt(easy, CURLOPT_USERAGENT, "idem-sqs");
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(config_.connect_timeout.count()));
  curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(std::max<std::int64_t>(t->request.timeout.count(), 1)));
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &Transfer::on_body);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, t.get());
  curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, &Transfer::on_header);
  curl_easy_setopt(easy, CURLOPT_HEADERDATA, t.get());
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, t->error);
  curl_easy_setopt(easy, CURLOPT_PRIVATE, t.get());
  if (const CURLMcode rc = curl_multi_add_handle(static_cast<CURLM*>(multi_), easy); rc != CURLM_OK) {
    Reply r;
    r.curl_code = CURLE_FAILED_INIT;
    r.curl_detail = curl_multi_strerror(rc);
    t->done(std::move(r));
    return;
  }
  running_.push_back(std::move(t));
}

void Client::finish(Transfer* t, int code) {
  CURLM* multi = static_cast<CURLM*>(multi_);
  curl_multi_remove_handle(multi, t->easy);
  const auto it = std::find_if(running_.begin(), running_.end(), [t](const auto& p) { return p.get() == t; });
  if (it == running_.end()) return;
  std::unique_ptr<Transfer> owned = std::move(*it);
  running_.erase(it);
  Reply r;
  r.curl_code = code;
  if (code != CURLE_OK) {
    r.curl_detail = t->too_big ? std::string("the answer is larger than 64 MiB") : std::string(t->error);
  } else {
    long status = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    r.status = status;
    r.body = std::move(t->response);
  }
  r.query_error = std::move(t->query_error);
  r.request_id = std::move(t->request_id);
  owned->done(std::move(r));
}

void Client::run() {
  CURLM* multi = static_cast<CURLM*>(multi_);
  if (multi == nullptr) return;
  Steady::time_point next_tick = Steady::now();
  while (true) {
    std::deque<std::unique_ptr<Transfer>> incoming;
    std::vector<std::uint64_t> cancels;
    std::function<Steady::time_point()> ticker;
    {
      const std::lock_guard lock(mutex_);
      if (stopping_) break;
      incoming.swap(queued_);
      cancels.swap(cancels_);
      ticker = ticker_;
    }
    for (const std::uint64_t id : cancels) {
      // Queued ones are in `incoming` now: answered without being started.
      if (auto q = std::find_if(incoming.begin(), incoming.end(), [id](const auto& t) { return t->id == id; }); q != incoming.end()) {
        std::unique_ptr<Transfer> t = std::move(*q);
        incoming.erase(q);
        t->done(aborted());
        continue;
      }
      if (auto r = std::find_if(running_.begin(), running_.end(), [id](const auto& t) { return t->id == id; }); r != running_.end()) {
        std::unique_ptr<Transfer> t = std::move(*r);
        running_.erase(r);
        curl_multi_remove_handle(multi, t->easy);
        t->done(aborted());
      }
    }
    for (auto& t : incoming) begin(std::move(t));
    int still_running = 0;
    curl_multi_perform(multi, &still_running);
    int left = 0;
    while (CURLMsg* m = curl_multi_info_read(multi, &left)) {
      if (m->msg != CURLMSG_DONE) continue;
      Transfer* t = nullptr;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &t);
      if (t != nullptr) finish(t, m->data.result);
    }
    auto wait = kIdlePoll;
    if (ticker) {
      const auto now = Steady::now();
      if (now >= next_tick) next_tick = ticker();
      wait = std::clamp(std::chrono::duration_cast<Millis>(next_tick - Steady::now()), Millis{0}, kIdlePoll);
    }
    {
      const std::lock_guard lock(mutex_);
      if (!queued_.empty() || !cancels_.empty() || stopping_) wait = Millis{0};
    }
    curl_multi_poll(multi, nullptr, 0, static_cast<int>(wait.count()), nullptr);
  }
  // Stopping: everything in flight or queued is answered as aborted, so no caller waits forever.
  for (auto& t : running_) curl_multi_remove_handle(multi, t->easy);
  std::vector<std::unique_ptr<Transfer>> running;
  running.swap(running_);
  for (auto& t : running) t->done(aborted());
  std::deque<std::unique_ptr<Transfer>> queued;
  {
    const std::lock_guard lock(mutex_);
    queued.swap(queued_);
  }
  for (auto& t : queued) t->done(aborted());
}

}  // namespace idem::sqs_detail
