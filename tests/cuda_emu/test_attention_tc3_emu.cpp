// kernels/cuda/experimental/attention_tc3.cu's own code (the wgmma forward and backward), rewritten by emulate_cuda.py
// onto ptx_emu.hpp and run on the CPU against the materialised CPU reference (kernels/cpu/attention), in
// both shared-memory layouts (no swizzle, 128-byte swizzle), on shapes that reach every edge the kernels
// handle (and bf16 operands handed over as they are, bit for bit the fp32 call's): sequence lengths that are not multiples of the 128-row / 128-key / 64-query / 64-key tiles, a
// second warpgroup whose rows (or keys) are all past the sequence, several streamed tiles (the double
// buffers refilled), GQA groups of 2 and 1, batch 2, head dims 64 and 128. Copies land late (at their wait_group) but once. Any race, misaligned access,
// accumulator read before its wgmma.wait_group or operand overwritten in flight aborts the run
// (ptx_emu.hpp); reading an accumulator early would leave stale values and fail the comparison.
// What this cannot show: whether the hardware reads the descriptors as ptx_emu.hpp does; the GPU test
// (tests/cuda/test_attention.cpp) answers that on the device.
#include <random>
#include <string>

#include "tests/cuda_emu/attention_check.hpp"

namespace tessel::kernels::cuda::detail {
Status tc3_attention_fwd(void* s, const AttentionArgs& a, int swizzle, bool overlap);
Status tc3_attention_bwd(void* s, const AttentionArgs& a, int swizzle);
}  // namespace tessel::kernels::cuda::detail
namespace emu {
void set_late(int);  // defined in the rewritten file
}  // namespace emu

namespace {

namespace kg = tessel::kernels::cuda;
std::mt19937 rng(20261130);

// The second version's tolerances (same operand rounding, fp32 accumulation): attention_check.hpp's.
bool check(const tessel::kernels::cpu::AttentionShape& a, int swizzle, bool overlap = false, bool bf16_operands = false) {
  emu::set_late(1);
  return tessel::test::check_attention(
      rng, a, [=](const kg::AttentionArgs& g) { return kg::detail::tc3_attention_fwd(nullptr, g, swizzle, overlap); },
      [=](const kg::AttentionArgs& g) { return kg::detail::tc3_attention_bwd(nullptr, g, swizzle); },
      "swizzle " + std::to_string(swizzle) + (overlap ? ", overlapped forward" : ""), bf16_operands);
}

}  // namespace

int main() {
  int bad = 0;
  for (int swz : {0, 128}) {
    bad += !check({2, 45, 4, 2, 64}, swz);    // batch 2, GQA 2; the second warpgroup's rows all past S
    bad += !check({1, 300, 2, 1, 128}, swz);  // d 128, one kv head, 3 key tiles: 300 = 2 x 128 + 44
  }
  bad += !check({1, 200, 1, 1, 64}, 128, false, true);  // d 64, 2 tiles, second warpgroup partly past S; bf16 operands
  // The overlapped forward: one tile, and five (the three K/V buffers each refilled), both layouts.
  bad += !check({2, 45, 4, 2, 64}, 128, true);
  bad += !check({1, 520, 2, 1, 64}, 128, true);
  bad += !check({1, 300, 2, 2, 128}, 0, true);
  return bad == 0 ? 0 : 1;
}
