// A CPU emulation of the CUDA subset that kernels/cuda/attention_tc.cu, experimental/attention_tc2.cu,
// experimental/attention_tc3.cu, norm.cu (with colreduce.cuh), rows.cu and elementwise.cu use, so CI (no GPU) runs those kernel files' own code (common.cuh's warp and block reductions
// included, pasted in by emulate_cuda.py): each CUDA thread is an OS thread of its block; __syncthreads is a block barrier;
// warp instructions (shfl.xor, shfl.idx, ldmatrix .x4 with and without .trans, mma.m16n8k16 bf16 -> f32) exchange
// their operands through a per-warp barrier and compute what the PTX ISA specifies for each lane:
//   - ldmatrix: register m of lane L holds matrix m's elements (row L/4, columns 2(L%4), +1), the row
//     addresses coming from lanes 8m..8m+7; with .trans, (rows 2(L%4), +1, column L/4); low half first;
//   - mma.m16n8k16: the fragment layouts of attention_tc.cu's header (which ran on an H200), products of
//     the bf16 operands accumulated in fp32;
//   - cp.async: queued per commit group and landed at the wait_group that covers it (g_late = 1) or at
//     issue (0); both orders must give the same results;
//   - wgmma.mma_async m64nNk16 bf16 -> f32 (Hopper, sm_90a): described where it is defined below.
// Shared memory carries a shadow per 16-byte chunk that fails the run on a read of a copy not yet waited
// for, a read of another thread's copy with no barrier in between, or a copy into a chunk another thread
// read in the same barrier interval; every cp.async/ldmatrix address is checked for 16-byte alignment and
// every cp.async source for lying inside a registered allocation. Shared memory starts as bf16 NaN.
// What it cannot show: timing, and any difference between this reading of the PTX ISA and the hardware.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/status.hpp"

#define __global__
#define __device__
#define __host__
#define __launch_bounds__(...)
#define __align__(x) alignas(x)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
template <class T> T __ldg(const T* p) { return *p; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fadd_rn(float a, float b) { return a + b; }  // ISO C++ rounds each operation: no fusion here
inline float __fmul_rn(float a, float b) { return a * b; }  // the device's is within 2 ulp of this
// Float atomics: one lock for all (correct, not fast; the emulated kernels use them in embedding gradients).
inline std::mutex atomic_mu;
template <class T>
inline T atomicAdd(T* p, T v) {  // float and double
  std::lock_guard<std::mutex> l(atomic_mu);
  const T old = *p;
  *p = old + v;
  return old;
}

struct __nv_bfloat16 { std::uint16_t x; };
inline std::uint16_t f2bf(float f) {
  std::uint32_t u; std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);
  return std::uint16_t(u >> 16);
}
inline float bf2f(std::uint16_t h) { std::uint32_t u = std::uint32_t(h) << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline __nv_bfloat16 __float2bfloat16(float f) { return {f2bf(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {f2bf(f)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return bf2f(h.x); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }

typedef void* cudaStream_t;
typedef int cudaError_t;
constexpr int cudaSuccess = 0;
constexpr int cudaFuncAttributeMaxDynamicSharedMemorySize = 8;

namespace emu {
[[noreturn]] inline void fail(const char* what, const char* file, int line) {
  std::fprintf(stderr, "EMU FAIL %s:%d: %s\n", file, line, what);
  std::fflush(stderr);
  std::abort();
}
#define EMU_CHECK(c) do { if (!(c)) ::emu::fail(#c, __FILE__, __LINE__); } while (0)

inline int g_late = 1;  // 1: cp.async data lands at the wait (latest); 0: at issue (earliest)

struct Block {
  std::vector<unsigned char> smem;
  std::unique_ptr<std::barrier<>> bar;
  std::unique_ptr<std::barrier<>> wbar[32];
  std::uint32_t slots[32][32][16];  // [warp][lane][words]
  std::mutex mu;
  // shadow per 16-byte chunk
  struct Chunk {
    int writer = -1; long wissue_epoch = -1; bool pending = false; long land_epoch = -1;
    long read_epoch = -1; std::uint64_t readers[4] = {0, 0, 0, 0};  // up to 256 threads
  };
  std::vector<Chunk> sh;
};
inline thread_local Block* tb = nullptr;
inline thread_local long epoch = 0;
struct Copy { unsigned char* dst; const unsigned char* src; bool valid; };
inline thread_local std::vector<std::vector<Copy>> groups;
inline thread_local std::vector<Copy> open_group;
}  // namespace emu

inline thread_local dim3 threadIdx, blockIdx, gridDim, blockDim;

namespace emu {
// global allocations (for the "mapped source" check)
inline std::mutex amu;
inline std::map<const unsigned char*, std::size_t> allocs;
// A new allocation cannot overlap a live one: any registered range it overlaps is stale (a host buffer a
// test registered and freed without unregistering) and is dropped, or it would hide the new range.
inline void reg(const void* p, std::size_t n) {
  std::lock_guard l(amu);
  const auto* c = (const unsigned char*)p;
  auto it = allocs.lower_bound(c);
  if (it != allocs.begin() && std::prev(it)->first + std::prev(it)->second > c) --it;
  while (it != allocs.end() && it->first < c + n) it = allocs.erase(it);
  allocs[c] = n;
}
inline void unreg(const void* p) { std::lock_guard l(amu); allocs.erase((const unsigned char*)p); }
inline bool mapped(const void* p, std::size_t n) {
  std::lock_guard l(amu);
  auto c = (const unsigned char*)p;
  auto it = allocs.upper_bound(c);
  if (it == allocs.begin()) return false;
  --it;
  return c >= it->first && c + n <= it->first + it->second;
}

inline int tid() { return threadIdx.x; }
inline int lane() { return threadIdx.x % 32; }
inline int warp() { return threadIdx.x / 32; }

inline Block::Chunk& chunk_of(const void* p) {
  const auto off = (const unsigned char*)p - tb->smem.data();
  EMU_CHECK(off >= 0 && std::size_t(off) + 16 <= tb->smem.size());
  EMU_CHECK(off % 16 == 0);
  return tb->sh[off / 16];
}

inline void shadow_read(const void* p) {
  std::lock_guard l(tb->mu);
  auto& c = chunk_of(p);
  const int me = tid();
  if (c.pending) fail("RAW: a shared read (ldmatrix, wgmma) of a chunk whose cp.async has not been waited for", __FILE__, __LINE__);
  if (c.writer >= 0 && c.writer != me && c.land_epoch >= epoch)
    fail("RAW: chunk landed by another thread without a barrier in between", __FILE__, __LINE__);
  if (c.writer >= 0 && c.writer != me && c.wissue_epoch == epoch)
    fail("race: read in the same barrier interval as another thread's cp.async to it", __FILE__, __LINE__);
  if (c.read_epoch != epoch) { c.read_epoch = epoch; c.readers[0] = c.readers[1] = c.readers[2] = c.readers[3] = 0; }
  c.readers[me / 64] |= 1ull << (me % 64);
}

inline void do_copy(const Copy& c) {
  if (c.valid) std::memcpy(c.dst, c.src, 16); else std::memset(c.dst, 0, 16);
}

inline void cp_async(void* dst, const void* src, bool valid) {
  EMU_CHECK(reinterpret_cast<std::uintptr_t>(dst) % 16 == 0);
  EMU_CHECK(reinterpret_cast<std::uintptr_t>(src) % 16 == 0);
  EMU_CHECK(mapped(src, 16));
  {
    std::lock_guard l(tb->mu);
    auto& c = chunk_of(dst);
    const int me = tid();
    if (c.read_epoch == epoch) {
      std::uint64_t others[4] = {c.readers[0], c.readers[1], c.readers[2], c.readers[3]};
      others[me / 64] &= ~(1ull << (me % 64));
      if (others[0] | others[1] | others[2] | others[3]) fail("WAR: cp.async to a chunk another thread read in this barrier interval", __FILE__, __LINE__);
    }
    if (c.pending) fail("WAW: second cp.async to a chunk still pending", __FILE__, __LINE__);
    c.writer = me; c.wissue_epoch = epoch; c.pending = true;
  }
  Copy cp{(unsigned char*)dst, (const unsigned char*)src, valid};
  if (!g_late) do_copy(cp);
  open_group.push_back(cp);
}
inline void commit() { groups.push_back(std::move(open_group)); open_group.clear(); }
inline void wait_group(int n) {
  EMU_CHECK(open_group.empty() || true);
  while ((int)groups.size() > n) {
    for (auto& cp : groups.front()) {
      if (g_late) do_copy(cp);
      std::lock_guard l(tb->mu);
      auto& c = chunk_of(cp.dst);
      c.pending = false; c.land_epoch = epoch;
    }
    groups.erase(groups.begin());
  }
}

inline void syncthreads() { tb->bar->arrive_and_wait(); ++epoch; }

// Warp collective: every lane writes n words, all wait, fn reads all, all wait.
template <class F>
inline void collective(const std::uint32_t* in, int n, F&& fn) {
  auto& ws = tb->slots[warp()];
  std::memcpy(ws[lane()], in, 4 * n);
  tb->wbar[warp()]->arrive_and_wait();
  fn(ws);
  tb->wbar[warp()]->arrive_and_wait();
}

inline float shfl_xor(float v, int m) {
  std::uint32_t u; std::memcpy(&u, &v, 4);
  float out = 0;
  collective(&u, 1, [&](auto& ws) { std::memcpy(&out, &ws[lane() ^ m][0], 4); });
  return out;
}

// shfl.idx: every lane reads lane `src`'s value.
inline float shfl_idx(float v, int src) {
  std::uint32_t u; std::memcpy(&u, &v, 4);
  float out = 0;
  collective(&u, 1, [&](auto& ws) { std::memcpy(&out, &ws[src % 32][0], 4); });
  return out;
}

inline void ldsm(std::uint32_t (&r)[4], const __nv_bfloat16* p, bool trans) {
  EMU_CHECK(reinterpret_cast<std::uintptr_t>(p) % 16 == 0);
  shadow_read(p);
  std::uint64_t a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t in[2] = {std::uint32_t(a), std::uint32_t(a >> 32)};
  collective(in, 2, [&](auto& ws) {
    const int L = lane(), g = L / 4, t = L % 4;
    for (int m = 0; m < 4; ++m) {
      auto row = [&](int rr) {
        const int src = 8 * m + rr;
        return reinterpret_cast<const std::uint16_t*>(std::uintptr_t(ws[src][0]) | (std::uintptr_t(ws[src][1]) << 32));
      };
      std::uint16_t lo, hi;
      if (!trans) { lo = row(g)[2 * t]; hi = row(g)[2 * t + 1]; }
      else { lo = row(2 * t)[g]; hi = row(2 * t + 1)[g]; }
      r[m] = std::uint32_t(lo) | (std::uint32_t(hi) << 16);
    }
  });
}

inline void mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  std::uint32_t in[10] = {a[0], a[1], a[2], a[3], b0, b1};
  std::memcpy(in + 6, c, 16);
  collective(in, 10, [&](auto& ws) {
    float A[16][16], B[16][8], C[16][8];
    for (int L = 0; L < 32; ++L) {
      const int g = L / 4, t = L % 4;
      auto lo = [&](std::uint32_t w) { return bf2f(w & 0xffff); };
      auto hi = [&](std::uint32_t w) { return bf2f(w >> 16); };
      const std::uint32_t* s = ws[L];
      A[g][2 * t] = lo(s[0]); A[g][2 * t + 1] = hi(s[0]);
      A[g + 8][2 * t] = lo(s[1]); A[g + 8][2 * t + 1] = hi(s[1]);
      A[g][2 * t + 8] = lo(s[2]); A[g][2 * t + 9] = hi(s[2]);
      A[g + 8][2 * t + 8] = lo(s[3]); A[g + 8][2 * t + 9] = hi(s[3]);
      B[2 * t][g] = lo(s[4]); B[2 * t + 1][g] = hi(s[4]);
      B[2 * t + 8][g] = lo(s[5]); B[2 * t + 9][g] = hi(s[5]);
      float cc[4]; std::memcpy(cc, s + 6, 16);
      C[g][2 * t] = cc[0]; C[g][2 * t + 1] = cc[1]; C[g + 8][2 * t] = cc[2]; C[g + 8][2 * t + 1] = cc[3];
    }
    const int L = lane(), g = L / 4, t = L % 4;
    auto dot = [&](int i, int j) { float s = C[i][j]; for (int k = 0; k < 16; ++k) s += A[i][k] * B[k][j]; return s; };
    c[0] = dot(g, 2 * t); c[1] = dot(g, 2 * t + 1); c[2] = dot(g + 8, 2 * t); c[3] = dot(g + 8, 2 * t + 1);
  });
}

// wgmma.mma_async (sm_90a), bf16 inputs, f32 accumulator, shape m64nNk16, per the PTX ISA ("Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate"): warp w of the warpgroup owns accumulator rows 16(w % 4) +
// g and + 8 (g = lane / 4, t = lane % 4), d[4i + 0, 1] at columns 8i + 2t, +1 of row g, d[4i + 2, 3] the
// same of row g + 8; A from registers has mma.m16n8k16's fragment of the warp's 16 rows. Operands in
// shared memory are read through a 64-bit descriptor (start address, leading and stride byte offsets, each
// encoded >> 4; swizzle mode in bits 62-63) with the canonical layouts of the ISA's "Shared Memory Matrix
// Layout" (T = 8 bf16 elements per 16 bytes), for no swizzling and the 128-byte swizzle:
//   K-major,  none: (mn % 8) * 16 + (mn / 8) * SBO + (k % 8) * 2 + (k / 8) * LBO
//   MN-major, none: (mn % 8) * 2 + (mn / 8) * SBO + (k % 8) * 16 + (k / 8) * LBO
//   K-major,  128B: (mn % 8) * 128 + (mn / 8) * SBO + k * 2                       then the swizzle below
//   MN-major, 128B: (mn % 64) * 2 + (mn / 64) * LBO + (k % 8) * 128 + (k / 8) * SBO
// where the 128-byte swizzle XORs address bits 4-6 with bits 7-9 of the shared-memory address.
// Asynchrony: the products are computed at issue and written to the accumulator registers only at the
// wgmma.wait_group that covers them, so reading an accumulator early gives the old value; at that wait the
// registers must still hold what they held at issue (nothing may touch them in flight) and the shared
// operands must still give the same products (nothing may overwrite them in flight), or the run fails.
// Several wgmmas on one accumulator before a wait chain as on the hardware.
struct WgOp {
  float* d; int n;                 // accumulator registers, n floats
  std::vector<float> before;       // the registers at the chain's first issue
  std::vector<float> in;           // the accumulator input of this op (after earlier ops of the chain)
  std::vector<float> result;
  bool rs; std::vector<float> a;   // A in registers: the warp's 16 x 16 (row, k), gathered at issue
  std::uint64_t adesc, bdesc; bool atrans, btrans; int N;
};
inline thread_local std::vector<WgOp> wg_open;
inline thread_local std::vector<std::vector<WgOp>> wg_groups;

inline unsigned shared_addr(const void* p) {
  const auto off = (const unsigned char*)p - tb->smem.data();
  EMU_CHECK(off >= 0 && std::size_t(off) <= tb->smem.size());
  return unsigned(off);
}

// The shared-memory byte address of the bf16 element (mn, k) of an operand, by its descriptor.
inline unsigned desc_addr(std::uint64_t desc, bool mn_major, int mn, int k) {
  const unsigned start = unsigned(desc & 0x3fff) << 4, lbo = unsigned((desc >> 16) & 0x3fff) << 4,
                 sbo = unsigned((desc >> 32) & 0x3fff) << 4, base_off = unsigned((desc >> 49) & 7),
                 swz = unsigned(desc >> 62);
  EMU_CHECK(base_off == 0);
  EMU_CHECK(swz == 0 || swz == 1);  // the two modes this emulation knows: none, 128-byte
  unsigned off;
  if (swz == 0)
    off = mn_major ? (mn % 8) * 2 + (mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo
                   : (mn % 8) * 16 + (mn / 8) * sbo + (k % 8) * 2 + (k / 8) * lbo;
  else
    off = mn_major ? (mn % 64) * 2 + (mn / 64) * lbo + (k % 8) * 128 + (k / 8) * sbo
                   : (mn % 8) * 128 + (mn / 8) * sbo + k * 2;
  unsigned addr = start + off;
  if (swz == 1) addr ^= ((addr >> 7) & 7) << 4;
  EMU_CHECK(addr + 2 <= tb->smem.size());
  return addr;
}
inline float smem_bf16(unsigned addr) {
  std::uint16_t h;
  std::memcpy(&h, tb->smem.data() + addr, 2);
  return bf2f(h);
}

// This thread's products: rows 16 (warp % 4) + g, + 8; columns 8i + 2t, +1.
inline std::vector<float> wg_compute(const WgOp& op) {
  const int L = lane(), g = L / 4, t = L % 4, row0 = 16 * (warp() % 4);
  float A[2][16];
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 16; ++k)
      A[h][k] = op.rs ? op.a[(g + 8 * h) * 16 + k] : smem_bf16(desc_addr(op.adesc, op.atrans, row0 + g + 8 * h, k));
  std::vector<float> out(op.in);
  for (int i = 0; i < op.N / 8; ++i)
    for (int e1 = 0; e1 < 2; ++e1) {
      const int c = 8 * i + 2 * t + e1;
      float B[16];
      for (int k = 0; k < 16; ++k) B[k] = smem_bf16(desc_addr(op.bdesc, op.btrans, c, k));
      for (int h = 0; h < 2; ++h) {
        float s = out[4 * i + 2 * h + e1];
        for (int k = 0; k < 16; ++k) s += A[h][k] * B[k];
        out[4 * i + 2 * h + e1] = s;
      }
    }
  return out;
}

// The race checks of the shared operands (shadow_read), once per warp and 16-byte chunk: lane 0 reads what
// the warp's rows of A and all of B cover.
inline void wg_shadow(const WgOp& op) {
  if (lane() != 0) return;
  std::vector<unsigned> chunks;
  const int row0 = 16 * (warp() % 4);
  for (int k = 0; k < 16; ++k) {
    if (!op.rs)
      for (int r = 0; r < 16; ++r) chunks.push_back(desc_addr(op.adesc, op.atrans, row0 + r, k) & ~15u);
    for (int c = 0; c < op.N; ++c) chunks.push_back(desc_addr(op.bdesc, op.btrans, c, k) & ~15u);
  }
  std::sort(chunks.begin(), chunks.end());
  chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
  for (unsigned a : chunks) shadow_read(tb->smem.data() + a);
}

inline WgOp* wg_pending(float* d) {
  for (auto it = wg_open.rbegin(); it != wg_open.rend(); ++it) if (it->d == d) return &*it;
  for (auto g = wg_groups.rbegin(); g != wg_groups.rend(); ++g)
    for (auto it = g->rbegin(); it != g->rend(); ++it) if (it->d == d) return &*it;
  return nullptr;
}

inline void wgmma(float* d, int N, const std::uint32_t* a_regs, std::uint64_t adesc, bool atrans, std::uint64_t bdesc,
                  bool btrans, int scale_d) {
  WgOp op{d, N / 2, {}, {}, {}, a_regs != nullptr, {}, adesc, bdesc, atrans, btrans, N};
  if (op.rs) {  // the warp's A fragment (mma.m16n8k16's layout)
    op.a.assign(256, 0.0f);
    collective(a_regs, 4, [&](auto& ws) {
      for (int L = 0; L < 32; ++L) {
        const int g = L / 4, t = L % 4;
        const std::uint32_t* s = ws[L];
        auto put = [&](int r, int k, std::uint32_t w) { op.a[r * 16 + k] = bf2f(w & 0xffff); op.a[r * 16 + k + 1] = bf2f(w >> 16); };
        put(g, 2 * t, s[0]); put(g + 8, 2 * t, s[1]); put(g, 2 * t + 8, s[2]); put(g + 8, 2 * t + 8, s[3]);
      }
    });
  }
  if (const WgOp* prev = wg_pending(d)) { op.before = prev->before; op.in = prev->result; }
  else { op.before.assign(d, d + op.n); op.in = op.before; }
  if (!scale_d) op.in.assign(op.n, 0.0f);
  wg_shadow(op);
  op.result = wg_compute(op);
  wg_open.push_back(std::move(op));
}
inline void wg_commit() { wg_groups.push_back(std::move(wg_open)); wg_open.clear(); }
inline void wg_wait(int n) {
  while ((int)wg_groups.size() > n) {
    for (auto& op : wg_groups.front()) {
      for (int i = 0; i < op.n; ++i)
        if (std::memcmp(&op.d[i], &op.before[i], 4) != 0)
          fail("wgmma: accumulator registers changed while the wgmma was in flight", __FILE__, __LINE__);
      const std::vector<float> again = wg_compute(op);
      if (std::memcmp(again.data(), op.result.data(), 4 * op.result.size()) != 0)
        fail("wgmma: a shared-memory operand changed while the wgmma was in flight", __FILE__, __LINE__);
    }
    // The chain's registers become each op's result in issue order; the last one stands.
    for (auto& op : wg_groups.front()) {
      std::memcpy(op.d, op.result.data(), 4 * op.n);
      for (auto& g : wg_groups) for (auto& o2 : g) if (o2.d == op.d) o2.before = op.result;
      for (auto& o2 : wg_open) if (o2.d == op.d) o2.before = op.result;
    }
    wg_groups.erase(wg_groups.begin());
  }
}

// launch
inline std::mutex fmu;
inline std::map<const void*, int> max_dyn;
inline std::atomic<long> blocks_run{0};
inline std::atomic<long> last_launch_threads{0};  // grid x block of the latest launch (which path a launcher took)

template <class K, class... A>
void launch(K kernel, dim3 grid, dim3 block, std::size_t smem, cudaStream_t, A... args) {
  {
    std::lock_guard l(fmu);
    int lim = 48 * 1024;
    auto it = max_dyn.find((const void*)kernel);
    if (it != max_dyn.end()) lim = it->second;
    EMU_CHECK(smem <= std::size_t(lim));
  }
  const int nt = block.x * block.y * block.z;
  EMU_CHECK(block.y == 1 && block.z == 1 && nt % 32 == 0 && nt <= 256);  // the shadow's reader masks
  last_launch_threads = long(grid.x) * grid.y * grid.z * nt;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        auto B = std::make_unique<Block>();
        B->smem.assign(smem, 0xff);  // bf16 NaN everywhere: stale reads show up
        B->sh.resize(smem / 16 + 1);
        B->bar = std::make_unique<std::barrier<>>(nt);
        for (int w = 0; w < nt / 32; ++w) B->wbar[w] = std::make_unique<std::barrier<>>(32);
        std::vector<std::thread> th;
        for (int t = 0; t < nt; ++t)
          th.emplace_back([&, t] {
            tb = B.get(); epoch = 0; groups.clear(); open_group.clear(); wg_open.clear(); wg_groups.clear();
            threadIdx = dim3(t); blockIdx = dim3(bx, by, bz); gridDim = grid; blockDim = block;
            kernel(args...);
            EMU_CHECK(open_group.empty());
            EMU_CHECK(wg_open.empty() && wg_groups.empty());  // every wgmma committed and waited for
            wait_group(0);
          });
        for (auto& x : th) x.join();
        ++blocks_run;
      }
}
}  // namespace emu

inline float __shfl_xor_sync(unsigned, float v, int m) { return emu::shfl_xor(v, m); }
inline float __shfl_sync(unsigned, float v, int src) { return emu::shfl_idx(v, src); }
inline void __syncthreads() { emu::syncthreads(); }

template <class K>
inline cudaError_t cudaFuncSetAttribute(K k, int, int v) { std::lock_guard l(emu::fmu); emu::max_dyn[(const void*)k] = v; return 0; }
inline cudaError_t cudaMallocAsync(void** p, std::size_t n, cudaStream_t) { *p = std::malloc(n); std::memset(*p, 0xff, n); emu::reg(*p, n); return 0; }
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { emu::unreg(p); std::free(p); return 0; }
inline cudaError_t cudaGetLastError() { return 0; }

namespace tessel::kernels::cpu { struct AttentionShape; }
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/optimizer.hpp"
#include "kernels/cuda/attention_variant.hpp"  // AttentionArgs: plain C++, the same header the device build reads

namespace tessel::kernels::cuda {
using cpu::AdamW;  // kernels.hpp's aliases
struct DeviceInfo {  // an H200's figures
  int sm_count = 132; int max_threads_per_sm = 2048; int max_smem_per_block_optin = 232448; int major = 9, minor = 0;
};
inline Status device_info(DeviceInfo& d) { d = DeviceInfo{}; return {}; }
}  // namespace tessel::kernels::cuda

#define TESSEL_CUDA_CHECK(expr) do { if ((expr) != 0) return ::tessel::kernels::cuda::Status{1, #expr}; } while (0)
#define TESSEL_STATUS_CHECK(expr) do { ::tessel::kernels::cuda::Status s_ = (expr); if (!s_.ok()) return s_; } while (0)
#define TESSEL_LAUNCH_CHECK() TESSEL_CUDA_CHECK(cudaGetLastError())
#define TESSEL_NVTX_FN()
