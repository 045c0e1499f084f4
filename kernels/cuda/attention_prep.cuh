// What the tensor-core attention versions (attention_tc.cu, attention_tc2.cu, attention_tc3.cu) share. In
// an unnamed namespace: each kernel file that includes it has its own copy.
//   AttnDims / attn_dims: the kernels' shape argument (sequence, query and kv heads, 1 / sqrt(d));
//   attn_check: the shape and operand rules of the launchers (16-byte aligned inputs with row strides
//     divisible by 4, 8-byte aligned outputs with even row strides), errors prefixed by the version's name;
//   attn_check_bf16: the same for the bf16 entry points (compact operand rows, 16-byte aligned);
//   attn_launch: a launch with dynamic shared memory beyond 48 KiB (checked against the device's limit);
//   to_bf16_rows: dst = bf16(src) for a [rows, cols] block of a row-major fp32 matrix (row stride ld) into
//     a compact bf16 matrix, so q, k, v (and dO) are rounded once and their tiles loaded as bf16 by
//     cp.async. Round to nearest even, as the first version's operands. cols % 4 == 0, ld % 4 == 0, src
//     16-byte aligned, dst 8-byte aligned;
//   with_bf16_copies: q, k, v (and dO when given) rounded so into one stream-ordered allocation, handed to
//     run(qb, kb, vb, ob), and freed on the stream after it (versions 2 and 3 take bf16 operands);
//   attention_delta: delta[b, h, i] = sum_c dO[i, c] O[i, c] (FlashAttention-2's D_i) in fp32, a warp per
//     row, for the backward; dO fp32 or bf16 (the bf16 entry points' compact rows, widened exactly).
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
#include "kernels/cuda/kernels.hpp"
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

inline Status attn_check(const char* who, const AttentionShape& a,
                         std::initializer_list<std::pair<const float*, int>> in,
                         std::initializer_list<std::pair<const float*, int>> out) {
  if (!attention_tc_supported(a))
    return {1, std::string(who) + ": unsupported shape batch " + std::to_string(a.batch) + " seq " +
                   std::to_string(a.seq) + " hq " + std::to_string(a.hq) + " hkv " + std::to_string(a.hkv) + " d " +
                   std::to_string(a.d) + " (needs hq % hkv == 0 and d 64 or 128)"};
  for (const auto& [p, ld] : in)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0 || ld % 4 != 0)
      return {1, std::string(who) + ": inputs need 16-byte aligned pointers and row strides divisible by 4 (ld " +
                     std::to_string(ld) + ")"};
  for (const auto& [p, ld] : out)
    if (reinterpret_cast<std::uintptr_t>(p) % 8 != 0 || ld % 2 != 0)
      return {1, std::string(who) + ": outputs need 8-byte alignment and an even row stride (ld " +
                     std::to_string(ld) + ")"};
  return {};
}

// The bf16 entry points' rules: attn_check's for the shape and outputs, and 16-byte aligned operands (their
// rows are compact: hq or hkv times d wide).
inline Status attn_check_bf16(const char* who, const AttentionShape& a, std::initializer_list<const void*> in,
                              std::initializer_list<std::pair<const float*, int>> out) {
  TESSEL_STATUS_CHECK(attn_check(who, a, {}, out));
  for (const void* p : in)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
      return {1, std::string(who) + ": bf16 operands need 16-byte aligned pointers"};
  return {};
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
