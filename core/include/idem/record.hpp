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
  TimePoint lease_expires{};       ///< meaningful while in_progress
  TimePoint created{};
  std::optional<TimePoint> completed;     ///< set once completed
  TimePoint expires{};                    ///< after this the record is as if absent
  std::optional<StoredResponse> response; ///< set once completed
};

}  // namespace idem
