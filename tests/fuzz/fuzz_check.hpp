// FUZZ_CHECK: an invariant the fuzz targets assert on accepted inputs (round trips, finite results).
// A failure aborts, so libFuzzer records the input as a crash and the regression test fails loudly.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, msg)                                                          \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "fuzz invariant failed: %s (%s) at %s:%d\n", msg, #cond,    \
                   __FILE__, __LINE__);                                                \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)
