// Each element-wise / row-wise CUDA kernel against its CPU reference (kernels/cpu) on fresh random inputs,
// outputs poisoned with NaN first. Expected values: the CPU reference itself (double-accumulating where it
// sums), so the tolerance bounds only fp32 rounding and summation order (gpu_util.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/optimizer.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cuda/kernels.hpp"
#include "tests/cuda/gpu_util.hpp"

namespace kc = tessel::kernels::cpu;
namespace kg = tessel::kernels::cuda;
using namespace tessel::test;

TEST_SUITE("gpu") {

TEST_CASE("layernorm and rmsnorm forward and backward match the CPU reference") {
  // 1031 x 300: five 256-row chunks of the parameter-gradient column sums (the last partial), and a last
  // 32-column block with 12 columns. 21 x 66: cols not a multiple of 4, so the scalar row path (the others
  // take the 16-byte one).
  for (const auto& rc : {std::pair{33, 64}, std::pair{128, 1000}, std::pair{7, 4096}, std::pair{1031, 300},
                         std::pair{21, 66}}) {
    const int rows = rc.first, cols = rc.second;  // no structured binding: clang cannot capture one in CAPTURE
    CAPTURE(rows);
    CAPTURE(cols);
    const std::size_t n = std::size_t(rows) * cols;
    const auto x = random_vec(n, -3, 3), g = random_vec(cols, 0.5f, 1.5f), b = random_vec(cols), dy = random_vec(n);
    const auto dg0 = random_vec(cols), db0 = random_vec(cols);  // accumulate into non-zero gradients
    for (const bool rms : {false, true}) {
      CAPTURE(rms);
      std::vector<float> y(n), mu(rows), rs(rows), dx(n), dg = dg0, db = db0;
      if (rms) {
        kc::rmsnorm_fwd(x.data(), g.data(), y.data(), rs.data(), rows, cols, 1e-5f);
        kc::rmsnorm_bwd(dy.data(), x.data(), g.data(), rs.data(), dx.data(), dg.data(), rows, cols);
      } else {
        kc::layernorm_fwd(x.data(), g.data(), b.data(), y.data(), mu.data(), rs.data(), rows, cols, 1e-5f);
        kc::layernorm_bwd(dy.data(), x.data(), g.data(), mu.data(), rs.data(), dx.data(), dg.data(), db.data(), rows, cols);
      }
      DeviceBuf<float> dX(x), dG(g), dB(b), dDY(dy), dY(n), dMU(rows), dRS(rows), dDX(n), dDG(dg0), dDB(db0);
      if (rms) {
        REQUIRE_OK(kg::rmsnorm_fwd(nullptr, dX, dG, dY, dRS, rows, cols, 1e-5f));
        REQUIRE_OK(kg::rmsnorm_bwd(nullptr, dDY, dX, dG, dRS, dDX, dDG, rows, cols));
      } else {
        REQUIRE_OK(kg::layernorm_fwd(nullptr, dX, dG, dB, dY, dMU, dRS, rows, cols, 1e-5f));
        REQUIRE_OK(kg::layernorm_bwd(nullptr, dDY, dX, dG, dMU, dRS, dDX, dDG, dDB, rows, cols));
        CHECK_CLOSE(dMU.download(), mu, kTolFp32);
        CHECK_CLOSE(dDB.download(), db, kTolFp32Reduction);
      }
      CHECK_CLOSE(dY.download(), y, kTolFp32);
      CHECK_CLOSE(dRS.download(), rs, kTolFp32);
      CHECK_CLOSE(dDX.download(), dx, kTolFp32Reduction);
      CHECK_CLOSE(dDG.download(), dg, kTolFp32Reduction);
    }
  }
}

TEST_CASE("GELU and SwiGLU forward and backward match the CPU reference") {
  const std::size_t n = 100003;  // not a multiple of any block size
  const auto x = random_vec(n, -5, 5), up = random_vec(n, -2, 2), dy = random_vec(n);
  std::vector<float> y(n), dx(n), ys(n), dgate(n), dup(n);
  kc::gelu_fwd(x.data(), y.data(), n);
  kc::gelu_bwd(dy.data(), x.data(), dx.data(), n);
  kc::swiglu_fwd(x.data(), up.data(), ys.data(), n);
  kc::swiglu_bwd(dy.data(), x.data(), up.data(), dgate.data(), dup.data(), n);
  DeviceBuf<float> dX(x), dUP(up), dDY(dy), dY(n), dDX(n), dYS(n), dDG(n), dDU(n);
  REQUIRE_OK(kg::gelu_fwd(nullptr, dX, dY, n));
  REQUIRE_OK(kg::gelu_bwd(nullptr, dDY, dX, dDX, n));
  REQUIRE_OK(kg::swiglu_fwd(nullptr, dX, dUP, dYS, n));
  REQUIRE_OK(kg::swiglu_bwd(nullptr, dDY, dX, dUP, dDG, dDU, n));
  CHECK_CLOSE(dY.download(), y, kTolFp32);
  CHECK_CLOSE(dDX.download(), dx, kTolFp32);
  CHECK_CLOSE(dYS.download(), ys, kTolFp32);
  CHECK_CLOSE(dDG.download(), dgate, kTolFp32);
  CHECK_CLOSE(dDU.download(), dup, kTolFp32);
}

TEST_CASE("rotary embedding forward and backward match the CPU reference, padded rows included") {
  // Expected: kernels::cpu::rope_fwd/rope_bwd on the same data and the same host table (rope_table, uploaded
  // as is). Both compute each output as two rounded products and one rounded sum, so they should agree to
  // the last bit; the bound is the fp32 one of the other element-wise cases. In place, so "poisoning the
  // output" means: the ld - heads * d padding columns of every row are NaN on the device; a kernel that
  // reads them produces NaN (rel_error -> inf), one that writes them is caught by the padding check.
  struct Case {
    int batch, seq, heads, d, pad;
    double theta;
  };
  for (const Case c : {Case{3, 37, 4, 64, 8, 10000.0}, Case{2, 4096, 2, 128, 0, 500000.0}, Case{5, 8, 3, 2, 1, 100.0}}) {
    CAPTURE(c.seq);
    CAPTURE(c.d);
    const int rows = c.batch * c.seq, ld = c.heads * c.d + c.pad;
    const std::size_t n = std::size_t(rows) * ld;
    const kc::RopeTable t = kc::rope_table(c.seq, c.d, c.theta);
    auto x = random_vec(n, -2, 2), dy = random_vec(n, -2, 2);
    for (int r = 0; r < rows; ++r)  // NaN padding, on the host and so on the device
      for (int col = c.heads * c.d; col < ld; ++col)
        x[std::size_t(r) * ld + col] = dy[std::size_t(r) * ld + col] = std::numeric_limits<float>::quiet_NaN();
    DeviceBuf<float> dX(x), dDY(dy), dCOS(t.cos), dSIN(t.sin);
    const kg::RopeTableView view{dCOS, dSIN, t.seq, t.d};
    REQUIRE_OK(kg::rope_fwd(nullptr, view, dX, rows, c.heads, ld));
    REQUIRE_OK(kg::rope_bwd(nullptr, view, dDY, rows, c.heads, ld));
    auto gx = dX.download(), gdy = dDY.download();
    kc::rope_fwd(t, x.data(), rows, c.heads, ld);
    kc::rope_bwd(t, dy.data(), rows, c.heads, ld);
    int pad_changed = 0;  // padding must still be NaN; then compare the head columns only
    std::vector<float> hx, hgx, hdy, hgdy;
    for (int r = 0; r < rows; ++r)
      for (int col = 0; col < ld; ++col) {
        const std::size_t i = std::size_t(r) * ld + col;
        if (col >= c.heads * c.d) {
          pad_changed += !std::isnan(gx[i]) || !std::isnan(gdy[i]);
          continue;
        }
        hx.push_back(x[i]);
        hgx.push_back(gx[i]);
        hdy.push_back(dy[i]);
        hgdy.push_back(gdy[i]);
      }
    CHECK(pad_changed == 0);
    CHECK_CLOSE(hgx, hx, kTolFp32);
    CHECK_CLOSE(hgdy, hdy, kTolFp32);
  }
  // The launcher refuses what the CPU reference's check refuses: rows not a multiple of seq, odd d, short ld.
  const kc::RopeTable t = kc::rope_table(8, 4, 100.0);
  DeviceBuf<float> dCOS(t.cos), dSIN(t.sin), dX(64);
  const kg::RopeTableView view{dCOS, dSIN, t.seq, t.d};
  CHECK_FALSE(kg::rope_fwd(nullptr, view, dX, 12, 1, 4).ok());
  CHECK_FALSE(kg::rope_fwd(nullptr, kg::RopeTableView{dCOS, dSIN, 8, 3}, dX, 8, 1, 4).ok());
  CHECK_FALSE(kg::rope_bwd(nullptr, view, dX, 8, 2, 4).ok());
}

TEST_CASE("softmax cross-entropy forward and backward match the CPU reference, whole and sharded vocabulary") {
  const int rows = 37, vocab = 5003;
  for (const int start : {0, 1000}) {  // start 1000: a shard; targets below it contribute no target logit
    CAPTURE(start);
    const auto z = random_vec(std::size_t(rows) * vocab, -8, 8), dl = random_vec(rows);
    const auto t = random_tokens(rows, vocab + start);
    std::vector<float> loss(rows), mx(rows), sm(rows), dz(z.size());
    kc::cross_entropy_fwd(z.data(), rows, vocab, start, t.data(), loss.data(), mx.data(), sm.data(), nullptr);
    kc::cross_entropy_bwd(z.data(), rows, vocab, start, t.data(), mx.data(), sm.data(), dl.data(), dz.data());
    DeviceBuf<float> dZ(z), dDL(dl), dLOSS(rows), dMX(rows), dSM(rows), dDZ(z.size());
    DeviceBuf<std::int32_t> dT(t);
    REQUIRE_OK(kg::cross_entropy_fwd(nullptr, dZ, rows, vocab, start, dT, dLOSS, dMX, dSM));
    REQUIRE_OK(kg::cross_entropy_bwd(nullptr, dZ, rows, vocab, start, dT, dMX, dSM, dDL, dDZ));
    CHECK_CLOSE(dLOSS.download(), loss, kTolFp32Reduction);
    CHECK_CLOSE(dMX.download(), mx, kTolFp32);
    CHECK_CLOSE(dSM.download(), sm, kTolFp32Reduction);
    CHECK_CLOSE(dDZ.download(), dz, kTolFp32Reduction);
  }
}

// tp = 3 shards of one vocabulary, each a slice of the full logits, through the three passes with the
// all-reduces done here on the host (max, then sum): loss, statistics and every shard's dlogits must equal
// the single-shard CPU reference over the whole vocabulary. Targets fall in every shard.
TEST_CASE("vocab-parallel cross-entropy passes over three shards match the whole-vocabulary reference") {
  const int rows = 37, vocab = 3 * 1001, shards = 3, vl = vocab / shards;
  const auto z = random_vec(std::size_t(rows) * vocab, -8, 8), dl = random_vec(rows);
  auto t = random_tokens(rows, vocab);
  const std::int32_t edges[] = {0, vl - 1, vl, 2 * vl - 1, 2 * vl, 3 * vl - 1};  // each shard's first and last column
  std::copy(std::begin(edges), std::end(edges), t.begin());
  std::vector<float> loss(rows), mx(rows), sm(rows), dz(z.size());
  kc::cross_entropy_fwd(z.data(), rows, vocab, 0, t.data(), loss.data(), mx.data(), sm.data(), nullptr);
  kc::cross_entropy_bwd(z.data(), rows, vocab, 0, t.data(), mx.data(), sm.data(), dl.data(), dz.data());
  std::vector<std::vector<float>> zs(shards);
  for (int k = 0; k < shards; ++k)
    for (int r = 0; r < rows; ++r)
      zs[k].insert(zs[k].end(), z.begin() + std::size_t(r) * vocab + k * vl, z.begin() + std::size_t(r) * vocab + (k + 1) * vl);
  DeviceBuf<std::int32_t> dT(t);
  std::vector<float> gmax(rows, -std::numeric_limits<float>::infinity()), gsums(2 * std::size_t(rows), 0.0f);
  for (int k = 0; k < shards; ++k) {  // pass 1 on every shard, then the max all-reduce
    DeviceBuf<float> dZ(zs[k]), dMX(rows);
    REQUIRE_OK(kg::cross_entropy_max(nullptr, dZ, rows, vl, dMX));
    const auto m = dMX.download();
    for (int r = 0; r < rows; ++r) gmax[r] = std::max(gmax[r], m[r]);
  }
  CHECK_CLOSE(gmax, mx, kTolFp32);
  DeviceBuf<float> dGMAX(gmax);
  for (int k = 0; k < shards; ++k) {  // pass 2, then the sum all-reduce
    DeviceBuf<float> dZ(zs[k]), dSUMS(2 * std::size_t(rows));
    REQUIRE_OK(kg::cross_entropy_partial(nullptr, dZ, rows, vl, k * vl, dT, dGMAX, dSUMS));
    const auto p = dSUMS.download();
    for (std::size_t i = 0; i < p.size(); ++i) gsums[i] += p[i];
  }
  CHECK_CLOSE(std::vector<float>(gsums.begin(), gsums.begin() + rows), sm, kTolFp32Reduction);
  DeviceBuf<float> dSUMS(gsums), dLOSS(rows);
  REQUIRE_OK(kg::cross_entropy_loss(nullptr, rows, dGMAX, dSUMS, dLOSS));
  CHECK_CLOSE(dLOSS.download(), loss, kTolFp32Reduction);
  DeviceBuf<float> dDL(dl), dSM(std::vector<float>(gsums.begin(), gsums.begin() + rows));
  for (int k = 0; k < shards; ++k) {  // the backward needs only the reduced statistics
    CAPTURE(k);
    DeviceBuf<float> dZ(zs[k]), dDZ(zs[k].size());
    REQUIRE_OK(kg::cross_entropy_bwd(nullptr, dZ, rows, vl, k * vl, dT, dGMAX, dSM, dDL, dDZ));
    std::vector<float> want;
    for (int r = 0; r < rows; ++r)
      want.insert(want.end(), dz.begin() + std::size_t(r) * vocab + k * vl, dz.begin() + std::size_t(r) * vocab + (k + 1) * vl);
    CHECK_CLOSE(dDZ.download(), want, kTolFp32Reduction);
  }
}

TEST_CASE("embedding forward and backward match the CPU reference, repeated tokens included") {
  const int vocab = 300, start = 100, dim = 96, n = 517;
  const auto table = random_vec(std::size_t(vocab) * dim), dout = random_vec(std::size_t(n) * dim);
  const auto dt0 = random_vec(table.size());
  const auto tok = random_tokens(n, 500);  // ids outside [100, 400) belong to other shards
  std::vector<float> out(std::size_t(n) * dim), dt = dt0;
  kc::embedding_fwd(table.data(), vocab, start, dim, tok.data(), n, out.data());
  kc::embedding_bwd(dout.data(), vocab, start, dim, tok.data(), n, dt.data());
  DeviceBuf<float> dTAB(table), dOUT(out.size()), dDOUT(dout), dDT(dt0);
  DeviceBuf<std::int32_t> dTOK(tok);
  REQUIRE_OK(kg::embedding_fwd(nullptr, dTAB, vocab, start, dim, dTOK, n, dOUT));
  REQUIRE_OK(kg::embedding_bwd(nullptr, dDOUT, vocab, start, dim, dTOK, n, dDT));
  CHECK_CLOSE(dOUT.download(), out, kTolFp32);
  CHECK_CLOSE(dDT.download(), dt, kTolFp32);
  // From the table's bf16 copy: the fp32 lookup of the widened table, exactly.
  DeviceBuf<__nv_bfloat16> hTAB(table.size());
  DeviceBuf<float> wTAB(table.size()), dWANT(out.size()), dOUT16(out.size());
  REQUIRE_OK(kg::to_bf16(nullptr, dTAB, hTAB, table.size()));
  REQUIRE_OK(kg::from_bf16(nullptr, hTAB, wTAB, table.size()));
  REQUIRE_OK(kg::embedding_fwd(nullptr, wTAB, vocab, start, dim, dTOK, n, dWANT));
  REQUIRE_OK(kg::embedding_fwd_bf16(nullptr, hTAB, vocab, start, dim, dTOK, n, dOUT16));
  CHECK(dOUT16.download() == dWANT.download());
}

TEST_CASE("AdamW steps match the CPU reference") {
  const std::size_t n = 65537;
  kc::AdamW hp;
  hp.lr = 3e-3f;
  hp.weight_decay = 0.1f;
  auto p = random_vec(n), m = random_vec(n, -0.01f, 0.01f), v = random_vec(n, 0, 1e-4f);
  DeviceBuf<float> dP(p), dM(m), dV(v), dG(n);
  for (int step = 1; step <= 3; ++step) {
    const auto g = random_vec(n);
    dG.upload(g);
    kc::adamw_step(p.data(), g.data(), m.data(), v.data(), n, hp, step);
    REQUIRE_OK(kg::adamw_step(nullptr, dP, dG, dM, dV, n, hp, step));
  }
  CHECK_CLOSE(dP.download(), p, kTolFp32);
  CHECK_CLOSE(dM.download(), m, kTolFp32);
  CHECK_CLOSE(dV.download(), v, kTolFp32);
  CHECK_FALSE(kg::adamw_step(nullptr, dP, dG, dM, dV, n, hp, 0).ok());  // steps count from 1
}

TEST_CASE("reductions: sum of squares, column sums, block sum/max, bf16 round trip") {
  const std::size_t n = 1 << 20;
  const auto x = random_vec(n);
  DeviceBuf<float> dX(x);
  DeviceBuf<double> dS(1, false);
  REQUIRE(cudaMemset(dS.get(), 0, sizeof(double)) == cudaSuccess);
  REQUIRE_OK(kg::sum_squares(nullptr, dX, n, dS));
  const double expect = kc::sum_squares(x.data(), n);  // double sum on the CPU
  CHECK(dS.download()[0] == doctest::Approx(expect).epsilon(kTolFp32));

  // col_sum: db[c] += sum_r x[r, c] over the first rows*cols values. 511 rows, not 513: 513 * 2048 is 2048
  // more than n, and both sides read past x (the H200 reported an illegal address, error 700).
  const int rows = 511, cols = 2048;
  REQUIRE(std::size_t(rows) * cols <= n);
  std::vector<float> db = random_vec(cols);
  DeviceBuf<float> dDB(db);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) db[c] += x[std::size_t(r) * cols + c];
  REQUIRE_OK(kg::col_sum(nullptr, dX, rows, cols, dDB));
  CHECK_CLOSE(dDB.download(), db, kTolFp32Reduction);
  {  // a partial last chunk (700 = 2 x 256 + 188 rows) and a partial last column block (333 = 10 x 32 + 13)
    const int r2 = 700, c2 = 333;
    std::vector<float> db2 = random_vec(c2);
    DeviceBuf<float> dDB2(db2);
    for (int r = 0; r < r2; ++r)
      for (int c = 0; c < c2; ++c) db2[c] += x[std::size_t(r) * c2 + c];
    REQUIRE_OK(kg::col_sum(nullptr, dX, r2, c2, dDB2));
    CHECK_CLOSE(dDB2.download(), db2, kTolFp32Reduction);
  }

  const int parts = 4;  // reduce_blocks: out[i] = sum (or max) over the 4 blocks of n/4
  const std::size_t count = n / parts;
  std::vector<float> sum(count), mx(count);
  for (std::size_t i = 0; i < count; ++i) {
    sum[i] = x[i];
    mx[i] = x[i];
    for (int p = 1; p < parts; ++p) {
      sum[i] += x[p * count + i];
      mx[i] = std::max(mx[i], x[p * count + i]);
    }
  }
  DeviceBuf<float> dSUM(count), dMX(count);
  REQUIRE_OK(kg::reduce_blocks(nullptr, dX, parts, count, dSUM, false));
  REQUIRE_OK(kg::reduce_blocks(nullptr, dX, parts, count, dMX, true));
  CHECK_CLOSE(dSUM.download(), sum, kTolFp32);
  CHECK_CLOSE(dMX.download(), mx, 0.0);

  DeviceBuf<__nv_bfloat16> dH(n);
  DeviceBuf<float> dBACK(n);
  REQUIRE_OK(kg::to_bf16(nullptr, dX, dH, n));
  REQUIRE_OK(kg::from_bf16(nullptr, dH, dBACK, n));
  CHECK_CLOSE(dBACK.download(), x, kTolBf16 / 2);  // one rounding to 8 significant bits: <= 2^-9 relative
}

// The fused extras (kernels.hpp) against the same kernels' plain outputs, bit for bit: a bf16 copy written
// beside or instead of the fp32 result is that result rounded (by the CUDA headers' host conversion), a
// residual added inside the norm backward is the float sum, AdamW with a gradient scale is AdamW on the
// scaled gradient. Sizes reach the 16-byte paths (4 divides n) and the scalar ones.
namespace {
std::size_t bf16_off(const std::vector<__nv_bfloat16>& h, const std::vector<float>& f) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < f.size(); ++i) bad += __bfloat16_as_ushort(h[i]) != __bfloat16_as_ushort(__float2bfloat16(f[i]));
  return bad;
}
}  // namespace

TEST_CASE("fused outputs equal the plain kernels' results bit for bit, 16-byte and scalar paths") {
  for (const std::size_t n : {std::size_t(100004), std::size_t(100003)}) {
    CAPTURE(n);
    const auto x = random_vec(n, -5, 5), up = random_vec(n, -2, 2), dy = random_vec(n);
    DeviceBuf<float> dX(x), dUP(up), dDY(dy), dY(n), dDX(n), dDG(n), dDU(n);
    DeviceBuf<__nv_bfloat16> hY(n), hDX(n), hDG(n), hDU(n), hY2(n);
    REQUIRE_OK(kg::gelu_fwd(nullptr, dX, dY, n, hY));
    REQUIRE_OK(kg::gelu_fwd(nullptr, dX, nullptr, n, hY2));
    REQUIRE_OK(kg::gelu_bwd(nullptr, dDY, dX, dDX, n, hDX));
    const auto y = dY.download(), dx = dDX.download();
    CHECK(bf16_off(hY.download(), y) == 0);
    CHECK(bf16_off(hY2.download(), y) == 0);
    CHECK(bf16_off(hDX.download(), dx) == 0);
    REQUIRE_OK(kg::swiglu_fwd(nullptr, dX, dUP, dY, n, hY));
    REQUIRE_OK(kg::swiglu_fwd(nullptr, dX, dUP, nullptr, n, hY2));
    REQUIRE_OK(kg::swiglu_bwd(nullptr, dDY, dX, dUP, dDG, dDU, n, hDG, hDU));
    CHECK(bf16_off(hY.download(), dY.download()) == 0);
    CHECK(bf16_off(hY2.download(), dY.download()) == 0);
    CHECK(bf16_off(hDG.download(), dDG.download()) == 0);
    CHECK(bf16_off(hDU.download(), dDU.download()) == 0);

    // The bf16-input activations on bf16 copies of the inputs: the fp32 kernels' bf16 outputs on the
    // widened copies, bit for bit; and the bias gradient from bf16 equals col_sum over the widened values.
    DeviceBuf<__nv_bfloat16> hX(n), hUP(n), hDYb(n), o1(n), o2(n), o3(n), o4(n);
    DeviceBuf<float> wX(n), wUP(n), wDY(n);
    REQUIRE_OK(kg::to_bf16(nullptr, dX, hX, n));
    REQUIRE_OK(kg::to_bf16(nullptr, dUP, hUP, n));
    REQUIRE_OK(kg::to_bf16(nullptr, dDY, hDYb, n));
    REQUIRE_OK(kg::from_bf16(nullptr, hX, wX, n));
    REQUIRE_OK(kg::from_bf16(nullptr, hUP, wUP, n));
    REQUIRE_OK(kg::from_bf16(nullptr, hDYb, wDY, n));
    REQUIRE_OK(kg::gelu_fwd(nullptr, wX, dY, n));
    REQUIRE_OK(kg::gelu_bwd(nullptr, wDY, wX, dDX, n));
    REQUIRE_OK(kg::gelu_fwd_bf16(nullptr, hX, o1, n));
    REQUIRE_OK(kg::gelu_bwd_bf16(nullptr, hDYb, hX, o2, n));
    CHECK(bf16_off(o1.download(), dY.download()) == 0);
    CHECK(bf16_off(o2.download(), dDX.download()) == 0);
    REQUIRE_OK(kg::swiglu_fwd(nullptr, wX, wUP, dY, n));
    REQUIRE_OK(kg::swiglu_bwd(nullptr, wDY, wX, wUP, dDG, dDU, n));
    REQUIRE_OK(kg::swiglu_fwd_bf16(nullptr, hX, hUP, o1, n));
    REQUIRE_OK(kg::swiglu_bwd_bf16(nullptr, hDYb, hX, hUP, o3, o4, n));
    CHECK(bf16_off(o1.download(), dY.download()) == 0);
    CHECK(bf16_off(o3.download(), dDG.download()) == 0);
    CHECK(bf16_off(o4.download(), dDU.download()) == 0);
    const int rows = int(n / 100), cols = 100;
    const auto db0 = random_vec(cols);
    DeviceBuf<float> dB1(db0), dB2(db0);
    REQUIRE_OK(kg::col_sum(nullptr, wDY, rows, cols, dB1));
    REQUIRE_OK(kg::col_sum_bf16(nullptr, hDYb, rows, cols, dB2));
    CHECK(dB1.download() == dB2.download());

    kc::AdamW hp;
    hp.lr = 3e-3f;
    hp.weight_decay = 0.1f;
    auto p = random_vec(n), m = random_vec(n, -0.01f, 0.01f), v = random_vec(n, 0, 1e-4f);
    auto g = dy;
    kc::scale(g.data(), n, 0.37f);
    DeviceBuf<float> dP(p), dM(m), dV(v), dP2(p), dM2(m), dV2(v), dGS(g);
    DeviceBuf<__nv_bfloat16> hP(n);
    REQUIRE_OK(kg::adamw_step(nullptr, dP, dDY, dM, dV, n, hp, 1, 0.37f, hP));  // scaled as read
    REQUIRE_OK(kg::adamw_step(nullptr, dP2, dGS, dM2, dV2, n, hp, 1));           // scaled beforehand
    const auto p1 = dP.download();
    CHECK(p1 == dP2.download());
    CHECK(dM.download() == dM2.download());
    CHECK(dV.download() == dV2.download());
    CHECK(bf16_off(hP.download(), p1) == 0);
  }
  for (const auto& rc : {std::pair{33, 64}, std::pair{21, 66}}) {
    const int rows = rc.first, cols = rc.second;
    CAPTURE(cols);
    const std::size_t n = std::size_t(rows) * cols;
    const auto x = random_vec(n, -3, 3), g = random_vec(cols, 0.5f, 1.5f), b = random_vec(cols), dy = random_vec(n);
    const auto res = random_vec(n);
    DeviceBuf<float> dX(x), dG(g), dB(b), dDY(dy), dRES(res), dY(n), dMU(rows), dRS(rows), dDX(n), dDXR(n), dOUT(n);
    DeviceBuf<__nv_bfloat16> hY(n), hY2(n);
    for (const bool rms : {false, true}) {
      CAPTURE(rms);
      if (rms) {
        REQUIRE_OK(kg::rmsnorm_fwd(nullptr, dX, dG, dY, dRS, rows, cols, 1e-5f, hY));
        REQUIRE_OK(kg::rmsnorm_fwd(nullptr, dX, dG, nullptr, dRS, rows, cols, 1e-5f, hY2));
        REQUIRE_OK(kg::rmsnorm_bwd(nullptr, dDY, dX, dG, dRS, dDX, nullptr, rows, cols));
        REQUIRE_OK(kg::rmsnorm_bwd(nullptr, dDY, dX, dG, dRS, dDXR, nullptr, rows, cols, dRES));
      } else {
        REQUIRE_OK(kg::layernorm_fwd(nullptr, dX, dG, dB, dY, dMU, dRS, rows, cols, 1e-5f, hY));
        REQUIRE_OK(kg::layernorm_fwd(nullptr, dX, dG, dB, nullptr, dMU, dRS, rows, cols, 1e-5f, hY2));
        REQUIRE_OK(kg::layernorm_bwd(nullptr, dDY, dX, dG, dMU, dRS, dDX, nullptr, nullptr, rows, cols));
        REQUIRE_OK(kg::layernorm_bwd(nullptr, dDY, dX, dG, dMU, dRS, dDXR, nullptr, nullptr, rows, cols, dRES));
      }
      const auto y = dY.download(), dx = dDX.download(), dxr = dDXR.download();
      CHECK(bf16_off(hY.download(), y) == 0);
      CHECK(bf16_off(hY2.download(), y) == 0);
      std::size_t off = 0;
      for (std::size_t i = 0; i < n; ++i) off += !(dxr[i] == dx[i] + res[i]);
      CHECK(off == 0);
    }
    // residual_add: (a + b) + bias per column, out of place and in place
    REQUIRE_OK(kg::residual_add(nullptr, dX, dDY, dB, dOUT, rows, cols));
    REQUIRE_OK(kg::residual_add(nullptr, dX, dDY, dB, dX, rows, cols));
    const auto out = dOUT.download(), in_place = dX.download();
    std::size_t off = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const std::size_t i = std::size_t(r) * cols + c;
        const float want = (x[i] + dy[i]) + b[c];
        off += !(out[i] == want) + !(in_place[i] == want);
      }
    CHECK(off == 0);
  }
  {  // cross-entropy's logit gradient written in bf16 only
    const int rows = 37, vocab = 5003;
    const auto z = random_vec(std::size_t(rows) * vocab, -8, 8), dl = random_vec(rows);
    const auto t = random_tokens(rows, vocab);
    DeviceBuf<float> dZ(z), dDL(dl), dLOSS(rows), dMX(rows), dSM(rows), dDZ(z.size());
    DeviceBuf<std::int32_t> dT(t);
    DeviceBuf<__nv_bfloat16> hDZ(z.size());
    REQUIRE_OK(kg::cross_entropy_fwd(nullptr, dZ, rows, vocab, 0, dT, dLOSS, dMX, dSM));
    REQUIRE_OK(kg::cross_entropy_bwd(nullptr, dZ, rows, vocab, 0, dT, dMX, dSM, dDL, dDZ));
    REQUIRE_OK(kg::cross_entropy_bwd(nullptr, dZ, rows, vocab, 0, dT, dMX, dSM, dDL, nullptr, hDZ));
    CHECK(bf16_off(hDZ.download(), dDZ.download()) == 0);
    CHECK_FALSE(kg::cross_entropy_bwd(nullptr, dZ, rows, vocab, 0, dT, dMX, dSM, dDL, dDZ, hDZ).ok());  // one form
  }
}

}  // TEST_SUITE
