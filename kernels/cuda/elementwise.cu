// Element-wise kernels: GELU/SwiGLU forward and backward, AdamW, scale/add/bias, bf16 conversion, fill.
// Memory-bound: each thread walks a grid-stride loop so a grid sized from the SM count covers any n.
#include <cmath>

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

__global__ void gelu_fwd_kernel(const float* __restrict__ x, float* __restrict__ y, std::size_t n) {
  GRID_STRIDE(i, n) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v)));
  }
}

// d/dx [0.5 x (1 + t)], t = tanh(c (x + k x^3)): 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2).
__global__ void gelu_bwd_kernel(const float* __restrict__ dy, const float* __restrict__ x, float* __restrict__ dx,
                                std::size_t n) {
  GRID_STRIDE(i, n) {
    const float v = x[i];
    const float t = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v));
  }
}

__global__ void swiglu_fwd_kernel(const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ y,
                                  std::size_t n) {
  GRID_STRIDE(i, n) {
    const float a = gate[i];
    y[i] = a / (1.0f + expf(-a)) * up[i];
  }
}

// silu'(a) = s (1 + a (1 - s)), s = sigmoid(a).
__global__ void swiglu_bwd_kernel(const float* __restrict__ dy, const float* __restrict__ gate,
                                  const float* __restrict__ up, float* __restrict__ dgate, float* __restrict__ dup,
                                  std::size_t n) {
  GRID_STRIDE(i, n) {
    const float a = gate[i], s = 1.0f / (1.0f + expf(-a));
    dgate[i] = dy[i] * up[i] * s * (1.0f + a * (1.0f - s));
    dup[i] = dy[i] * a * s;
  }
}

// AdamW in PyTorch's order (kernels/cpu/optimizer.hpp); step_size and bc2_sqrt precomputed in double.
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, std::size_t n, float decay, float b1, float b2, float eps,
                             float step_size, float bc2_sqrt) {
  GRID_STRIDE(i, n) {
    const float gi = g[i];
    float pi = p[i] * decay;
    const float mi = m[i] + (1.0f - b1) * (gi - m[i]);
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    pi -= step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
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
__global__ void add_kernel(const float* a, const float* b, float* out, std::size_t n) { GRID_STRIDE(i, n) out[i] = a[i] + b[i]; }
__global__ void fill_kernel(float* x, std::size_t n, float value) { GRID_STRIDE(i, n) x[i] = value; }
__global__ void add_bias_kernel(float* x, const float* __restrict__ bias, std::size_t n, int cols) {
  GRID_STRIDE(i, n) x[i] += bias[i % cols];
}
__global__ void to_bf16_kernel(const float* __restrict__ in, __nv_bfloat16* __restrict__ out, std::size_t n) {
  GRID_STRIDE(i, n) out[i] = __float2bfloat16(in[i]);
}
__global__ void from_bf16_kernel(const __nv_bfloat16* __restrict__ in, float* __restrict__ out, std::size_t n) {
  GRID_STRIDE(i, n) out[i] = __bfloat162float(in[i]);
}

// The element of column_sums' first pass for col_sum: dy itself.
struct ColValue {
  const float* dy;
  int cols;
  __device__ void operator()(int r, int c, float (&v)[1]) const { v[0] = dy[std::size_t(r) * cols + c]; }
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
  const int sms = device_info(info).ok() ? info.sm_count : 1;
  const std::size_t want = ceil_div(n, static_cast<std::size_t>(threads));
  const std::size_t cap = static_cast<std::size_t>(sms) * 8;  // 8 resident 256-thread blocks per SM (2048 threads)
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

Status gelu_fwd(cudaStream_t s, const float* x, float* y, std::size_t n) { ELEMENTWISE_LAUNCH(gelu_fwd_kernel, n, x, y, n); }
Status gelu_bwd(cudaStream_t s, const float* dy, const float* x, float* dx, std::size_t n) {
  ELEMENTWISE_LAUNCH(gelu_bwd_kernel, n, dy, x, dx, n);
}
Status swiglu_fwd(cudaStream_t s, const float* gate, const float* up, float* y, std::size_t n) {
  ELEMENTWISE_LAUNCH(swiglu_fwd_kernel, n, gate, up, y, n);
}
Status swiglu_bwd(cudaStream_t s, const float* dy, const float* gate, const float* up, float* dgate, float* dup,
                  std::size_t n) {
  ELEMENTWISE_LAUNCH(swiglu_bwd_kernel, n, dy, gate, up, dgate, dup, n);
}

Status adamw_step(cudaStream_t s, float* param, const float* grad, float* m, float* v, std::size_t n, const AdamW& hp,
                  int step) {
  if (step < 1) return {1, "adamw_step: step counts from 1, got " + std::to_string(step)};
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), step);
  const float step_size = static_cast<float>(hp.lr / bc1), bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - hp.lr * hp.weight_decay;
  ELEMENTWISE_LAUNCH(adamw_kernel, n, param, grad, m, v, n, decay, hp.beta1, hp.beta2, hp.eps, step_size, bc2_sqrt);
}

Status sum_squares(cudaStream_t s, const float* x, std::size_t n, double* out) {
  ELEMENTWISE_LAUNCH(sum_squares_kernel, n, x, n, out);
}
Status scale(cudaStream_t s, float* x, std::size_t n, float factor) { ELEMENTWISE_LAUNCH(scale_kernel, n, x, n, factor); }
Status add(cudaStream_t s, const float* a, const float* b, float* out, std::size_t n) {
  ELEMENTWISE_LAUNCH(add_kernel, n, a, b, out, n);
}
Status fill(cudaStream_t s, float* x, std::size_t n, float value) { ELEMENTWISE_LAUNCH(fill_kernel, n, x, n, value); }
Status fill_uniform(cudaStream_t s, float* x, std::size_t n, std::uint64_t seed, float bound) {
  ELEMENTWISE_LAUNCH(fill_uniform_kernel, n, x, n, seed, bound);
}
Status fill_tokens(cudaStream_t s, std::int32_t* tokens, std::size_t n, std::uint64_t seed, int vocab) {
  ELEMENTWISE_LAUNCH(fill_tokens_kernel, n, tokens, n, seed, vocab);
}
Status add_bias(cudaStream_t s, float* x, const float* bias, int rows, int cols) {
  const std::size_t n = std::size_t(rows) * cols;
  ELEMENTWISE_LAUNCH(add_bias_kernel, n, x, bias, n, cols);
}
Status to_bf16(cudaStream_t s, const float* in, __nv_bfloat16* out, std::size_t n) {
  ELEMENTWISE_LAUNCH(to_bf16_kernel, n, in, out, n);
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

}  // namespace tessel::kernels::cuda
