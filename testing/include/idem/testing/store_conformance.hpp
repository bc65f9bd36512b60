#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "idem/store.hpp"

namespace idem::testing {

/// How the conformance suite obtains stores of one backend.
struct StoreFactory {
  /// Shown in test names, e.g. "memory", "sqlite".
  std::string name;
  /// A store over fresh, empty storage. Stores made by one test may share storage with each
  /// other only if `share` says so.
  std::function<std::unique_ptr<Store>()> make;
  /// A second store over the same storage as the last one `make` returned (another replica,
  /// another process's view); null when the backend cannot share (memory).
  std::function<std::unique_ptr<Store>()> share;
};

/// Names a factory in test output (instead of its bytes).
inline void PrintTo(const StoreFactory& factory, std::ostream* os) { *os << factory.name; }

/// The one suite every Store must pass (SPEC §4, §6). A backend's test instantiates it:
///   INSTANTIATE_TEST_SUITE_P(Sqlite, StoreConformance, ::testing::Values(StoreFactory{...}),
///                            StoreConformance::name_of);
/// Link the target `idem::store_conformance` (its tests are compiled into the executable).
class StoreConformance : public ::testing::TestWithParam<StoreFactory> {
 public:
  /// Test-name generator for INSTANTIATE_TEST_SUITE_P.
  static std::string name_of(const ::testing::TestParamInfo<StoreFactory>& info) { return info.param.name; }
};

/// The suite of Consumer::process_once (SPEC §10) on one backend, instantiated the same way:
///   INSTANTIATE_TEST_SUITE_P(Sqlite, ConsumerConformance, ::testing::Values(StoreFactory{...}),
///                            ConsumerConformance::name_of);
class ConsumerConformance : public ::testing::TestWithParam<StoreFactory> {
 public:
  static std::string name_of(const ::testing::TestParamInfo<StoreFactory>& info) { return info.param.name; }
};

}  // namespace idem::testing
