// kernels/cuda/norm.cu's own code (with colreduce.cuh's column sums), rewritten by emulate_cuda.py onto
// ptx_emu.hpp and run on the CPU: LayerNorm and RMSNorm forward and backward against kernels/cpu/norm with
// the tolerances of tests/cuda/test_kernels.cpp (1e-5 relative for the row results, 1e-4 for the long
// sums), on shapes that reach both row paths (16-byte vectors when cols % 4 == 0, scalar otherwise) and
// the column sums' edges (several 256-row chunks, the last partial; a partial last 32-column block); the
// fused bf16 output and residual add exactly against the kernels' own fp32 results.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu/norm.hpp"
#include "kernels/cuda/status.hpp"
#include "tests/cuda_emu/emu_check.hpp"

struct __nv_bfloat16;  // the rewritten file's 16-bit type; only pointers to it cross this file

namespace tessel::kernels::cuda {
Status layernorm_fwd(void* s, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                     float* rstd, int rows, int cols, float eps, __nv_bfloat16* y16);
Status layernorm_bwd(void* s, const float* dy, const float* x, const float* gamma, const float* mean,
                     const float* rstd, float* dx, float* dgamma, float* dbeta, int rows, int cols, const float* dres);
Status rmsnorm_fwd(void* s, const float* x, const float* gamma, float* y, float* rstd, int rows, int cols, float eps,
                   __nv_bfloat16* y16);
Status rmsnorm_bwd(void* s, const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                   float* dgamma, int rows, int cols, const float* dres);
}  // namespace tessel::kernels::cuda

namespace {

namespace kc = tessel::kernels::cpu;
namespace kg = tessel::kernels::cuda;
using tessel::test::random_vec;
using tessel::test::rel_error;

std::mt19937 rng(20261130);

using tessel::test::bf16_mismatches;
using tessel::test::sum_mismatches;

// The plain contract against kernels/cpu, then the fused extras against the same kernel's plain outputs,
// exactly: the bf16 rows (written beside y, and alone) are y rounded, and dx with a residual is dx + dres.
bool check(int rows, int cols, bool rms) {
  const std::size_t n = std::size_t(rows) * cols;
  const auto x = random_vec(rng, n, -3, 3), g = random_vec(rng, cols, 0.5f, 1.5f), b = random_vec(rng, cols), dy = random_vec(rng, n);
  const auto dg0 = random_vec(rng, cols), db0 = random_vec(rng, cols);  // accumulated into, as parameter gradients are
  const auto dres = random_vec(rng, n);
  std::vector<float> y(n), mu(rows), rs(rows), dx(n), dg = dg0, db = db0;
  std::vector<float> y2(n, NAN), mu2(rows, NAN), rs2(rows, NAN), dx2(n, NAN), dg2 = dg0, db2 = db0, dxr(n, NAN);
  std::vector<std::uint16_t> h(n, 0xffff), h_alone(n, 0xffff);
  auto* h16 = reinterpret_cast<__nv_bfloat16*>(h.data());
  auto* h16_alone = reinterpret_cast<__nv_bfloat16*>(h_alone.data());
  bool ok = true;
  if (rms) {
    kc::rmsnorm_fwd(x.data(), g.data(), y.data(), rs.data(), rows, cols, 1e-5f);
    kc::rmsnorm_bwd(dy.data(), x.data(), g.data(), rs.data(), dx.data(), dg.data(), rows, cols);
    ok = kg::rmsnorm_fwd(nullptr, x.data(), g.data(), y2.data(), rs2.data(), rows, cols, 1e-5f, h16).ok() &&
         kg::rmsnorm_fwd(nullptr, x.data(), g.data(), nullptr, rs2.data(), rows, cols, 1e-5f, h16_alone).ok() &&
         kg::rmsnorm_bwd(nullptr, dy.data(), x.data(), g.data(), rs2.data(), dx2.data(), dg2.data(), rows, cols, nullptr).ok() &&
         kg::rmsnorm_bwd(nullptr, dy.data(), x.data(), g.data(), rs2.data(), dxr.data(), nullptr, rows, cols, dres.data()).ok();
  } else {
    kc::layernorm_fwd(x.data(), g.data(), b.data(), y.data(), mu.data(), rs.data(), rows, cols, 1e-5f);
    kc::layernorm_bwd(dy.data(), x.data(), g.data(), mu.data(), rs.data(), dx.data(), dg.data(), db.data(), rows, cols);
    ok = kg::layernorm_fwd(nullptr, x.data(), g.data(), b.data(), y2.data(), mu2.data(), rs2.data(), rows, cols, 1e-5f, h16).ok() &&
         kg::layernorm_fwd(nullptr, x.data(), g.data(), b.data(), nullptr, mu2.data(), rs2.data(), rows, cols, 1e-5f, h16_alone).ok() &&
         kg::layernorm_bwd(nullptr, dy.data(), x.data(), g.data(), mu2.data(), rs2.data(), dx2.data(), dg2.data(),
                           db2.data(), rows, cols, nullptr).ok() &&
         kg::layernorm_bwd(nullptr, dy.data(), x.data(), g.data(), mu2.data(), rs2.data(), dxr.data(), nullptr, nullptr,
                           rows, cols, dres.data()).ok();
  }
  const double ey = rel_error(y2, y), ers = rel_error(rs2, rs), edx = rel_error(dx2, dx), edg = rel_error(dg2, dg);
  const double emu = rms ? 0.0 : rel_error(mu2, mu), edb = rms ? 0.0 : rel_error(db2, db);
  const std::size_t bad_h = bf16_mismatches(h, y2), bad_alone = bf16_mismatches(h_alone, y2), bad_res = sum_mismatches(dxr, dx2, dres);
  ok = ok && ey <= 1e-5 && ers <= 1e-5 && emu <= 1e-5 && edx <= 1e-4 && edg <= 1e-4 && edb <= 1e-4 && bad_h == 0 &&
       bad_alone == 0 && bad_res == 0;
  std::printf("%s %d x %d: rel err y %.1e rstd %.1e mean %.1e dx %.1e dgamma %.1e dbeta %.1e; bf16 y off %zu (alone %zu), "
              "dx + residual off %zu %s\n",
              rms ? "rmsnorm" : "layernorm", rows, cols, ey, ers, emu, edx, edg, edb, bad_h, bad_alone, bad_res, ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

int main() {
  int bad = 0;
  for (const bool rms : {false, true}) {
    bad += !check(33, 64, rms);   // 16-byte rows
    bad += !check(21, 66, rms);   // scalar rows (66 % 4 != 0)
    bad += !check(520, 100, rms);  // three 256-row chunks (the last 8 rows), columns 96 + a partial block of 4
  }
  return bad == 0 ? 0 : 1;
}
