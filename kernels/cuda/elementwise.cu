// Element-wise kernels: GELU/SwiGLU forward and backward (fp32 or bf16 inputs), AdamW, scale/add/residual, bf16 conversion, fill.
// Memory-bound: each thread walks a grid-stride loop so a grid sized from the SM count covers any n; the
// large ones move 16 bytes per access where the pointers allow (the first device run measured GELU at 69%
// of the copy rate with 4-byte accesses, against issue 7's 70%).
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/colreduce.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/nvtx.hpp"

namespace tessel::kernels::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2/pi), as kernels/cpu/activation.cpp
constexpr float kGeluCubic = 0.044715f;              // Hendrycks & Gimpel's tanh-approximation constant
constexpr int kThreads = 256;

#define GRID_STRIDE(i, n) \
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < (n); i += std::size_t(gridDim.x) * blockDim.x)

__device__ inline float gelu(float v) { return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v))); }
// d/dx [0.5 x (1 + t)], t = tanh(c (x + k x^3)): 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2).
__device__ inline float gelu_grad(float v) {
  const float t = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
}

// The kernels below take V elements per thread and iteration over `groups` = n / V (VEC_LAUNCH picks V = 4,
// 16-byte accesses, when it can). An output pointer may be null: the fp32 and the bf16 form of a result are
// each written only where a caller reads them, so an activation that only feeds bf16 GEMMs is never
// stored in fp32 and read back for a conversion. The activations' inputs (In) are fp32, or bf16 where
// the GEMM before them writes bf16 (widened exactly, then the same fp32 arithmetic).
template <int V, class In = float>
__global__ void gelu_fwd_kernel(const In* __restrict__ x, float* __restrict__ y, __nv_bfloat16* __restrict__ y16,
                                std::size_t groups) {
  GRID_STRIDE(j, groups) {
    float v[V];
    load_vec<V>(v, x + j * V);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = gelu(v[k]);
    if (y) store_vec<V>(y + j * V, v);
    if (y16) store_vec<V>(y16 + j * V, v);
  }
}

template <int V, class In = float>
__global__ void gelu_bwd_kernel(const In* __restrict__ dy, const In* __restrict__ x, float* __restrict__ dx,
                                __nv_bfloat16* __restrict__ dx16, std::size_t groups) {
  GRID_STRIDE(j, groups) {
    float d[V], v[V];
    load_vec<V>(d, dy + j * V);
    load_vec<V>(v, x + j * V);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = d[k] * gelu_grad(v[k]);
    if (dx) store_vec<V>(dx + j * V, v);
    if (dx16) store_vec<V>(dx16 + j * V, v);
  }
}

template <int V, class In = float>
__global__ void swiglu_fwd_kernel(const In* __restrict__ gate, const In* __restrict__ up, float* __restrict__ y,
                                  __nv_bfloat16* __restrict__ y16, std::size_t groups) {
  GRID_STRIDE(j, groups) {
    float a[V], u[V];
    load_vec<V>(a, gate + j * V);
    load_vec<V>(u, up + j * V);
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = a[k] / (1.0f + expf(-a[k])) * u[k];
    if (y) store_vec<V>(y + j * V, a);
    if (y16) store_vec<V>(y16 + j * V, a);
  }
}

// silu'(a) = s (1 + a (1 - s)), s = sigmoid(a).
template <int V, class In = float>
__global__ void swiglu_bwd_kernel(const In* __restrict__ dy, const In* __restrict__ gate,
                                  const In* __restrict__ up, float* __restrict__ dgate, float* __restrict__ dup,
                                  __nv_bfloat16* __restrict__ dgate16, __nv_bfloat16* __restrict__ dup16,
                                  std::size_t groups) {
  GRID_STRIDE(j, groups) {
    float d[V], a[V], u[V], dg[V], du[V];
    load_vec<V>(d, dy + j * V);
    load_vec<V>(a, gate + j * V);
    load_vec<V>(u, up + j * V);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float s = 1.0f / (1.0f + expf(-a[k]));
      dg[k] = d[k] * u[k] * s * (1.0f + a[k] * (1.0f - s));
      du[k] = d[k] * a[k] * s;
    }
    if (dgate) store_vec<V>(dgate + j * V, dg);
    if (dup) store_vec<V>(dup + j * V, du);
    if (dgate16) store_vec<V>(dgate16 + j * V, dg);
    if (dup16) store_vec<V>(dup16 + j * V, du);
  }
}

// AdamW in PyTorch's order (kernels/cpu/optimizer.hpp); step_size and bc2_sqrt precomputed in double. The
// gradient is read times gscale (the clip coefficient: no separate pass scales it in place) and the
// updated parameter optionally written in bf16 too (the GEMMs' copy, no second pass over the parameters).
template <int V>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, __nv_bfloat16* __restrict__ p16, float gscale, float decay,
                             float b1, float b2, float eps, float step_size, float bc2_sqrt, std::size_t groups) {
  GRID_STRIDE(j, groups) {
    const std::size_t i = j * V;
    float pv[V], gv[V], mv[V], vv[V];
    load_vec<V>(pv, p + i);
    load_vec<V>(gv, g + i);
    load_vec<V>(mv, m + i);
    load_vec<V>(vv, v + i);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float gi = __fmul_rn(gv[k], gscale);  // rounded, never fused: the gradient a scale pass would store
      float pi = pv[k] * decay;
      const float mi = mv[k] + (1.0f - b1) * (gi - mv[k]);
      const float vi = b2 * vv[k] + (1.0f - b2) * gi * gi;
      pi -= step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
      pv[k] = pi;
      mv[k] = mi;
      vv[k] = vi;
    }
    store_vec<V>(p + i, pv);
    store_vec<V>(m + i, mv);
    store_vec<V>(v + i, vv);
    if (p16) store_vec<V>(p16 + i, pv);
  }
}

// out = (a + b) + bias[column]: a residual sum and a bias in one pass (bias may be null). out may be a.
template <int V>
__global__ void residual_add_kernel(const float* a, const float* b, const float* __restrict__ bias, float* out,
                                    int cols, std::size_t groups) {
  GRID_STRIDE(j, groups) {
    const std::size_t i = j * V;
    float x[V], y[V];
    load_vec<V>(x, a + i);
    load_vec<V>(y, b + i);
#pragma unroll
    for (int k = 0; k < V; ++k) x[k] = x[k] + y[k];
    if (bias) {
      float c[V];
      load_vec<V>(c, bias + i % std::size_t(cols));  // V divides cols: the V columns are consecutive
#pragma unroll
      for (int k = 0; k < V; ++k) x[k] = x[k] + c[k];
    }
    store_vec<V>(out + i, x);
  }
}

template <int V>
__global__ void to_bf16_kernel(const float* __restrict__ in, __nv_bfloat16* __restrict__ out, std::size_t groups) {
  GRID_STRIDE(j, groups) {
    float v[V];
    load_vec<V>(v, in + j * V);
    store_vec<V>(out + j * V, v);
  }
}

// SplitMix64's finaliser (Steele, Lea & Flood 2014), as runtime/init.hpp's mix64.
__device__ inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__global__ void fill_uniform_kernel(float* x, std::size_t n, std::uint64_t seed, float bound) {
  GRID_STRIDE(i, n) x[i] = bound * (float(mix64(seed + i * 0x9e3779b97f4a7c15ull) >> 40) * (2.0f / 16777216.0f) - 1.0f);
}
__global__ void fill_tokens_kernel(std::int32_t* t, std::size_t n, std::uint64_t seed, int vocab) {
  GRID_STRIDE(i, n) t[i] = static_cast<std::int32_t>(mix64(seed + i * 0x9e3779b97f4a7c15ull) % std::uint64_t(vocab));
}

__global__ void scale_kernel(float* x, std::size_t n, float f) { GRID_STRIDE(i, n) x[i] *= f; }
__global__ void fill_kernel(float* x, std::size_t n, float value) { GRID_STRIDE(i, n) x[i] = value; }
__global__ void from_bf16_kernel(const __nv_bfloat16* __restrict__ in, float* __restrict__ out, std::size_t n) {
  GRID_STRIDE(i, n) out[i] = __bfloat162float(in[i]);
}

// The element of column_sums' first pass for col_sum: dy itself (fp32, or bf16 widened).
struct ColValue {
  const float* dy;
  int cols;
  __device__ void operator()(int r, int c, float (&v)[1]) const { v[0] = dy[std::size_t(r) * cols + c]; }
};
struct ColValueBf16 {
  const __nv_bfloat16* dy;
  int cols;
  __device__ void operator()(int r, int c, float (&v)[1]) const { v[0] = __bfloat162float(dy[std::size_t(r) * cols + c]); }
};

__global__ void reduce_blocks_kernel(const float* __restrict__ in, int parts, std::size_t count, float* __restrict__ out,
                                     bool take_max) {
  GRID_STRIDE(i, count) {
    float a = in[i];
    for (int p = 1; p < parts; ++p) {
      const float b = in[std::size_t(p) * count + i];
      a = take_max ? fmaxf(a, b) : a + b;
    }
    out[i] = a;
  }
}

// Block partial sums in double, one atomicAdd per block (fp64 atomics: sm_60 and later).
__global__ void sum_squares_kernel(const float* __restrict__ x, std::size_t n, double* out) {
  __shared__ double part[kThreads / kWarp];
  double s = 0;
  GRID_STRIDE(i, n) s += double(x[i]) * x[i];
  for (int o = kWarp / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % kWarp == 0) part[threadIdx.x / kWarp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int w = 0; w < kThreads / kWarp; ++w) t += part[w];
    atomicAdd(out, t);
  }
}

}  // namespace

unsigned elementwise_blocks(std::size_t n, int threads) {
  DeviceInfo info;
  const bool known = device_info(info).ok();
  const int sms = known ? info.sm_count : 1;
  const int per_sm = known ? std::max(1, info.max_threads_per_sm / threads) : 1;  // resident blocks per SM
  const std::size_t want = ceil_div(n, static_cast<std::size_t>(threads));
  const std::size_t cap = static_cast<std::size_t>(sms) * static_cast<std::size_t>(per_sm);
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(want, cap)));
}

#define ELEMENTWISE_LAUNCH(kernel, n, ...)                                         \
  do {                                                                             \
    TESSEL_NVTX_FN();                                                              \
    if ((n) == 0) return {};                                                       \
    kernel<<<elementwise_blocks((n), kThreads), kThreads, 0, s>>>(__VA_ARGS__);   \
    TESSEL_LAUNCH_CHECK();                                                         \
    return {};                                                                     \
  } while (0)

// kernel<4> over n / 4 groups when `vec` holds (the pointers aligned for 16-byte float and 8-byte bf16
// accesses) and 4 divides n; kernel<1> over n otherwise.
#define VEC_LAUNCH(kernel, n, vec, ...)                                                        \
  do {                                                                                         \
    TESSEL_NVTX_FN();                                                                          \
    if ((n) == 0) return {};                                                                   \
    if ((vec) && (n) % 4 == 0)                                                                 \
      kernel<4><<<elementwise_blocks((n) / 4, kThreads), kThreads, 0, s>>>(__VA_ARGS__, (n) / 4); \
    else                                                                                       \
      kernel<1><<<elementwise_blocks((n), kThreads), kThreads, 0, s>>>(__VA_ARGS__, (n));    \
    TESSEL_LAUNCH_CHECK();                                                                     \
    return {};                                                                                 \
  } while (0)

// VEC_LAUNCH for the kernels templated on their input type In as well.
#define VEC_LAUNCH_IN(kernel, In, n, vec, ...)                                                        \
  do {                                                                                                \
    TESSEL_NVTX_FN();                                                                                 \
    if ((n) == 0) return {};                                                                          \
    if ((vec) && (n) % 4 == 0)                                                                        \
      kernel<4, In><<<elementwise_blocks((n) / 4, kThreads), kThreads, 0, s>>>(__VA_ARGS__, (n) / 4); \
    else                                                                                              \
      kernel<1, In><<<elementwise_blocks((n), kThreads), kThreads, 0, s>>>(__VA_ARGS__, (n));       \
    TESSEL_LAUNCH_CHECK();                                                                            \
    return {};                                                                                        \
  } while (0)

namespace {
// The 16-byte path's alignment: fp32 pointers to 16 bytes, bf16 ones (four elements) to 8.
bool f32_vec(std::initializer_list<const void*> ps) { return all_aligned(ps, 16); }
bool bf16_vec(std::initializer_list<const void*> ps) { return all_aligned(ps, 8); }
Status no_output(const char* fn) { return {1, std::string(fn) + ": neither the fp32 nor the bf16 output given"}; }
}  // namespace

Status gelu_fwd(cudaStream_t s, const float* x, float* y, std::size_t n, __nv_bfloat16* y16) {
  if (!y && !y16) return no_output("gelu_fwd");
  VEC_LAUNCH(gelu_fwd_kernel, n, f32_vec({x, y}) && bf16_vec({y16}), x, y, y16);
}
Status gelu_bwd(cudaStream_t s, const float* dy, const float* x, float* dx, std::size_t n, __nv_bfloat16* dx16) {
  if (!dx && !dx16) return no_output("gelu_bwd");
  VEC_LAUNCH(gelu_bwd_kernel, n, f32_vec({dy, x, dx}) && bf16_vec({dx16}), dy, x, dx, dx16);
}
Status swiglu_fwd(cudaStream_t s, const float* gate, const float* up, float* y, std::size_t n, __nv_bfloat16* y16) {
  if (!y && !y16) return no_output("swiglu_fwd");
  VEC_LAUNCH(swiglu_fwd_kernel, n, f32_vec({gate, up, y}) && bf16_vec({y16}), gate, up, y, y16);
}
Status swiglu_bwd(cudaStream_t s, const float* dy, const float* gate, const float* up, float* dgate, float* dup,
                  std::size_t n, __nv_bfloat16* dgate16, __nv_bfloat16* dup16) {
  if (!dgate && !dgate16) return no_output("swiglu_bwd (gate)");
  if (!dup && !dup16) return no_output("swiglu_bwd (up)");
  VEC_LAUNCH(swiglu_bwd_kernel, n, f32_vec({dy, gate, up, dgate, dup}) && bf16_vec({dgate16, dup16}), dy, gate, up, dgate, dup,
             dgate16, dup16);
}

Status gelu_fwd_bf16(cudaStream_t s, const __nv_bfloat16* x, __nv_bfloat16* y, std::size_t n) {
  if (!y) return no_output("gelu_fwd_bf16");
  VEC_LAUNCH_IN(gelu_fwd_kernel, __nv_bfloat16, n, bf16_vec({x, y}), x, nullptr, y);
}
Status gelu_bwd_bf16(cudaStream_t s, const __nv_bfloat16* dy, const __nv_bfloat16* x, __nv_bfloat16* dx, std::size_t n) {
  if (!dx) return no_output("gelu_bwd_bf16");
  VEC_LAUNCH_IN(gelu_bwd_kernel, __nv_bfloat16, n, bf16_vec({dy, x, dx}), dy, x, nullptr, dx);
}
Status swiglu_fwd_bf16(cudaStream_t s, const __nv_bfloat16* gate, const __nv_bfloat16* up, __nv_bfloat16* y,
                       std::size_t n) {
  if (!y) return no_output("swiglu_fwd_bf16");
  VEC_LAUNCH_IN(swiglu_fwd_kernel, __nv_bfloat16, n, bf16_vec({gate, up, y}), gate, up, nullptr, y);
}
Status swiglu_bwd_bf16(cudaStream_t s, const __nv_bfloat16* dy, const __nv_bfloat16* gate, const __nv_bfloat16* up,
                       __nv_bfloat16* dgate, __nv_bfloat16* dup, std::size_t n) {
  if (!dgate || !dup) return no_output("swiglu_bwd_bf16");
  VEC_LAUNCH_IN(swiglu_bwd_kernel, __nv_bfloat16, n, bf16_vec({dy, gate, up, dgate, dup}), dy, gate, up, nullptr,
                nullptr, dgate, dup);
}

Status adamw_step(cudaStream_t s, float* param, const float* grad, float* m, float* v, std::size_t n, const AdamW& hp,
                  int step, float grad_scale, __nv_bfloat16* param16) {
  if (step < 1) return {1, "adamw_step: step counts from 1, got " + std::to_string(step)};
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), step);
  const float step_size = static_cast<float>(hp.lr / bc1), bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - hp.lr * hp.weight_decay;
  VEC_LAUNCH(adamw_kernel, n, f32_vec({param, grad, m, v}) && bf16_vec({param16}), param, grad, m, v, param16, grad_scale, decay,
             hp.beta1, hp.beta2, hp.eps, step_size, bc2_sqrt);
}

Status sum_squares(cudaStream_t s, const float* x, std::size_t n, double* out) {
  ELEMENTWISE_LAUNCH(sum_squares_kernel, n, x, n, out);
}
Status scale(cudaStream_t s, float* x, std::size_t n, float factor) { ELEMENTWISE_LAUNCH(scale_kernel, n, x, n, factor); }
Status add(cudaStream_t s, const float* a, const float* b, float* out, std::size_t n) {
  VEC_LAUNCH(residual_add_kernel, n, f32_vec({a, b, out}), a, b, nullptr, out, 1);
}
Status residual_add(cudaStream_t s, const float* a, const float* b, const float* bias, float* out, int rows, int cols) {
  const std::size_t n = std::size_t(rows) * cols;
  VEC_LAUNCH(residual_add_kernel, n, f32_vec({a, b, bias, out}) && cols % 4 == 0, a, b, bias, out, cols);
}
Status fill(cudaStream_t s, float* x, std::size_t n, float value) { ELEMENTWISE_LAUNCH(fill_kernel, n, x, n, value); }
Status fill_uniform(cudaStream_t s, float* x, std::size_t n, std::uint64_t seed, float bound) {
  ELEMENTWISE_LAUNCH(fill_uniform_kernel, n, x, n, seed, bound);
}
Status fill_tokens(cudaStream_t s, std::int32_t* tokens, std::size_t n, std::uint64_t seed, int vocab) {
  ELEMENTWISE_LAUNCH(fill_tokens_kernel, n, tokens, n, seed, vocab);
}
Status to_bf16(cudaStream_t s, const float* in, __nv_bfloat16* out, std::size_t n) {
  VEC_LAUNCH(to_bf16_kernel, n, f32_vec({in}) && bf16_vec({out}), in, out);
}
Status from_bf16(cudaStream_t s, const __nv_bfloat16* in, float* out, std::size_t n) {
  ELEMENTWISE_LAUNCH(from_bf16_kernel, n, in, out, n);
}
Status reduce_blocks(cudaStream_t s, const float* in, int parts, std::size_t count, float* out, bool max) {
  ELEMENTWISE_LAUNCH(reduce_blocks_kernel, count, in, parts, count, out, max);
}

Status col_sum(cudaStream_t s, const float* dy, int rows, int cols, float* db) {
  TESSEL_NVTX_FN();
  if (cols == 0) return {};
  return column_sums<1>(s, ColValue{dy, cols}, rows, cols, ColOut<1>{{db}});
}
Status col_sum_bf16(cudaStream_t s, const __nv_bfloat16* dy, int rows, int cols, float* db) {
  TESSEL_NVTX_FN();
  if (cols == 0) return {};
  return column_sums<1>(s, ColValueBf16{dy, cols}, rows, cols, ColOut<1>{{db}});
}

}  // namespace tessel::kernels::cuda
