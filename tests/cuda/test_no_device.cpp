// Runs everywhere (no GPU needed): without a device, `tessel run --backend cuda`'s entry point and
// `tessel bench --backend cuda` refuse with an InputError (exit 2) that says there is no CUDA device; with
// one, they are skipped here (the GPU tests and tools/device-check.sh cover that case).
#include <doctest/doctest.h>

#include "util/error.hpp"
#include "runtime/cuda/run_cuda.hpp"
#include "tests/tools/run_util.hpp"

using namespace tessel;

TEST_CASE("run_cuda without a GPU says so as bad input" * doctest::skip(rt::cuda::cuda_devices() > 0)) {
  rt::cuda::CudaRunOptions o;
  o.model = load_model("tiny");
  o.layout.global_batch = 2;
  CHECK_THROWS_WITH_AS(rt::cuda::run_cuda(o), doctest::Contains("no CUDA device"), InputError);
}

// The built tessel of this CUDA build: bench --backend cuda is compiled in (not "not available in this
// build"), finds no device and says so, exit 2, before writing any document on stdout.
TEST_CASE("tessel bench --backend cuda without a GPU exits 2 saying so" * doctest::skip(rt::cuda::cuda_devices() > 0)) {
  const auto r = tessel::test::run_tessel({"bench", "--backend", "cuda", "--json"});
  CHECK(r.code == 2);
  CHECK(r.err.find("--backend cuda: no CUDA device") != std::string::npos);
  CHECK(r.out.empty());
}
