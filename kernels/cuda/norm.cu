// LayerNorm / RMSNorm forward and backward (formulas in kernels/cpu/norm.hpp). One warp per row: the row's
// statistics are warp reductions with no shared memory or block barrier; the parameter gradients are
// column sums in two deterministic passes (colreduce.cuh), no atomics.
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/colreduce.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/nvtx.hpp"

namespace tessel::kernels::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // 8 warps = 256 threads per block

// rms = false: LayerNorm (mean and biased variance); true: RMSNorm (mean of squares, no centring).
template <bool kRms>
__global__ void norm_fwd_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                const float* __restrict__ beta, float* __restrict__ y, float* __restrict__ mean,
                                float* __restrict__ rstd, int rows, int cols, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const float* xr = x + std::size_t(row) * cols;
  float mu = 0;
  if (!kRms) {
    float s = 0;
    for (int c = lane; c < cols; c += kWarp) s += xr[c];
    mu = warp_sum(s) / cols;
  }
  float v = 0;  // second pass over the (cached) row: no cancellation from E[x^2] - E[x]^2
  for (int c = lane; c < cols; c += kWarp) v += (xr[c] - mu) * (xr[c] - mu);
  const float rs = rsqrtf(warp_sum(v) / cols + eps);
  float* yr = y + std::size_t(row) * cols;
  for (int c = lane; c < cols; c += kWarp) yr[c] = (xr[c] - mu) * rs * gamma[c] + (kRms ? 0.0f : beta[c]);
  if (lane == 0) {
    if (!kRms && mean) mean[row] = mu;
    if (rstd) rstd[row] = rs;
  }
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma (RMSNorm: no mean(g) term, xhat = x rstd).
template <bool kRms>
__global__ void norm_bwd_dx_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                   const float* __restrict__ gamma, const float* __restrict__ mean,
                                   const float* __restrict__ rstd, float* __restrict__ dx, int rows, int cols) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const float* dyr = dy + std::size_t(row) * cols;
  const float* xr = x + std::size_t(row) * cols;
  const float mu = kRms ? 0.0f : mean[row], rs = rstd[row];
  float sg = 0, sgx = 0;
  for (int c = lane; c < cols; c += kWarp) {
    const float g = dyr[c] * gamma[c];
    sg += g;
    sgx += g * (xr[c] - mu) * rs;
  }
  sg = kRms ? 0.0f : warp_sum(sg) / cols;
  sgx = warp_sum(sgx) / cols;
  float* dxr = dx + std::size_t(row) * cols;
  for (int c = lane; c < cols; c += kWarp) dxr[c] = rs * (dyr[c] * gamma[c] - sg - (xr[c] - mu) * rs * sgx);
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
Status norm_bwd(cudaStream_t s, const float* dy, const float* x, const float* gamma, const float* mean,
                const float* rstd, float* dx, float* dgamma, float* dbeta, int rows, int cols) {
  if (rows == 0) return {};
  if (dx) {
    norm_bwd_dx_kernel<kRms><<<row_blocks(rows), kRowsPerBlock * kWarp, 0, s>>>(dy, x, gamma, mean, rstd, dx, rows, cols);
    TESSEL_LAUNCH_CHECK();
  }
  if (dgamma || dbeta)
    return column_sums<2>(s, NormParamValues<kRms>{dy, x, mean, rstd, cols}, rows, cols,
                          ColOut<2>{{dgamma, kRms ? nullptr : dbeta}});
  return {};
}

}  // namespace

Status layernorm_fwd(cudaStream_t s, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                     float* rstd, int rows, int cols, float eps) {
  TESSEL_NVTX_FN();
  if (rows == 0) return {};
  norm_fwd_kernel<false><<<row_blocks(rows), kRowsPerBlock * kWarp, 0, s>>>(x, gamma, beta, y, mean, rstd, rows, cols, eps);
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status layernorm_bwd(cudaStream_t s, const float* dy, const float* x, const float* gamma, const float* mean,
                     const float* rstd, float* dx, float* dgamma, float* dbeta, int rows, int cols) {
  TESSEL_NVTX_FN();
  return norm_bwd<false>(s, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols);
}

Status rmsnorm_fwd(cudaStream_t s, const float* x, const float* gamma, float* y, float* rstd, int rows, int cols,
                   float eps) {
  TESSEL_NVTX_FN();
  if (rows == 0) return {};
  norm_fwd_kernel<true><<<row_blocks(rows), kRowsPerBlock * kWarp, 0, s>>>(x, gamma, nullptr, y, nullptr, rstd, rows, cols, eps);
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status rmsnorm_bwd(cudaStream_t s, const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                   float* dgamma, int rows, int cols) {
  TESSEL_NVTX_FN();
  return norm_bwd<true>(s, dy, x, gamma, nullptr, rstd, dx, dgamma, nullptr, rows, cols);
}

}  // namespace tessel::kernels::cuda
