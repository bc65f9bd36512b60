#include "sqlite_url.hpp"

#include <charconv>
#include <limits>

namespace idem::open_detail {
namespace {

std::expected<std::int64_t, std::string> positive(std::string_view name, std::string_view value,
                                                  std::int64_t max = std::numeric_limits<int>::max()) {
  std::int64_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc{} || end != value.data() + value.size() || n < 1 || n > max) {
    return std::unexpected("sqlite URL option " + std::string(name) + ": expected a whole number from 1 to " +
                           std::to_string(max) + ", got \"" + std::string(value) + "\"");
  }
  return n;
}

std::expected<SqliteSynchronous, std::string> synchronous(std::string_view value) {
  if (value == "off") return SqliteSynchronous::off;
  if (value == "normal") return SqliteSynchronous::normal;
  if (value == "full") return SqliteSynchronous::full;
  if (value == "extra") return SqliteSynchronous::extra;
  return std::unexpected("sqlite URL option synchronous: expected off, normal, full or extra, got \"" +
                         std::string(value) + "\"");
}

// Applies one NAME=VALUE.
std::expected<void, std::string> apply(SqliteOptions& options, std::string_view item) {
  const auto eq = item.find('=');
  if (eq == std::string_view::npos) {
    return std::unexpected("sqlite URL option \"" + std::string(item) + "\": expected NAME=VALUE");
  }
  const std::string_view name = item.substr(0, eq);
  const std::string_view value = item.substr(eq + 1);
  if (name == "synchronous") {
    auto mode = synchronous(value);
    if (!mode) return std::unexpected(mode.error());
    options.synchronous = *mode;
  } else if (name == "busy_timeout_ms") {
    auto ms = positive(name, value);
    if (!ms) return std::unexpected(ms.error());
    options.busy_timeout = Millis(*ms);
  } else if (name == "max_batch") {
    auto n = positive(name, value, 100'000);
    if (!n) return std::unexpected(n.error());
    options.max_batch = static_cast<std::size_t>(*n);
  } else if (name == "wal_autocheckpoint") {
    auto n = positive(name, value);
    if (!n) return std::unexpected(n.error());
    options.wal_autocheckpoint = static_cast<int>(*n);
  } else {
    return std::unexpected("unknown sqlite URL option \"" + std::string(name) +
                           "\" (expected synchronous, busy_timeout_ms, max_batch or wal_autocheckpoint)");
  }
  return {};
}

}  // namespace

std::expected<SqliteOptions, std::string> parse_sqlite_url(std::string_view url) {
  std::string_view rest = url.substr(url.starts_with("sqlite:") ? 7 : 0);
  if (rest.starts_with("//")) rest.remove_prefix(2);  // sqlite:///abs/path
  const auto question = rest.find('?');
  const std::string_view path = rest.substr(0, question);
  if (path.empty()) return std::unexpected("expected sqlite:PATH, e.g. \"sqlite:./var/idem.db\"");
  SqliteOptions options;
  options.path = std::string(path);
  if (question == std::string_view::npos) return options;
  std::string_view query = rest.substr(question + 1);
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    if (!item.empty()) {  // "a=1&&b=2", "a=1&": empty items are ignored, as browsers do
      if (auto applied = apply(options, item); !applied) return std::unexpected(applied.error());
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return options;
}

}  // namespace idem::open_detail
