// Causal attention, second tensor-core version, forward and backward: the same contracts and numerics as
// attention_tc.cu (bf16 operands, fp32 accumulation and softmax, fp32 outputs, lse in
// natural units), with the three changes the first version's H200 figures pointed at (12-20% of the bf16
// rate):
//   - q, k, v (and dO) are rounded to bf16 once, by a pass over the whole tensors, instead of on every tile
//     load (each K/V tile is read by every query block of its head);
//   - K/V tiles are double-buffered with cp.async (Ampere+ asynchronous global->shared copies): tile j+1
//     is in flight while tile j's products run, instead of load, barrier, compute, barrier;
//   - operand fragments come from shared memory by ldmatrix (four 8x8 matrices per instruction) instead of
//     one 32-bit load per register, and V is read row-major through ldmatrix.trans, so no transposed store.
// Work split of the forward: a block of 4 warps owns 64 query rows (16 per warp, kept in registers as A
// fragments) and streams 64-key tiles; the backward's kernels are described where they are defined. Shared memory: Q 64 rows + 2 x (K, V) 64 rows, bf16, rows padded by 8 elements
// (16 bytes), so the 8 row addresses of an ldmatrix land in distinct banks: 87,040 bytes at d 128.
//
// ldmatrix.x4 (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): lanes 8m..8m+7 give the row
// addresses of matrix m; register m of lane L receives matrix m's elements (row L/4, columns 2(L%4), +1),
// or with .trans (rows 2(L%4), +1, column L/4). Against mma.m16n8k16's fragments (attention_tc.cu's header):
//   A (Q rows r0.., d k0..):    matrix m at rows r0 + 8(m%2), columns k0 + 8(m/2)  -> a0..a3;
//   B of S = Q K^T (K row-major [key][d], keys n0..n0+15): matrix m at keys n0 + 8(m/2), d k0 + 8(m%2)
//                               -> b0, b1 of keys n0..n0+7, then b0, b1 of keys n0+8..;
//   B of O = P V (V row-major [key][d], .trans): matrix m at keys k0 + 8(m%2), d n0 + 8(m/2)
//                               -> b0, b1 of d n0..n0+7, then b0, b1 of d n0+8...
//
// Experimental (attention variant experimental-tc2): never run on a GPU. tests/cuda_emu runs this file's
// code on the CPU in every build (an emulation of ldmatrix, mma, cp.async and the barriers per the PTX ISA,
// with race and alignment checks); tests/cuda/test_attention.cpp compares both directions with the CPU
// reference on a GPU and tools/device-check.sh times them beside the measured kernels.
#include <cuda_bf16.h>

#include <algorithm>
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
constexpr int kWarps = 4;
constexpr int kRows = 16 * kWarps;  // query rows per block
constexpr int kKeys = 64;           // keys per streamed tile


// Rows [row0, row0 + R) of one head (columns col0.., D wide) of a compact bf16 matrix (row stride ld) into
// an [R][D + 8] tile; rows at or past S are zeros.
template <int D, int R = 64>
__device__ void load_tile_async(bf16* dst, const bf16* __restrict__ src, int ld, std::size_t base, int col0, int row0,
                                int S) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static_assert(R * kChunks % (kWarps * kWarp) == 0, "whole chunks per thread");
#pragma unroll
  for (int u = 0; u < R * kChunks / (kWarps * kWarp); ++u) {  // a constant trip count, so it unrolls
    const int idx = threadIdx.x + u * kWarps * kWarp, r = idx / kChunks, c = (idx % kChunks) * 8;
    const bool ok = row0 + r < S;
    cp_async16(dst + r * (D + 8) + c, src + (base + (ok ? row0 + r : 0)) * ld + col0 + c, ok);
  }
}


// grid (ceil(S / 64), HQ, B); block x in reverse so the rows with the most keys start first.
template <int D>
__global__ void __launch_bounds__(kWarps * kWarp) fwd2_kernel(AttnDims d, const bf16* __restrict__ q, int ldq,
                                                               const bf16* __restrict__ k, const bf16* __restrict__ v,
                                                               int ldkv, float* __restrict__ out, int ldo,
                                                               float* __restrict__ lse) {
  constexpr int P = D + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [64][P]
  bf16* Ks = Qs + kRows * P;                 // [2][64][P]
  bf16* Vs = Ks + 2 * kKeys * P;             // [2][64][P]
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z, hk = h / (d.HQ / d.HKV);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const std::size_t base = std::size_t(b) * d.S;
  const int last = min(d.S, i0 + kRows), tiles = (last + kKeys - 1) / kKeys;

  load_tile_async<D>(Qs, q, ldq, base, h * D, i0, d.S);
  load_tile_async<D>(Ks, k, ldkv, base, hk * D, 0, d.S);
  load_tile_async<D>(Vs, v, ldkv, base, hk * D, 0, d.S);
  cp_async_commit();

  // Lane address offsets of the three ldmatrix patterns (header), within a tile.
  const int m = lane / 8, r8 = lane % 8;
  const int a_off = (warp * 16 + (m % 2) * 8 + r8) * P + (m / 2) * 8;  // + kk * 16
  const int k_off = ((m / 2) * 8 + r8) * P + (m % 2) * 8;              // + n0 * P + kk * 16
  const int v_off = ((m % 2) * 8 + r8) * P + (m / 2) * 8;              // + kk * 16 * P + n0

  std::uint32_t qf[D / 16][4];
  float o[D / 8][4] = {};
  SoftmaxRow row[2];  // this thread's rows ia and ia + 8 (attention_softmax.cuh)
  const float sl2 = score_scale(d.scale);
  const int ia = i0 + warp * 16 + g;

  for (int tile = 0; tile < tiles; ++tile) {
    const int cur = tile & 1, j0 = tile * kKeys;
    if (tile + 1 < tiles) {  // the next tile into the other buffer, free since the last iteration's barrier
      load_tile_async<D>(Ks + (cur ^ 1) * kKeys * P, k, ldkv, base, hk * D, j0 + kKeys, d.S);
      load_tile_async<D>(Vs + (cur ^ 1) * kKeys * P, v, ldkv, base, hk * D, j0 + kKeys, d.S);
      cp_async_commit();
      cp_async_wait<1>();  // everything but the group just issued: this tile (and Q) have landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (tile == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(qf[kk], Qs + a_off + kk * 16);
    }
    const bf16* Kt = Ks + cur * kKeys * P;
    const bf16* Vt = Vs + cur * kKeys * P;

    float sc[kKeys / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        std::uint32_t bk[4];
        ldsm_x4(bk, Kt + k_off + np * 16 * P + kk * 16);
        mma16816(sc[2 * np], qf[kk], bk[0], bk[1]);
        mma16816(sc[2 * np + 1], qf[kk], bk[2], bk[3]);
      }
    // Causal mask where the tile reaches past this warp's first row (it also hides keys >= S for rows < S).
    const bool diag = j0 + kKeys - 1 > i0 + warp * 16;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j0 + n * 8 + 2 * t + (e & 1), i = ia + (e >> 1) * 8;
        sc[n][e] = (diag && j > i) ? -INFINITY : sc[n][e] * sl2;
        mx[e >> 1] = fmaxf(mx[e >> 1], sc[n][e]);
      }
    const float alpha[2] = {row[0].next_tile(quad_max(mx[0])), row[1].next_tile(quad_max(mx[1]))};
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
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
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      std::uint32_t a[4] = {pack2(sc[2 * kk][0], sc[2 * kk][1]), pack2(sc[2 * kk][2], sc[2 * kk][3]),
                            pack2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), pack2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        std::uint32_t bv[4];
        ldsm_x4_trans(bv, Vt + v_off + kk * 16 * P + np * 16);
        mma16816(o[2 * np], a, bv[0], bv[1]);
        mma16816(o[2 * np + 1], a, bv[2], bv[3]);
      }
    }
    __syncthreads();  // this buffer is refilled by the load issued at the top of the next iteration
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

constexpr int kQry = 32;  // dK/dV: queries per streamed tile

// grid (ceil(S / 64), HKV, B): a block owns 64 keys (16 per warp) and streams 32-query tiles of every query
// head of its GQA group, double-buffered. Per tile: S^T = K Q^T and dP^T = V dO^T (B operands from the
// row-major Q and dO tiles), P^T = exp(S^T - lse), dS^T = P^T (dP^T - delta), then dV += P^T dO and
// dK += dS^T Q (B operands through ldmatrix.trans of the same tiles: no transposed copies).
template <int D>
__global__ void __launch_bounds__(kWarps * kWarp) dkdv2_kernel(AttnDims d, const bf16* __restrict__ q, int ldq,
                                                                const bf16* __restrict__ k, const bf16* __restrict__ v,
                                                                int ldkv, const bf16* __restrict__ dout,
                                                                const float* __restrict__ lse,
                                                                const float* __restrict__ delta, float* __restrict__ dk,
                                                                int lddk, float* __restrict__ dv, int lddv) {
  constexpr int P = D + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);  // [64][P]
  bf16* Vs = Ks + kRows * P;                 // [64][P]
  bf16* Qs = Vs + kRows * P;                 // [2][32][P]
  bf16* Os = Qs + 2 * kQry * P;              // [2][32][P] dO
  const int j0 = (gridDim.x - 1 - blockIdx.x) * kRows, hk = blockIdx.y, b = blockIdx.z, group = d.HQ / d.HKV;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const std::size_t base = std::size_t(b) * d.S;
  const int per_head = (d.S - j0 + kQry - 1) / kQry, tiles = group * per_head;  // causal: queries i >= j0
  const auto tile_of = [&](int u, int& h, int& i0) {
    h = hk * group + u / per_head;
    i0 = j0 + (u % per_head) * kQry;
  };
  const auto load_qdo = [&](int u, int buf) {
    int h, i0;
    tile_of(u, h, i0);
    load_tile_async<D, kQry>(Qs + buf * kQry * P, q, ldq, base, h * D, i0, d.S);
    load_tile_async<D, kQry>(Os + buf * kQry * P, dout, ldq, base, h * D, i0, d.S);
  };
  load_tile_async<D, kRows>(Ks, k, ldkv, base, hk * D, j0, d.S);
  load_tile_async<D, kRows>(Vs, v, ldkv, base, hk * D, j0, d.S);
  load_qdo(0, 0);
  cp_async_commit();

  const int m = lane / 8, r8 = lane % 8;
  const int a_off = (warp * 16 + (m % 2) * 8 + r8) * P + (m / 2) * 8;
  const int k_off = ((m / 2) * 8 + r8) * P + (m % 2) * 8;
  const int v_off = ((m % 2) * 8 + r8) * P + (m / 2) * 8;
  float gk[D / 8][4] = {}, gv[D / 8][4] = {};
  const float sl2 = score_scale(d.scale);
  const int ja = j0 + warp * 16 + g;  // this thread's keys: ja and ja + 8

  for (int u = 0; u < tiles; ++u) {
    const int cur = u & 1;
    if (u + 1 < tiles) {
      load_qdo(u + 1, cur ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    int h, i0;
    tile_of(u, h, i0);
    const bf16* Qt = Qs + cur * kQry * P;
    const bf16* Ot = Os + cur * kQry * P;
    float st[kQry / 8][4] = {}, dpt[kQry / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t ak[4], av[4];
      ldsm_x4(ak, Ks + a_off + kk * 16);
      ldsm_x4(av, Vs + a_off + kk * 16);
#pragma unroll
      for (int np = 0; np < kQry / 16; ++np) {
        std::uint32_t bq[4], bo[4];
        ldsm_x4(bq, Qt + k_off + np * 16 * P + kk * 16);
        ldsm_x4(bo, Ot + k_off + np * 16 * P + kk * 16);
        mma16816(st[2 * np], ak, bq[0], bq[1]);
        mma16816(st[2 * np + 1], ak, bq[2], bq[3]);
        mma16816(dpt[2 * np], av, bo[0], bo[1]);
        mma16816(dpt[2 * np + 1], av, bo[2], bo[3]);
      }
    }
    const float* lse_h = lse + (std::size_t(b) * d.HQ + h) * d.S;
    const float* delta_h = delta + (std::size_t(b) * d.HQ + h) * d.S;
    const bool mask = i0 < j0 + kRows || i0 + kQry > d.S;  // causal edge or queries past S
#pragma unroll
    for (int n = 0; n < kQry / 8; ++n)
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {  // the thread's two queries of this 8-query block
        const int i = i0 + n * 8 + 2 * t + e2;
        const bool in = i < d.S;
        const float l2 = in ? __ldg(lse_h + i) * kLog2e : 0.0f, dl = in ? __ldg(delta_h + i) : 0.0f;
#pragma unroll
        for (int r = 0; r < 2; ++r) {  // its two keys
          const int e = 2 * r + e2, j = ja + 8 * r;
          float p = exp2f(st[n][e] * sl2 - l2);
          if (mask && (i < j || !in)) p = 0.0f;
          st[n][e] = p;
          dpt[n][e] = p * (dpt[n][e] - dl);
        }
      }
#pragma unroll
    for (int kk = 0; kk < kQry / 16; ++kk) {
      const std::uint32_t ap[4] = {pack2(st[2 * kk][0], st[2 * kk][1]), pack2(st[2 * kk][2], st[2 * kk][3]),
                                   pack2(st[2 * kk + 1][0], st[2 * kk + 1][1]), pack2(st[2 * kk + 1][2], st[2 * kk + 1][3])};
      const std::uint32_t ads[4] = {pack2(dpt[2 * kk][0], dpt[2 * kk][1]), pack2(dpt[2 * kk][2], dpt[2 * kk][3]),
                                    pack2(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                                    pack2(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        std::uint32_t bo[4], bq[4];
        ldsm_x4_trans(bo, Ot + v_off + kk * 16 * P + np * 16);
        ldsm_x4_trans(bq, Qt + v_off + kk * 16 * P + np * 16);
        mma16816(gv[2 * np], ap, bo[0], bo[1]);
        mma16816(gv[2 * np + 1], ap, bo[2], bo[3]);
        mma16816(gk[2 * np], ads, bq[0], bq[1]);
        mma16816(gk[2 * np + 1], ads, bq[2], bq[3]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = ja + 8 * r;
    if (j >= d.S) continue;
    store_acc_row<D>(dk + (base + j) * lddk + hk * D, gk, r, t, d.scale);
    store_acc_row<D>(dv + (base + j) * lddv + hk * D, gv, r, t, 1.0f);
  }
}

// grid (ceil(S / 64), HQ, B): a block owns 64 query rows (Q and dO in shared memory) and streams 64-key
// tiles, double-buffered. S = Q K^T, dP = dO V^T (B operands from the row-major K and V tiles), dS =
// P (dP - delta), dQ += dS K (B operand through ldmatrix.trans of the K tile).
template <int D>
__global__ void __launch_bounds__(kWarps * kWarp) dq2_kernel(AttnDims d, const bf16* __restrict__ q, int ldq,
                                                              const bf16* __restrict__ k, const bf16* __restrict__ v,
                                                              int ldkv, const bf16* __restrict__ dout,
                                                              const float* __restrict__ lse,
                                                              const float* __restrict__ delta, float* __restrict__ dq,
                                                              int lddq) {
  constexpr int P = D + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [64][P]
  bf16* Os = Qs + kRows * P;                 // [64][P] dO
  bf16* Ks = Os + kRows * P;                 // [2][64][P]
  bf16* Vs = Ks + 2 * kKeys * P;             // [2][64][P]
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z, hk = h / (d.HQ / d.HKV);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const std::size_t base = std::size_t(b) * d.S;
  const int last = min(d.S, i0 + kRows), tiles = (last + kKeys - 1) / kKeys;
  load_tile_async<D, kRows>(Qs, q, ldq, base, h * D, i0, d.S);
  load_tile_async<D, kRows>(Os, dout, ldq, base, h * D, i0, d.S);
  load_tile_async<D, kKeys>(Ks, k, ldkv, base, hk * D, 0, d.S);
  load_tile_async<D, kKeys>(Vs, v, ldkv, base, hk * D, 0, d.S);
  cp_async_commit();

  const int m = lane / 8, r8 = lane % 8;
  const int a_off = (warp * 16 + (m % 2) * 8 + r8) * P + (m / 2) * 8;
  const int k_off = ((m / 2) * 8 + r8) * P + (m % 2) * 8;
  const int v_off = ((m % 2) * 8 + r8) * P + (m / 2) * 8;
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
  for (int tile = 0; tile < tiles; ++tile) {
    const int cur = tile & 1, j0 = tile * kKeys;
    if (tile + 1 < tiles) {
      load_tile_async<D, kKeys>(Ks + (cur ^ 1) * kKeys * P, k, ldkv, base, hk * D, j0 + kKeys, d.S);
      load_tile_async<D, kKeys>(Vs + (cur ^ 1) * kKeys * P, v, ldkv, base, hk * D, j0 + kKeys, d.S);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* Kt = Ks + cur * kKeys * P;
    const bf16* Vt = Vs + cur * kKeys * P;
    float sc[kKeys / 8][4] = {}, dp[kKeys / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t aq[4], ao[4];
      ldsm_x4(aq, Qs + a_off + kk * 16);
      ldsm_x4(ao, Os + a_off + kk * 16);
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        std::uint32_t bk[4], bv[4];
        ldsm_x4(bk, Kt + k_off + np * 16 * P + kk * 16);
        ldsm_x4(bv, Vt + k_off + np * 16 * P + kk * 16);
        mma16816(sc[2 * np], aq, bk[0], bk[1]);
        mma16816(sc[2 * np + 1], aq, bk[2], bk[3]);
        mma16816(dp[2 * np], ao, bv[0], bv[1]);
        mma16816(dp[2 * np + 1], ao, bv[2], bv[3]);
      }
    }
    const bool diag = j0 + kKeys - 1 > i0 + warp * 16;  // as in the forward: also hides keys >= S
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j0 + n * 8 + 2 * t + (e & 1), r = e >> 1;
        float p = exp2f(sc[n][e] * sl2 - l2[r]);
        if (diag && j > ia + 8 * r) p = 0.0f;
        dp[n][e] = p * (dp[n][e] - dl[r]);
      }
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const std::uint32_t a[4] = {pack2(dp[2 * kk][0], dp[2 * kk][1]), pack2(dp[2 * kk][2], dp[2 * kk][3]),
                                  pack2(dp[2 * kk + 1][0], dp[2 * kk + 1][1]), pack2(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        std::uint32_t bk[4];
        ldsm_x4_trans(bk, Kt + v_off + kk * 16 * P + np * 16);
        mma16816(gq[2 * np], a, bk[0], bk[1]);
        mma16816(gq[2 * np + 1], a, bk[2], bk[3]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = ia + 8 * r;
    if (i >= d.S) continue;
    store_acc_row<D>(dq + (base + i) * lddq + h * D, gq, r, t, d.scale);
  }
}

template <int D>
constexpr std::size_t fwd2_smem() { return sizeof(bf16) * (kRows + 4 * kKeys) * (D + 8); }

template <int D>
Status fwd2(cudaStream_t s, const AttentionShape& a, const bf16* q, const bf16* k, const bf16* v, float* out, int ldo,
            float* lse) {
  const dim3 grid(static_cast<unsigned>(ceil_div(a.seq, kRows)), a.hq, a.batch);
  return attn_launch("attention (experimental-tc2)", fwd2_kernel<D>, grid, kWarps * kWarp, fwd2_smem<D>(), s, attn_dims(a), q,
                     a.hq * D, k, v, a.hkv * D, out, ldo, lse);
}

template <int D>
constexpr std::size_t dkdv2_smem() { return sizeof(bf16) * (2 * kRows + 4 * kQry) * (D + 8); }
template <int D>
constexpr std::size_t dq2_smem() { return sizeof(bf16) * (2 * kRows + 4 * kKeys) * (D + 8); }

template <int D>
Status bwd2(cudaStream_t s, const AttentionShape& a, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
            const float* lse, const float* delta, float* dq, int lddq, float* dk, int lddk, float* dv, int lddv) {
  const AttnDims d = attn_dims(a);
  const unsigned blocks = static_cast<unsigned>(ceil_div(a.seq, kRows));
  TESSEL_STATUS_CHECK(attn_launch("attention (experimental-tc2)", dkdv2_kernel<D>, dim3(blocks, a.hkv, a.batch), kWarps * kWarp,
                                  dkdv2_smem<D>(), s, d, q, a.hq * D, k, v, a.hkv * D, dout, lse, delta, dk, lddk, dv,
                                  lddv));
  return attn_launch("attention (experimental-tc2)", dq2_kernel<D>, dim3(blocks, a.hq, a.batch), kWarps * kWarp, dq2_smem<D>(), s, d,
                     q, a.hq * D, k, v, a.hkv * D, dout, lse, delta, dq, lddq);
}

}  // namespace

namespace detail {

Status tc2_attention_fwd(cudaStream_t s, const AttentionArgs& g) {
  const AttentionShape& a = g.shape;
  return with_bf16_operands(s, g, false, [&](const bf16* q, const bf16* k, const bf16* v, const bf16*) {
    return a.d == 64 ? fwd2<64>(s, a, q, k, v, g.out, g.ldo, g.lse) : fwd2<128>(s, a, q, k, v, g.out, g.ldo, g.lse);
  });
}

// delta from dO in the caller's type (fp32 or bf16), then the kernels on bf16 operands.
Status tc2_attention_bwd(cudaStream_t s, const AttentionArgs& g) {
  const AttentionShape& a = g.shape;
  TESSEL_STATUS_CHECK(attention_delta(s, g));
  return with_bf16_operands(s, g, true, [&](const bf16* q, const bf16* k, const bf16* v, const bf16* dout) {
    return a.d == 64 ? bwd2<64>(s, a, q, k, v, dout, g.lse, g.delta, g.dq, g.lddq, g.dk, g.lddk, g.dv, g.lddv)
                     : bwd2<128>(s, a, q, k, v, dout, g.lse, g.delta, g.dq, g.lddq, g.dk, g.lddk, g.dv, g.lddv);
  });
}

}  // namespace detail

}  // namespace tessel::kernels::cuda
