// Device-side helpers shared by the kernel files: warp/block reductions, grid sizing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace tessel::kernels::cuda {

constexpr int kWarp = 32;

__host__ __device__ constexpr std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

__device__ inline float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Over the 4 lanes of a quad (lanes 4g .. 4g + 3): the lanes that hold one row of an mma/wgmma accumulator.
__device__ inline float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ inline float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// Sum over a block of up to 1024 threads; every thread gets the result. `scratch` holds 32 floats.
__device__ inline float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// V consecutive elements in one access: V = 4 is one 16-byte float load or store, or one 8-byte store of
// four bf16 (the caller has checked the alignment, `aligned` below); V = 1 is scalar.
template <int V>
__device__ inline void load_vec(float (&r)[V], const float* p) {
  if constexpr (V == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
  } else {
    for (int k = 0; k < V; ++k) r[k] = p[k];
  }
}
template <int V>
__device__ inline void store_vec(float* p, const float (&r)[V]) {
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
  } else {
    for (int k = 0; k < V; ++k) p[k] = r[k];
  }
}
// bf16 inputs widen exactly to fp32: V = 4 is one 8-byte load of four.
// One element as fp32: itself, or a bf16 widened exactly.
__device__ inline float widen(float v) { return v; }
__device__ inline float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ inline float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
template <int V>
__device__ inline void load_vec(float (&r)[V], const __nv_bfloat16* p) {
  if constexpr (V == 4) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    r[0] = bf16_lo(v.x), r[1] = bf16_hi(v.x), r[2] = bf16_lo(v.y), r[3] = bf16_hi(v.y);
  } else {
    for (int k = 0; k < V; ++k) r[k] = __bfloat162float(p[k]);
  }
}
__device__ inline unsigned bf16_pair(float lo, float hi) {
  return unsigned(__bfloat16_as_ushort(__float2bfloat16(lo))) | (unsigned(__bfloat16_as_ushort(__float2bfloat16(hi))) << 16);
}
template <int V>
__device__ inline void store_vec(__nv_bfloat16* p, const float (&r)[V]) {
  if constexpr (V == 4) {
    *reinterpret_cast<uint2*>(p) = make_uint2(bf16_pair(r[0], r[1]), bf16_pair(r[2], r[3]));
  } else {
    for (int k = 0; k < V; ++k) p[k] = __float2bfloat16(r[k]);
  }
}
// Null (an output not asked for) or aligned to `bytes`; all_aligned: every one of ps.
inline bool aligned(const void* p, std::size_t bytes) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}
inline bool all_aligned(std::initializer_list<const void*> ps, std::size_t bytes) {
  for (const void* p : ps)
    if (!aligned(p, bytes)) return false;
  return true;
}

// Grid for a grid-stride element-wise kernel: enough blocks to fill every SM a few times over, no more.
unsigned elementwise_blocks(std::size_t n, int threads);

}  // namespace tessel::kernels::cuda
