// kernels/cuda/experimental/attention_tc2.cu's own code, rewritten by emulate_cuda.py onto ptx_emu.hpp and run on the
// CPU: forward and backward against the materialised CPU reference (attention_check.hpp: inputs,
// reference, tolerances), on shapes that reach every
// edge the kernels handle: sequence lengths that are not multiples of the 64-row / 64-key / 32-query
// tiles, GQA groups of 2 and 1, batch 2, head dims 64 and 128. cp.async lands late (at its wait_group) in
// every case and early (at issue) once: the results must not depend on when copies land; bf16 operands
// handed over as they are give the fp32 call's results bit for bit. Any race,
// misaligned or unmapped access the emulation detects aborts the run (ptx_emu.hpp).
#include <random>

#include "tests/cuda_emu/attention_check.hpp"

namespace tessel::kernels::cuda::detail {
Status tc2_attention_fwd(void* s, const AttentionArgs& a);
Status tc2_attention_bwd(void* s, const AttentionArgs& a);
}  // namespace tessel::kernels::cuda::detail
namespace emu {
void set_late(int);  // defined in the rewritten file
}  // namespace emu

namespace {

namespace kg = tessel::kernels::cuda;
std::mt19937 rng(20261129);

bool check(const tessel::kernels::cpu::AttentionShape& a, int late, bool bf16_operands = false) {
  emu::set_late(late);
  return tessel::test::check_attention(
      rng, a, [](const kg::AttentionArgs& g) { return kg::detail::tc2_attention_fwd(nullptr, g); },
      [](const kg::AttentionArgs& g) { return kg::detail::tc2_attention_bwd(nullptr, g); },
      late ? "cp.async lands at its wait" : "cp.async lands at issue", bf16_operands);
}

}  // namespace

int main() {
  int bad = 0;
  bad += !check({2, 77, 4, 2, 64}, 1, true);  // batch 2, GQA 2, 77 = 64 + 13 rows; bf16 operands too
  bad += !check({1, 150, 2, 1, 128}, 1);  // d 128, GQA 2 (one kv head), 3 key tiles: 150 = 2 x 64 + 22
  bad += !check({1, 45, 2, 2, 64}, 0);   // one partial tile, copies landing at issue
  return bad == 0 ? 0 : 1;
}
