#pragma once

// What every fuzz target shares: a property that does not hold is a crash (libFuzzer keeps the
// input), with a line saying which.

#include <cstdio>
#include <cstdlib>

/// Aborts with `what` when `ok` is false: libFuzzer reports the input as a crash.
#define FUZZ_CHECK(ok, what)                                                        \
  do {                                                                              \
    if (!(ok)) {                                                                    \
      std::fprintf(stderr, "fuzz property violated: %s (%s:%d)\n", what, __FILE__, __LINE__); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)
