// kernels/cuda/attention.cu's own code (the fp32 variant: the GPU path's reference and the --precision fp32
// kernel), rewritten by emulate_cuda.py onto ptx_emu.hpp and run on the CPU against the materialised CPU
// reference (attention_check.hpp's inputs and report), on head dims of every tile width (1 to 4 columns a
// lane), GQA groups of 1, 2 and 3, batch 2 and sequence lengths that are not multiples of the 16-row /
// 32-key tiles. fp32 throughout, so its bound is the GPU test's fp32 one (kTolFp32Reduction, 1e-4 in
// tests/cuda/gpu_util.hpp: summation order and exp/log chains only).
#include <random>

#include "tests/cuda_emu/attention_check.hpp"

namespace tessel::kernels::cuda::detail {
Status fp32_attention_fwd(void* s, const AttentionArgs& a);
Status fp32_attention_bwd(void* s, const AttentionArgs& a);
}  // namespace tessel::kernels::cuda::detail

namespace {

namespace kg = tessel::kernels::cuda;
std::mt19937 rng(20261202);

bool check(const tessel::kernels::cpu::AttentionShape& a) {
  return tessel::test::check_attention(
      rng, a, [](const kg::AttentionArgs& g) { return kg::detail::fp32_attention_fwd(nullptr, g); },
      [](const kg::AttentionArgs& g) { return kg::detail::fp32_attention_bwd(nullptr, g); }, "fp32", false, 1e-4);
}

}  // namespace

int main() {
  int bad = 0;
  bad += !check({2, 37, 4, 2, 16});  // batch 2, GQA 2, one column a lane; 37 = 2 x 16 + 5 rows
  bad += !check({1, 70, 6, 2, 96});  // GQA 3, three columns a lane, 3 key tiles
  bad += !check({1, 33, 2, 2, 128}); // four columns a lane
  return bad == 0 ? 0 : 1;
}
