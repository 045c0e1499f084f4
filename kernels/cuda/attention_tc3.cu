// Causal attention forward, third version: warpgroup matrix multiply-accumulate (wgmma, Hopper's sm_90a),
// the instruction the second version's mma.sync cannot stand in for: the H200's tensor cores reach their
// rate only through it (HGMMA in SASS; mma.sync runs at a fraction). Same contract and numerics as
// attention_tc_fwd (bf16 operands, fp32 accumulation and softmax, fp32 output, lse in natural units); the
// backward stays the second version's.
//
// Work split: a block of two warpgroups (256 threads) owns 128 query rows, 64 per warpgroup, and streams
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
// Both layouts serve K (K-major for S) and V (MN-major for O) from the same bytes; only the descriptors
// differ (make_desc callers below). cp.async chunk order: consecutive threads write consecutive 16-byte
// chunks of shared memory (no bank conflicts) and read 64 or 128 contiguous bytes of a global row.
//
// Written without a GPU (2026-11-30): tests/cuda_emu runs this file's code on the CPU with an emulation of
// wgmma read from the PTX ISA (descriptors, both layouts, fragments, the asynchronous completion at
// wgmma.wait_group), and tests/cuda/test_attention.cpp and bench_cuda.cpp check and time it on the device.
// The runtime uses it only with TESSEL_ATTENTION=3 until the device has measured it. Built for sm_90a only
// (kernels/cuda/meson.build); other GPUs get a Status error from attention_tc3_fwd, never a launch.
#include <cuda_bf16.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "kernels/cuda/attention_prep.cuh"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/nvtx.hpp"

namespace tessel::kernels::cuda {

namespace {

using bf16 = __nv_bfloat16;
constexpr int kGroups = 2;               // warpgroups per block
constexpr int kThreads = 128 * kGroups;  // 256
constexpr int kRows = 64 * kGroups;      // query rows per block
constexpr int kKeys = 128;               // keys per streamed tile
constexpr int kSwzNone = 0, kSwz128 = 1; // descriptor swizzle field values (bits 62-63)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Dims3 {
  int S, HQ, HKV;
  float scale;
};

// PTX helpers: begin (tests/cuda_emu/emulate_cuda.py replaces everything up to "PTX helpers: end" with
// tests/cuda_emu/wgmma_helpers.inc, the CPU emulation of the same functions)
__device__ inline std::uint32_t pack2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}
__device__ inline unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ inline void cp_async16(void* dst, const bf16* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// cp.async writes shared memory through the generic proxy, wgmma reads it through the async proxy.
__device__ inline void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ inline void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ inline void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// The compiler must not move reads of an accumulator above the wait that completes it, nor writes below
// the wgmma that reads it: an empty asm that "modifies" every register pins them in place.
template <int N>
__device__ inline void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// D (64 x N, f32) = A B + (scale_d ? D : 0), A (64 x 16) and B (16 x N) in shared memory, K-major.
template <int N>
__device__ void wgmma_ss(float (&d)[N / 2], std::uint64_t a, std::uint64_t b, int scale_d);
// The same with A from registers (mma.m16n8k16's A fragment per warp) and B MN-major (trans-b 1).
template <int N>
__device__ void wgmma_rs_bt(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t b, int scale_d);
template <>
__device__ inline void wgmma_rs_bt<64>(float (&d)[32], const std::uint32_t (&a)[4], std::uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <>
__device__ inline void wgmma_ss<128>(float (&d)[64], std::uint64_t a, std::uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(scale_d));
}
template <>
__device__ inline void wgmma_rs_bt<128>(float (&d)[64], const std::uint32_t (&a)[4], std::uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
// PTX helpers: end

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

__device__ inline float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ inline float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <int D>
constexpr std::size_t fwd3_smem() { return sizeof(bf16) * std::size_t(kRows + 4 * kKeys) * D + 1024; }

// grid (ceil(S / 128), HQ, B); block x in reverse so the rows with the most keys start first.
template <int D, int Swz>
__global__ void __launch_bounds__(kThreads, 1) fwd3_kernel(Dims3 d, const bf16* __restrict__ q, int ldq,
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
  const float sl2 = d.scale * kLog2e;
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
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_ss<kKeys>(s, desc_kmajor<Swz, kRows, D>(Qs, 64 * wg, kk), desc_kmajor<Swz, kKeys, D>(Kt, 0, kk), kk > 0);
    wg_commit();
    wg_wait<0>();
    fence_regs(s);

    // Causal mask where the tile reaches past this warp's first row (it also hides keys >= S for rows < S).
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
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(mrow[r], quad_max(mx[r]));
      alpha[r] = exp2f(mrow[r] - m_new);  // 0 on the first tile
      mrow[r] = m_new;
      l[r] *= alpha[r];
    }
    std::uint32_t p[kKeys / 16][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[4 * n + e] = exp2f(s[4 * n + e] - mrow[e >> 1]);
        l[e >> 1] += s[4 * n + e];
      }
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {  // the accumulator's columns 16 kk .. as A's k16 slice kk
      p[kk][0] = pack2(s[8 * kk + 0], s[8 * kk + 1]);
      p[kk][1] = pack2(s[8 * kk + 2], s[8 * kk + 3]);
      p[kk][2] = pack2(s[8 * kk + 4], s[8 * kk + 5]);
      p[kk][3] = pack2(s[8 * kk + 6], s[8 * kk + 7]);
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[4 * n + 0] *= alpha[0];
      o[4 * n + 1] *= alpha[0];
      o[4 * n + 2] *= alpha[1];
      o[4 * n + 3] *= alpha[1];
    }
    fence_regs(o);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) wgmma_rs_bt<D>(o, p[kk], desc_mnmajor<Swz, kKeys, D>(Vt, kk), 1);
    wg_commit();
    wg_wait<0>();
    fence_regs(o);
    __syncthreads();  // both warpgroups are done with buffer cur: refill it with tile + 2
    if (tile + 2 < tiles) {
      load_tile<Swz, kKeys, D>(Ks + cur * kTile, k, ldkv, base, hk * D, j0 + 2 * kKeys, d.S);
      load_tile<Swz, kKeys, D>(Vs + cur * kTile, v, ldkv, base, hk * D, j0 + 2 * kKeys, d.S);
      cp_async_commit();
    }
  }
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
#endif
}

template <int D, int Swz>
Status fwd3(cudaStream_t s, const AttentionShape& a, const bf16* q, const bf16* k, const bf16* v, float* out, int ldo,
            float* lse, const DeviceInfo& info) {
  constexpr std::size_t smem = fwd3_smem<D>();
  if (smem > static_cast<std::size_t>(info.max_smem_per_block_optin))
    return {1, "attention_tc3: needs " + std::to_string(smem) + " bytes of shared memory per block, device allows " +
                   std::to_string(info.max_smem_per_block_optin)};
  TESSEL_CUDA_CHECK(cudaFuncSetAttribute(fwd3_kernel<D, Swz>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const Dims3 d{a.seq, a.hq, a.hkv, 1.0f / sqrtf(static_cast<float>(a.d))};
  const dim3 grid(static_cast<unsigned>(ceil_div(a.seq, kRows)), a.hq, a.batch);
  fwd3_kernel<D, Swz><<<grid, kThreads, smem, s>>>(d, q, a.hq * D, k, v, a.hkv * D, out, ldo, lse);
  TESSEL_LAUNCH_CHECK();
  return {};
}

int g_layout = kSwz128;  // attention_tc3_set_layout

}  // namespace

Status attention_tc3_set_layout(int swizzle_bytes) {
  if (swizzle_bytes != 0 && swizzle_bytes != 128)
    return {1, "attention_tc3: shared-memory swizzle " + std::to_string(swizzle_bytes) + " (needs 0 or 128)"};
  g_layout = swizzle_bytes == 128 ? kSwz128 : kSwzNone;
  return {};
}

bool attention_tc3_available() {
  DeviceInfo info;
  return device_info(info).ok() && info.major == 9 && info.minor == 0;
}

Status attention_tc3_fwd(cudaStream_t s, const AttentionShape& a, const float* q, int ldq, const float* k, int ldk,
                         const float* v, int ldv, float* out, int ldo, float* lse) {
  TESSEL_NVTX_FN();
  if (!attention_tc_supported(a))
    return {1, "attention_tc3: unsupported shape batch " + std::to_string(a.batch) + " seq " + std::to_string(a.seq) +
                   " hq " + std::to_string(a.hq) + " hkv " + std::to_string(a.hkv) + " d " + std::to_string(a.d) +
                   " (needs hq % hkv == 0 and d 64 or 128)"};
  for (const auto& [p, ld] : {std::pair<const float*, int>{q, ldq}, {k, ldk}, {v, ldv}})
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0 || ld % 4 != 0)
      return {1, "attention_tc3: inputs need 16-byte aligned pointers and row strides divisible by 4 (ld " +
                     std::to_string(ld) + ")"};
  if (reinterpret_cast<std::uintptr_t>(out) % 8 != 0 || ldo % 2 != 0)
    return {1, "attention_tc3: out needs 8-byte alignment and an even row stride (ld " + std::to_string(ldo) + ")"};
  DeviceInfo info;
  TESSEL_STATUS_CHECK(device_info(info));
  if (info.major != 9 || info.minor != 0)
    return {1, "attention_tc3: wgmma needs compute capability 9.0 (sm_90a machine code); this device is " +
                   std::to_string(info.major) + "." + std::to_string(info.minor)};
  const int T = a.batch * a.seq, qd = a.hq * a.d, kd = a.hkv * a.d;
  bf16* buf = nullptr;
  const std::size_t qn = std::size_t(T) * qd, kn = std::size_t(T) * kd;
  TESSEL_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buf), (qn + 2 * kn) * sizeof(bf16), s));
  bf16 *qb = buf, *kb = buf + qn, *vb = kb + kn;
  Status st = to_bf16_rows(s, q, ldq, T, qd, qb);
  if (st.ok()) st = to_bf16_rows(s, k, ldk, T, kd, kb);
  if (st.ok()) st = to_bf16_rows(s, v, ldv, T, kd, vb);
  if (st.ok()) {
    if (a.d == 64)
      st = g_layout == kSwz128 ? fwd3<64, kSwz128>(s, a, qb, kb, vb, out, ldo, lse, info)
                               : fwd3<64, kSwzNone>(s, a, qb, kb, vb, out, ldo, lse, info);
    else
      st = g_layout == kSwz128 ? fwd3<128, kSwz128>(s, a, qb, kb, vb, out, ldo, lse, info)
                               : fwd3<128, kSwzNone>(s, a, qb, kb, vb, out, ldo, lse, info);
  }
  TESSEL_CUDA_CHECK(cudaFreeAsync(buf, s));
  return st;
}

}  // namespace tessel::kernels::cuda
