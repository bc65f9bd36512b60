#include "errors.hpp"

#include <array>
#include <charconv>

namespace idem::redis_detail {
namespace {

std::string_view first_word(std::string_view text) { return text.substr(0, text.find(' ')); }

// Error replies that mean "this server cannot serve you now", not "your command is wrong".
// NOREPLICAS: `min-replicas-to-write` with too few replicas connected; MISCONF: Redis cannot
// persist (an RDB save or an AOF write failed: a full disk, say). Both refuse a write before
// making it.
constexpr std::array<std::string_view, 12> kUnavailable = {
    "LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY", "BUSY",
    "OOM", "NOAUTH", "WRONGPASS", "NOPERM", "NOREPLICAS", "MISCONF"};

// Of those, the ones worth retrying after a short delay (a failover or a load in progress).
constexpr std::array<std::string_view, 5> kRetry = {"LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY"};

template <std::size_t N>
bool one_of(std::string_view word, const std::array<std::string_view, N>& words) {
  for (auto w : words) {
    if (w == word) return true;
  }
  return false;
}

std::string where(const Failure& f) { return f.node.empty() ? std::string("redis") : "redis " + f.node; }

}  // namespace

StoreError map_error(const Failure& f) {
  using K = Failure::Kind;
  switch (f.kind) {
    case K::connect:
      return {StoreErrc::unavailable, where(f) + ": cannot connect: " + f.detail, false};
    case K::connect_timeout:
      return {StoreErrc::timeout, where(f) + ": connect timed out: " + f.detail, false};
    case K::down:
      return {StoreErrc::unavailable, where(f) + " is down: " + f.detail, false};
    case K::io:
      return {StoreErrc::unavailable, where(f) + ": connection lost before the reply: " + f.detail, true};
    case K::timeout:
      return {StoreErrc::timeout, where(f) + ": no reply within the command timeout" +
                                      (f.detail.empty() ? std::string() : ": " + f.detail),
              true};
    case K::protocol:
      return {StoreErrc::internal, where(f) + ": protocol error: " + f.detail, true};
    case K::retries:
      return {StoreErrc::unavailable, where(f) + ": still failing after retries: " + f.detail, false};
    case K::redirects:
      return {StoreErrc::unavailable, where(f) + ": too many redirections: " + f.detail, false};
    case K::replication:
      return {StoreErrc::unavailable, where(f) + ": write not replicated: " + f.detail, true};
    case K::no_route:
      return {StoreErrc::unavailable, "redis cluster: " + f.detail, false};
    case K::closing:
      return {StoreErrc::unavailable, "redis store is closing", false};
    case K::wrong_kind:
      return {StoreErrc::unavailable, where(f) + ": " + f.detail, false};
    case K::reply: {
      const auto word = first_word(f.detail);
      if (one_of(word, kUnavailable)) return {StoreErrc::unavailable, where(f) + ": " + f.detail, false};
      if (word == "WRONGTYPE" || word == "IDEMCORRUPT") {
        return {StoreErrc::corrupt, where(f) + ": not an idem record: " + f.detail, false};
      }
      return {StoreErrc::internal, where(f) + ": " + f.detail, false};
    }
  }
  return {StoreErrc::internal, where(f) + ": " + f.detail, false};
}

ErrorAction classify_error_reply(std::string_view text) {
  const auto word = first_word(text);
  if (word == "MOVED") return ErrorAction::moved;
  if (word == "ASK") return ErrorAction::ask;
  if (word == "NOSCRIPT") return ErrorAction::noscript;
  if (one_of(word, kRetry)) return ErrorAction::retry;
  return ErrorAction::report;
}

std::optional<Redirect> parse_redirect(std::string_view text) {
  const auto sp1 = text.find(' ');
  if (sp1 == std::string_view::npos) return std::nullopt;
  const auto sp2 = text.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return std::nullopt;
  Redirect r;
  const auto slot = text.substr(sp1 + 1, sp2 - sp1 - 1);
  auto [ptr, ec] = std::from_chars(slot.data(), slot.data() + slot.size(), r.slot);
  if (ec != std::errc{} || ptr != slot.data() + slot.size() || r.slot < 0 || r.slot >= 16384) return std::nullopt;
  auto target = text.substr(sp2 + 1);
  // "MOVED 3999 :6381": the node does not know its own address; the caller fills in the host
  // it is talking to.
  const bool no_host = target.starts_with(':');
  auto address = parse_address(no_host ? std::string("?").append(target) : std::string(target));
  if (!address) return std::nullopt;
  if (no_host) address->host.clear();
  r.to = std::move(*address);
  return r;
}

}  // namespace idem::redis_detail
