// doctest main for the tests on ../shared's data (published measurements): without ../shared the whole
// executable is skipped (meson's exit code 77), as the GPU tests are without a device (tests/cuda/gpu_main.cpp),
// so a checkout without the data reports SKIP instead of counting cases that returned early as passed.
// With ../shared present every case runs, and a file missing from it is a failure of the case that reads it.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "tests/test_paths.hpp"

int main(int argc, char** argv) {
  if (tessel::test::shared_dir().empty()) {
    std::printf("../shared (or TESSEL_SHARED) is absent: the tests on its data are skipped (exit 77)\n");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
