// libFuzzer entry point; each fuzz executable compiles this file with TESSEL_FUZZ_TARGET naming its target
// function (tessel::fuzz::<name>), so it links only the libraries that target needs.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/targets.hpp"

#ifndef TESSEL_FUZZ_TARGET
#error "compile with -DTESSEL_FUZZ_TARGET=<target function name>"
#endif

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  tessel::fuzz::run_expecting_rejection_or_success(&tessel::fuzz::TESSEL_FUZZ_TARGET,
                                                   {reinterpret_cast<const char*>(data), size});
  return 0;
}
