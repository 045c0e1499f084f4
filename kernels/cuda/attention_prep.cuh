// What the hand-written attention kernels (attention.cu, attention_tc.cu, experimental/) share besides the
// softmax (attention_softmax.cuh). In an unnamed namespace: each kernel file that includes it has its own
// copy. Their arguments have passed attention_args_rule (attention_variant.hpp) before they get here.
//   AttnDims / attn_dims: the kernels' shape argument (sequence, query and kv heads, 1 / sqrt(d));
//   attn_launch: a launch with dynamic shared memory beyond 48 KiB (checked against the device's limit);
//   to_bf16_rows: dst = bf16(src) for a [rows, cols] block of a row-major fp32 matrix (row stride ld) into
//     a compact bf16 matrix, so q, k, v (and dO) are rounded once and their tiles loaded as bf16 by
//     cp.async. Round to nearest even, as the first version's operands. cols % 4 == 0, ld % 4 == 0, src
//     16-byte aligned, dst 8-byte aligned;
//   with_bf16_copies: q, k, v (and dO when given) rounded so into one stream-ordered allocation, handed to
//     run(qb, kb, vb, ob), and freed on the stream after it (versions 2 and 3 take bf16 operands);
//   with_bf16_operands: a call's q, k, v (and dO) as compact bf16, rounded by with_bf16_copies when fp32;
//   attention_delta: delta[b, h, i] = sum_c dO[i, c] O[i, c] (FlashAttention-2's D_i) in fp32, a warp per
//     row, for the backward; dO fp32 or bf16 (compact rows, widened exactly).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/attention_variant.hpp"
#include "kernels/cuda/status.hpp"

namespace tessel::kernels::cuda {
namespace {

struct AttnDims {
  int S, HQ, HKV;
  float scale;  // 1 / sqrt(d)
};
inline AttnDims attn_dims(const AttentionShape& a) {
  return {a.seq, a.hq, a.hkv, 1.0f / sqrtf(static_cast<float>(a.d))};
}

template <typename Kernel, typename... Args>
Status attn_launch(const char* who, Kernel kernel, dim3 grid, int threads, std::size_t smem, cudaStream_t s,
                   Args... args) {
  DeviceInfo info;
  TESSEL_STATUS_CHECK(device_info(info));
  if (smem > static_cast<std::size_t>(info.max_smem_per_block_optin))
    return {1, std::string(who) + ": needs " + std::to_string(smem) +
                   " bytes of shared memory per block, device allows " + std::to_string(info.max_smem_per_block_optin)};
  TESSEL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, threads, smem, s>>>(args...);
  TESSEL_LAUNCH_CHECK();
  return {};
}

__global__ void to_bf16_rows_kernel(const float* __restrict__ src, int ld, int rows, int cols,
                                    __nv_bfloat16* __restrict__ dst) {
  const std::size_t quads = std::size_t(rows) * (cols / 4);
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < quads; i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = i / (cols / 4), c = (i % (cols / 4)) * 4;
    const float4 x = *reinterpret_cast<const float4*>(src + r * ld + c);
    const float f[4] = {x.x, x.y, x.z, x.w};
    store_vec<4>(dst + r * cols + c, f);
  }
}

inline Status to_bf16_rows(cudaStream_t s, const float* src, int ld, int rows, int cols, __nv_bfloat16* dst) {
  const std::size_t quads = std::size_t(rows) * (cols / 4);
  if (quads == 0) return {};
  DeviceInfo info;
  TESSEL_STATUS_CHECK(device_info(info));
  const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>(ceil_div(quads, 256), std::size_t(info.sm_count) * 8));
  to_bf16_rows_kernel<<<blocks, 256, 0, s>>>(src, ld, rows, cols, dst);
  TESSEL_LAUNCH_CHECK();
  return {};
}

// run: Status(const bf16* q, const bf16* k, const bf16* v, const bf16* dout), compact rows (hq or hkv
// times d wide); dout is null when not given.
template <class Run>
Status with_bf16_copies(cudaStream_t s, const AttentionShape& a, const float* q, int ldq, const float* k, int ldk,
                        const float* v, int ldv, const float* dout, int lddo, Run&& run) {
  const int T = a.batch * a.seq, qd = a.hq * a.d, kd = a.hkv * a.d;
  const std::size_t qn = std::size_t(T) * qd, kn = std::size_t(T) * kd;
  __nv_bfloat16* buf = nullptr;
  TESSEL_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buf), (qn * (dout ? 2 : 1) + 2 * kn) * sizeof(*buf), s));
  __nv_bfloat16 *qb = buf, *kb = qb + qn, *vb = kb + kn, *ob = dout ? vb + kn : nullptr;
  Status st = to_bf16_rows(s, q, ldq, T, qd, qb);
  if (st.ok()) st = to_bf16_rows(s, k, ldk, T, kd, kb);
  if (st.ok()) st = to_bf16_rows(s, v, ldv, T, kd, vb);
  if (st.ok() && dout) st = to_bf16_rows(s, dout, lddo, T, qd, ob);
  if (st.ok()) st = run(qb, kb, vb, ob);
  TESSEL_CUDA_CHECK(cudaFreeAsync(buf, s));
  return st;
}

// The experimental kernels' operands as compact bf16: the caller's when they are bf16 already, else
// with_bf16_copies' rounded ones (dout too when with_dout).
template <class Run>
Status with_bf16_operands(cudaStream_t s, const AttentionArgs& g, bool with_dout, Run&& run) {
  using B = const __nv_bfloat16*;
  if (g.dtype == AttnDtype::bf16)
    return run(static_cast<B>(g.q), static_cast<B>(g.k), static_cast<B>(g.v), with_dout ? static_cast<B>(g.dout) : nullptr);
  const auto f = [](const void* p) { return static_cast<const float*>(p); };
  return with_bf16_copies(s, g.shape, f(g.q), g.ldq, f(g.k), g.ldk, f(g.v), g.ldv, with_dout ? f(g.dout) : nullptr,
                          g.lddo, run);
}

template <class TD>
__global__ void attention_delta_kernel(int S, int HQ, int B, int D, const float* __restrict__ out, int ldo,
                                       const TD* __restrict__ dout, int lddo, float* __restrict__ delta) {
  const std::size_t row = blockIdx.x * std::size_t(blockDim.x / kWarp) + threadIdx.x / kWarp;  // over B * HQ * S
  if (row >= std::size_t(B) * HQ * S) return;
  const int lane = threadIdx.x % kWarp, i = row % S, h = (row / S) % HQ;
  const std::size_t tok = (row / (std::size_t(S) * HQ)) * S + i;
  float s = 0;
  for (int c = lane; c < D; c += kWarp) s += widen(dout[tok * lddo + h * D + c]) * out[tok * ldo + h * D + c];
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

template <class TD>
Status attention_delta(cudaStream_t s, int B, int S, int HQ, int D, const float* out, int ldo, const TD* dout, int lddo,
                       float* delta) {
  const std::size_t rows = std::size_t(B) * HQ * S;
  if (rows == 0) return {};
  constexpr int kRowsPerBlock = 4;
  attention_delta_kernel<TD><<<static_cast<unsigned>(ceil_div(rows, kRowsPerBlock)), kRowsPerBlock * kWarp, 0, s>>>(
      S, HQ, B, D, out, ldo, dout, lddo, delta);
  TESSEL_LAUNCH_CHECK();
  return {};
}

}  // namespace
}  // namespace tessel::kernels::cuda

namespace tessel::kernels::cuda {
namespace {

// delta = rowsum(dO * O) of a backward call, from dout in its own type.
inline Status attention_delta(cudaStream_t s, const AttentionArgs& g) {
  const AttentionShape& a = g.shape;
  if (g.dtype == AttnDtype::bf16)
    return attention_delta(s, a.batch, a.seq, a.hq, a.d, g.out, g.ldo, static_cast<const __nv_bfloat16*>(g.dout),
                           g.lddo, g.delta);
  return attention_delta(s, a.batch, a.seq, a.hq, a.d, g.out, g.ldo, static_cast<const float*>(g.dout), g.lddo, g.delta);
}

}  // namespace
}  // namespace tessel::kernels::cuda
