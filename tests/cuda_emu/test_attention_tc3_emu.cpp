// kernels/cuda/attention_tc3.cu's own code (the wgmma forward and backward), rewritten by emulate_cuda.py
// onto ptx_emu.hpp and run on the CPU against the materialised CPU reference (kernels/cpu/attention), in
// both shared-memory layouts (no swizzle, 128-byte swizzle), on shapes that reach every edge the kernels
// handle: sequence lengths that are not multiples of the 128-row / 128-key / 64-query / 64-key tiles, a
// second warpgroup whose rows (or keys) are all past the sequence, several streamed tiles (the double
// buffers refilled), GQA groups of 2 and 1, batch 2, head dims 64 and 128. Copies land late (at their wait_group) but once. Any race, misaligned access,
// accumulator read before its wgmma.wait_group or operand overwritten in flight aborts the run
// (ptx_emu.hpp); reading an accumulator early would leave stale values and fail the comparison.
// What this cannot show: whether the hardware reads the descriptors as ptx_emu.hpp does; the GPU test
// (tests/cuda/test_attention.cpp) answers that on the device.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu/attention.hpp"
#include "kernels/cuda/status.hpp"
#include "tests/cuda_emu/emu_check.hpp"

namespace tessel::kernels::cuda {
Status attention_tc3_fwd(void* s, const cpu::AttentionShape& a, const float* q, int ldq, const float* k, int ldk,
                         const float* v, int ldv, float* out, int ldo, float* lse);
Status attention_tc3_set_layout(int swizzle_bytes);
void attention_tc3_set_overlap(bool on);
Status attention_tc3_bwd(void* s, const cpu::AttentionShape& a, const float* q, int ldq, const float* k, int ldk,
                         const float* v, int ldv, const float* out, int ldo, const float* lse, const float* dout,
                         int lddo, float* dq, int lddq, float* dk, int lddk, float* dv, int lddv, float* delta);
}  // namespace tessel::kernels::cuda
namespace emu {
void set_late(int);
void reg_ext(const void*, std::size_t);
}  // namespace emu

namespace {

namespace kc = tessel::kernels::cpu;
namespace kg = tessel::kernels::cuda;
using tessel::test::random_vec;
using tessel::test::rel_error;

// The second version's emulation tolerances (same operand rounding, fp32 accumulation).
constexpr double kTolOut = 6e-3, kTolLse = 1e-3, kTolGrad = 8e-3;
std::mt19937 rng(20261130);

bool check(const kc::AttentionShape& a, int swizzle, bool overlap = false) {
  emu::set_late(1);
  if (!kg::attention_tc3_set_layout(swizzle).ok()) return false;
  kg::attention_tc3_set_overlap(overlap);
  const int T = a.batch * a.seq, qd = a.hq * a.d, kd = a.hkv * a.d;
  auto q = random_vec(rng, std::size_t(T) * qd, -2, 2), k = random_vec(rng, std::size_t(T) * kd, -2, 2),
       v = random_vec(rng, std::size_t(T) * kd), dout = random_vec(rng, std::size_t(T) * qd);
  std::vector<float> out(q.size()), probs(std::size_t(a.batch) * a.hq * a.seq * a.seq), dq(q.size()), dk(k.size()),
      dv(v.size());
  kc::attention_fwd(a, q.data(), qd, k.data(), kd, v.data(), kd, out.data(), qd, probs.data());
  kc::attention_bwd(a, q.data(), qd, k.data(), kd, v.data(), kd, probs.data(), dout.data(), qd, dq.data(), qd, dk.data(),
                    kd, dv.data(), kd);
  std::vector<float> lse(std::size_t(a.batch) * a.hq * a.seq);
  kc::attention_lse(a, q.data(), qd, k.data(), kd, lse.data());
  const std::size_t rows = lse.size();
  std::vector<float> o2(out.size(), NAN), l2(rows, NAN), delta(rows, NAN), dq2(dq.size(), NAN), dk2(dk.size(), NAN),
      dv2(dv.size(), NAN);
  for (auto* p : {&q, &k, &v, &dout, &o2, &l2, &delta, &dq2, &dk2, &dv2}) emu::reg_ext(p->data(), p->size() * sizeof(float));
  auto st = kg::attention_tc3_fwd(nullptr, a, q.data(), qd, k.data(), kd, v.data(), kd, o2.data(), qd, l2.data());
  if (st.ok())
    st = kg::attention_tc3_bwd(nullptr, a, q.data(), qd, k.data(), kd, v.data(), kd, o2.data(), qd, l2.data(),
                               dout.data(), qd, dq2.data(), qd, dk2.data(), kd, dv2.data(), kd, delta.data());
  if (!st.ok()) {
    std::printf("b%d s%d hq%d hkv%d d%d: %s\n", a.batch, a.seq, a.hq, a.hkv, a.d, st.message.c_str());
    return false;
  }
  const double e[5] = {rel_error(o2, out), rel_error(l2, lse), rel_error(dq2, dq), rel_error(dk2, dk), rel_error(dv2, dv)};
  const double tol[5] = {kTolOut, kTolLse, kTolGrad, kTolGrad, kTolGrad};
  bool ok = true;
  for (int i = 0; i < 5; ++i) ok = ok && e[i] <= tol[i];
  std::printf("b%d s%d hq%d hkv%d d%d, swizzle %d%s: rel err out %.2e lse %.2e dq %.2e dk %.2e dv %.2e %s\n", a.batch,
              a.seq, a.hq, a.hkv, a.d, swizzle, overlap ? ", overlapped forward" : "", e[0], e[1], e[2], e[3], e[4],
              ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

int main() {
  int bad = 0;
  for (int swz : {0, 128}) {
    bad += !check({2, 45, 4, 2, 64}, swz);    // batch 2, GQA 2; the second warpgroup's rows all past S
    bad += !check({1, 300, 2, 1, 128}, swz);  // d 128, one kv head, 3 key tiles: 300 = 2 x 128 + 44
  }
  bad += !check({1, 200, 1, 1, 64}, 128);  // d 64, 2 tiles, second warpgroup partly past S
  // The overlapped forward: one tile, and five (the three K/V buffers each refilled), both layouts.
  bad += !check({2, 45, 4, 2, 64}, 128, true);
  bad += !check({1, 520, 2, 1, 64}, 128, true);
  bad += !check({1, 300, 2, 2, 128}, 0, true);
  return bad == 0 ? 0 : 1;
}
