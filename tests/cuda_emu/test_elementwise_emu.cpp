// kernels/cuda/elementwise.cu's own code, rewritten by emulate_cuda.py onto ptx_emu.hpp and run on the CPU:
// GELU and SwiGLU forward and backward (fp32 and bf16 inputs), AdamW, the sum of squares, scale/add/residual-with-bias, the
// bias-gradient column sums (colreduce.cuh: several row chunks, a partial last column block) and bf16
// conversion, against kernels/cpu with the tolerances of tests/cuda/test_kernels.cpp, on the scalar and the
// 16-byte paths; the fused bf16 outputs and adds exactly against the kernels' own fp32 results. Sizes are
// not multiples of any block.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/optimizer.hpp"
#include "kernels/cuda/status.hpp"
#include "tests/cuda_emu/emu_check.hpp"

struct __nv_bfloat16;  // the rewritten file's 16-bit type; only pointers to it cross this file

namespace emu {
long last_threads();  // grid x block of the latest launch (defined in the rewritten file)
}

namespace tessel::kernels::cuda {
Status gelu_fwd(void* s, const float* x, float* y, std::size_t n, __nv_bfloat16* y16);
Status gelu_bwd(void* s, const float* dy, const float* x, float* dx, std::size_t n, __nv_bfloat16* dx16);
Status swiglu_fwd(void* s, const float* gate, const float* up, float* y, std::size_t n, __nv_bfloat16* y16);
Status swiglu_bwd(void* s, const float* dy, const float* gate, const float* up, float* dgate, float* dup, std::size_t n,
                  __nv_bfloat16* dgate16, __nv_bfloat16* dup16);
Status adamw_step(void* s, float* param, const float* grad, float* m, float* v, std::size_t n,
                  const cpu::AdamW& hp, int step, float grad_scale, __nv_bfloat16* param16);
Status sum_squares(void* s, const float* x, std::size_t n, double* out);
Status scale(void* s, float* x, std::size_t n, float factor);
Status add(void* s, const float* a, const float* b, float* out, std::size_t n);
Status residual_add(void* s, const float* a, const float* b, const float* bias, float* out, int rows, int cols);
Status col_sum(void* s, const float* dy, int rows, int cols, float* db);
Status gelu_fwd_bf16(void* s, const __nv_bfloat16* x, __nv_bfloat16* y, std::size_t n);
Status gelu_bwd_bf16(void* s, const __nv_bfloat16* dy, const __nv_bfloat16* x, __nv_bfloat16* dx, std::size_t n);
Status swiglu_fwd_bf16(void* s, const __nv_bfloat16* gate, const __nv_bfloat16* up, __nv_bfloat16* y, std::size_t n);
Status swiglu_bwd_bf16(void* s, const __nv_bfloat16* dy, const __nv_bfloat16* gate, const __nv_bfloat16* up,
                       __nv_bfloat16* dgate, __nv_bfloat16* dup, std::size_t n);
Status col_sum_bf16(void* s, const __nv_bfloat16* dy, int rows, int cols, float* db);
Status to_bf16(void* s, const float* in, __nv_bfloat16* out, std::size_t n);
Status from_bf16(void* s, const __nv_bfloat16* in, float* out, std::size_t n);
}  // namespace tessel::kernels::cuda

namespace {

namespace kc = tessel::kernels::cpu;
namespace kg = tessel::kernels::cuda;
using tessel::test::random_vec;
using tessel::test::rel_error;

std::mt19937 rng(20261201);
int bad = 0;

void expect(const char* what, bool ran, double err, double tol) {
  const bool ok = ran && err <= tol;
  bad += !ok;
  std::printf("  %-34s rel err %.1e (tol %.0e) %s\n", what, err, tol, ok ? "ok" : "FAILED");
}

// 1 when the launch just made did not take the path expected: n / 4 groups of four (the 16-byte kernels)
// or n elements, in 256-thread blocks (a launcher that always fell back to scalar would pass the value
// checks unnoticed).
double path_off(std::size_t n, bool vec) {
  const std::size_t units = vec ? n / 4 : n;
  return emu::last_threads() == long((units + 255) / 256 * 256) ? 0.0 : 1.0;
}

using H = std::vector<std::uint16_t>;
__nv_bfloat16* bf(H& h) { return reinterpret_cast<__nv_bfloat16*>(h.data()); }
double off(const H& h, const std::vector<float>& f) { return double(tessel::test::bf16_mismatches(h, f)); }

// n = 1031 runs the scalar kernels, n = 1032 the 16-byte ones (4 divides n; vectors are 16-byte aligned).
// The fused bf16 outputs are checked bit for bit against the same kernels' fp32 outputs, written beside
// them and alone.
void elementwise(std::size_t n) {
  const auto x = random_vec(rng, n, -5, 5), up = random_vec(rng, n, -2, 2), dy = random_vec(rng, n);
  std::printf("element-wise kernels, n = %zu:\n", n);
  {
    std::vector<float> y(n), dx(n), y2(n, NAN), dx2(n, NAN);
    H y16(n, 0xffff), y16a(n, 0xffff), dx16(n, 0xffff), dx16a(n, 0xffff);
    kc::gelu_fwd(x.data(), y.data(), n);
    kc::gelu_bwd(dy.data(), x.data(), dx.data(), n);
    const bool ran0 = kg::gelu_fwd(nullptr, x.data(), y2.data(), n, bf(y16)).ok();
    expect(n % 4 == 0 ? "gelu took the 16-byte path" : "gelu took the scalar path", ran0, path_off(n, n % 4 == 0), 0.0);
    const bool ran = ran0 && kg::gelu_fwd(nullptr, x.data(), nullptr, n, bf(y16a)).ok() &&
                     kg::gelu_bwd(nullptr, dy.data(), x.data(), dx2.data(), n, bf(dx16)).ok() &&
                     kg::gelu_bwd(nullptr, dy.data(), x.data(), nullptr, n, bf(dx16a)).ok();
    expect("gelu forward", ran, rel_error(y2, y), 1e-5);
    expect("gelu backward", ran, rel_error(dx2, dx), 1e-5);
    expect("gelu fwd bf16 off (beside, alone)", ran, off(y16, y2) + off(y16a, y2), 0.0);
    expect("gelu bwd bf16 off (beside, alone)", ran, off(dx16, dx2) + off(dx16a, dx2), 0.0);
    expect("gelu with no output refused", !kg::gelu_fwd(nullptr, x.data(), nullptr, n, nullptr).ok(), 0.0, 0.0);
  }
  {
    std::vector<float> y(n), dg(n), du(n), y2(n, NAN), dg2(n, NAN), du2(n, NAN);
    H y16(n, 0xffff), dg16(n, 0xffff), du16(n, 0xffff);
    kc::swiglu_fwd(x.data(), up.data(), y.data(), n);
    kc::swiglu_bwd(dy.data(), x.data(), up.data(), dg.data(), du.data(), n);
    const bool ran = kg::swiglu_fwd(nullptr, x.data(), up.data(), y2.data(), n, nullptr).ok() &&
                     kg::swiglu_fwd(nullptr, x.data(), up.data(), nullptr, n, bf(y16)).ok() &&
                     kg::swiglu_bwd(nullptr, dy.data(), x.data(), up.data(), dg2.data(), du2.data(), n, nullptr, nullptr).ok() &&
                     kg::swiglu_bwd(nullptr, dy.data(), x.data(), up.data(), nullptr, nullptr, n, bf(dg16), bf(du16)).ok();
    expect("swiglu forward", ran, rel_error(y2, y), 1e-5);
    expect("swiglu backward (gate)", ran, rel_error(dg2, dg), 1e-5);
    expect("swiglu backward (up)", ran, rel_error(du2, du), 1e-5);
    expect("swiglu bf16 off (y, dgate, dup)", ran, off(y16, y2) + off(dg16, dg2) + off(du16, du2), 0.0);
  }
  {
    // The bf16-input activations (the MLP under bf16 GEMMs): inputs rounded to bf16; the outputs must be
    // bit for bit the fp32-input kernels' bf16 outputs on the widened inputs (the same arithmetic, checked
    // against kernels/cpu above), on the launch path the length and alignment call for.
    H x16(n), up16(n), dy16(n);
    std::vector<float> xw(n), upw(n), dyw(n);
    for (std::size_t i = 0; i < n; ++i) {
      x16[i] = tessel::test::bf16_bits(x[i]), up16[i] = tessel::test::bf16_bits(up[i]), dy16[i] = tessel::test::bf16_bits(dy[i]);
      const std::uint32_t a = std::uint32_t(x16[i]) << 16, b = std::uint32_t(up16[i]) << 16, c = std::uint32_t(dy16[i]) << 16;
      std::memcpy(&xw[i], &a, 4), std::memcpy(&upw[i], &b, 4), std::memcpy(&dyw[i], &c, 4);
    }
    H ref[5], got[5];
    for (int i = 0; i < 5; ++i) ref[i].assign(n, 0xffff), got[i].assign(n, 0x7fbf);  // both poisoned, differently
    bool ran = kg::gelu_fwd(nullptr, xw.data(), nullptr, n, bf(ref[0])).ok() &&
               kg::gelu_bwd(nullptr, dyw.data(), xw.data(), nullptr, n, bf(ref[1])).ok() &&
               kg::swiglu_fwd(nullptr, xw.data(), upw.data(), nullptr, n, bf(ref[2])).ok() &&
               kg::swiglu_bwd(nullptr, dyw.data(), xw.data(), upw.data(), nullptr, nullptr, n, bf(ref[3]), bf(ref[4])).ok();
    const bool ran0 = kg::gelu_fwd_bf16(nullptr, bf(x16), bf(got[0]), n).ok();
    expect(n % 4 == 0 ? "gelu bf16-in took the 8-byte path" : "gelu bf16-in took the scalar path", ran0,
           path_off(n, n % 4 == 0), 0.0);
    ran = ran && ran0 && kg::gelu_bwd_bf16(nullptr, bf(dy16), bf(x16), bf(got[1]), n).ok() &&
          kg::swiglu_fwd_bf16(nullptr, bf(x16), bf(up16), bf(got[2]), n).ok() &&
          kg::swiglu_bwd_bf16(nullptr, bf(dy16), bf(x16), bf(up16), bf(got[3]), bf(got[4]), n).ok();
    double differ = 0;
    for (int i = 0; i < 5; ++i)
      for (std::size_t j = 0; j < n; ++j) differ += got[i][j] != ref[i][j];
    expect("bf16-in activations off (5 outputs)", ran, differ, 0.0);
    std::vector<float> y(n);
    kc::gelu_fwd(xw.data(), y.data(), n);
    std::vector<float> back(n);
    for (std::size_t j = 0; j < n; ++j) {
      const std::uint32_t u = std::uint32_t(got[0][j]) << 16;
      std::memcpy(&back[j], &u, 4);
    }
    expect("gelu bf16-in against the CPU (bf16 rounding)", ran, rel_error(back, y), 4e-3);
    expect("gelu bf16-in with no output refused", !kg::gelu_fwd_bf16(nullptr, bf(x16), nullptr, n).ok(), 0.0, 0.0);
  }
  {
    // Three steps against the CPU optimizer; the third with a clip coefficient, which the kernel applies
    // as it reads the gradient (the reference scales a copy first), and the bf16 parameter copy.
    kc::AdamW hp;
    hp.lr = 3e-3f;
    hp.weight_decay = 0.1f;
    auto p = random_vec(rng, n), m = random_vec(rng, n, -0.01f, 0.01f), v = random_vec(rng, n, 0, 1e-4f);
    auto p2 = p, m2 = m, v2 = v;
    H p16(n, 0xffff);
    bool ran = true;
    for (int step = 1; step <= 3; ++step) {
      const auto g = random_vec(rng, n);
      const float coef = step == 3 ? 0.37f : 1.0f;
      auto gs = g;
      kc::scale(gs.data(), n, coef);
      kc::adamw_step(p.data(), gs.data(), m.data(), v.data(), n, hp, step);
      ran = ran && kg::adamw_step(nullptr, p2.data(), g.data(), m2.data(), v2.data(), n, hp, step, coef,
                                  step == 3 ? bf(p16) : nullptr).ok();
    }
    expect("adamw launch path", ran, path_off(n, n % 4 == 0), 0.0);
    expect("adamw, 3 steps (parameters)", ran, rel_error(p2, p), 1e-5);
    expect("adamw, 3 steps (second moment)", ran, rel_error(v2, v), 1e-5);
    expect("adamw bf16 parameter copy off", ran, off(p16, p2), 0.0);
  }
  {
    double sq = 0;
    const bool ran = kg::sum_squares(nullptr, x.data(), n, &sq).ok();
    expect("sum of squares", ran, std::abs(sq - kc::sum_squares(x.data(), n)) / kc::sum_squares(x.data(), n), 1e-6);
  }
  {
    std::vector<float> a = x, sum2(n, NAN);
    kc::scale(a.data(), n, 0.37f);
    auto a2 = x;
    bool ran = kg::scale(nullptr, a2.data(), n, 0.37f).ok() && kg::add(nullptr, x.data(), up.data(), sum2.data(), n).ok();
    expect("scale", ran, rel_error(a2, a), 1e-7);
    expect("add (elements not the float sum)", ran, double(tessel::test::sum_mismatches(sum2, x, up)), 0.0);
  }
  {
    std::vector<float> in(n), back(n, NAN);
    for (std::size_t i = 0; i < n; ++i) in[i] = x[i] * 1e-3f;
    H h(n, 0xffff);
    const bool ran = kg::to_bf16(nullptr, in.data(), bf(h), n).ok();
    expect("bf16 conversion launch path", ran, path_off(n, n % 4 == 0), 0.0);
    expect("bf16 conversion off", ran, off(h, in), 0.0);
  }
}

}  // namespace

int main() {
  elementwise(1031);
  elementwise(1032);
  {
    // Residual plus bias over [520, 100] and [33, 98] (the 16-byte and the scalar path), then the bias
    // gradient over [520, 100]: three 256-row chunks (the last 8 rows) and a last 32-column block of 4
    // columns.
    for (const int cols : {100, 98}) {
      const int rows = cols == 100 ? 520 : 33;
      const std::size_t n = std::size_t(rows) * cols;
      const auto a = random_vec(rng, n), b = random_vec(rng, n), bias = random_vec(rng, cols);
      std::vector<float> want(n), out(n, NAN), in_place = a;
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          const std::size_t i = std::size_t(r) * cols + c;
          want[i] = (a[i] + b[i]) + bias[c];
        }
      const bool ran0 = kg::residual_add(nullptr, a.data(), b.data(), bias.data(), out.data(), rows, cols).ok();
      expect("residual + bias launch path", ran0, path_off(n, cols % 4 == 0), 0.0);
      const bool ran = ran0 &&
                       kg::residual_add(nullptr, in_place.data(), b.data(), bias.data(), in_place.data(), rows, cols).ok();
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i) wrong += !(out[i] == want[i]) + !(in_place[i] == want[i]);
      expect(cols == 100 ? "residual + bias, 16-byte (off)" : "residual + bias, scalar (off)", ran, double(wrong), 0.0);
    }
    const int rows = 520, cols = 100;
    const auto m = random_vec(rng, std::size_t(rows) * cols), db0 = random_vec(rng, cols);
    std::vector<float> db = db0, db2 = db0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) db[c] += m[std::size_t(r) * cols + c];
    const bool ran = kg::col_sum(nullptr, m.data(), rows, cols, db2.data()).ok();
    expect("bias gradient (column sums)", ran, rel_error(db2, db), 1e-4);
    // From bf16 values: the same sums, in the same order, as col_sum over the widened values.
    H m16(m.size());
    std::vector<float> mw(m.size());
    for (std::size_t i = 0; i < m.size(); ++i) {
      m16[i] = tessel::test::bf16_bits(m[i]);
      const std::uint32_t u = std::uint32_t(m16[i]) << 16;
      std::memcpy(&mw[i], &u, 4);
    }
    std::vector<float> dbw = db0, db16 = db0;
    const bool ran16 = kg::col_sum(nullptr, mw.data(), rows, cols, dbw.data()).ok() &&
                       kg::col_sum_bf16(nullptr, bf(m16), rows, cols, db16.data()).ok();
    std::size_t unequal = 0;
    for (int c = 0; c < cols; ++c) unequal += !(db16[c] == dbw[c]);
    expect("bias gradient from bf16 (off)", ran16, double(unequal), 0.0);
  }
  {
    // Rounding cases with their bf16 bits written out (the emulation's conversion is the formula the
    // device documents, so a computed reference would only repeat it): exact, ties to even both ways,
    // round up, the largest float overflowing to infinity, a negative tie; then NaN, which must stay a NaN
    // (its payload is the implementation's: 0x7FFF on the device, 0x7FC0 here).
    const std::uint32_t in_bits[] = {0x3F800000u, 0x3F808000u, 0x3F818000u, 0x3F808001u, 0x7F7FFFFFu, 0xBF818000u,
                                     0x7FC00000u};
    const std::uint16_t want[] = {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x7F80, 0xBF82};
    const std::size_t k = sizeof(in_bits) / sizeof(in_bits[0]), exact = sizeof(want) / sizeof(want[0]);
    std::vector<float> in(k);
    for (std::size_t i = 0; i < k; ++i) std::memcpy(&in[i], &in_bits[i], 4);
    std::vector<std::uint16_t> h(k, 0);
    const bool ran = kg::to_bf16(nullptr, in.data(), reinterpret_cast<__nv_bfloat16*>(h.data()), k).ok();
    int wrong = 0;
    for (std::size_t i = 0; i < exact; ++i) wrong += h[i] != want[i];
    wrong += !((h[k - 1] & 0x7F80) == 0x7F80 && (h[k - 1] & 0x007F) != 0);
    expect("bf16 rounding, 7 written-out cases", ran, double(wrong), 0.0);
    std::vector<float> back(exact, 0.0f);
    const bool ran2 = kg::from_bf16(nullptr, reinterpret_cast<const __nv_bfloat16*>(want), back.data(), exact).ok();
    int off = 0;
    for (std::size_t i = 0; i < exact; ++i) {
      std::uint32_t u;
      std::memcpy(&u, &back[i], 4);
      off += u != (std::uint32_t(want[i]) << 16);
    }
    expect("bf16 widening, the 6 exact ones", ran2, double(off), 0.0);
  }
  return bad == 0 ? 0 : 1;
}
