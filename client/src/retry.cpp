#include "idem/client/retry.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

namespace idem::client {
namespace {

using std::chrono::days;
using std::chrono::hours;
using std::chrono::minutes;
using std::chrono::seconds;

// Longest wait a Retry-After may ask for before we treat it as "forever" (saturates, no overflow).
constexpr std::int64_t kMaxRetryAfterSeconds = 10LL * 365 * 24 * 3600;

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A strict left-to-right reader over the date grammar of RFC 9110 §5.6.7.
class DateReader {
 public:
  explicit DateReader(std::string_view s) : s_(s) {}

  bool done() const { return i_ == s_.size(); }
  bool literal(std::string_view lit) {
    if (s_.substr(i_, lit.size()) != lit) return false;
    i_ += lit.size();
    return true;
  }
  // Exactly n digits.
  std::optional<int> digits(std::size_t n) {
    if (i_ + n > s_.size()) return std::nullopt;
    int value = 0;
    for (std::size_t k = 0; k < n; ++k) {
      const char c = s_[i_ + k];
      if (c < '0' || c > '9') return std::nullopt;
      value = value * 10 + (c - '0');
    }
    i_ += n;
    return value;
  }
  // One of `names`; returns its index.
  template <std::size_t N>
  std::optional<int> one_of(const std::array<std::string_view, N>& names) {
    for (std::size_t k = 0; k < N; ++k) {
      if (literal(names[k])) return static_cast<int>(k);
    }
    return std::nullopt;
  }
  // A letter run (the long day names of RFC 850 dates).
  std::string_view word() {
    const std::size_t start = i_;
    while (i_ < s_.size() && ((s_[i_] >= 'A' && s_[i_] <= 'Z') || (s_[i_] >= 'a' && s_[i_] <= 'z'))) ++i_;
    return s_.substr(start, i_ - start);
  }
  // "HH:MM:SS"
  std::optional<seconds> time_of_day() {
    const auto h = digits(2);
    if (!h || !literal(":")) return std::nullopt;
    const auto m = digits(2);
    if (!m || !literal(":")) return std::nullopt;
    const auto s = digits(2);
    // 60 allows a leap second, as RFC 9110 does.
    if (!s || *h > 23 || *m > 59 || *s > 60) return std::nullopt;
    return hours(*h) + minutes(*m) + seconds(*s);
  }

 private:
  std::string_view s_;
  std::size_t i_ = 0;
};

constexpr std::array<std::string_view, 7> kDays{"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
constexpr std::array<std::string_view, 7> kLongDays{"Monday", "Tuesday",  "Wednesday", "Thursday",
                                                    "Friday", "Saturday", "Sunday"};
constexpr std::array<std::string_view, 12> kMonths{"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

std::optional<TimePoint> make_time(int year, int month0, int day, seconds time) {
  const std::chrono::year_month_day ymd{std::chrono::year{year}, std::chrono::month{static_cast<unsigned>(month0 + 1)},
                                        std::chrono::day{static_cast<unsigned>(day)}};
  if (!ymd.ok()) return std::nullopt;
  return std::chrono::time_point_cast<Millis>(std::chrono::sys_days{ymd} + time);
}

// IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT"
std::optional<TimePoint> parse_imf_fixdate(std::string_view text) {
  DateReader r(text);
  if (!r.one_of(kDays) || !r.literal(", ")) return std::nullopt;
  const auto day = r.digits(2);
  if (!day || !r.literal(" ")) return std::nullopt;
  const auto month = r.one_of(kMonths);
  if (!month || !r.literal(" ")) return std::nullopt;
  const auto year = r.digits(4);
  if (!year || !r.literal(" ")) return std::nullopt;
  const auto time = r.time_of_day();
  if (!time || !r.literal(" GMT") || !r.done()) return std::nullopt;
  return make_time(*year, *month, *day, *time);
}

// RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT"
std::optional<TimePoint> parse_rfc850(std::string_view text) {
  DateReader r(text);
  const auto name = r.word();
  if (std::find(kLongDays.begin(), kLongDays.end(), name) == kLongDays.end() || !r.literal(", ")) {
    return std::nullopt;
  }
  const auto day = r.digits(2);
  if (!day || !r.literal("-")) return std::nullopt;
  const auto month = r.one_of(kMonths);
  if (!month || !r.literal("-")) return std::nullopt;
  const auto yy = r.digits(2);
  if (!yy || !r.literal(" ")) return std::nullopt;
  const auto time = r.time_of_day();
  if (!time || !r.literal(" GMT") || !r.done()) return std::nullopt;
  // RFC 9110 asks for "more than 50 years in the future means the past"; a fixed pivot is the
  // same for every date this century.
  const int year = *yy < 70 ? 2000 + *yy : 1900 + *yy;
  return make_time(year, *month, *day, *time);
}

// asctime: "Sun Nov  6 08:49:37 1994"
std::optional<TimePoint> parse_asctime(std::string_view text) {
  DateReader r(text);
  if (!r.one_of(kDays) || !r.literal(" ")) return std::nullopt;
  const auto month = r.one_of(kMonths);
  if (!month || !r.literal(" ")) return std::nullopt;
  std::optional<int> day;
  if (r.literal(" ")) {
    day = r.digits(1);
  } else {
    day = r.digits(2);
  }
  if (!day || !r.literal(" ")) return std::nullopt;
  const auto time = r.time_of_day();
  if (!time || !r.literal(" ")) return std::nullopt;
  const auto year = r.digits(4);
  if (!year || !r.done()) return std::nullopt;
  return make_time(*year, *month, *day, *time);
}

}  // namespace

AnswerClass classify(const HttpResponse& response, const RetryOptions& options) {
  const int status = response.status;
  if (status >= 200 && status <= 299) return AnswerClass::success;
  switch (status) {
    case 408:  // the server gave up waiting for the request: nothing ran
    case 429:
    case 500:
    case 502:
    case 503:
    case 504:
      return AnswerClass::retry;
    case 409: {
      const auto code = problem_code(response.body);
      if (code == "idempotency_key_in_use") return AnswerClass::retry;
      if (code == "idempotency_outcome_unknown") return AnswerClass::outcome_unknown;
      if (!code && options.retry_conflict_with_retry_after && find_header(response.headers, "Retry-After")) {
        return AnswerClass::retry;
      }
      return AnswerClass::final;
    }
    default:
      return AnswerClass::final;
  }
}

std::optional<TimePoint> parse_http_date(std::string_view text) {
  text = trim_ows(text);
  if (auto t = parse_imf_fixdate(text)) return t;
  if (auto t = parse_rfc850(text)) return t;
  return parse_asctime(text);
}

std::optional<Millis> parse_retry_after(std::string_view value, TimePoint now) {
  value = trim_ows(value);
  if (value.empty()) return std::nullopt;
  if (std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    std::int64_t secs = 0;
    for (const char c : value) {
      secs = std::min<std::int64_t>(kMaxRetryAfterSeconds, secs * 10 + (c - '0'));
    }
    return std::chrono::duration_cast<Millis>(seconds(secs));
  }
  const auto date = parse_http_date(value);
  if (!date) return std::nullopt;
  if (*date <= now) return Millis{0};
  return std::min<Millis>(*date - now, std::chrono::duration_cast<Millis>(seconds(kMaxRetryAfterSeconds)));
}

Millis backoff_ceiling(int retry, const RetryOptions& options) {
  if (retry < 1) retry = 1;
  const double base = static_cast<double>(std::max<std::int64_t>(0, options.base_delay.count()));
  const double cap = static_cast<double>(std::max<std::int64_t>(0, options.max_delay.count()));
  // pow grows to inf rather than overflowing; min() then picks the cap.
  const double raw = base * std::pow(std::max(1.0, options.multiplier), retry - 1);
  const double ms = std::isfinite(raw) ? std::min(raw, cap) : cap;
  return Millis{static_cast<std::int64_t>(ms)};
}

Millis full_jitter(Millis ceiling, std::mt19937_64& rng) {
  if (ceiling.count() <= 0) return Millis{0};
  std::uniform_int_distribution<std::int64_t> pick(0, ceiling.count());
  return Millis{pick(rng)};
}

RetryBudget::RetryBudget(BudgetOptions options, SteadyTime now)
    : options_(options), tokens_(options.max_tokens), last_refill_(now) {}

void RetryBudget::refill(SteadyTime now) {
  if (now <= last_refill_) return;
  const double elapsed = std::chrono::duration<double>(now - last_refill_).count();
  tokens_ = std::min(options_.max_tokens, tokens_ + elapsed * options_.min_retries_per_second);
  last_refill_ = now;
}

void RetryBudget::on_operation(SteadyTime now) {
  std::lock_guard lock(mutex_);
  refill(now);
  tokens_ = std::min(options_.max_tokens, tokens_ + options_.retry_ratio);
}

bool RetryBudget::try_retry(SteadyTime now) {
  if (!options_.enabled) return true;
  std::lock_guard lock(mutex_);
  refill(now);
  // Tolerance: ten deposits of 0.1 add up to 0.999...9, which must buy one retry.
  if (tokens_ < 1.0 - 1e-9) return false;
  tokens_ = std::max(0.0, tokens_ - 1.0);
  return true;
}

double RetryBudget::tokens(SteadyTime now) {
  std::lock_guard lock(mutex_);
  refill(now);
  return tokens_;
}

}  // namespace idem::client
