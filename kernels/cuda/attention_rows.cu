// Row conversions between the runtime's fp32 attention tensors and the compact bf16 ones cuDNN reads and
// writes (attention_kernels.hpp). Pairs of elements per thread: 8-byte fp32 and 4-byte bf16 accesses, the
// alignment every attention output already has (attention_args_rule).
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/attention_kernels.hpp"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"

namespace tessel::kernels::cuda {

namespace {

__global__ void round_rows_kernel(const float* __restrict__ src, int ld, int rows, int cols, unsigned* __restrict__ dst) {
  const std::size_t pairs = std::size_t(rows) * (cols / 2);
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < pairs; i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = i / (cols / 2), c = (i % (cols / 2)) * 2;
    const float2 x = *reinterpret_cast<const float2*>(src + r * ld + c);
    dst[i] = bf16_pair(x.x, x.y);
  }
}

__global__ void widen_rows_kernel(const unsigned* __restrict__ src, int rows, int cols, float* __restrict__ dst, int ld) {
  const std::size_t pairs = std::size_t(rows) * (cols / 2);
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < pairs; i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = i / (cols / 2), c = (i % (cols / 2)) * 2;
    *reinterpret_cast<float2*>(dst + r * ld + c) = make_float2(bf16_lo(src[i]), bf16_hi(src[i]));
  }
}

constexpr int kThreads = 256;

}  // namespace

namespace detail {

Status round_rows_bf16(cudaStream_t s, const float* src, int ld, int rows, int cols, void* dst) {
  const std::size_t pairs = std::size_t(rows) * (cols / 2);
  if (pairs == 0) return {};
  round_rows_kernel<<<elementwise_blocks(pairs, kThreads), kThreads, 0, s>>>(src, ld, rows, cols, static_cast<unsigned*>(dst));
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status widen_rows_bf16(cudaStream_t s, const void* src, int rows, int cols, float* dst, int ld) {
  const std::size_t pairs = std::size_t(rows) * (cols / 2);
  if (pairs == 0) return {};
  widen_rows_kernel<<<elementwise_blocks(pairs, kThreads), kThreads, 0, s>>>(static_cast<const unsigned*>(src), rows, cols, dst, ld);
  TESSEL_LAUNCH_CHECK();
  return {};
}

}  // namespace detail

}  // namespace tessel::kernels::cuda
