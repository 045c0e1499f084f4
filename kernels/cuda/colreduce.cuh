// Column reductions over a row-major [rows, cols] matrix (bias gradients, norm parameter gradients) in two
// deterministic passes, without atomics:
//   1. grid (ceil(cols / 32), ceil(rows / kColChunk)): a block of 8 warps takes 32 columns (one per lane,
//      128 contiguous bytes per warp per row) and kColChunk rows (warp w: rows w, w + 8, ...), sums its
//      K values per element, combines the 8 warps in warp order and writes partial[chunk][k][col];
//   2. thread per (column): out_k[c] += sum over chunks in chunk order.
// The first version (thread per column over all rows) gave 2,048 columns 8 blocks of 256 threads: on a
// 132-SM GPU most SMs idle and each thread walked every row in sequence.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/status.hpp"

namespace tessel::kernels::cuda {

constexpr int kColWarps = 8;
constexpr int kColChunk = 256;  // rows per block: 32 per warp

// F: a functor with `__device__ void operator()(int r, int c, float (&v)[K]) const` setting the K values of
// element (r, c) to be summed down the columns.
template <int K, class F>
__global__ void __launch_bounds__(kColWarps * kWarp) col_partials_kernel(F f, int rows, int cols, float* __restrict__ partial) {
  __shared__ float part[K][kColWarps][kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int c = blockIdx.x * kWarp + lane, r0 = blockIdx.y * kColChunk;
  const int r1 = min(rows, r0 + kColChunk);
  float s[K] = {};
  if (c < cols) {
    for (int r = r0 + warp; r < r1; r += kColWarps) {
      float v[K];
      f(r, c, v);
#pragma unroll
      for (int k = 0; k < K; ++k) s[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) part[k][warp][lane] = s[k];
  __syncthreads();
  if (warp == 0 && c < cols) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float t = 0;
      for (int w = 0; w < kColWarps; ++w) t += part[k][w][lane];
      partial[(std::size_t(blockIdx.y) * K + k) * cols + c] = t;
    }
  }
}

template <int K>
struct ColOut {
  float* out[K];  // out[k] may be null: that sum is not wanted
};

template <int K>
__global__ void col_finish_kernel(const float* __restrict__ partial, int chunks, int cols, ColOut<K> o) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!o.out[k]) continue;
      float t = 0;
      for (int p = 0; p < chunks; ++p) t += partial[(std::size_t(p) * K + k) * cols + c];
      o.out[k][c] += t;
    }
  }
}

// out_k[c] += sum_r f(r, c)_k. The partial sums live in a stream-ordered allocation (cudaMallocAsync: the
// driver's pool, no device synchronisation), freed on the stream after the second pass.
template <int K, class F>
Status column_sums(cudaStream_t s, F f, int rows, int cols, ColOut<K> o) {
  if (rows <= 0 || cols <= 0) return {};
  const int chunks = static_cast<int>(ceil_div(std::size_t(rows), kColChunk));
  float* partial = nullptr;
  TESSEL_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partial), std::size_t(chunks) * K * cols * sizeof(float), s));
  const dim3 grid(static_cast<unsigned>(ceil_div(std::size_t(cols), kWarp)), static_cast<unsigned>(chunks));
  col_partials_kernel<K, F><<<grid, kColWarps * kWarp, 0, s>>>(f, rows, cols, partial);
  const cudaError_t launched = cudaGetLastError();
  if (launched == cudaSuccess)
    col_finish_kernel<K><<<static_cast<unsigned>(ceil_div(std::size_t(cols), 256)), 256, 0, s>>>(partial, chunks, cols, o);
  const cudaError_t finished = cudaGetLastError();
  TESSEL_CUDA_CHECK(cudaFreeAsync(partial, s));
  TESSEL_CUDA_CHECK(launched);
  TESSEL_CUDA_CHECK(finished);
  return {};
}

}  // namespace tessel::kernels::cuda
