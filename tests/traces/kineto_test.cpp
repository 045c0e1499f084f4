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

TEST_CASE("nccl_data: the 15 all-reduces and 6 broadcasts with sizes, groups and measured times") {
  std::string path = kineto_file("nccl_parser_config__nccl_data.json.gz");
  if (path.empty()) {
    MESSAGE("skipped: ../shared/traces/kineto is absent");
    return;
  }
  KinetoTrace k = import_kineto(path);
  // Source: ../shared/traces/kineto/README.md and reference/ecosystem.md: rank 0 of 2, A100-PG509-200,
  // 15 x ncclKernel_AllReduce (Float) and 6 x ncclKernel_Broadcast kernels, all with collective args.
  CHECK(k.rank == 0);
  CHECK(k.world_size == 2);
  CHECK(k.device_name == "NVIDIA A100-PG509-200");
  REQUIRE(k.collectives.size() == 21);
  CHECK(k.unattributed_nccl_kernels == 0);
  std::vector<const Collective*> ar;
  for (const auto& c : k.collectives) {
    if (c.name == "allreduce") ar.push_back(&c);
    CHECK(c.group_size == 2);
    CHECK(c.duration_us > 0);
  }
  REQUIRE(ar.size() == 15);
  // The kernel quoted in ecosystem.md: allreduce of 6637568 Float, dur 2636.669 µs; bytes = 6637568 x 4.
  const Collective* quoted = nullptr;
  for (auto* c : ar) {
    if (c->in_nelems == 6637568 && std::abs(c->duration_us - 2636.669) < 1e-6) quoted = c;
  }
  REQUIRE(quoted != nullptr);
  REQUIRE(quoted->bytes.has_value());
  CHECK(*quoted->bytes == doctest::Approx(6637568.0 * 4));
  // Five all-reduce buckets per step whose element counts add up to the model's parameter count:
  // 2049000 + 7875584 + 6563840 + 6637568 + 2431040 = 25,557,032 = ResNet-50's parameters (DDP reduces
  // every gradient once per step). Three profiled steps -> 3 x 25,557,032 elements.
  std::int64_t total = 0;
  for (auto* c : ar) total += c->in_nelems;
  CHECK(total == 3 * 25557032LL);
  // Every all-reduce was launched inside one of the three ProfilerStep#4..#6 annotations.
  REQUIRE(k.steps.size() == 3);
  CHECK(k.steps[0].name == "ProfilerStep#4");
  for (auto* c : ar) CHECK(c->step >= 0);
  // Measured all-reduce time, summed with Python over the kernel events: 46762.159 µs.
  double ar_time = 0;
  for (auto* c : ar) ar_time += c->duration_us;
  constexpr double kSumTol = 1e-6;
  CHECK(ar_time == doctest::Approx(46762.159).epsilon(kSumTol));
  // 3774 GPU events (kernel + gpu_memcpy + gpu_memset); their durations sum to 165185.838 µs.
  CHECK(k.kernels.size() == 3774);
  double all = 0;
  for (const auto& t : k.totals) all += t.total_us;
  CHECK(all == doctest::Approx(165185.838).epsilon(kSumTol));
  // The steps' mean host time: (222442.191 + 219726.905 + 224936.243) / 3 = 222368.446 µs.
  CHECK(k.step_time_us() == doctest::Approx(222368.446).epsilon(kSumTol));
  CHECK(k.exposed_comm_us <= k.comm_us);
  CHECK(k.totals[static_cast<int>(Category::conv)].count > 0);
  CHECK(k.totals[static_cast<int>(Category::memcpy)].count == 960);
}

TEST_CASE("older traces: NCCL kernels without collective args are counted, not guessed") {
  std::string path = kineto_file("trace_filter__sampled_rank-0.json.gz");
  if (path.empty()) {
    MESSAGE("skipped: ../shared/traces/kineto is absent");
    return;
  }
  KinetoTrace k = import_kineto(path);
  // README: 10 ncclKernel_SendRecv kernels, record_param_comms without collective args.
  CHECK(k.collectives.empty());
  CHECK(k.unattributed_nccl_kernels == 10);
  CHECK(k.totals[static_cast<int>(Category::nccl)].count == 10);
}

TEST_CASE("Kineto bad input") {
  CHECK_THROWS_WITH_AS(parse_kineto(R"({"schemaVersion":1,"traceEvents":[]})", "k.json"),
                       doctest::Contains("k.json: no GPU kernels"), InputError);
  CHECK_THROWS_WITH_AS(parse_kineto("{\"schemaVersion\":1", "k.json"), doctest::Contains("k.json:1:"), InputError);
  CHECK(sniff_kineto(R"({"schemaVersion": 1, "traceEvents": [)"));
  CHECK(!sniff_kineto(R"({"otherData":{},"traceEvents":[{"ph":"X","cat":"compute"}]})"));
}
