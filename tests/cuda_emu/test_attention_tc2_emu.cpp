// kernels/cuda/attention_tc2.cu's own code, rewritten by emulate_cuda.py onto ptx_emu.hpp and run on the
// CPU: forward and backward against the materialised CPU reference (attention_check.hpp: inputs,
// reference, tolerances), on shapes that reach every
// edge the kernels handle: sequence lengths that are not multiples of the 64-row / 64-key / 32-query
// tiles, GQA groups of 2 and 1, batch 2, head dims 64 and 128. cp.async lands late (at its wait_group) in
// every case and early (at issue) once: the results must not depend on when copies land. Any race,
// misaligned or unmapped access the emulation detects aborts the run (ptx_emu.hpp).
#include <random>

#include "tests/cuda_emu/attention_check.hpp"

namespace tessel::kernels::cuda {
Status attention_tc2_bwd(void* s, const cpu::AttentionShape& a, const float* q, int ldq, const float* k, int ldk,
                         const float* v, int ldv, const float* out, int ldo, const float* lse, const float* dout,
                         int lddo, float* dq, int lddq, float* dk, int lddk, float* dv, int lddv, float* delta);
Status attention_tc2_fwd(void* s, const cpu::AttentionShape& a, const float* q, int ldq, const float* k, int ldk,
                         const float* v, int ldv, float* out, int ldo, float* lse);
}  // namespace tessel::kernels::cuda
namespace emu {
void set_late(int);  // defined in the rewritten file
}  // namespace emu

namespace {

namespace kg = tessel::kernels::cuda;
std::mt19937 rng(20261129);

bool check(const tessel::kernels::cpu::AttentionShape& a, int late) {
  emu::set_late(late);
  return tessel::test::check_attention(rng, a, kg::attention_tc2_fwd, kg::attention_tc2_bwd,
                                       late ? "cp.async lands at its wait" : "cp.async lands at issue");
}

}  // namespace

int main() {
  int bad = 0;
  bad += !check({2, 77, 4, 2, 64}, 1);   // batch 2, GQA 2, 77 = 64 + 13 rows
  bad += !check({1, 150, 2, 1, 128}, 1);  // d 128, GQA 2 (one kv head), 3 key tiles: 150 = 2 x 64 + 22
  bad += !check({1, 45, 2, 2, 64}, 0);   // one partial tile, copies landing at issue
  return bad == 0 ? 0 : 1;
}
