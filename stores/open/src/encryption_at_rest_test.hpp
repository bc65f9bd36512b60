#pragma once

// Encryption at rest on the durable stores (issue 19 §2): the same cases against SQLite,
// PostgreSQL and Redis, each reading its storage raw (file bytes; the table through psql; the
// values through redis-cli) rather than through the store.

#include <gtest/gtest.h>

#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "idem/store.hpp"

namespace idem::testing {

/// One backend's storage, reachable both as a Store and raw.
class RawBackend {
 public:
  virtual ~RawBackend() = default;
  /// The backend over this storage (a new object, the same data every time).
  virtual std::unique_ptr<Store> open() = 0;
  /// How many times `needle` occurs in the raw storage: bytes on disk, or the rows and values as
  /// the database's own client prints them.
  virtual std::size_t count_in_storage(std::string_view needle) = 0;
  /// Alters one byte of the stored response of `id` (a completed record), in place.
  virtual void alter_one_byte(const RecordId& id) = 0;
  /// Copies the stored response of `from` onto `to` (both completed), as raw bytes.
  virtual void copy_response(const RecordId& from, const RecordId& to) = 0;
};

/// How the suite makes a backend: a name for test output and a factory (fresh storage).
struct RawBackendFactory {
  std::string name;
  std::function<std::unique_ptr<RawBackend>()> make;
};

inline void PrintTo(const RawBackendFactory& f, std::ostream* os) { *os << f.name; }

/// The suite; a backend's test instantiates it with INSTANTIATE_TEST_SUITE_P.
class EncryptionAtRest : public ::testing::TestWithParam<RawBackendFactory> {
 public:
  static std::string name_of(const ::testing::TestParamInfo<RawBackendFactory>& info) { return info.param.name; }
};

/// Runs `argv` (no shell) and returns its standard output; fails the test on a non-zero exit.
std::string run_command(const std::vector<std::string>& argv);

/// Lowercase hex of `bytes` (how psql prints bytea).
std::string hex_of(std::string_view bytes);

/// Non-overlapping occurrences of `needle` in `haystack`.
std::size_t occurrences(std::string_view haystack, std::string_view needle);

}  // namespace idem::testing
