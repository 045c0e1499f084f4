// The check both emulated tensor-core attention versions run (test_attention_tc2_emu.cpp,
// test_attention_tc3_emu.cpp): seeded q, k, v, dO; the materialised CPU reference (kernels/cpu/attention:
// out, lse, dq, dk, dv); the version's forward and backward on NaN-poisoned outputs, every host buffer
// registered for the emulation's cp.async source check; relative errors within the tolerances below, one
// printed line per case.
#pragma once

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.hpp"
#include "kernels/cuda/status.hpp"
#include "tests/cuda_emu/emu_check.hpp"

namespace emu {
void reg_ext(const void*, std::size_t);  // defined in the rewritten kernel file
}  // namespace emu

namespace tessel::test {

// About twice the errors the emulation gives (deterministic: fixed seed, no atomics) and the first
// version gave on the H200: out 2.4-2.9e-3, lse 1.8-3.9e-4, dq/dk 3.8-4.2e-3, dv 2.8-3.1e-3. The GPU test
// keeps 1e-2 for run-to-run and device differences; here a subtler error than a wrong mask shows.
constexpr double kTolAttnOut = 6e-3, kTolAttnLse = 1e-3, kTolAttnGrad = 8e-3;

using AttnFwd = kernels::cuda::Status (*)(void*, const kernels::cpu::AttentionShape&, const float*, int, const float*,
                                          int, const float*, int, float*, int, float*);
using AttnBwd = kernels::cuda::Status (*)(void*, const kernels::cpu::AttentionShape&, const float*, int, const float*,
                                          int, const float*, int, const float*, int, const float*, const float*, int,
                                          float*, int, float*, int, float*, int, float*);

inline bool check_attention(std::mt19937& rng, const kernels::cpu::AttentionShape& a, AttnFwd fwd, AttnBwd bwd,
                            const std::string& label) {
  namespace kc = kernels::cpu;
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
  auto st = fwd(nullptr, a, q.data(), qd, k.data(), kd, v.data(), kd, o2.data(), qd, l2.data());
  if (st.ok())
    st = bwd(nullptr, a, q.data(), qd, k.data(), kd, v.data(), kd, o2.data(), qd, l2.data(), dout.data(), qd,
             dq2.data(), qd, dk2.data(), kd, dv2.data(), kd, delta.data());
  if (!st.ok()) {
    std::printf("b%d s%d hq%d hkv%d d%d: %s\n", a.batch, a.seq, a.hq, a.hkv, a.d, st.message.c_str());
    return false;
  }
  const double e[5] = {rel_error(o2, out), rel_error(l2, lse), rel_error(dq2, dq), rel_error(dk2, dk), rel_error(dv2, dv)};
  const double tol[5] = {kTolAttnOut, kTolAttnLse, kTolAttnGrad, kTolAttnGrad, kTolAttnGrad};
  bool ok = true;
  for (int i = 0; i < 5; ++i) ok = ok && e[i] <= tol[i];
  std::printf("b%d s%d hq%d hkv%d d%d, %s: rel err out %.2e lse %.2e dq %.2e dk %.2e dv %.2e %s\n", a.batch, a.seq,
              a.hq, a.hkv, a.d, label.c_str(), e[0], e[1], e[2], e[3], e[4], ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace tessel::test
