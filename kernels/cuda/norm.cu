// LayerNorm / RMSNorm forward and backward (formulas in kernels/cpu/norm.hpp). One warp per row: the row's
// statistics are warp reductions with no shared memory or block barrier; the parameter gradients are
// column sums in two deterministic passes (colreduce.cuh), no atomics.
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/colreduce.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/nvtx.hpp"

namespace tessel::kernels::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // 8 warps = 256 threads per block

// Rows are read in vectors of V floats (common.cuh's load_vec: V = 4, 16-byte loads and stores, when
// cols % 4 == 0 and every pointer is aligned; V = 1 otherwise). The first device run measured the scalar
// kernels at 48% (forward) and 59% (backward dx) of the copy bandwidth, against issue 7's 70%.

// rms = false: LayerNorm (mean and biased variance); true: RMSNorm (mean of squares, no centring). y and
// y16 (the bf16 form a GEMM reads) are each optional.
template <bool kRms, int V>
__global__ void norm_fwd_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                const float* __restrict__ beta, float* __restrict__ y,
                                __nv_bfloat16* __restrict__ y16, float* __restrict__ mean, float* __restrict__ rstd,
                                int rows, int cols, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const std::size_t r0 = std::size_t(row) * cols;
  const float* xr = x + r0;
  float mu = 0;
  if (!kRms) {
    float s = 0;
    for (int c = lane * V; c < cols; c += kWarp * V) {
      float v[V];
      load_vec<V>(v, xr + c);
#pragma unroll
      for (int k = 0; k < V; ++k) s += v[k];
    }
    mu = warp_sum(s) / cols;
  }
  float var = 0;  // second pass over the (cached) row: no cancellation from E[x^2] - E[x]^2
  for (int c = lane * V; c < cols; c += kWarp * V) {
    float v[V];
    load_vec<V>(v, xr + c);
#pragma unroll
    for (int k = 0; k < V; ++k) var += (v[k] - mu) * (v[k] - mu);
  }
  const float rs = rsqrtf(warp_sum(var) / cols + eps);
  for (int c = lane * V; c < cols; c += kWarp * V) {
    float v[V], g[V], b[V] = {};
    load_vec<V>(v, xr + c);
    load_vec<V>(g, gamma + c);
    if (!kRms) load_vec<V>(b, beta + c);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = (v[k] - mu) * rs * g[k] + (kRms ? 0.0f : b[k]);
    if (y) store_vec<V>(y + r0 + c, v);
    if (y16) store_vec<V>(y16 + r0 + c, v);
  }
  if (lane == 0) {
    if (!kRms && mean) mean[row] = mu;
    if (rstd) rstd[row] = rs;
  }
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma (RMSNorm: no mean(g) term, xhat = x rstd), plus
// dres when given (the residual branch's gradient, added in the same pass).
template <bool kRms, int V>
__global__ void norm_bwd_dx_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                   const float* __restrict__ gamma, const float* __restrict__ mean,
                                   const float* __restrict__ rstd, const float* __restrict__ dres,
                                   float* __restrict__ dx, int rows, int cols) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const std::size_t r0 = std::size_t(row) * cols;
  const float mu = kRms ? 0.0f : mean[row], rs = rstd[row];
  float sg = 0, sgx = 0;
  for (int c = lane * V; c < cols; c += kWarp * V) {
    float d[V], xv[V], gv[V];
    load_vec<V>(d, dy + r0 + c);
    load_vec<V>(xv, x + r0 + c);
    load_vec<V>(gv, gamma + c);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float g = d[k] * gv[k];
      sg += g;
      sgx += g * (xv[k] - mu) * rs;
    }
  }
  sg = kRms ? 0.0f : warp_sum(sg) / cols;
  sgx = warp_sum(sgx) / cols;
  for (int c = lane * V; c < cols; c += kWarp * V) {
    float d[V], xv[V], gv[V];
    load_vec<V>(d, dy + r0 + c);
    load_vec<V>(xv, x + r0 + c);
    load_vec<V>(gv, gamma + c);
#pragma unroll
    for (int k = 0; k < V; ++k) d[k] = rs * (d[k] * gv[k] - sg - (xv[k] - mu) * rs * sgx);
    if (dres) {
      float r[V];
      load_vec<V>(r, dres + r0 + c);
#pragma unroll
      for (int k = 0; k < V; ++k) d[k] = __fadd_rn(d[k], r[k]);  // not fused into the product above: dx rounds
                                                                   // first, as when the add was its own pass
    }
    store_vec<V>(dx + r0 + c, d);
  }
}

// The 16-byte path: whole float4s per row, and every row start aligned (bf16 rows: 8 bytes).
bool vec4(int cols, std::initializer_list<const void*> ptrs, const void* half = nullptr) {
  return cols % 4 == 0 && aligned(half, 8) && all_aligned(ptrs, 16);
}

// The element of column_sums' first pass for the parameter gradients: (dy xhat, dy), summed down the
// columns into dgamma and dbeta.
template <bool kRms>
struct NormParamValues {
  const float *dy, *x, *mean, *rstd;
  int cols;
  __device__ void operator()(int r, int c, float (&v)[2]) const {
    const std::size_t i = std::size_t(r) * cols + c;
    v[0] = dy[i] * (x[i] - (kRms ? 0.0f : mean[r])) * rstd[r];
    v[1] = dy[i];
  }
};

unsigned row_blocks(int rows) { return static_cast<unsigned>(ceil_div(rows, kRowsPerBlock)); }

template <bool kRms>
Status norm_fwd(cudaStream_t s, const float* x, const float* gamma, const float* beta, float* y, __nv_bfloat16* y16,
                float* mean, float* rstd, int rows, int cols, float eps) {
  if (!y && !y16) return {1, std::string(kRms ? "rmsnorm" : "layernorm") + "_fwd: neither y nor y16 given"};
  if (rows == 0) return {};
  if (vec4(cols, {x, gamma, beta, y}, y16))
    norm_fwd_kernel<kRms, 4><<<row_blocks(rows), kRowsPerBlock * kWarp, 0, s>>>(x, gamma, beta, y, y16, mean, rstd, rows, cols, eps);
  else
    norm_fwd_kernel<kRms, 1><<<row_blocks(rows), kRowsPerBlock * kWarp, 0, s>>>(x, gamma, beta, y, y16, mean, rstd, rows, cols, eps);
  TESSEL_LAUNCH_CHECK();
  return {};
}

template <bool kRms>
Status norm_bwd(cudaStream_t s, const float* dy, const float* x, const float* gamma, const float* mean,
                const float* rstd, float* dx, float* dgamma, float* dbeta, int rows, int cols, const float* dres) {
  if (rows == 0) return {};
  if (dx) {
    if (vec4(cols, {dy, x, gamma, dx, dres}))
      norm_bwd_dx_kernel<kRms, 4><<<row_blocks(rows), kRowsPerBlock * kWarp, 0, s>>>(dy, x, gamma, mean, rstd, dres, dx, rows, cols);
    else
      norm_bwd_dx_kernel<kRms, 1><<<row_blocks(rows), kRowsPerBlock * kWarp, 0, s>>>(dy, x, gamma, mean, rstd, dres, dx, rows, cols);
    TESSEL_LAUNCH_CHECK();
  }
  if (dgamma || dbeta)
    return column_sums<2>(s, NormParamValues<kRms>{dy, x, mean, rstd, cols}, rows, cols,
                          ColOut<2>{{dgamma, kRms ? nullptr : dbeta}});
  return {};
}

}  // namespace

Status layernorm_fwd(cudaStream_t s, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                     float* rstd, int rows, int cols, float eps, __nv_bfloat16* y16) {
  TESSEL_NVTX_FN();
  return norm_fwd<false>(s, x, gamma, beta, y, y16, mean, rstd, rows, cols, eps);
}

Status layernorm_bwd(cudaStream_t s, const float* dy, const float* x, const float* gamma, const float* mean,
                     const float* rstd, float* dx, float* dgamma, float* dbeta, int rows, int cols, const float* dres) {
  TESSEL_NVTX_FN();
  return norm_bwd<false>(s, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols, dres);
}

Status rmsnorm_fwd(cudaStream_t s, const float* x, const float* gamma, float* y, float* rstd, int rows, int cols,
                   float eps, __nv_bfloat16* y16) {
  TESSEL_NVTX_FN();
  return norm_fwd<true>(s, x, gamma, nullptr, y, y16, nullptr, rstd, rows, cols, eps);
}

Status rmsnorm_bwd(cudaStream_t s, const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                   float* dgamma, int rows, int cols, const float* dres) {
  TESSEL_NVTX_FN();
  return norm_bwd<true>(s, dy, x, gamma, nullptr, rstd, dx, dgamma, nullptr, rows, cols, dres);
}

}  // namespace tessel::kernels::cuda
