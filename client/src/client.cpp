#include "idem/client/client.hpp"

#include <algorithm>
#include <utility>

#include "idem/client/curl_transport.hpp"
#include "idem/client/key.hpp"

namespace idem::client {
namespace {

// The key as the header carries it: bare (Stripe) or as a Structured Field string (IETF draft).
std::string key_header_value(std::string_view key, bool quote) {
  if (!quote) return std::string(key);
  std::string out = "\"";
  for (const char c : key) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

std::uint64_t random_seed() {
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

SendResult refused(std::string key, StopReason reason, std::string detail) {
  SendResult result;
  result.key = std::move(key);
  result.stop = reason;
  result.detail = std::move(detail);
  return result;
}

}  // namespace

std::string_view to_string(StopReason reason) {
  switch (reason) {
    case StopReason::success: return "success";
    case StopReason::non_retryable: return "non_retryable";
    case StopReason::outcome_unknown: return "outcome_unknown";
    case StopReason::attempts_exhausted: return "attempts_exhausted";
    case StopReason::deadline: return "deadline";
    case StopReason::budget_exhausted: return "budget_exhausted";
    case StopReason::transport_failed: return "transport_failed";
    case StopReason::expired: return "expired";
    case StopReason::invalid_request: return "invalid_request";
    case StopReason::journal_failed: return "journal_failed";
  }
  return "unknown";
}

// Marks a key as being sent by this Client for as long as it lives: one key is one operation, so
// two concurrent sends of it would race on its journal row, and resume() must not re-send it.
class Client::InFlight {
 public:
  InFlight(Client& client, std::string key) : client_(client), key_(std::move(key)) {
    std::lock_guard lock(client_.mutex_);
    owned_ = client_.in_flight_.insert(key_).second;
  }
  ~InFlight() {
    if (!owned_) return;
    std::lock_guard lock(client_.mutex_);
    client_.in_flight_.erase(key_);
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  explicit operator bool() const { return owned_; }

 private:
  Client& client_;
  std::string key_;
  bool owned_ = false;
};

Client::Client(ClientOptions options, std::shared_ptr<Transport> transport, std::shared_ptr<Journal> journal,
               std::shared_ptr<Timer> timer)
    : options_(std::move(options)),
      transport_(transport ? std::move(transport) : std::make_shared<CurlTransport>()),
      journal_(std::move(journal)),
      timer_(timer ? std::move(timer) : std::make_shared<SystemTimer>()),
      budget_(options_.budget, timer_->now()),
      rng_(options_.jitter_seed ? *options_.jitter_seed : random_seed()) {}

Client::~Client() = default;

double Client::retry_tokens() const { return budget_.tokens(timer_->now()); }

Millis Client::backoff(int retry) {
  std::lock_guard lock(mutex_);
  return full_jitter(backoff_ceiling(retry, options_.retry), rng_);
}

SendResult Client::send(HttpRequest request, std::optional<std::string> key) {
  // A key header already in the request is the caller's key; the client sends it itself.
  std::vector<std::string> header_keys;
  std::erase_if(request.headers, [&](const Header& h) {
    if (!header_name_equals(h.name, options_.key_header)) return false;
    header_keys.push_back(h.value);
    return true;
  });
  if (!header_keys.empty()) {
    const std::vector<std::string_view> views(header_keys.begin(), header_keys.end());
    auto parsed = parse_key(views, options_.key_rules);
    if (!parsed) return refused(key.value_or(""), StopReason::invalid_request, parsed.error().detail);
    if (key && *key != *parsed) {
      return refused(*key, StopReason::invalid_request, "the key argument and the request's key header differ");
    }
    key = std::move(*parsed);
  }
  if (!key) {
    auto fresh = new_key();
    if (!fresh) return refused("", StopReason::invalid_request, "cannot make a key: " + fresh.error());
    key = std::move(*fresh);
  }

  // The key must survive the server's parser unchanged, or the server answers 400.
  const std::string value = key_header_value(*key, options_.quote_key);
  const std::string_view views[] = {value};
  auto parsed = parse_key(views, options_.key_rules);
  if (!parsed) return refused(*key, StopReason::invalid_request, parsed.error().detail);
  if (*parsed != *key) {
    return refused(*key, StopReason::invalid_request, "the key would not reach the server unchanged");
  }

  InFlight in_flight(*this, *key);
  if (!in_flight) {
    return refused(*key, StopReason::invalid_request, "an operation with this key is already being sent");
  }
  if (journal_) {
    Operation op{*key, request, 1, timer_->wall_now()};
    if (auto r = journal_->begin(op); !r) {
      return refused(*key, StopReason::journal_failed, r.error().message);
    }
  }
  budget_.on_operation(timer_->now());
  return run(*key, request, /*first_attempt_counted=*/true);
}

SendResult Client::run(const std::string& key, const HttpRequest& request, bool first_attempt_counted) {
  const RetryOptions& policy = options_.retry;
  const int max_attempts = std::max(1, policy.max_attempts);
  const SteadyTime deadline = timer_->now() + policy.deadline;
  const std::string key_value = key_header_value(key, options_.quote_key);

  SendResult result;
  result.key = key;
  while (true) {
    const SteadyTime now = timer_->now();
    if (now >= deadline) {
      result.stop = StopReason::deadline;
      break;
    }
    if (journal_ && (result.attempts > 0 || !first_attempt_counted)) {
      // Only bookkeeping: the operation itself is already durable, so a failure here is reported
      // but does not stop the retry.
      if (auto r = journal_->count_attempt(key); !r) result.journal_error = r.error().message;
    }

    HttpRequest wire = request;
    wire.headers.push_back({options_.key_header, key_value});
    if (options_.before_attempt) options_.before_attempt(wire);
    const Millis timeout =
        std::max(Millis{1}, std::min(policy.attempt_timeout, std::chrono::duration_cast<Millis>(deadline - now)));
    auto outcome = transport_->perform(wire, timeout);
    ++result.attempts;

    std::optional<Millis> retry_after;
    if (outcome) {
      result.response = std::move(*outcome);
      result.error.reset();
      result.replayed = is_replay(result.response->headers);
      const AnswerClass answer = classify(*result.response, policy);
      if (answer == AnswerClass::success) {
        result.stop = StopReason::success;
        break;
      }
      if (answer == AnswerClass::final) {
        result.stop = StopReason::non_retryable;
        break;
      }
      if (answer == AnswerClass::outcome_unknown) {
        result.stop = StopReason::outcome_unknown;
        break;
      }
      if (policy.honor_retry_after) {
        if (const auto header = find_header(result.response->headers, "Retry-After")) {
          retry_after = parse_retry_after(*header, timer_->wall_now());
        }
      }
    } else {
      result.error = std::move(outcome.error());
      if (!result.error->retryable()) {
        result.stop = StopReason::transport_failed;
        break;
      }
    }

    if (result.attempts >= max_attempts) {
      result.stop = StopReason::attempts_exhausted;
      break;
    }
    // The server's Retry-After wins over our backoff, longer or shorter; if it asks for more
    // time than the deadline leaves, we stop now rather than retry early against its wish.
    const Millis wait = retry_after ? *retry_after : backoff(result.attempts);
    if (timer_->now() + wait >= deadline) {
      result.stop = StopReason::deadline;
      break;
    }
    if (!budget_.try_retry(timer_->now())) {
      result.stop = StopReason::budget_exhausted;
      break;
    }
    timer_->sleep_for(wait);
  }

  if (journal_) {
    JournalResult<void> recorded;
    if (result.stop == StopReason::success || result.stop == StopReason::non_retryable) {
      recorded = journal_->complete(key);
    } else {
      DeadLetter letter;
      letter.operation = Operation{key, request, result.attempts, timer_->wall_now()};
      letter.failed = timer_->wall_now();
      letter.reason = std::string(to_string(result.stop));
      letter.last_response = result.response;
      if (result.error) letter.last_error = result.error->message;
      recorded = journal_->bury(letter);
    }
    if (!recorded) result.journal_error = recorded.error().message;
  }
  return result;
}

JournalResult<std::vector<SendResult>> Client::resume() {
  std::vector<SendResult> results;
  if (!journal_) return results;
  auto operations = journal_->pending();
  if (!operations) return std::unexpected(operations.error());
  for (auto& op : *operations) {
    InFlight in_flight(*this, op.key);
    if (!in_flight) continue;  // this Client is sending it right now
    if (timer_->wall_now() - op.created > options_.resume_max_age) {
      // Past the age the server is trusted to remember the key: re-sending could execute the
      // operation a second time. A person decides.
      SendResult result = refused(op.key, StopReason::expired,
                                  "journaled longer ago than resume_max_age; the server may have forgotten the key");
      DeadLetter letter;
      letter.operation = op;
      letter.failed = timer_->wall_now();
      letter.reason = std::string(to_string(StopReason::expired));
      letter.last_error = result.detail;
      if (auto r = journal_->bury(letter); !r) result.journal_error = r.error().message;
      results.push_back(std::move(result));
      continue;
    }
    budget_.on_operation(timer_->now());
    results.push_back(run(op.key, op.request, /*first_attempt_counted=*/false));
  }
  return results;
}

JournalResult<SendResult> Client::retry_dead_letter(std::string_view key) {
  if (!journal_) return std::unexpected(JournalError{JournalErrc::not_found, "this client has no journal"});
  InFlight in_flight(*this, std::string(key));
  if (!in_flight) {
    return refused(std::string(key), StopReason::invalid_request, "an operation with this key is already being sent");
  }
  auto op = journal_->revive(key);
  if (!op) return std::unexpected(op.error());
  budget_.on_operation(timer_->now());
  return run(op->key, op->request, /*first_attempt_counted=*/false);
}

JournalResult<void> Client::drop_dead_letter(std::string_view key) {
  if (!journal_) return std::unexpected(JournalError{JournalErrc::not_found, "this client has no journal"});
  return journal_->drop_dead_letter(key);
}

JournalResult<std::vector<Operation>> Client::pending() {
  if (!journal_) return std::vector<Operation>{};
  return journal_->pending();
}

JournalResult<std::vector<DeadLetter>> Client::dead_letters() {
  if (!journal_) return std::vector<DeadLetter>{};
  return journal_->dead_letters();
}

}  // namespace idem::client
