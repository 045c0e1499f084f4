// PyTorch profiler (Kineto) import, on the real HTA sample traces in ../shared (skipped when absent).
#include <doctest/doctest.h>

#include <filesystem>
#include <numeric>

#include "util/error.hpp"
#include "tests/test_paths.hpp"
#include "traces/kineto.hpp"

using namespace tessel;
using namespace tessel::trace::kineto;

namespace {

std::string kineto_file(const std::string& name) {
  std::string shared = test::shared_dir();
  if (shared.empty()) return "";
  auto p = std::filesystem::path(shared) / "traces" / "kineto" / name;
  return std::filesystem::exists(p) ? p.string() : "";
}

}  // namespace

TEST_CASE("kernel classification by name, collectives by their args") {
  CHECK(classify_kernel("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>", false) == Category::gemm);
  CHECK(classify_kernel("ampere_sgemm_32x32_sliced1x4_tn", false) == Category::gemm);
  CHECK(classify_kernel("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32", false) == Category::conv);
  CHECK(classify_kernel("flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", false) == Category::attention);
  CHECK(classify_kernel("void at::native::vectorized_layer_norm_kernel<float>", false) == Category::norm);
  CHECK(classify_kernel("void cudnn::bn_fw_tr_1C11_singleread<float, 512>", false) == Category::norm);
  CHECK(classify_kernel("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor>", false) == Category::elementwise);
  CHECK(classify_kernel("void at::native::reduce_kernel<512, 1>", false) == Category::reduction);
  // The name is not what makes it a collective: any kernel with a "Collective name" arg is NCCL.
  CHECK(classify_kernel("some_kernel", true) == Category::nccl);
  CHECK(classify_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", false) == Category::nccl);
  CHECK(classify_kernel("my_custom_kernel", false) == Category::other);
  CHECK(dtype_size("Float") == 4);
  CHECK(dtype_size("BFloat16") == 2);
  CHECK(!dtype_size("Quaternion").has_value());
}

TEST_CASE("Kineto bad input") {
  CHECK_THROWS_WITH_AS(parse_kineto(R"({"schemaVersion":1,"traceEvents":[]})", "k.json"),
                       doctest::Contains("k.json: no GPU kernels"), InputError);
  CHECK_THROWS_WITH_AS(parse_kineto("{\"schemaVersion\":1", "k.json"), doctest::Contains("k.json:1:"), InputError);
  CHECK(sniff_kineto(R"({"schemaVersion": 1, "traceEvents": [)"));
  CHECK(!sniff_kineto(R"({"otherData":{},"traceEvents":[{"ph":"X","cat":"compute"}]})"));
}
