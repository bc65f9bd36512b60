#include "errors.hpp"

#include <array>
#include <string>

namespace idem::redis_streams {
namespace {

using redis_detail::Failure;

// Error replies meaning "this server cannot serve you now", not "your command is wrong": a load
// or failover in progress, a busy script, persistence failing (MISCONF), too few replicas
// (NOREPLICAS), memory full (OOM), a replica named as the server (READONLY, until failover).
constexpr std::array<std::string_view, 9> kUnavailable = {
    "LOADING", "MASTERDOWN", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "READONLY", "MISCONF", "NOREPLICAS", "OOM"};

bool one_of(std::string_view word, const auto& words) {
  for (std::string_view w : words) {
    if (w == word) return true;
  }
  return false;
}

std::string where(const Failure& f) { return f.node.empty() ? std::string("redis") : "redis " + f.node; }

std::string key_part(const ErrorContext& c) {
  return c.key.empty() ? std::string() : " (stream \"" + std::string(c.key) + "\")";
}

const char* const kLogin = "Redis refused the login: check the user and password";

BrokerError reply_error(const Failure& f, const ErrorContext& c) {
  const auto code = error_code(f.detail);
  if (one_of(code, kUnavailable)) return {BrokerErrc::unavailable, where(f) + ": " + f.detail, false};
  if (code == "NOGROUP" || code == "UNBLOCKED") {
    return {BrokerErrc::unavailable,
            where(f) + ": the consumer group (or its whole stream) is gone" + key_part(c) +
                " (deleted, or Redis restarted without persistence); the source creates it again",
            false};
  }
  // The server's words for these are safe to quote (they never echo a password), and say which
  // command or key the ACL denied.
  if (code == "NOAUTH" || code == "WRONGPASS") {
    return {BrokerErrc::refused, where(f) + ": " + kLogin + " (" + f.detail + ")", false};
  }
  if (code == "NOPERM") {
    return {BrokerErrc::refused,
            where(f) + ": the Redis user may not do this" + key_part(c) + "; check its ACL (" + f.detail + ")", false};
  }
  if (code == "MOVED" || code == "ASK" || code == "CROSSSLOT") {
    return {BrokerErrc::refused,
            where(f) + " is a Redis Cluster node that does not hold" + key_part(c) +
                ": Redis Streams need a standalone Redis, or the URL must name the node holding the stream's slot"
                " (this module does not route cluster slots): " +
                f.detail,
            false};
  }
  if (code == "WRONGTYPE") {
    return {BrokerErrc::refused,
            where(f) + ": \"" + std::string(c.key) +
                "\" is not a stream (WRONGTYPE): another kind of value is stored there",
            false};
  }
  return {BrokerErrc::internal, where(f) + ": " + f.detail + key_part(c), false};
}

}  // namespace

std::string_view error_code(std::string_view reply_text) { return reply_text.substr(0, reply_text.find(' ')); }

Failure reply_failure(std::string_view reply_text, std::string_view node) {
  return Failure{Failure::Kind::reply, std::string(reply_text), std::string(node)};
}

BrokerError map_error(const Failure& f, const ErrorContext& c) {
  using K = Failure::Kind;
  switch (f.kind) {
    case K::connect:
      if (const auto refusal = redis_detail::handshake_refusal(f)) {
        const auto code = error_code(refusal->reply);
        if (one_of(code, kUnavailable)) return {BrokerErrc::unavailable, where(f) + ": " + f.detail, false};
        if (refusal->command == "AUTH") {
          // Any refused AUTH: a wrong password (WRONGPASS), a disabled user, or a password given
          // to a server that has none ("ERR AUTH <password> called without any password ...").
          return {BrokerErrc::refused, where(f) + ": " + kLogin + " (" + std::string(refusal->reply) + ")", false};
        }
        return {BrokerErrc::refused,
                where(f) + ": Redis refused " + std::string(refusal->command) + ": check the URL's db (" +
                    std::string(refusal->reply) + ")",
                false};
      }
      return {BrokerErrc::unavailable, where(f) + ": cannot connect: " + f.detail, false};
    case K::connect_timeout:
      return {BrokerErrc::timeout, where(f) + ": connect timed out: " + f.detail, false};
    case K::down:
      return {BrokerErrc::unavailable, where(f) + " is unreachable: " + f.detail, false};
    case K::io:
      return {BrokerErrc::unavailable, where(f) + ": connection lost before the reply: " + f.detail, c.appends};
    case K::timeout:
      return {BrokerErrc::timeout,
              where(f) + ": no reply in time" + (f.detail.empty() ? std::string() : ": " + f.detail), c.appends};
    case K::protocol:
      return {BrokerErrc::internal, where(f) + ": protocol error: " + f.detail, c.appends};
    case K::reply:
      return reply_error(f, c);
    // The store's router and nodes report these; a stream source or sink does not, but the
    // mapping stays total.
    case K::retries:
    case K::redirects:
    case K::no_route:
    case K::closing:
      return {BrokerErrc::unavailable, where(f) + ": " + f.detail, false};
    case K::replication:
      return {BrokerErrc::unavailable, where(f) + ": write not replicated: " + f.detail, c.appends};
    case K::wrong_kind:
      return {BrokerErrc::refused, where(f) + ": " + f.detail, false};
  }
  return {BrokerErrc::internal, where(f) + ": " + f.detail, false};
}

}  // namespace idem::redis_streams
