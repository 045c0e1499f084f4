// Row-wise kernels over tokens: softmax cross-entropy (block per row over the vocabulary shard),
// embedding lookup and its gradient, learned positions.
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/nvtx.hpp"

namespace tessel::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// loss = (m + log s) - z_target, m = max z, s = sum exp(z - m) (kernels/cpu/cross_entropy.hpp). A target
// outside the shard contributes 0, as the CPU reference's owning-shard rule.
__global__ void cross_entropy_fwd_kernel(const float* __restrict__ logits, int vocab, int vocab_start,
                                         const std::int32_t* __restrict__ targets, float* __restrict__ loss,
                                         float* __restrict__ row_max, float* __restrict__ row_sum) {
  __shared__ float scratch[kWarp];
  const int r = blockIdx.x;
  const float* z = logits + std::size_t(r) * vocab;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, z[j]);
  m = block_max(m, scratch);
  float s = 0;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) s += expf(z[j] - m);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) {
    const int t = targets[r] - vocab_start;
    const float zt = (t >= 0 && t < vocab) ? z[t] : 0.0f;
    row_max[r] = m;
    row_sum[r] = s;
    loss[r] = m + logf(s) - zt;
  }
}

// O = float, or bf16 when the logits' gradient only feeds bf16 GEMMs (no fp32 copy written and converted).
template <class O>
__global__ void cross_entropy_bwd_kernel(const float* __restrict__ logits, int vocab, int vocab_start,
                                         const std::int32_t* __restrict__ targets, const float* __restrict__ row_max,
                                         const float* __restrict__ row_sum, const float* __restrict__ dloss,
                                         O* __restrict__ dlogits) {
  const int r = blockIdx.x;
  const float* z = logits + std::size_t(r) * vocab;
  O* dz = dlogits + std::size_t(r) * vocab;
  const float m = row_max[r], inv = 1.0f / row_sum[r], d = dloss[r];
  const int t = targets[r] - vocab_start;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float g[1] = {d * (expf(z[j] - m) * inv) - (j == t ? d : 0.0f)};
    store_vec<1>(dz + j, g);
  }
}

// The vocab-parallel passes (kernels.hpp): the fused kernel above split where the tp reductions go.
__global__ void cross_entropy_max_kernel(const float* __restrict__ logits, int vocab, float* __restrict__ row_max) {
  __shared__ float scratch[kWarp];
  const float* z = logits + std::size_t(blockIdx.x) * vocab;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, z[j]);
  m = block_max(m, scratch);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

__global__ void cross_entropy_partial_kernel(const float* __restrict__ logits, int rows, int vocab, int vocab_start,
                                             const std::int32_t* __restrict__ targets,
                                             const float* __restrict__ row_max, float* __restrict__ sums) {
  __shared__ float scratch[kWarp];
  const int r = blockIdx.x;
  const float* z = logits + std::size_t(r) * vocab;
  const float m = row_max[r];
  float s = 0;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) s += expf(z[j] - m);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) {
    const int t = targets[r] - vocab_start;
    sums[r] = s;
    sums[rows + r] = (t >= 0 && t < vocab) ? z[t] : 0.0f;
  }
}

__global__ void cross_entropy_loss_kernel(int rows, const float* __restrict__ row_max, const float* __restrict__ sums,
                                          float* __restrict__ loss) {
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x)
    loss[r] = row_max[r] + logf(sums[r]) - sums[rows + r];
}


// Block per token row; columns across threads. The table in fp32, or its bf16 copy (widened exactly).
template <class T>
__global__ void embedding_fwd_kernel(const T* __restrict__ table, int vocab, int vocab_start, int dim,
                                     const std::int32_t* __restrict__ tokens, float* __restrict__ out) {
  const int i = blockIdx.x, t = tokens[i] - vocab_start;
  float* o = out + std::size_t(i) * dim;
  const bool own = t >= 0 && t < vocab;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) o[c] = own ? widen(table[std::size_t(t) * dim + c]) : 0.0f;
}

// Repeated tokens add into the same table row: atomics (summation order, hence the last bits, may vary).
__global__ void embedding_bwd_kernel(const float* __restrict__ dout, int vocab, int vocab_start, int dim,
                                     const std::int32_t* __restrict__ tokens, float* __restrict__ dtable) {
  const int i = blockIdx.x, t = tokens[i] - vocab_start;
  if (t < 0 || t >= vocab) return;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) atomicAdd(&dtable[std::size_t(t) * dim + c], dout[std::size_t(i) * dim + c]);
}

// Token permutation (kernels/cpu/permute.hpp): a block per output row.
__global__ void gather_rows_kernel(const float* __restrict__ src, const std::int32_t* __restrict__ index,
                                   const float* __restrict__ scale, int width, float* __restrict__ dst) {
  const int i = blockIdx.x;
  const float* r = src + std::size_t(index[i]) * width;
  float* d = dst + std::size_t(i) * width;
  const float f = scale ? scale[i] : 1.0f;
  for (int c = threadIdx.x; c < width; c += blockDim.x) d[c] = scale ? f * r[c] : r[c];
}

__global__ void combine_rows_kernel(const float* __restrict__ src, const float* __restrict__ w, int k, int width,
                                    float* __restrict__ dst, bool accumulate) {
  const int t = blockIdx.x;
  float* d = dst + std::size_t(t) * width;
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    float acc = accumulate ? d[c] : 0.0f;
    for (int j = 0; j < k; ++j) {
      const std::size_t slot = std::size_t(t) * k + j;
      acc += (w ? w[slot] : 1.0f) * src[slot * width + c];
    }
    d[c] = acc;
  }
}

__global__ void row_dots_kernel(const float* __restrict__ a, const float* __restrict__ b, int k, int width,
                                float* __restrict__ out) {
  __shared__ float scratch[kWarp];
  const int i = blockIdx.x;
  const float* x = a + std::size_t(i / k) * width;
  const float* y = b + std::size_t(i) * width;
  float d = 0;
  for (int c = threadIdx.x; c < width; c += blockDim.x) d += x[c] * y[c];
  d = block_sum(d, scratch);
  if (threadIdx.x == 0) out[i] = d;
}

__global__ void positions_kernel(float* __restrict__ x, const float* __restrict__ pos, int row0, int seq, int dim) {
  const int r = blockIdx.x;
  const float* p = pos + std::size_t((row0 + r) % seq) * dim;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) x[std::size_t(r) * dim + c] += p[c];
}

__global__ void positions_bwd_kernel(const float* __restrict__ dx, float* __restrict__ dpos, int row0, int seq, int dim) {
  const int r = blockIdx.x;
  float* p = dpos + std::size_t((row0 + r) % seq) * dim;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) atomicAdd(&p[c], dx[std::size_t(r) * dim + c]);
}

}  // namespace

Status cross_entropy_fwd(cudaStream_t s, const float* logits, int rows, int vocab_local, int vocab_start,
                         const std::int32_t* targets, float* loss, float* row_max, float* row_sum) {
  TESSEL_NVTX_FN();
  if (rows == 0) return {};
  cross_entropy_fwd_kernel<<<rows, kThreads, 0, s>>>(logits, vocab_local, vocab_start, targets, loss, row_max, row_sum);
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status cross_entropy_bwd(cudaStream_t s, const float* logits, int rows, int vocab_local, int vocab_start,
                         const std::int32_t* targets, const float* row_max, const float* row_sum, const float* dloss,
                         float* dlogits, __nv_bfloat16* dlogits16) {
  TESSEL_NVTX_FN();
  if (!dlogits == !dlogits16) return {1, "cross_entropy_bwd: exactly one of dlogits and dlogits16 is written"};
  if (rows == 0) return {};
  if (dlogits16)
    cross_entropy_bwd_kernel<__nv_bfloat16><<<rows, kThreads, 0, s>>>(logits, vocab_local, vocab_start, targets,
                                                                      row_max, row_sum, dloss, dlogits16);
  else
    cross_entropy_bwd_kernel<float><<<rows, kThreads, 0, s>>>(logits, vocab_local, vocab_start, targets, row_max,
                                                              row_sum, dloss, dlogits);
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status cross_entropy_max(cudaStream_t s, const float* logits, int rows, int vocab_local, float* row_max) {
  TESSEL_NVTX_FN();
  if (rows == 0) return {};
  cross_entropy_max_kernel<<<rows, kThreads, 0, s>>>(logits, vocab_local, row_max);
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status cross_entropy_partial(cudaStream_t s, const float* logits, int rows, int vocab_local, int vocab_start,
                             const std::int32_t* targets, const float* row_max, float* sums) {
  TESSEL_NVTX_FN();
  if (rows == 0) return {};
  cross_entropy_partial_kernel<<<rows, kThreads, 0, s>>>(logits, rows, vocab_local, vocab_start, targets, row_max, sums);
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status cross_entropy_loss(cudaStream_t s, int rows, const float* row_max, const float* sums, float* loss) {
  TESSEL_NVTX_FN();
  if (rows == 0) return {};
  cross_entropy_loss_kernel<<<(rows + kThreads - 1) / kThreads, kThreads, 0, s>>>(rows, row_max, sums, loss);
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status embedding_fwd(cudaStream_t s, const float* table, int vocab_local, int vocab_start, int dim,
                     const std::int32_t* tokens, int n, float* out) {
  TESSEL_NVTX_FN();
  if (n == 0) return {};
  embedding_fwd_kernel<float><<<n, kThreads, 0, s>>>(table, vocab_local, vocab_start, dim, tokens, out);
  TESSEL_LAUNCH_CHECK();
  return {};
}
Status embedding_fwd_bf16(cudaStream_t s, const __nv_bfloat16* table, int vocab_local, int vocab_start, int dim,
                          const std::int32_t* tokens, int n, float* out) {
  TESSEL_NVTX_FN();
  if (n == 0) return {};
  embedding_fwd_kernel<__nv_bfloat16><<<n, kThreads, 0, s>>>(table, vocab_local, vocab_start, dim, tokens, out);
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status embedding_bwd(cudaStream_t s, const float* dout, int vocab_local, int vocab_start, int dim,
                     const std::int32_t* tokens, int n, float* dtable) {
  TESSEL_NVTX_FN();
  if (n == 0) return {};
  embedding_bwd_kernel<<<n, kThreads, 0, s>>>(dout, vocab_local, vocab_start, dim, tokens, dtable);
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status add_positions(cudaStream_t s, float* x, const float* pos, int rows, int row0, int seq, int dim) {
  TESSEL_NVTX_FN();
  if (rows == 0) return {};
  positions_kernel<<<rows, kThreads, 0, s>>>(x, pos, row0, seq, dim);
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status add_positions_bwd(cudaStream_t s, const float* dx, float* dpos, int rows, int row0, int seq, int dim) {
  TESSEL_NVTX_FN();
  if (rows == 0) return {};
  positions_bwd_kernel<<<rows, kThreads, 0, s>>>(dx, dpos, row0, seq, dim);
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status gather_rows(cudaStream_t s, const float* src, const std::int32_t* index, const float* scale, int n, int width,
                   float* dst) {
  TESSEL_NVTX_FN();
  if (n == 0 || width == 0) return {};
  gather_rows_kernel<<<n, kThreads, 0, s>>>(src, index, scale, width, dst);
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status combine_rows(cudaStream_t s, const float* src, const float* w, int tokens, int k, int width, float* dst,
                    bool accumulate) {
  TESSEL_NVTX_FN();
  if (tokens == 0 || width == 0) return {};
  combine_rows_kernel<<<tokens, kThreads, 0, s>>>(src, w, k, width, dst, accumulate);
  TESSEL_LAUNCH_CHECK();
  return {};
}

Status row_dots(cudaStream_t s, const float* a, const float* b, int n, int k, int width, float* out) {
  TESSEL_NVTX_FN();
  if (n == 0) return {};
  row_dots_kernel<<<n, kThreads, 0, s>>>(a, b, k, width, out);
  TESSEL_LAUNCH_CHECK();
  return {};
}

}  // namespace tessel::kernels::cuda
