// kernels/cuda/rows.cu's own code, rewritten by emulate_cuda.py onto ptx_emu.hpp and run on the CPU:
// softmax cross-entropy forward and backward (whole vocabulary and a shard), the vocab-parallel passes
// that tensor parallelism uses (three shards, the all-reduces done here: max, then sum), and the
// embedding lookup and its gradient, each against kernels/cpu with the tolerances of
// tests/cuda/test_kernels.cpp (1e-5 relative, 1e-4 where long sums or exp/log chains are involved).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/permute.hpp"
#include "kernels/cuda/status.hpp"
#include "tests/cuda_emu/emu_check.hpp"

struct __nv_bfloat16;  // the rewritten file's 16-bit type; only pointers to it cross this file

namespace tessel::kernels::cuda {
Status cross_entropy_fwd(void* s, const float* logits, int rows, int vocab_local, int vocab_start,
                         const std::int32_t* targets, float* loss, float* row_max, float* row_sum);
Status cross_entropy_bwd(void* s, const float* logits, int rows, int vocab_local, int vocab_start,
                         const std::int32_t* targets, const float* row_max, const float* row_sum,
                         const float* dloss, float* dlogits, __nv_bfloat16* dlogits16);
Status cross_entropy_max(void* s, const float* logits, int rows, int vocab_local, float* row_max);
Status cross_entropy_partial(void* s, const float* logits, int rows, int vocab_local, int vocab_start,
                             const std::int32_t* targets, const float* row_max, float* sums);
Status cross_entropy_loss(void* s, int rows, const float* row_max, const float* sums, float* loss);
Status embedding_fwd(void* s, const float* table, int vocab_local, int vocab_start, int dim,
                     const std::int32_t* tokens, int n, float* out);
Status embedding_fwd_bf16(void* s, const __nv_bfloat16* table, int vocab_local, int vocab_start, int dim,
                          const std::int32_t* tokens, int n, float* out);
Status embedding_bwd(void* s, const float* dout, int vocab_local, int vocab_start, int dim,
                     const std::int32_t* tokens, int n, float* dtable);
Status gather_rows(void* s, const float* src, const std::int32_t* index, const float* scale, int n, int width,
                   float* dst);
Status combine_rows(void* s, const float* src, const float* w, int tokens, int k, int width, float* dst,
                    bool accumulate);
Status row_dots(void* s, const float* a, const float* b, int n, int k, int width, float* out);
}  // namespace tessel::kernels::cuda

namespace {

namespace kc = tessel::kernels::cpu;
namespace kg = tessel::kernels::cuda;
using tessel::test::random_tokens;
using tessel::test::random_vec;
using tessel::test::rel_error;

std::mt19937 rng(20261131);

int bad = 0;
void expect(const char* what, double err, double tol) {
  const bool ok = err <= tol;
  bad += !ok;
  std::printf("  %-40s rel err %.1e (tol %.0e) %s\n", what, err, tol, ok ? "ok" : "FAILED");
}

void cross_entropy() {
  const int rows = 13, vocab = 1003;
  for (const int start : {0, 400}) {  // 400: a shard; targets below it contribute no target logit
    std::printf("cross-entropy, %d rows, vocabulary shard [%d, %d):\n", rows, start, start + vocab);
    const auto z = random_vec(rng, std::size_t(rows) * vocab, -8, 8), dl = random_vec(rng, rows);
    auto t = random_tokens(rng, rows, vocab + start);
    // Targets on the shard's edges: just outside it (no target logit here) and its first and last columns.
    t[0] = start - 1 >= 0 ? start - 1 : 0;
    t[1] = start;
    t[2] = start + vocab - 1;
    t[3] = start + vocab;
    std::vector<float> loss(rows), mx(rows), sm(rows), dz(z.size());
    kc::cross_entropy_fwd(z.data(), rows, vocab, start, t.data(), loss.data(), mx.data(), sm.data(), nullptr);
    kc::cross_entropy_bwd(z.data(), rows, vocab, start, t.data(), mx.data(), sm.data(), dl.data(), dz.data());
    std::vector<float> loss2(rows, NAN), mx2(rows, NAN), sm2(rows, NAN), dz2(z.size(), NAN);
    bad += !kg::cross_entropy_fwd(nullptr, z.data(), rows, vocab, start, t.data(), loss2.data(), mx2.data(), sm2.data()).ok();
    bad += !kg::cross_entropy_bwd(nullptr, z.data(), rows, vocab, start, t.data(), mx2.data(), sm2.data(), dl.data(),
                                  dz2.data(), nullptr).ok();
    std::vector<std::uint16_t> dz16(z.size(), 0xffff);  // the bf16-only output: dz2 rounded, bit for bit
    bad += !kg::cross_entropy_bwd(nullptr, z.data(), rows, vocab, start, t.data(), mx2.data(), sm2.data(), dl.data(),
                                  nullptr, reinterpret_cast<__nv_bfloat16*>(dz16.data())).ok();
    expect("loss", rel_error(loss2, loss), 1e-4);
    expect("row max", rel_error(mx2, mx), 1e-5);
    expect("row sum", rel_error(sm2, sm), 1e-4);
    expect("dlogits", rel_error(dz2, dz), 1e-4);
    expect("dlogits in bf16 (mismatched elements)", double(tessel::test::bf16_mismatches(dz16, dz2)), 0.0);
  }
}

// Three shards of one vocabulary through the three passes, the all-reduces done here, against the whole.
void vocab_parallel() {
  const int rows = 11, shards = 3, vl = 301, vocab = shards * vl;
  std::printf("vocab-parallel cross-entropy, %d rows, %d shards of %d:\n", rows, shards, vl);
  const auto z = random_vec(rng, std::size_t(rows) * vocab, -8, 8), dl = random_vec(rng, rows);
  auto t = random_tokens(rng, rows, vocab);
  const std::int32_t edges[] = {0, vl - 1, vl, 2 * vl - 1, 2 * vl, 3 * vl - 1};  // each shard's first and last column
  std::copy(std::begin(edges), std::end(edges), t.begin());
  std::vector<float> loss(rows), mx(rows), sm(rows), dz(z.size());
  kc::cross_entropy_fwd(z.data(), rows, vocab, 0, t.data(), loss.data(), mx.data(), sm.data(), nullptr);
  kc::cross_entropy_bwd(z.data(), rows, vocab, 0, t.data(), mx.data(), sm.data(), dl.data(), dz.data());
  std::vector<std::vector<float>> zs(shards);
  for (int k = 0; k < shards; ++k)
    for (int r = 0; r < rows; ++r)
      zs[k].insert(zs[k].end(), z.begin() + std::size_t(r) * vocab + k * vl, z.begin() + std::size_t(r) * vocab + (k + 1) * vl);
  std::vector<float> gmax(rows, -std::numeric_limits<float>::infinity()), sums(2 * std::size_t(rows), 0.0f);
  for (int k = 0; k < shards; ++k) {
    std::vector<float> m(rows, NAN);
    bad += !kg::cross_entropy_max(nullptr, zs[k].data(), rows, vl, m.data()).ok();
    for (int r = 0; r < rows; ++r) gmax[r] = std::max(gmax[r], m[r]);
  }
  expect("max all-reduced", rel_error(gmax, mx), 1e-5);
  for (int k = 0; k < shards; ++k) {
    std::vector<float> p(2 * std::size_t(rows), NAN);
    bad += !kg::cross_entropy_partial(nullptr, zs[k].data(), rows, vl, k * vl, t.data(), gmax.data(), p.data()).ok();
    for (std::size_t i = 0; i < p.size(); ++i) sums[i] += p[i];
  }
  expect("exp-sums all-reduced", rel_error(std::vector<float>(sums.begin(), sums.begin() + rows), sm), 1e-4);
  std::vector<float> loss2(rows, NAN);
  bad += !kg::cross_entropy_loss(nullptr, rows, gmax.data(), sums.data(), loss2.data()).ok();
  expect("loss", rel_error(loss2, loss), 1e-4);
  const std::vector<float> row_sum(sums.begin(), sums.begin() + rows);
  for (int k = 0; k < shards; ++k) {
    std::vector<float> dz2(zs[k].size(), NAN), want;
    bad += !kg::cross_entropy_bwd(nullptr, zs[k].data(), rows, vl, k * vl, t.data(), gmax.data(), row_sum.data(),
                                  dl.data(), dz2.data(), nullptr).ok();
    for (int r = 0; r < rows; ++r)
      want.insert(want.end(), dz.begin() + std::size_t(r) * vocab + k * vl, dz.begin() + std::size_t(r) * vocab + (k + 1) * vl);
    expect("dlogits of a shard", rel_error(dz2, want), 1e-4);
  }
}

void embedding() {
  const int vocab = 50, start = 20, dim = 40, n = 37;  // ids outside [20, 70) belong to other shards
  std::printf("embedding, %d tokens, rows [%d, %d) x %d:\n", n, start, start + vocab, dim);
  const auto table = random_vec(rng, std::size_t(vocab) * dim), dout = random_vec(rng, std::size_t(n) * dim);
  const auto dt0 = random_vec(rng, table.size());
  auto tok = random_tokens(rng, n, 90);
  // The shard's edges (just outside, first and last row) and a repeated id, not left to the draw.
  const std::int32_t edges[] = {start - 1, start, start + vocab - 1, start + vocab, start, start};
  std::copy(std::begin(edges), std::end(edges), tok.begin());
  std::vector<float> out(std::size_t(n) * dim), dt = dt0, out2(out.size(), NAN), dt2 = dt0;
  kc::embedding_fwd(table.data(), vocab, start, dim, tok.data(), n, out.data());
  kc::embedding_bwd(dout.data(), vocab, start, dim, tok.data(), n, dt.data());
  bad += !kg::embedding_fwd(nullptr, table.data(), vocab, start, dim, tok.data(), n, out2.data()).ok();
  bad += !kg::embedding_bwd(nullptr, dout.data(), vocab, start, dim, tok.data(), n, dt2.data()).ok();
  expect("lookup", rel_error(out2, out), 1e-5);
  expect("table gradient (repeated tokens)", rel_error(dt2, dt), 1e-5);
  // From the bf16 copy: the fp32 lookup of the widened table, exactly (other shards' ids give zeros).
  std::vector<std::uint16_t> t16(table.size());
  std::vector<float> widened(table.size()), want(out.size()), out3(out.size(), NAN);
  for (std::size_t i = 0; i < table.size(); ++i) {
    t16[i] = tessel::test::bf16_bits(table[i]);
    const std::uint32_t u = std::uint32_t(t16[i]) << 16;
    std::memcpy(&widened[i], &u, 4);
  }
  kc::embedding_fwd(widened.data(), vocab, start, dim, tok.data(), n, want.data());
  const bool ran = kg::embedding_fwd_bf16(nullptr, reinterpret_cast<const __nv_bfloat16*>(t16.data()), vocab, start, dim,
                                          tok.data(), n, out3.data()).ok();
  std::size_t off = 0;
  for (std::size_t i = 0; i < want.size(); ++i) off += !(out3[i] == want[i]);
  bad += !ran;
  expect("lookup from the bf16 copy (off)", double(off), 0.0);
}

// A MoE layer's dispatch and combine: 29 tokens, top-3, rows of 300 (more than a block's threads), the slots
// gathered in a shuffled order with and without weights, summed back per token, and the slot-token dots.
void permute() {
  const int tokens = 29, k = 3, width = 300, n = tokens * k;
  std::printf("token permutation, %d tokens, top-%d, width %d:\n", tokens, k, width);
  const auto src = random_vec(rng, std::size_t(tokens) * width), slots = random_vec(rng, std::size_t(n) * width);
  const auto w = random_vec(rng, n), acc0 = random_vec(rng, std::size_t(tokens) * width);
  std::vector<std::int32_t> index(n);
  for (int i = 0; i < n; ++i) index[i] = std::int32_t((i * 17 + 5) % n) / k;  // each token k times, shuffled
  std::vector<float> g(std::size_t(n) * width), gw(g.size()), g2(g.size(), NAN), gw2(g.size(), NAN);
  kc::gather_rows(src.data(), index.data(), nullptr, n, width, g.data());
  kc::gather_rows(src.data(), index.data(), w.data(), n, width, gw.data());
  bad += !kg::gather_rows(nullptr, src.data(), index.data(), nullptr, n, width, g2.data()).ok();
  bad += !kg::gather_rows(nullptr, src.data(), index.data(), w.data(), n, width, gw2.data()).ok();
  expect("gather (exact)", rel_error(g2, g), 0.0);
  expect("gather, weighted (exact)", rel_error(gw2, gw), 0.0);
  std::vector<float> c(acc0.size()), ca = acc0, c2(acc0.size(), NAN), ca2 = acc0;
  kc::combine_rows(slots.data(), w.data(), tokens, k, width, c.data(), false);
  kc::combine_rows(slots.data(), nullptr, tokens, k, width, ca.data(), true);
  bad += !kg::combine_rows(nullptr, slots.data(), w.data(), tokens, k, width, c2.data(), false).ok();
  bad += !kg::combine_rows(nullptr, slots.data(), nullptr, tokens, k, width, ca2.data(), true).ok();
  expect("combine, weighted", rel_error(c2, c), 1e-6);
  expect("combine, accumulated", rel_error(ca2, ca), 1e-6);
  std::vector<float> d(n), d2(n, NAN);
  kc::row_dots(src.data(), slots.data(), n, k, width, d.data());
  bad += !kg::row_dots(nullptr, src.data(), slots.data(), n, k, width, d2.data()).ok();
  expect("slot-token dots", rel_error(d2, d), 1e-5);
}

}  // namespace

int main() {
  cross_entropy();
  vocab_parallel();
  embedding();
  permute();
  return bad == 0 ? 0 : 1;
}
