// Causal attention on the tensor cores (attention variant tc, the default under bf16 GEMMs): bf16 operands,
// fp32 accumulation, FlashAttention-2 (Dao 2023) structure. The fp32 kernels of attention.cu stay the
// reference path (--precision fp32); the online softmax and the epilogue are theirs (attention_softmax.cuh).
//
// Matrix products are PTX mma.sync.m16n8k16 (bf16 x bf16 -> f32). Its register layouts (PTX ISA, "Matrix
// Fragments for mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//   A (16x16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16x8, "col"):      b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C (16x8 f32):         c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1)
// so the accumulators of two adjacent 8-column tiles are, packed to bf16, exactly an A fragment over those
// 16 columns: P = softmax(S) feeds P V without leaving registers. Every operand tile sits in shared memory
// as bf16, row-major with 8 elements of padding per row (16 bytes: the 8 rows x 4 words a fragment load
// touches land in 32 distinct banks), and B operands that must be read down a column are stored
// transposed. fp32 inputs are rounded to bf16 as they are loaded, so the layer needs no bf16 copies.
//
// Work split (W = 4 or 8 warps, 16 rows each; AttentionConfig::tc_block_warps): forward and dQ own 16 W query rows and stream 64-key tiles;
// dK/dV own 16 W keys and stream 32-query tiles for every query head of the GQA group (no atomics,
// deterministic).
// Softmax in base 2 (attention_softmax.cuh): lse in natural units, so any variant's lse serves this backward.
//
// Measured on an H200 (2026-11-29, 8-warp blocks, median of 10; causal FLOPs fwd 2 b s^2 h d, bwd 2.5x):
// b16 s1024 h16 d128 fwd 75 / bwd 68 TFLOP/s, b2 s8192 h16 d128 fwd 97 / bwd 90, b16 s1024 h16 d64 fwd 75 /
// bwd 55; the fp32 kernels: 4-6. That is 12% of the 785 TFLOP/s bf16 GEMM rate. What this kernel lacks
// (a software pipeline for the K/V tiles, which load synchronously here; bf16 inputs instead of fp32 ones
// converted on every load; wgmma) is what experimental/ tries, unmeasured (docs/cuda.md).
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_kernels.hpp"
#include "kernels/cuda/attention_prep.cuh"
#include "kernels/cuda/attention_softmax.cuh"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ptx.cuh"

namespace tessel::kernels::cuda {

namespace {

using bf16 = __nv_bfloat16;
// Blocks of W warps own 16 W rows (W = 4 or 8): 8 halves the K/V (forward, dQ) or Q/dO (dK/dV) tiles
// streamed per FLOP, 4 keeps more blocks per SM (AttentionConfig::tc_block_warps says which was faster).
constexpr int kKeyTile = 64;   // forward and dQ: keys per streamed tile
constexpr int kQryTile = 32;   // dK/dV: queries per streamed tile

// A fragment: rows r0..r0+15, columns k0..k0+15 of a row-major bf16 tile with row pitch P elements.
template <int P>
__device__ inline void load_a(std::uint32_t (&a)[4], const bf16* tile, int r0, int k0) {
  const int g = (threadIdx.x % kWarp) / 4, t = threadIdx.x % 4;
  const std::uint32_t* w = reinterpret_cast<const std::uint32_t*>(tile);
  constexpr int PW = P / 2;
  const int lo = (r0 + g) * PW + k0 / 2 + t, hi = lo + 8 * PW;
  a[0] = w[lo];
  a[1] = w[hi];
  a[2] = w[lo + 4];
  a[3] = w[hi + 4];
}

// B fragment for B[k][n] = Y[n][k], Y row-major (pitch P): rows n0..n0+7 of Y, columns k0..k0+15.
template <int P>
__device__ inline void load_b(std::uint32_t& b0, std::uint32_t& b1, const bf16* tile, int n0, int k0) {
  const int g = (threadIdx.x % kWarp) / 4, t = threadIdx.x % 4;
  const std::uint32_t* w = reinterpret_cast<const std::uint32_t*>(tile) + (n0 + g) * (P / 2) + k0 / 2 + t;
  b0 = w[0];
  b1 = w[4];
}

// Accumulator tiles 2kk and 2kk+1 (16 columns) as the A fragment of the next product.
__device__ inline void to_a(std::uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack2(c0[0], c0[1]);
  a[1] = pack2(c0[2], c0[3]);
  a[2] = pack2(c1[0], c1[1]);
  a[3] = pack2(c1[2], c1[3]);
}

// Rows [row0, row0 + R) of a head's D columns (token-major, batch base row `base`), fp32 -> bf16, into
// `row` ([R][D + 8]) and/or `col` ([D][R + 8], transposed), by NT threads. Rows at or past S are zeros.
// 16-byte loads: the launcher checked ld % 4 == 0 and 16-byte aligned pointers. Each thread issues up to
// 8 loads before its first store, so a tile costs one or two memory latencies, not one per load (the
// first device run, with one load in flight per thread, reached 7% of the bf16 matrix rate).
template <int R, int D, int NT>
__device__ void load_tile(bf16* row, bf16* col, const float* __restrict__ src, int ld, std::size_t base, int col0,
                          int row0, int S) {
  constexpr int V = D / 4, N = R * V / NT, kBatch = N < 8 ? N : 8;
  static_assert(R * V % NT == 0 && N % kBatch == 0, "whole float4s per thread");
#pragma unroll
  for (int u0 = 0; u0 < N; u0 += kBatch) {
    float4 x[kBatch];
    // A warp takes 8 rows x 4 float4s: 64 contiguous bytes per row (two full sectors), and its transposed
    // bf16 stores hit at most 2 words per bank.
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = threadIdx.x + (u0 + u) * NT, rest = idx / 8, r = (rest / V) * 8 + idx % 8, c = (rest % V) * 4;
      x[u] = row0 + r < S ? __ldg(reinterpret_cast<const float4*>(src + (base + row0 + r) * ld + col0 + c))
                          : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = threadIdx.x + (u0 + u) * NT, rest = idx / 8, r = (rest / V) * 8 + idx % 8, c = (rest % V) * 4;
      if (row) *reinterpret_cast<uint2*>(row + r * (D + 8) + c) = make_uint2(pack2(x[u].x, x[u].y), pack2(x[u].z, x[u].w));
      if (col) {
        col[(c + 0) * (R + 8) + r] = __float2bfloat16_rn(x[u].x);
        col[(c + 1) * (R + 8) + r] = __float2bfloat16_rn(x[u].y);
        col[(c + 2) * (R + 8) + r] = __float2bfloat16_rn(x[u].z);
        col[(c + 3) * (R + 8) + r] = __float2bfloat16_rn(x[u].w);
      }
    }
  }
}

// grid (ceil(S / 64), HQ, B); block x runs in reverse so the longest rows (most keys) start first.
template <int D, int W>
__global__ void __launch_bounds__(kWarp * W) fwd_kernel(AttnDims d, const float* __restrict__ q, int ldq,
                                                       const float* __restrict__ k, int ldk,
                                                       const float* __restrict__ v, int ldv, float* __restrict__ out,
                                                       int ldo, float* __restrict__ lse) {
  constexpr int PD = D + 8, PK = kKeyTile + 8;
  constexpr int kRows = 16 * W;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [16 W][PD]
  bf16* Ks = Qs + kRows * PD;                // [16 W][PD]
  bf16* Vt = Ks + kKeyTile * PD;             // [D][PK]
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z, hk = h / (d.HQ / d.HKV);
  const int warp = threadIdx.x / kWarp, g = (threadIdx.x % kWarp) / 4, t = threadIdx.x % 4;
  const std::size_t base = std::size_t(b) * d.S;
  load_tile<kRows, D, kWarp * W>(Qs, nullptr, q, ldq, base, h * D, i0, d.S);
  __syncthreads();
  std::uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a<PD>(qf[kk], Qs, warp * 16, kk * 16);
  float o[D / 8][4] = {};
  SoftmaxRow row[2];  // this thread's rows ia and ia + 8; l is the thread's share, the quad's added at the end
  const float sl2 = score_scale(d.scale);
  const int ia = i0 + warp * 16 + g;
  const int last = min(d.S, i0 + kRows);
  for (int j0 = 0; j0 < last; j0 += kKeyTile) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<kKeyTile, D, kWarp * W>(Ks, nullptr, k, ldk, base, hk * D, j0, d.S);
    load_tile<kKeyTile, D, kWarp * W>(nullptr, Vt, v, ldv, base, hk * D, j0, d.S);
    __syncthreads();
    float sc[kKeyTile / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int n = 0; n < kKeyTile / 8; ++n) {
        std::uint32_t b0, b1;
        load_b<PD>(b0, b1, Ks, n * 8, kk * 16);
        mma16816(sc[n], qf[kk], b0, b1);
      }
    // Causal mask (j > i), needed only where the tile reaches past this warp's first row. It also hides
    // keys >= S for rows < S (such keys only occur in the diagonal tile).
    const bool diag = j0 + kKeyTile - 1 > i0 + warp * 16;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kKeyTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j0 + n * 8 + 2 * t + (e & 1), i = ia + (e >> 1) * 8;
        sc[n][e] = (diag && j > i) ? -INFINITY : sc[n][e] * sl2;
        mx[e >> 1] = fmaxf(mx[e >> 1], sc[n][e]);
      }
    const float alpha[2] = {row[0].next_tile(quad_max(mx[0])), row[1].next_tile(quad_max(mx[1]))};
#pragma unroll
    for (int n = 0; n < kKeyTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[n][e] = row[e >> 1].weight(sc[n][e]);
        row[e >> 1].l += sc[n][e];
      }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < kKeyTile / 16; ++kk) {
      std::uint32_t a[4];
      to_a(a, sc[2 * kk], sc[2 * kk + 1]);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        std::uint32_t b0, b1;
        load_b<PK>(b0, b1, Vt, n * 8, kk * 16);
        mma16816(o[n], a, b0, b1);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = ia + 8 * r;
    const float sum = quad_sum(row[r].l);
    if (i >= d.S) continue;
    store_acc_row<D>(out + (base + i) * ldo + h * D, o, r, t, 1.0f / sum);
    if (t == 0) lse[stat_index(b, h, i, d.HQ, d.S)] = row[r].lse(sum);
  }
}


// grid (ceil(S / 64), HKV, B): a block owns 64 keys, a warp 16 of them. Per streamed query tile it forms
// S^T = K Q^T and dP^T = V dO^T, then P^T = exp(S^T - lse), dS^T = P^T (dP^T - delta), and accumulates
// dV += P^T dO and dK += dS^T Q (the transposed tiles give those products' B operands).
template <int D, int W>
__global__ void __launch_bounds__(kWarp * W) dkdv_kernel(AttnDims d, const float* __restrict__ q, int ldq,
                                                        const float* __restrict__ k, int ldk,
                                                        const float* __restrict__ v, int ldv,
                                                        const float* __restrict__ lse, const float* __restrict__ delta,
                                                        const float* __restrict__ dout, int lddo,
                                                        float* __restrict__ dk, int lddk, float* __restrict__ dv,
                                                        int lddv) {
  constexpr int PD = D + 8, PQ = kQryTile + 8;
  constexpr int kRows = 16 * W;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);  // [16 W][PD]
  bf16* Vs = Ks + kRows * PD;                // [16 W][PD]
  bf16* Qs = Vs + kRows * PD;                // [32][PD]
  bf16* Os = Qs + kQryTile * PD;             // [32][PD] dO
  bf16* Qt = Os + kQryTile * PD;             // [D][PQ]
  bf16* Ot = Qt + D * PQ;                    // [D][PQ]
  float* Ls = reinterpret_cast<float*>(Ot + D * PQ);  // [32] lse * log2(e)
  float* Ds = Ls + kQryTile;                          // [32] delta
  const int j0 = (gridDim.x - 1 - blockIdx.x) * kRows, hk = blockIdx.y, b = blockIdx.z, group = d.HQ / d.HKV;
  const int warp = threadIdx.x / kWarp, g = (threadIdx.x % kWarp) / 4, t = threadIdx.x % 4;
  const std::size_t base = std::size_t(b) * d.S;
  load_tile<kRows, D, kWarp * W>(Ks, nullptr, k, ldk, base, hk * D, j0, d.S);
  load_tile<kRows, D, kWarp * W>(Vs, nullptr, v, ldv, base, hk * D, j0, d.S);
  float gk[D / 8][4] = {}, gv[D / 8][4] = {};
  const float sl2 = score_scale(d.scale);
  const int ja = j0 + warp * 16 + g;  // this thread's keys: ja and ja + 8
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const float* lse_h = lse + (std::size_t(b) * d.HQ + h) * d.S;
    const float* delta_h = delta + (std::size_t(b) * d.HQ + h) * d.S;
    for (int i0 = j0; i0 < d.S; i0 += kQryTile) {  // causal: queries i >= j only (j0 % 32 == 0)
      __syncthreads();
      load_tile<kQryTile, D, kWarp * W>(Qs, Qt, q, ldq, base, h * D, i0, d.S);
      load_tile<kQryTile, D, kWarp * W>(Os, Ot, dout, lddo, base, h * D, i0, d.S);
      if (threadIdx.x < kQryTile) {
        const int i = i0 + threadIdx.x;
        Ls[threadIdx.x] = i < d.S ? lse_h[i] * kLog2e : 0.0f;
        Ds[threadIdx.x] = i < d.S ? delta_h[i] : 0.0f;
      }
      __syncthreads();
      float st[kQryTile / 8][4] = {}, dpt[kQryTile / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        std::uint32_t ak[4], av[4];
        load_a<PD>(ak, Ks, warp * 16, kk * 16);
        load_a<PD>(av, Vs, warp * 16, kk * 16);
#pragma unroll
        for (int n = 0; n < kQryTile / 8; ++n) {
          std::uint32_t b0, b1;
          load_b<PD>(b0, b1, Qs, n * 8, kk * 16);
          mma16816(st[n], ak, b0, b1);
          load_b<PD>(b0, b1, Os, n * 8, kk * 16);
          mma16816(dpt[n], av, b0, b1);
        }
      }
      const bool mask = i0 < j0 + kRows || i0 + kQryTile > d.S;  // causal edge or queries past S
#pragma unroll
      for (int n = 0; n < kQryTile / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int il = n * 8 + 2 * t + (e & 1), i = i0 + il, j = ja + (e >> 1) * 8;
          float p = exp2f(st[n][e] * sl2 - Ls[il]);
          if (mask && (i < j || i >= d.S)) p = 0.0f;
          st[n][e] = p;
          dpt[n][e] = p * (dpt[n][e] - Ds[il]);
        }
#pragma unroll
      for (int kk = 0; kk < kQryTile / 16; ++kk) {
        std::uint32_t ap[4], ads[4];
        to_a(ap, st[2 * kk], st[2 * kk + 1]);
        to_a(ads, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          std::uint32_t b0, b1;
          load_b<PQ>(b0, b1, Ot, n * 8, kk * 16);
          mma16816(gv[n], ap, b0, b1);
          load_b<PQ>(b0, b1, Qt, n * 8, kk * 16);
          mma16816(gk[n], ads, b0, b1);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = ja + 8 * r;
    if (j >= d.S) continue;
    store_acc_row<D>(dk + (base + j) * lddk + hk * D, gk, r, t, d.scale);
    store_acc_row<D>(dv + (base + j) * lddv + hk * D, gv, r, t, 1.0f);
  }
}

// grid (ceil(S / 64), HQ, B): a block owns 64 query rows; key tiles stream through. dQ = scale dS K.
template <int D, int W>
__global__ void __launch_bounds__(kWarp * W) dq_kernel(AttnDims d, const float* __restrict__ q, int ldq,
                                                      const float* __restrict__ k, int ldk,
                                                      const float* __restrict__ v, int ldv,
                                                      const float* __restrict__ lse, const float* __restrict__ delta,
                                                      const float* __restrict__ dout, int lddo,
                                                      float* __restrict__ dq, int lddq) {
  constexpr int PD = D + 8, PK = kKeyTile + 8;
  constexpr int kRows = 16 * W;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [16 W][PD]
  bf16* Os = Qs + kRows * PD;                // [16 W][PD] dO
  bf16* Ks = Os + kRows * PD;                // [16 W][PD]
  bf16* Vs = Ks + kKeyTile * PD;             // [16 W][PD]
  bf16* Kt = Vs + kKeyTile * PD;             // [D][PK]
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z, hk = h / (d.HQ / d.HKV);
  const int warp = threadIdx.x / kWarp, g = (threadIdx.x % kWarp) / 4, t = threadIdx.x % 4;
  const std::size_t base = std::size_t(b) * d.S;
  load_tile<kRows, D, kWarp * W>(Qs, nullptr, q, ldq, base, h * D, i0, d.S);
  load_tile<kRows, D, kWarp * W>(Os, nullptr, dout, lddo, base, h * D, i0, d.S);
  const int ia = i0 + warp * 16 + g;
  float l2[2], dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::size_t at = (std::size_t(b) * d.HQ + h) * d.S + min(ia + 8 * r, d.S - 1);
    l2[r] = lse[at] * kLog2e;
    dl[r] = delta[at];
  }
  float gq[D / 8][4] = {};
  const float sl2 = score_scale(d.scale);
  const int last = min(d.S, i0 + kRows);
  for (int j0 = 0; j0 < last; j0 += kKeyTile) {
    __syncthreads();
    load_tile<kKeyTile, D, kWarp * W>(Ks, Kt, k, ldk, base, hk * D, j0, d.S);
    load_tile<kKeyTile, D, kWarp * W>(Vs, nullptr, v, ldv, base, hk * D, j0, d.S);
    __syncthreads();
    float sc[kKeyTile / 8][4] = {}, dp[kKeyTile / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t aq[4], ao[4];
      load_a<PD>(aq, Qs, warp * 16, kk * 16);
      load_a<PD>(ao, Os, warp * 16, kk * 16);
#pragma unroll
      for (int n = 0; n < kKeyTile / 8; ++n) {
        std::uint32_t b0, b1;
        load_b<PD>(b0, b1, Ks, n * 8, kk * 16);
        mma16816(sc[n], aq, b0, b1);
        load_b<PD>(b0, b1, Vs, n * 8, kk * 16);
        mma16816(dp[n], ao, b0, b1);
      }
    }
    const bool diag = j0 + kKeyTile - 1 > i0 + warp * 16;  // as in the forward: also hides keys >= S
#pragma unroll
    for (int n = 0; n < kKeyTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j0 + n * 8 + 2 * t + (e & 1), r = e >> 1;
        float p = exp2f(sc[n][e] * sl2 - l2[r]);
        if (diag && j > ia + 8 * r) p = 0.0f;
        dp[n][e] = p * (dp[n][e] - dl[r]);
      }
#pragma unroll
    for (int kk = 0; kk < kKeyTile / 16; ++kk) {
      std::uint32_t a[4];
      to_a(a, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        std::uint32_t b0, b1;
        load_b<PK>(b0, b1, Kt, n * 8, kk * 16);
        mma16816(gq[n], a, b0, b1);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = ia + 8 * r;
    if (i >= d.S) continue;
    store_acc_row<D>(dq + (base + i) * lddq + h * D, gq, r, t, d.scale);
  }
}

template <int D, int W>
constexpr std::size_t fwd_smem() { return sizeof(bf16) * ((16 * W + kKeyTile) * (D + 8) + D * (kKeyTile + 8)); }
template <int D, int W>
constexpr std::size_t dkdv_smem() {
  return sizeof(bf16) * (2 * 16 * W * (D + 8) + 2 * kQryTile * (D + 8) + 2 * D * (kQryTile + 8)) +
         sizeof(float) * 2 * kQryTile;
}
template <int D, int W>
constexpr std::size_t dq_smem() { return sizeof(bf16) * ((2 * 16 * W + 2 * kKeyTile) * (D + 8) + D * (kKeyTile + 8)); }


unsigned row_blocks(const AttentionShape& a, int W) { return static_cast<unsigned>(ceil_div(a.seq, 16 * W)); }

template <int D, int W>
Status fwd(cudaStream_t s, const AttentionArgs& g) {
  const AttentionShape& a = g.shape;
  return attn_launch("attention (tc)", fwd_kernel<D, W>, dim3(row_blocks(a, W), a.hq, a.batch), kWarp * W,
                     fwd_smem<D, W>(), s, attn_dims(a), static_cast<const float*>(g.q), g.ldq,
                     static_cast<const float*>(g.k), g.ldk, static_cast<const float*>(g.v), g.ldv, g.out, g.ldo, g.lse);
}

template <int D, int W>
Status bwd(cudaStream_t s, const AttentionArgs& g) {
  const AttentionShape& a = g.shape;
  const AttnDims d = attn_dims(a);
  const float *q = static_cast<const float*>(g.q), *k = static_cast<const float*>(g.k),
              *v = static_cast<const float*>(g.v), *dout = static_cast<const float*>(g.dout);
  TESSEL_STATUS_CHECK(attention_delta(s, a.batch, a.seq, a.hq, a.d, g.out, g.ldo, dout, g.lddo, g.delta));
  TESSEL_STATUS_CHECK(attn_launch("attention (tc)", dkdv_kernel<D, W>, dim3(row_blocks(a, W), a.hkv, a.batch), kWarp * W,
                                  dkdv_smem<D, W>(), s, d, q, g.ldq, k, g.ldk, v, g.ldv, g.lse, g.delta, dout, g.lddo,
                                  g.dk, g.lddk, g.dv, g.lddv));
  return attn_launch("attention (tc)", dq_kernel<D, W>, dim3(row_blocks(a, W), a.hq, a.batch), kWarp * W,
                     dq_smem<D, W>(), s, d, q, g.ldq, k, g.ldk, v, g.ldv, g.lse, g.delta, dout, g.lddo, g.dq, g.lddq);
}

}  // namespace

namespace detail {

// d is 64 or 128 and the operands fp32 (attention_args_rule).
Status tc_attention_fwd(cudaStream_t s, const AttentionArgs& a, int block_warps) {
  if (block_warps == 8) return a.shape.d == 64 ? fwd<64, 8>(s, a) : fwd<128, 8>(s, a);
  return a.shape.d == 64 ? fwd<64, 4>(s, a) : fwd<128, 4>(s, a);
}

Status tc_attention_bwd(cudaStream_t s, const AttentionArgs& a, int block_warps) {
  if (block_warps == 8) return a.shape.d == 64 ? bwd<64, 8>(s, a) : bwd<128, 8>(s, a);
  return a.shape.d == 64 ? bwd<64, 4>(s, a) : bwd<128, 4>(s, a);
}

}  // namespace detail

}  // namespace tessel::kernels::cuda
