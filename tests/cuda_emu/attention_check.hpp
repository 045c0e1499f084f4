// The check every emulated tensor-core attention kernel runs (test_attention_tc_emu.cpp and the
// experimental ones): seeded q, k, v, dO; the materialised CPU reference (kernels/cpu/attention: out, lse,
// dq, dk, dv); the kernel's forward and backward (kernels/cuda/attention_kernels.hpp's functions, on
// AttentionArgs) on NaN-poisoned outputs, every host buffer registered for the emulation's cp.async source
// check; relative errors within the tolerances below, one printed line per case. For kernels that read bf16
// operands, the same calls again on q, k, v, dO rounded to bf16 by the caller: the outputs must equal the
// fp32 call's bit for bit (the fp32 path only adds the rounding pass the runtime skips under bf16 GEMMs).
#pragma once

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.hpp"
#include "kernels/cuda/attention_variant.hpp"
#include "kernels/cuda/status.hpp"
#include "tests/cuda_emu/emu_check.hpp"

namespace emu {
void reg_ext(const void*, std::size_t);  // defined in the rewritten kernel file
}  // namespace emu

namespace tessel::test {

// About twice the errors the emulation gives (deterministic: fixed seed, no atomics) and the tc kernel gave
// on the H200 (bench/h200/tests.log): out 2.4-2.9e-3, lse 1.8-3.9e-4, dq/dk 3.8-4.2e-3, dv 2.8-3.1e-3. The
// GPU test keeps 1e-2 for run-to-run and device differences; here a subtler error than a wrong mask shows.
constexpr double kTolAttnOut = 6e-3, kTolAttnLse = 1e-3, kTolAttnGrad = 8e-3;

using AttnCall = std::function<kernels::cuda::Status(const kernels::cuda::AttentionArgs&)>;

struct AttnOutputs {
  std::vector<float> out, lse, dq, dk, dv;
};

// The forward, then the backward, on fresh NaN-poisoned outputs.
inline kernels::cuda::Status run_attention(const kernels::cuda::AttentionArgs& inputs, std::size_t nq, std::size_t nk,
                                           const AttnCall& fwd, const AttnCall& bwd, AttnOutputs& o) {
  const auto& a = inputs.shape;
  const std::size_t rows = std::size_t(a.batch) * a.hq * a.seq;
  o.out.assign(nq, NAN), o.lse.assign(rows, NAN), o.dq.assign(nq, NAN), o.dk.assign(nk, NAN), o.dv.assign(nk, NAN);
  std::vector<float> delta(rows, NAN);
  for (auto* p : {&o.out, &o.lse, &o.dq, &o.dk, &o.dv, &delta}) emu::reg_ext(p->data(), p->size() * sizeof(float));
  kernels::cuda::AttentionArgs g = inputs;
  g.out = o.out.data(), g.lse = o.lse.data(), g.dq = o.dq.data(), g.dk = o.dk.data(), g.dv = o.dv.data();
  g.delta = delta.data();
  auto st = fwd(g);
  return st.ok() ? bwd(g) : st;
}

inline std::vector<std::uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<std::uint16_t> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) h[i] = bf16_bits(x[i]);
  return h;
}

inline bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// tol: one bound for all five outputs in place of the bf16 ones above (the fp32 kernel's).
inline bool check_attention(std::mt19937& rng, const kernels::cpu::AttentionShape& a, const AttnCall& fwd,
                            const AttnCall& bwd, const std::string& label, bool takes_bf16, double tol_all = 0) {
  namespace kc = kernels::cpu;
  namespace kg = kernels::cuda;
  const int T = a.batch * a.seq, qd = a.hq * a.d, kd = a.hkv * a.d;
  auto q = random_vec(rng, std::size_t(T) * qd, -2, 2), k = random_vec(rng, std::size_t(T) * kd, -2, 2),
       v = random_vec(rng, std::size_t(T) * kd), dout = random_vec(rng, std::size_t(T) * qd);
  std::vector<float> out(q.size()), probs(std::size_t(a.batch) * a.hq * a.seq * a.seq), dq(q.size()), dk(k.size()),
      dv(v.size()), lse(std::size_t(a.batch) * a.hq * a.seq);
  kc::attention_fwd(a, q.data(), qd, k.data(), kd, v.data(), kd, out.data(), qd, probs.data());
  kc::attention_bwd(a, q.data(), qd, k.data(), kd, v.data(), kd, probs.data(), dout.data(), qd, dq.data(), qd, dk.data(),
                    kd, dv.data(), kd);
  kc::attention_lse(a, q.data(), qd, k.data(), kd, lse.data());
  for (auto* p : {&q, &k, &v, &dout}) emu::reg_ext(p->data(), p->size() * sizeof(float));
  kg::AttentionArgs in;
  in.shape = a;
  in.q = q.data(), in.k = k.data(), in.v = v.data(), in.dout = dout.data();
  in.ldq = in.ldo = in.lddo = in.lddq = qd;
  in.ldk = in.ldv = in.lddk = in.lddv = kd;
  AttnOutputs got;
  auto st = run_attention(in, q.size(), k.size(), fwd, bwd, got);
  if (!st.ok()) {
    std::printf("b%d s%d hq%d hkv%d d%d, %s: %s\n", a.batch, a.seq, a.hq, a.hkv, a.d, label.c_str(), st.message.c_str());
    return false;
  }
  const double e[5] = {rel_error(got.out, out), rel_error(got.lse, lse), rel_error(got.dq, dq), rel_error(got.dk, dk),
                       rel_error(got.dv, dv)};
  double tol[5] = {kTolAttnOut, kTolAttnLse, kTolAttnGrad, kTolAttnGrad, kTolAttnGrad};
  if (tol_all > 0)
    for (double& t : tol) t = tol_all;
  bool ok = true;
  for (int i = 0; i < 5; ++i) ok = ok && e[i] <= tol[i];
  std::printf("b%d s%d hq%d hkv%d d%d, %s: rel err out %.2e lse %.2e dq %.2e dk %.2e dv %.2e %s\n", a.batch, a.seq,
              a.hq, a.hkv, a.d, label.c_str(), e[0], e[1], e[2], e[3], e[4], ok ? "ok" : "FAILED");
  if (!takes_bf16) return ok;
  // bf16 operands handed over as they are: dO rounded too, so the fp32 call's delta is recomputed from the
  // rounded dO for the comparison to hold.
  std::vector<float> dout16(dout.size());
  for (std::size_t i = 0; i < dout.size(); ++i) {
    const std::uint32_t u = std::uint32_t(bf16_bits(dout[i])) << 16;
    std::memcpy(&dout16[i], &u, 4);
  }
  const auto qb = to_bf16(q), kb = to_bf16(k), vb = to_bf16(v), ob = to_bf16(dout);
  for (const auto* p : {&qb, &kb, &vb, &ob}) emu::reg_ext(p->data(), p->size() * 2);
  emu::reg_ext(dout16.data(), dout16.size() * sizeof(float));
  AttnOutputs ref, half;
  in.dout = dout16.data();
  st = run_attention(in, q.size(), k.size(), fwd, bwd, ref);
  kg::AttentionArgs hb = in;
  hb.dtype = kg::AttnDtype::bf16;
  hb.q = qb.data(), hb.k = kb.data(), hb.v = vb.data(), hb.dout = ob.data();
  if (st.ok()) st = run_attention(hb, q.size(), k.size(), fwd, bwd, half);
  const bool same = st.ok() && same_bits(half.out, ref.out) && same_bits(half.lse, ref.lse) &&
                    same_bits(half.dq, ref.dq) && same_bits(half.dk, ref.dk) && same_bits(half.dv, ref.dv);
  std::printf("  bf16 operands: %s\n", same ? "bit for bit the fp32 call's (ok)" : (st.ok() ? "DIFFER" : st.message.c_str()));
  return ok && same;
}

}  // namespace tessel::test
