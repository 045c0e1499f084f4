// The passes the attention kernels of attention_tc2.cu and attention_tc3.cu make before their tiled
// kernels. In an unnamed namespace: each kernel file that includes it has its own copy.
//   to_bf16_rows: dst = bf16(src) for a [rows, cols] block of a row-major fp32 matrix (row stride ld) into
//     a compact bf16 matrix, so q, k, v (and dO) are rounded once and their tiles loaded as bf16 by
//     cp.async. Round to nearest even, as the first version's operands. cols % 4 == 0, ld % 4 == 0, src
//     16-byte aligned, dst 8-byte aligned.
//   attention_delta: delta[b, h, i] = sum_c dO[i, c] O[i, c] (FlashAttention-2's D_i) in fp32, a warp per
//     row, for the backward.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/status.hpp"

namespace tessel::kernels::cuda {
namespace {

__device__ inline unsigned bf16_pair(float lo, float hi) {
  return unsigned(__bfloat16_as_ushort(__float2bfloat16(lo))) | (unsigned(__bfloat16_as_ushort(__float2bfloat16(hi))) << 16);
}

__global__ void to_bf16_rows_kernel(const float* __restrict__ src, int ld, int rows, int cols,
                                    __nv_bfloat16* __restrict__ dst) {
  const std::size_t quads = std::size_t(rows) * (cols / 4);
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < quads; i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = i / (cols / 4), c = (i % (cols / 4)) * 4;
    const float4 x = *reinterpret_cast<const float4*>(src + r * ld + c);
    *reinterpret_cast<uint2*>(dst + r * cols + c) = make_uint2(bf16_pair(x.x, x.y), bf16_pair(x.z, x.w));
  }
}

Status to_bf16_rows(cudaStream_t s, const float* src, int ld, int rows, int cols, __nv_bfloat16* dst) {
  const std::size_t quads = std::size_t(rows) * (cols / 4);
  if (quads == 0) return {};
  DeviceInfo info;
  TESSEL_STATUS_CHECK(device_info(info));
  const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>(ceil_div(quads, 256), std::size_t(info.sm_count) * 8));
  to_bf16_rows_kernel<<<blocks, 256, 0, s>>>(src, ld, rows, cols, dst);
  TESSEL_LAUNCH_CHECK();
  return {};
}

__global__ void attention_delta_kernel(int S, int HQ, int B, int D, const float* __restrict__ out, int ldo,
                                       const float* __restrict__ dout, int lddo, float* __restrict__ delta) {
  const std::size_t row = blockIdx.x * std::size_t(blockDim.x / kWarp) + threadIdx.x / kWarp;  // over B * HQ * S
  if (row >= std::size_t(B) * HQ * S) return;
  const int lane = threadIdx.x % kWarp, i = row % S, h = (row / S) % HQ;
  const std::size_t tok = (row / (std::size_t(S) * HQ)) * S + i;
  float s = 0;
  for (int c = lane; c < D; c += kWarp) s += dout[tok * lddo + h * D + c] * out[tok * ldo + h * D + c];
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

Status attention_delta(cudaStream_t s, int B, int S, int HQ, int D, const float* out, int ldo, const float* dout,
                       int lddo, float* delta) {
  const std::size_t rows = std::size_t(B) * HQ * S;
  if (rows == 0) return {};
  constexpr int kRowsPerBlock = 4;
  attention_delta_kernel<<<static_cast<unsigned>(ceil_div(rows, kRowsPerBlock)), kRowsPerBlock * kWarp, 0, s>>>(
      S, HQ, B, D, out, ldo, dout, lddo, delta);
  TESSEL_LAUNCH_CHECK();
  return {};
}

}  // namespace
}  // namespace tessel::kernels::cuda
