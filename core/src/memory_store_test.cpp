#include "idem/memory_store.hpp"

#include <gtest/gtest.h>

#include "idem/testing/store_conformance.hpp"

namespace idem::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Memory, StoreConformance,
                         ::testing::Values(StoreFactory{"memory", [] { return std::make_unique<MemoryStore>(); }, nullptr}),
                         StoreConformance::name_of);

}  // namespace
}  // namespace idem::testing
