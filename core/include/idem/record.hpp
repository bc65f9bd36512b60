#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"

namespace idem {

/// The three states of a stored key (SPEC §4). Absence of a record is the fourth, implicit one.
enum class RecordState : std::uint8_t { in_progress, completed, failed_retryable };

/// "in_progress", "completed" or "failed_retryable": the names stores and tools use.
std::string_view to_string(RecordState state);

/// Parses the names produced by to_string; nullopt for anything else.
std::optional<RecordState> parse_record_state(std::string_view name);

/// One HTTP header as stored and replayed.
struct Header {
  std::string name;
  std::string value;
  bool operator==(const Header&) const = default;
};

/// Headers in their original order; names may repeat.
using Headers = std::vector<Header>;

/// A response as stored for replay: status, headers, exact body bytes.
struct StoredResponse {
  int status = 0;
  Headers headers;
  std::string body;
  bool operator==(const StoredResponse&) const = default;
};

/// One idempotency record: the identity (tenant, key) and everything stored about it.
struct Record {
  std::string tenant;
  std::string key;
  RecordState state = RecordState::in_progress;
  std::string request_hash;        ///< hex SHA-256 fingerprint of the first request
  std::uint64_t fencing_token = 0; ///< changes on every claim and takeover
  /// Which execution of the operation holds (or last held) the key: 1 for the first, one more
  /// for each takeover (after a lease ran out, after failed_retryable). Unlike the token it only
  /// grows, so an upstream told it (the gateway's Idempotency-Attempt header) can refuse a stale
  /// holder's write. Starts again at 1 only when the key starts over (absent or expired).
  std::uint32_t attempt = 1;
  TimePoint lease_expires{};       ///< meaningful while in_progress
  TimePoint created{};
  std::optional<TimePoint> completed;     ///< set once completed
  TimePoint expires{};                    ///< after this the record is as if absent
  std::optional<StoredResponse> response; ///< set once completed
  /// For a route with on_lease_expiry = "ask": the upstream's lookup for the operation's outcome
  /// (`GET /path/{key}`, docs/gateway.md), kept so that `idemctl reconcile` can resolve the key
  /// without the gateway's configuration. Empty for every other record.
  std::string lookup;
};

}  // namespace idem
