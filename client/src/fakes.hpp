#pragma once

// Test doubles for the client: a timer that only moves when told (or when "slept"), and a
// transport that answers from a script and records what it was sent.

#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "idem/client/timer.hpp"
#include "idem/client/transport.hpp"

namespace idem::client::testing {

/// Time that advances only through sleep_for and advance; records every sleep.
class FakeTimer final : public Timer {
 public:
  SteadyTime now() const override {
    std::lock_guard lock(mutex_);
    return SteadyTime{} + std::chrono::hours(1) + elapsed_;
  }
  TimePoint wall_now() const override {
    std::lock_guard lock(mutex_);
    return from_epoch_ms(1'767'225'600'000) + elapsed_;  // 2026-01-01T00:00:00Z
  }
  void sleep_for(Millis d) override {
    std::lock_guard lock(mutex_);
    sleeps_.push_back(d);
    elapsed_ += d;
  }
  void advance(Millis d) {
    std::lock_guard lock(mutex_);
    elapsed_ += d;
  }
  std::vector<Millis> sleeps() const {
    std::lock_guard lock(mutex_);
    return sleeps_;
  }

 private:
  mutable std::mutex mutex_;
  Millis elapsed_{0};
  std::vector<Millis> sleeps_;
};

using Outcome = std::expected<HttpResponse, TransportError>;

/// Answers from a script, in order; with the script empty, answers `fallback`.
class ScriptedTransport final : public Transport {
 public:
  ScriptedTransport() = default;
  explicit ScriptedTransport(std::vector<Outcome> script) : script_(script.begin(), script.end()) {}

  Outcome perform(const HttpRequest& request, Millis timeout) override {
    std::function<void(const HttpRequest&)> hook;
    {
      std::lock_guard lock(mutex_);
      requests_.push_back(request);
      timeouts_.push_back(timeout);
      hook = on_perform;
    }
    if (hook) hook(request);  // may throw or re-enter the client: called without the lock
    if (timer && latency.count() > 0) timer->advance(latency);
    std::unique_lock lock(mutex_);
    if (script_.empty()) {
      if (responder) {
        auto respond = responder;
        lock.unlock();
        return respond(request);
      }
      return fallback;
    }
    Outcome next = std::move(script_.front());
    script_.pop_front();
    return next;
  }

  std::vector<HttpRequest> requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
  }
  std::vector<Millis> timeouts() const {
    std::lock_guard lock(mutex_);
    return timeouts_;
  }
  std::size_t calls() const {
    std::lock_guard lock(mutex_);
    return requests_.size();
  }

  /// Runs inside perform, before the answer: inspect the journal, throw to simulate a crash.
  std::function<void(const HttpRequest&)> on_perform;
  /// Answers once the script is used up (instead of `fallback`); called without the lock.
  std::function<Outcome(const HttpRequest&)> responder;
  Outcome fallback = HttpResponse{200, {}, "ok"};
  FakeTimer* timer = nullptr;  ///< advanced by `latency` on every attempt
  Millis latency{0};

 private:
  mutable std::mutex mutex_;
  std::deque<Outcome> script_;
  std::vector<HttpRequest> requests_;
  std::vector<Millis> timeouts_;
};

inline HttpResponse response(int status, Headers headers = {}, std::string body = "") {
  return HttpResponse{status, std::move(headers), std::move(body)};
}

/// An idem-style problem+json answer with the given code.
inline HttpResponse problem(int status, std::string_view code, Headers headers = {}) {
  headers.push_back({"Content-Type", "application/problem+json"});
  return HttpResponse{status, std::move(headers),
                      R"({"type":"https://idem.dev/problems/)" + std::string(code) + R"(","title":"t","status":)" +
                          std::to_string(status) + R"(,"detail":"d","code":")" + std::string(code) + "\"}"};
}

inline Outcome failure(TransportErrc code) {
  return std::unexpected(TransportError{code, std::string("fake: ") + std::string(to_string(code))});
}

/// The value of the key header of a recorded request.
inline std::string sent_key(const HttpRequest& request, std::string_view header = "Idempotency-Key") {
  std::string value;
  int count = 0;
  for (const auto& h : request.headers) {
    if (header_name_equals(h.name, header)) {
      value = h.value;
      ++count;
    }
  }
  return count == 1 ? value : "<" + std::to_string(count) + " key headers>";
}

}  // namespace idem::client::testing
