// Runs everywhere (no GPU needed): without a device, `tessel run --backend cuda`'s entry point refuses
// with an InputError (exit 2) that says there is no CUDA device; with one, it is skipped here (the GPU
// tests cover that case).
#include <doctest/doctest.h>

#include "util/error.hpp"
#include "runtime/cuda/run_cuda.hpp"

using namespace tessel;

TEST_CASE("run_cuda without a GPU says so as bad input" * doctest::skip(rt::cuda::cuda_devices() > 0)) {
  rt::cuda::CudaRunOptions o;
  o.model = load_model("tiny");
  o.layout.global_batch = 2;
  CHECK_THROWS_WITH_AS(rt::cuda::run_cuda(o), doctest::Contains("no CUDA device"), InputError);
}
