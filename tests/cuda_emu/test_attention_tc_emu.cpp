// kernels/cuda/attention_tc.cu's own code (the default bf16 attention, the one kernel of the three
// tensor-core ones measured on a GPU), rewritten by emulate_cuda.py onto ptx_emu.hpp and run on the CPU:
// forward and backward against the materialised CPU reference (attention_check.hpp: inputs, reference,
// tolerances), with 4- and 8-warp blocks (64 and 128 rows), on shapes that reach every edge the kernels
// handle: sequence lengths that are not multiples of the block rows or of the 64-key / 32-query tiles, a
// block whose rows are all past the sequence in some warps, GQA groups of 2 and 1, batch 2, head dims 64 and
// 128. Any race, misaligned or unmapped access the emulation detects aborts the run (ptx_emu.hpp).
#include <random>
#include <string>

#include "tests/cuda_emu/attention_check.hpp"

namespace tessel::kernels::cuda::detail {
Status tc_attention_fwd(void* s, const AttentionArgs& a, int block_warps);
Status tc_attention_bwd(void* s, const AttentionArgs& a, int block_warps);
}  // namespace tessel::kernels::cuda::detail

namespace {

namespace kg = tessel::kernels::cuda;
std::mt19937 rng(20261201);

bool check(const tessel::kernels::cpu::AttentionShape& a, int warps) {
  return tessel::test::check_attention(
      rng, a, [&](const kg::AttentionArgs& g) { return kg::detail::tc_attention_fwd(nullptr, g, warps); },
      [&](const kg::AttentionArgs& g) { return kg::detail::tc_attention_bwd(nullptr, g, warps); },
      std::to_string(warps) + " warps", false);
}

}  // namespace

int main() {
  int bad = 0;
  bad += !check({2, 77, 4, 2, 64}, 8);    // batch 2, GQA 2; 77 = 64 + 13 keys, the last warps' rows past S
  bad += !check({1, 150, 2, 1, 128}, 4);  // d 128, one kv head, 3 key tiles (150 = 2 x 64 + 22), 3 row blocks
  bad += !check({1, 45, 2, 2, 64}, 4);    // one partial tile
  return bad == 0 ? 0 : 1;
}
