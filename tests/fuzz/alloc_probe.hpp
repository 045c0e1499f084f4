// Largest single heap request made through operator new since the last reset, so a test can show that a
// parser rejected an absurd size *before* allocating it (not after a failed multi-gigabyte allocation).
// alloc_probe.cpp replaces the global operator new/delete of the test executable that links it.
#pragma once

#include <cstddef>

namespace tessel::fuzz {

void reset_largest_allocation();
std::size_t largest_allocation();

}  // namespace tessel::fuzz
