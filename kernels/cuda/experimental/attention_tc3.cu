// Causal attention, third version, forward and backward: warpgroup matrix multiply-accumulate (wgmma,
// Hopper's sm_90a), the instruction the second version's mma.sync cannot stand in for: the H200's tensor
// cores reach their rate only through it (HGMMA in SASS; mma.sync runs at a fraction). Same contracts and
// numerics as attention_tc.cu (bf16 operands, fp32 accumulation and softmax, fp32
// outputs, lse in natural units). The backward's two kernels are described where they are defined.
//
// Forward: a block of two warpgroups (256 threads) owns 128 query rows, 64 per warpgroup, and streams
// 128-key tiles of K and V through two shared-memory buffers filled by cp.async (tile j + 2 is loaded
// while tiles j + 1 and j are resident). Per tile and warpgroup:
//   S = Q K^T   D/16 wgmma m64n128k16, A (Q) and B (K) from shared memory, both K-major;
//   online softmax on S in registers (the accumulator fragment: rows 16 w + g, + 8; columns 8 i + 2 t, +1);
//   O += P V    128/16 wgmma m64nDk16, A (P, rounded to bf16) from registers, whose fragment is the
//               accumulator's own (columns 16 kk .. 16 kk + 15 of S are A's k16 slice kk), B (V) from
//               shared memory, MN-major (V is [key][d]: d contiguous), trans-b = 1.
// The operand tiles are laid out in shared memory in one of the two canonical layouts of the PTX ISA
// ("Shared Memory Matrix Layout"), a template parameter so the device can measure both:
//   kSwzNone  8 x 16-byte core matrices, 128 contiguous bytes each: chunk (r, c) (16 bytes, columns 8c ..
//             8c + 7 of row r) at (r / 8) * 16 D + c * 128 + (r % 8) * 16;
//   kSwz128   rows of 64 columns (128 bytes) in slabs of the tile's rows, 16-byte chunks XOR-swizzled by
//             the row: chunk (r, c) at (c / 8) * R * 128 + r * 128 + ((c % 8) ^ (r % 8)) * 16, in
//             1024-byte aligned slabs.
// Both layouts serve a tile as a K-major operand (K for S) and as an MN-major one (V for O; Q, dO and K in
// the backward) from the same bytes; only the descriptors differ (desc_kmajor, desc_mnmajor). cp.async
// chunk order: consecutive threads write consecutive 16-byte chunks of shared memory (no bank conflicts)
// and read 64 or 128 contiguous bytes of a global row.
//
// Experimental (attention variants experimental-tc3, -noswizzle, -overlap): never run on a GPU.
// tests/cuda_emu runs this file's code on the CPU with an emulation of wgmma read from the PTX ISA
// (descriptors, both layouts, fragments, the asynchronous completion at wgmma.wait_group);
// tests/cuda/test_attention.cpp checks it and tools/device-check.sh times it on a GPU. Built for sm_90a
// only (kernels/cuda/meson.build); other GPUs get a Status error from the launchers, never a launch.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/attention_kernels.hpp"
#include "kernels/cuda/attention_prep.cuh"
#include "kernels/cuda/attention_softmax.cuh"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/experimental/wgmma.cuh"
#include "kernels/cuda/ptx.cuh"

namespace tessel::kernels::cuda {

namespace {

using bf16 = __nv_bfloat16;
constexpr int kGroups = 2;               // warpgroups per block
constexpr int kThreads = 128 * kGroups;  // 256
constexpr int kRows = 64 * kGroups;      // query rows per block
constexpr int kKeys = 128;               // keys per streamed tile
constexpr int kSwzNone = 0, kSwz128 = 1; // descriptor swizzle field values (bits 62-63)



// A shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address, leading and
// stride dimension byte offsets, each (x & 0x3FFFF) >> 4; swizzle mode in bits 62-63; base offset 0 (every
// swizzled pattern here starts on a 1024-byte boundary).
__device__ inline std::uint64_t make_desc(const void* p, unsigned lbo, unsigned sbo, int swz) {
  return std::uint64_t((smem_addr(p) & 0x3FFFF) >> 4) | (std::uint64_t((lbo & 0x3FFFF) >> 4) << 16) |
         (std::uint64_t((sbo & 0x3FFFF) >> 4) << 32) | (std::uint64_t(swz) << 62);
}

// Byte offset of 16-byte chunk (r, c) of an R x D bf16 tile (header).
template <int Swz, int R, int D>
__device__ inline unsigned chunk_offset(int r, int c) {
  if constexpr (Swz == kSwzNone) return unsigned((r / 8) * 16 * D + c * 128 + (r % 8) * 16);
  else return unsigned((c / 8) * R * 128 + r * 128 + (((c % 8) ^ (r % 8)) * 16));
}

// Descriptor of the K-major operand rows [r0, r0 + 64 or 128) x columns [16 kk, 16 kk + 16) of an R x D tile.
template <int Swz, int R, int D>
__device__ inline std::uint64_t desc_kmajor(const unsigned char* tile, int r0, int kk) {
  if constexpr (Swz == kSwzNone) return make_desc(tile + (r0 / 8) * 16 * D + kk * 256, 128, 16 * D, kSwzNone);
  else return make_desc(tile + (kk / 4) * R * 128 + r0 * 128 + (kk % 4) * 32, 16, 1024, kSwz128);
}

// Descriptor of V's rows [16 kk, 16 kk + 16) (keys: the K of O = P V) x all D columns (N), MN-major.
template <int Swz, int R, int D>
__device__ inline std::uint64_t desc_mnmajor(const unsigned char* tile, int kk) {
  if constexpr (Swz == kSwzNone) return make_desc(tile + kk * 2 * 16 * D, 16 * D, 128, kSwzNone);
  else return make_desc(tile + kk * 16 * 128, R * 128, 1024, kSwz128);
}

// Rows [row0, row0 + R) of one head (columns col0 .. col0 + D) of a compact bf16 matrix (row stride ld),
// rows at or past S as zeros.
template <int Swz, int R, int D>
__device__ void load_tile(unsigned char* dst, const bf16* __restrict__ src, int ld, std::size_t base, int col0, int row0,
                          int S) {
  constexpr int C = D / 8;  // chunks per row
  static_assert(R * C % kThreads == 0, "whole chunks per thread");
#pragma unroll
  for (int u = 0; u < R * C / kThreads; ++u) {
    const int idx = threadIdx.x + u * kThreads;
    int r, c;
    if constexpr (Swz == kSwzNone) {  // idx = chunk index in shared memory: (row group, c, r % 8)
      r = (idx / (8 * C)) * 8 + idx % 8;
      c = (idx % (8 * C)) / 8;
    } else {  // (slab, r, c % 8), the swizzle only permutes within the 128 bytes of a row
      r = (idx % (R * 8)) / 8;
      c = (idx / (R * 8)) * 8 + idx % 8;
    }
    const bool ok = row0 + r < S;
    cp_async16(dst + chunk_offset<Swz, R, D>(r, c), src + (base + (ok ? row0 + r : 0)) * ld + col0 + c * 8, ok);
  }
}


// One online-softmax step on this thread's part of an S tile (rows ia and ia + 8 of the warp whose first
// row is row0; keys j0 + 8 n + 2 t + (e & 1)): scaled by sl2 (scale * log2 e), keys past the causal edge
// masked when the tile reaches it (which also hides keys >= S for rows < S), the running max and sum
// updated; alpha is the factor the O accumulated so far must be rescaled by (0 on the first tile), and p
// receives P in bf16 as the A fragments of O += P V (the accumulator's columns 16 kk .. as A's k16 slice kk).
__device__ inline void softmax_tile(float (&s)[kKeys / 2], int j0, int row0, int ia, int t, float sl2, float (&mrow)[2],
                                    float (&l)[2], float (&alpha)[2], std::uint32_t (&p)[kKeys / 16][4]) {
  const bool diag = j0 + kKeys - 1 > row0;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = j0 + n * 8 + 2 * t + (e & 1), i = ia + (e >> 1) * 8;
      s[4 * n + e] = (diag && j > i) ? -INFINITY : s[4 * n + e] * sl2;
      mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * n + e]);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = fmaxf(mrow[r], quad_max(mx[r]));
    alpha[r] = exp2f(mrow[r] - m_new);
    mrow[r] = m_new;
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[4 * n + e] = exp2f(s[4 * n + e] - mrow[e >> 1]);
      l[e >> 1] += s[4 * n + e];
    }
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) p[kk][r] = pack2(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

template <int D>
__device__ inline void rescale(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    o[4 * n + 0] *= alpha[0];
    o[4 * n + 1] *= alpha[0];
    o[4 * n + 2] *= alpha[1];
    o[4 * n + 3] *= alpha[1];
  }
}

// out = O / l and lse = ln 2 (m + log2 l) for this thread's rows ia and ia + 8 (those below S).
template <int D>
__device__ inline void store_out(const AttnDims& d, const float (&o)[D / 2], const float (&mrow)[2], const float (&l)[2],
                                 int ia, int t, std::size_t base, int b, int h, float* __restrict__ out, int ldo,
                                 float* __restrict__ lse) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = ia + 8 * r;
    const float sum = quad_sum(l[r]);
    if (i >= d.S) continue;
    const float inv = 1.0f / sum;
    float* dst = out + (base + i) * ldo + h * D + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[4 * n + 2 * r] * inv, o[4 * n + 2 * r + 1] * inv);
    if (t == 0) lse[(std::size_t(b) * d.HQ + h) * d.S + i] = kLn2 * (mrow[r] + log2f(sum));
  }
}

template <int D>
constexpr std::size_t fwd3_smem() { return sizeof(bf16) * std::size_t(kRows + 4 * kKeys) * D + 1024; }

// grid (ceil(S / 128), HQ, B); block x in reverse so the rows with the most keys start first.
template <int D, int Swz>
__global__ void __launch_bounds__(kThreads, 1) fwd3_kernel(AttnDims d, const bf16* __restrict__ q, int ldq,
                                                           const bf16* __restrict__ k, const bf16* __restrict__ v,
                                                           int ldkv, float* __restrict__ out, int ldo,
                                                           float* __restrict__ lse) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma exists only in sm_90a machine code; the launcher never gets here on another target
#else
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* const Qs = smem + ((1024u - (smem_addr(smem) & 1023u)) & 1023u);  // 1024-byte aligned
  unsigned char* const Ks = Qs + kRows * D * 2;  // [2][kKeys x D]
  unsigned char* const Vs = Ks + 2 * kKeys * D * 2;
  constexpr int kTile = kKeys * D * 2;  // bytes of one K or V tile
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z, hk = h / (d.HQ / d.HKV);
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const std::size_t base = std::size_t(b) * d.S;
  const int last = min(d.S, i0 + kRows), tiles = (last + kKeys - 1) / kKeys;

  load_tile<Swz, kRows, D>(Qs, q, ldq, base, h * D, i0, d.S);
  load_tile<Swz, kKeys, D>(Ks, k, ldkv, base, hk * D, 0, d.S);
  load_tile<Swz, kKeys, D>(Vs, v, ldkv, base, hk * D, 0, d.S);
  cp_async_commit();
  if (tiles > 1) {
    load_tile<Swz, kKeys, D>(Ks + kTile, k, ldkv, base, hk * D, kKeys, d.S);
    load_tile<Swz, kKeys, D>(Vs + kTile, v, ldkv, base, hk * D, kKeys, d.S);
    cp_async_commit();
  }

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float mrow[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float sl2 = score_scale(d.scale);
  const int row0 = i0 + 64 * wg + 16 * warp, ia = row0 + g;  // this thread's rows: ia and ia + 8

  for (int tile = 0; tile < tiles; ++tile) {
    const int cur = tile & 1, j0 = tile * kKeys;
    if (tile + 1 < tiles) cp_async_wait<1>();  // this tile's group has landed; the next one may be in flight
    else cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    const unsigned char* Kt = Ks + cur * kTile;
    const unsigned char* Vt = Vs + cur * kTile;

    float s[kKeys / 2];
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) s[i] = 0.0f;  // overwritten (scale-d 0), but never read undefined
    fence_regs(s);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_ss<kKeys>(s, desc_kmajor<Swz, kRows, D>(Qs, 64 * wg, kk), desc_kmajor<Swz, kKeys, D>(Kt, 0, kk), kk > 0);
    wg_commit();
    wg_wait<0>();
    fence_regs(s);

    float alpha[2];
    std::uint32_t p[kKeys / 16][4];
    softmax_tile(s, j0, row0, ia, t, sl2, mrow, l, alpha, p);
    rescale<D>(o, alpha);
    fence_regs(o);
    fence_regs(p);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) wgmma_rs_bt<D>(o, p[kk], desc_mnmajor<Swz, kKeys, D>(Vt, kk), 1);
    wg_commit();
    wg_wait<0>();
    fence_regs(o);
    fence_regs(p);
    __syncthreads();  // both warpgroups are done with buffer cur: refill it with tile + 2
    if (tile + 2 < tiles) {
      load_tile<Swz, kKeys, D>(Ks + cur * kTile, k, ldkv, base, hk * D, j0 + 2 * kKeys, d.S);
      load_tile<Swz, kKeys, D>(Vs + cur * kTile, v, ldkv, base, hk * D, j0 + 2 * kKeys, d.S);
      cp_async_commit();
    }
  }
  store_out<D>(d, o, mrow, l, ia, t, base, b, h, out, ldo, lse);
#endif
}

template <int D, int Swz>
Status fwd3(cudaStream_t s, const AttentionShape& a, const bf16* q, const bf16* k, const bf16* v, float* out, int ldo,
            float* lse) {
  const dim3 grid(static_cast<unsigned>(ceil_div(a.seq, kRows)), a.hq, a.batch);
  return attn_launch("attention (experimental-tc3)", fwd3_kernel<D, Swz>, grid, kThreads, fwd3_smem<D>(), s, attn_dims(a), q,
                     a.hq * D, k, v, a.hkv * D, out, ldo, lse);
}

// The forward with each warpgroup's tensor-core work overlapping its softmax (FlashAttention-3's
// "intra-warpgroup overlapping", Shah et al. 2024, section 3.2): in iteration j it issues S_j = Q K_j^T
// and O += P_{j-1} V_{j-1} back to back, waits for S_j only, runs the softmax of S_j while the P V
// products finish, then waits for those and rescales O. Tile j's K and tile j - 1's V are read in the
// same iteration, so K and V stream through three buffers (tile j in buffer j % 3; tile j + 1 is loaded
// while j runs, into the buffer tile j - 2 left): 225 KiB of shared memory at d 128. Same numerics as
// fwd3_kernel (the same products, softmax and rounding in the same order per tile).
// What the compiler made of it (nvcc 13.0, cuobjdump of the sm_90a object): the PTX has the softmax between
// the two waits, but ptxas moves the second wait up to just after the scale and mask, so the exponentials
// run after the P V products finish and little overlaps. Two tries did not move them (P alternating between
// two register arrays, so it is not rewritten in place; a real use of P's registers after the wait); the
// device's timing of this against fwd3_kernel says whether the rest of the reordering is worth keeping.
// FlashAttention-3 gets the overlap with warp-specialised producers and named-barrier scheduling, which
// this kernel does not have.
template <int D>
constexpr std::size_t fwd3o_smem() { return sizeof(bf16) * std::size_t(kRows + 6 * kKeys) * D + 1024; }

template <int D, int Swz>
__global__ void __launch_bounds__(kThreads, 1) fwd3o_kernel(AttnDims d, const bf16* __restrict__ q, int ldq,
                                                            const bf16* __restrict__ k, const bf16* __restrict__ v,
                                                            int ldkv, float* __restrict__ out, int ldo,
                                                            float* __restrict__ lse) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* const Qs = smem + ((1024u - (smem_addr(smem) & 1023u)) & 1023u);
  constexpr int kTile = kKeys * D * 2;
  unsigned char* const Ks = Qs + kRows * D * 2;  // [3][kKeys x D]
  unsigned char* const Vs = Ks + 3 * kTile;      // [3][kKeys x D]
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z, hk = h / (d.HQ / d.HKV);
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const std::size_t base = std::size_t(b) * d.S;
  const int last = min(d.S, i0 + kRows), tiles = (last + kKeys - 1) / kKeys;
  const auto load_kv = [&](int tile) {
    load_tile<Swz, kKeys, D>(Ks + (tile % 3) * kTile, k, ldkv, base, hk * D, tile * kKeys, d.S);
    load_tile<Swz, kKeys, D>(Vs + (tile % 3) * kTile, v, ldkv, base, hk * D, tile * kKeys, d.S);
  };
  load_tile<Swz, kRows, D>(Qs, q, ldq, base, h * D, i0, d.S);
  load_kv(0);
  cp_async_commit();
  if (tiles > 1) {
    load_kv(1);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  fence_proxy_async();
  __syncthreads();

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float mrow[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
  const float sl2 = score_scale(d.scale);
  const int row0 = i0 + 64 * wg + 16 * warp, ia = row0 + g;
  float s[kKeys / 2];
  std::uint32_t p[kKeys / 16][4];
#pragma unroll
  for (int i = 0; i < kKeys / 2; ++i) s[i] = 0.0f;
  fence_regs(s);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_ss<kKeys>(s, desc_kmajor<Swz, kRows, D>(Qs, 64 * wg, kk), desc_kmajor<Swz, kKeys, D>(Ks, 0, kk), kk > 0);
  wg_commit();
  wg_wait<0>();
  fence_regs(s);
  softmax_tile(s, 0, row0, ia, t, sl2, mrow, l, alpha, p);  // O is still 0: alpha not needed

  for (int tile = 1; tile < tiles; ++tile) {
    __syncthreads();  // every warpgroup is past iteration tile - 1: tile - 2's buffer is free
    if (tile + 1 < tiles) {
      load_kv(tile + 1);
      cp_async_commit();
      cp_async_wait<1>();  // tile's group has landed
    } else {
      cp_async_wait<0>();
    }
    fence_proxy_async();
    __syncthreads();
    const unsigned char* Kt = Ks + (tile % 3) * kTile;
    const unsigned char* Vp = Vs + ((tile - 1) % 3) * kTile;
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) s[i] = 0.0f;
    fence_regs(s);
    fence_regs(o);
    fence_regs(p);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_ss<kKeys>(s, desc_kmajor<Swz, kRows, D>(Qs, 64 * wg, kk), desc_kmajor<Swz, kKeys, D>(Kt, 0, kk), kk > 0);
    wg_commit();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) wgmma_rs_bt<D>(o, p[kk], desc_mnmajor<Swz, kKeys, D>(Vp, kk), 1);
    wg_commit();
    wg_wait<1>();  // S_tile is complete; O += P V may still run
    fence_regs(s);
    std::uint32_t pn[kKeys / 16][4];
    softmax_tile(s, tile * kKeys, row0, ia, t, sl2, mrow, l, alpha, pn);
    wg_wait<0>();
    fence_regs(o);
    fence_regs(p);
    rescale<D>(o, alpha);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) p[kk][r] = pn[kk][r];
  }
  fence_regs(o);
  fence_regs(p);
  wg_fence();
  const unsigned char* Vl = Vs + ((tiles - 1) % 3) * kTile;
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) wgmma_rs_bt<D>(o, p[kk], desc_mnmajor<Swz, kKeys, D>(Vl, kk), 1);
  wg_commit();
  wg_wait<0>();
  fence_regs(o);
  fence_regs(p);
  store_out<D>(d, o, mrow, l, ia, t, base, b, h, out, ldo, lse);
#endif
}

template <int D, int Swz>
Status fwd3o(cudaStream_t s, const AttentionShape& a, const bf16* q, const bf16* k, const bf16* v, float* out, int ldo,
             float* lse) {
  const dim3 grid(static_cast<unsigned>(ceil_div(a.seq, kRows)), a.hq, a.batch);
  return attn_launch("attention (experimental-tc3)", fwd3o_kernel<D, Swz>, grid, kThreads, fwd3o_smem<D>(), s, attn_dims(a), q,
                     a.hq * D, k, v, a.hkv * D, out, ldo, lse);
}

// ---- backward (FlashAttention-2's two kernels, on wgmma) ----
constexpr int kQryB = 64;   // dK/dV: queries per streamed tile
constexpr int kKeysB = 64;  // dQ: keys per streamed tile

template <int D>
constexpr std::size_t dkdv3_smem() { return sizeof(bf16) * std::size_t(2 * kRows + 4 * kQryB) * D + 1024; }
template <int D>
constexpr std::size_t dq3_smem() { return sizeof(bf16) * std::size_t(2 * kRows + 4 * kKeysB) * D + 1024; }

// dK/dV's per-tile softmax work on this thread's part of the transposed tiles (keys ja and ja + 8 of the
// warp whose first key is jr0; queries i0 + 8 n + 2 t + e2): P^T = exp(S^T - lse), 0 past the causal edge
// or past S, packed to bf16 as the A operands of dV += P^T dO.
__device__ inline void probs_t(float (&st)[kQryB / 2], std::uint32_t (&ap)[kQryB / 16][4], int i0, int jr0, int ja,
                               int t, int S, const float* __restrict__ lse_h, float sl2) {
  const bool mask = i0 < jr0 + 16 || i0 + kQryB > S;  // causal edge of this warp's keys, or queries past S
#pragma unroll
  for (int n = 0; n < kQryB / 8; ++n)
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {  // the thread's two queries of this 8-query block
      const int i = i0 + n * 8 + 2 * t + e2;
      const bool in = i < S;
      const float lse = in ? __ldg(lse_h + i) : 0.0f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {  // its two keys
        const int e = 2 * r + e2, j = ja + 8 * r;
        float p = prob_from_lse(st[4 * n + e] * sl2, lse);
        if (mask && (i < j || !in)) p = 0.0f;
        st[4 * n + e] = p;
      }
    }
#pragma unroll
  for (int kk = 0; kk < kQryB / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) ap[kk][r] = pack2(st[8 * kk + 2 * r], st[8 * kk + 2 * r + 1]);
}

// dS^T = P^T (dP^T - delta) in place of dP^T, packed to bf16 as the A operands of dK += dS^T Q.
__device__ inline void grads_t(float (&dpt)[kQryB / 2], const float (&pt)[kQryB / 2], std::uint32_t (&ads)[kQryB / 16][4],
                               int i0, int t, int S, const float* __restrict__ delta_h) {
#pragma unroll
  for (int n = 0; n < kQryB / 8; ++n)
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
      const int i = i0 + n * 8 + 2 * t + e2;
      const float dl = i < S ? __ldg(delta_h + i) : 0.0f;
#pragma unroll
      for (int r = 0; r < 2; ++r) dpt[4 * n + 2 * r + e2] = pt[4 * n + 2 * r + e2] * (dpt[4 * n + 2 * r + e2] - dl);
    }
#pragma unroll
  for (int kk = 0; kk < kQryB / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) ads[kk][r] = pack2(dpt[8 * kk + 2 * r], dpt[8 * kk + 2 * r + 1]);
}

// grid (ceil(S / 128), HKV, B): a block owns 128 keys (64 per warpgroup; K and V resident) and streams
// 64-query tiles of Q and dO of every query head of its GQA group, double-buffered. Per tile and warpgroup:
// S^T = K Q^T and dP^T = V dO^T (wgmma, both operands K-major from shared memory: the row-major tiles),
// P^T = exp(S^T - lse), dS^T = P^T (dP^T - delta) in registers, then dV += P^T dO and dK += dS^T Q with
// P^T and dS^T as register A operands and dO, Q as MN-major B operands of the same tiles (trans-b).
template <int D, int Swz>
__global__ void __launch_bounds__(kThreads, 1) dkdv3_kernel(AttnDims d, const bf16* __restrict__ q, int ldq,
                                                            const bf16* __restrict__ k, const bf16* __restrict__ v,
                                                            int ldkv, const bf16* __restrict__ dout,
                                                            const float* __restrict__ lse,
                                                            const float* __restrict__ delta, float* __restrict__ dk,
                                                            int lddk, float* __restrict__ dv, int lddv) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* const Ks = smem + ((1024u - (smem_addr(smem) & 1023u)) & 1023u);
  unsigned char* const Vs = Ks + kRows * D * 2;
  unsigned char* const Qs = Vs + kRows * D * 2;     // [2][kQryB x D]
  unsigned char* const Os = Qs + 2 * kQryB * D * 2;  // [2][kQryB x D] dO
  constexpr int kTile = kQryB * D * 2;
  const int j0 = (gridDim.x - 1 - blockIdx.x) * kRows, hk = blockIdx.y, b = blockIdx.z, group = d.HQ / d.HKV;
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const std::size_t base = std::size_t(b) * d.S;
  const int per_head = (d.S - j0 + kQryB - 1) / kQryB, tiles = group * per_head;  // causal: queries i >= j0
  const auto tile_of = [&](int u, int& h, int& i0) {
    h = hk * group + u / per_head;
    i0 = j0 + (u % per_head) * kQryB;
  };
  const auto load_qdo = [&](int u, int buf) {
    int h, i0;
    tile_of(u, h, i0);
    load_tile<Swz, kQryB, D>(Qs + buf * kTile, q, ldq, base, h * D, i0, d.S);
    load_tile<Swz, kQryB, D>(Os + buf * kTile, dout, ldq, base, h * D, i0, d.S);
  };
  load_tile<Swz, kRows, D>(Ks, k, ldkv, base, hk * D, j0, d.S);
  load_tile<Swz, kRows, D>(Vs, v, ldkv, base, hk * D, j0, d.S);
  load_qdo(0, 0);
  cp_async_commit();
  if (tiles > 1) {
    load_qdo(1, 1);
    cp_async_commit();
  }
  float gk[D / 2], gv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) gk[i] = gv[i] = 0.0f;
  const float sl2 = score_scale(d.scale);
  const int jr0 = j0 + 64 * wg + 16 * warp, ja = jr0 + g;  // this thread's keys: ja and ja + 8

  for (int u = 0; u < tiles; ++u) {
    const int cur = u & 1;
    if (u + 1 < tiles) cp_async_wait<1>();
    else cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    int h, i0;
    tile_of(u, h, i0);
    const unsigned char* Qt = Qs + cur * kTile;
    const unsigned char* Ot = Os + cur * kTile;
    float st[kQryB / 2], dpt[kQryB / 2];
#pragma unroll
    for (int i = 0; i < kQryB / 2; ++i) st[i] = dpt[i] = 0.0f;
    fence_regs(st);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_ss<kQryB>(st, desc_kmajor<Swz, kRows, D>(Ks, 64 * wg, kk), desc_kmajor<Swz, kQryB, D>(Qt, 0, kk), kk > 0);
    wg_commit();
    wg_wait<0>();
    fence_regs(st);
    const float* lse_h = lse + (std::size_t(b) * d.HQ + h) * d.S;
    const float* delta_h = delta + (std::size_t(b) * d.HQ + h) * d.S;
    std::uint32_t ap[kQryB / 16][4], ads[kQryB / 16][4];
    probs_t(st, ap, i0, jr0, ja, t, d.S, lse_h, sl2);
    // dP^T = V dO^T and dV += P^T dO in flight together; dS^T needs only the first (wait_group 1), and dK's
    // products start while dV's finish. Fewer accumulators live at once than computing S^T and dP^T
    // together (FlashAttention-3's order): no spill at d 128.
    fence_regs(gv);
    fence_regs(ap);
    fence_regs(dpt);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_ss<kQryB>(dpt, desc_kmajor<Swz, kRows, D>(Vs, 64 * wg, kk), desc_kmajor<Swz, kQryB, D>(Ot, 0, kk), kk > 0);
    wg_commit();
#pragma unroll
    for (int kk = 0; kk < kQryB / 16; ++kk) wgmma_rs_bt<D>(gv, ap[kk], desc_mnmajor<Swz, kQryB, D>(Ot, kk), 1);
    wg_commit();
    wg_wait<1>();
    fence_regs(dpt);
    grads_t(dpt, st, ads, i0, t, d.S, delta_h);
    fence_regs(gk);
    fence_regs(ads);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kQryB / 16; ++kk) wgmma_rs_bt<D>(gk, ads[kk], desc_mnmajor<Swz, kQryB, D>(Qt, kk), 1);
    wg_commit();
    wg_wait<0>();
    fence_regs(gk);
    fence_regs(gv);
    fence_regs(ap);
    fence_regs(ads);
    __syncthreads();  // both warpgroups are done with buffer cur: refill it with tile u + 2
    if (u + 2 < tiles) {
      load_qdo(u + 2, cur);
      cp_async_commit();
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = ja + 8 * r;
    if (j >= d.S) continue;
    float* pk = dk + (base + j) * lddk + hk * D + 2 * t;
    float* pv = dv + (base + j) * lddv + hk * D + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<float2*>(pk + n * 8) = make_float2(gk[4 * n + 2 * r] * d.scale, gk[4 * n + 2 * r + 1] * d.scale);
      *reinterpret_cast<float2*>(pv + n * 8) = make_float2(gv[4 * n + 2 * r], gv[4 * n + 2 * r + 1]);
    }
  }
#endif
}

// grid (ceil(S / 128), HQ, B): a block owns 128 query rows (64 per warpgroup; Q and dO resident) and
// streams 64-key tiles of K and V, double-buffered. S = Q K^T, dP = dO V^T (both K-major), dS = P (dP -
// delta), dQ += dS K with dS as the register A operand and K as the MN-major B operand of its tile.
template <int D, int Swz>
__global__ void __launch_bounds__(kThreads, 1) dq3_kernel(AttnDims d, const bf16* __restrict__ q, int ldq,
                                                          const bf16* __restrict__ k, const bf16* __restrict__ v,
                                                          int ldkv, const bf16* __restrict__ dout,
                                                          const float* __restrict__ lse, const float* __restrict__ delta,
                                                          float* __restrict__ dq, int lddq) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* const Qs = smem + ((1024u - (smem_addr(smem) & 1023u)) & 1023u);
  unsigned char* const Os = Qs + kRows * D * 2;      // dO
  unsigned char* const Ks = Os + kRows * D * 2;      // [2][kKeysB x D]
  unsigned char* const Vs = Ks + 2 * kKeysB * D * 2;  // [2][kKeysB x D]
  constexpr int kTile = kKeysB * D * 2;
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z, hk = h / (d.HQ / d.HKV);
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const std::size_t base = std::size_t(b) * d.S;
  const int last = min(d.S, i0 + kRows), tiles = (last + kKeysB - 1) / kKeysB;
  load_tile<Swz, kRows, D>(Qs, q, ldq, base, h * D, i0, d.S);
  load_tile<Swz, kRows, D>(Os, dout, ldq, base, h * D, i0, d.S);
  load_tile<Swz, kKeysB, D>(Ks, k, ldkv, base, hk * D, 0, d.S);
  load_tile<Swz, kKeysB, D>(Vs, v, ldkv, base, hk * D, 0, d.S);
  cp_async_commit();
  if (tiles > 1) {
    load_tile<Swz, kKeysB, D>(Ks + kTile, k, ldkv, base, hk * D, kKeysB, d.S);
    load_tile<Swz, kKeysB, D>(Vs + kTile, v, ldkv, base, hk * D, kKeysB, d.S);
    cp_async_commit();
  }
  const int row0 = i0 + 64 * wg + 16 * warp, ia = row0 + g;
  float l2[2], dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::size_t at = (std::size_t(b) * d.HQ + h) * d.S + min(ia + 8 * r, d.S - 1);
    l2[r] = lse[at] * kLog2e;
    dl[r] = delta[at];
  }
  float gq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) gq[i] = 0.0f;
  const float sl2 = score_scale(d.scale);
  for (int tile = 0; tile < tiles; ++tile) {
    const int cur = tile & 1, j0 = tile * kKeysB;
    if (tile + 1 < tiles) cp_async_wait<1>();
    else cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    const unsigned char* Kt = Ks + cur * kTile;
    const unsigned char* Vt = Vs + cur * kTile;
    float sc[kKeysB / 2], dp[kKeysB / 2];
#pragma unroll
    for (int i = 0; i < kKeysB / 2; ++i) sc[i] = dp[i] = 0.0f;
    fence_regs(sc);
    fence_regs(dp);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_ss<kKeysB>(sc, desc_kmajor<Swz, kRows, D>(Qs, 64 * wg, kk), desc_kmajor<Swz, kKeysB, D>(Kt, 0, kk), kk > 0);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_ss<kKeysB>(dp, desc_kmajor<Swz, kRows, D>(Os, 64 * wg, kk), desc_kmajor<Swz, kKeysB, D>(Vt, 0, kk), kk > 0);
    wg_commit();
    wg_wait<0>();
    fence_regs(sc);
    fence_regs(dp);
    const bool diag = j0 + kKeysB - 1 > row0;  // as in the forward: also hides keys >= S
#pragma unroll
    for (int n = 0; n < kKeysB / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j0 + n * 8 + 2 * t + (e & 1), r = e >> 1;
        float p = exp2f(sc[4 * n + e] * sl2 - l2[r]);
        if (diag && j > ia + 8 * r) p = 0.0f;
        dp[4 * n + e] = p * (dp[4 * n + e] - dl[r]);
      }
    std::uint32_t ads[kKeysB / 16][4];
#pragma unroll
    for (int kk = 0; kk < kKeysB / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) ads[kk][r] = pack2(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);
    fence_regs(gq);
    fence_regs(ads);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kKeysB / 16; ++kk) wgmma_rs_bt<D>(gq, ads[kk], desc_mnmajor<Swz, kKeysB, D>(Kt, kk), 1);
    wg_commit();
    wg_wait<0>();
    fence_regs(gq);
    fence_regs(ads);
    __syncthreads();
    if (tile + 2 < tiles) {
      load_tile<Swz, kKeysB, D>(Ks + cur * kTile, k, ldkv, base, hk * D, j0 + 2 * kKeysB, d.S);
      load_tile<Swz, kKeysB, D>(Vs + cur * kTile, v, ldkv, base, hk * D, j0 + 2 * kKeysB, d.S);
      cp_async_commit();
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = ia + 8 * r;
    if (i >= d.S) continue;
    float* dst = dq + (base + i) * lddq + h * D + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<float2*>(dst + n * 8) = make_float2(gq[4 * n + 2 * r] * d.scale, gq[4 * n + 2 * r + 1] * d.scale);
  }
#endif
}

template <int D, int Swz>
Status bwd3(cudaStream_t s, const AttentionShape& a, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
            const float* lse, const float* delta, float* dq, int lddq, float* dk, int lddk, float* dv, int lddv) {
  const AttnDims d = attn_dims(a);
  const unsigned blocks = static_cast<unsigned>(ceil_div(a.seq, kRows));
  TESSEL_STATUS_CHECK(attn_launch("attention (experimental-tc3)", dkdv3_kernel<D, Swz>, dim3(blocks, a.hkv, a.batch), kThreads,
                                  dkdv3_smem<D>(), s, d, q, a.hq * D, k, v, a.hkv * D, dout, lse, delta, dk, lddk, dv,
                                  lddv));
  return attn_launch("attention (experimental-tc3)", dq3_kernel<D, Swz>, dim3(blocks, a.hq, a.batch), kThreads, dq3_smem<D>(), s, d,
                     q, a.hq * D, k, v, a.hkv * D, dout, lse, delta, dq, lddq);
}

// wgmma exists only on compute capability 9.0 (sm_90a machine code).
Status check_device() {
  DeviceInfo info;
  TESSEL_STATUS_CHECK(device_info(info));
  if (info.major != 9 || info.minor != 0)
    return {1, "attention (experimental-tc3): wgmma needs compute capability 9.0 (sm_90a machine code); this device is " +
                   std::to_string(info.major) + "." + std::to_string(info.minor)};
  return {};
}

}  // namespace

namespace detail {

bool tc3_attention_available() { return check_device().ok(); }

// swizzle 128: the 128-byte swizzled layout, 0: core matrices (header); overlap: fwd3o_kernel.
Status tc3_attention_fwd(cudaStream_t s, const AttentionArgs& g, int swizzle, bool overlap) {
  TESSEL_STATUS_CHECK(check_device());
  const AttentionShape& a = g.shape;
  const bool sw = swizzle == 128, d64 = a.d == 64;
  const auto fwd = overlap ? (d64 ? (sw ? fwd3o<64, kSwz128> : fwd3o<64, kSwzNone>)
                                  : (sw ? fwd3o<128, kSwz128> : fwd3o<128, kSwzNone>))
                           : (d64 ? (sw ? fwd3<64, kSwz128> : fwd3<64, kSwzNone>)
                                  : (sw ? fwd3<128, kSwz128> : fwd3<128, kSwzNone>));
  return with_bf16_operands(s, g, false, [&](const bf16* q, const bf16* k, const bf16* v, const bf16*) {
    return fwd(s, a, q, k, v, g.out, g.ldo, g.lse);
  });
}

// delta from dO in the caller's type, then the kernels on bf16 operands.
Status tc3_attention_bwd(cudaStream_t s, const AttentionArgs& g, int swizzle) {
  TESSEL_STATUS_CHECK(check_device());
  const AttentionShape& a = g.shape;
  const bool sw = swizzle == 128;
  const auto bwd = a.d == 64 ? (sw ? bwd3<64, kSwz128> : bwd3<64, kSwzNone>) : (sw ? bwd3<128, kSwz128> : bwd3<128, kSwzNone>);
  TESSEL_STATUS_CHECK(attention_delta(s, g));
  return with_bf16_operands(s, g, true, [&](const bf16* q, const bf16* k, const bf16* v, const bf16* dout) {
    return bwd(s, a, q, k, v, dout, g.lse, g.delta, g.dq, g.lddq, g.dk, g.lddk, g.dv, g.lddv);
  });
}

}  // namespace detail

}  // namespace tessel::kernels::cuda
