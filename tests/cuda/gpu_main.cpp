// doctest main for the GPU tests: without a CUDA device the whole executable is skipped (meson's exit
// code 77), so CPU-only CI passes and says "SKIP" rather than pretending a GPU test ran.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "kernels/cuda/device_info.hpp"

int main(int argc, char** argv) {
  if (tessel::kernels::cuda::device_count() == 0) {
    std::printf("no CUDA device: GPU tests skipped (exit 77)\n");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
