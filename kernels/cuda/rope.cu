// Rotary position embeddings on the GPU, in place: kernels/cpu/rope.hpp's contract (rotate-half pairing
// (j, j + d/2), position = row % seq, head h in columns [h d, (h+1) d) of a row of stride ld), reading the
// host-computed cos/sin table (kernels::cpu::rope_table: double angles rounded once to float) from the
// device, so the GPU and the CPU rotate by the same float values.
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/nvtx.hpp"

namespace tessel::kernels::cuda {

namespace {

constexpr int kRopeThreads = 256;

// One thread per (row, head, j < d/2) pair, j fastest: a warp reads x[j] and x[j + d/2] of one head as two
// coalesced runs and the table row of its position once. Memory-bound (6 flops per 16 bytes moved).
// The products and differences are rounded separately (__fmul_rn/__fsub_rn/__fadd_rn keep nvcc from
// contracting them into FMAs), so each output is the CPU reference's float expression, bit for bit.
__global__ void rope_kernel(const float* __restrict__ cos_t, const float* __restrict__ sin_t, int seq, int half,
                            float* x, int rows, int heads, int ld, float sign) {
  const std::size_t n = std::size_t(rows) * heads * half;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const int j = int(i % half);
    const std::size_t rh = i / half;
    const int h = int(rh % heads);
    const int r = int(rh / heads);
    const std::size_t p = std::size_t(r % seq) * half + j;
    const float c = cos_t[p], sn = sign * sin_t[p];
    float* v = x + std::size_t(r) * ld + std::size_t(h) * (2 * half);
    const float a = v[j], b = v[j + half];
    v[j] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn));
    v[j + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, sn));
  }
}

Status rope_launch(cudaStream_t s, const RopeTableView& t, float* x, int rows, int heads, int ld, float sign) {
  TESSEL_NVTX_FN();
  if (t.cos == nullptr || t.sin == nullptr || t.seq <= 0 || t.d <= 0 || t.d % 2 != 0 || rows < 0 || rows % t.seq != 0 ||
      heads <= 0 || ld < heads * t.d)
    return {1, "rope: rows " + std::to_string(rows) + ", seq " + std::to_string(t.seq) + ", heads " +
                   std::to_string(heads) + ", head_dim " + std::to_string(t.d) + " (must be even), ld " +
                   std::to_string(ld) + " (must be >= heads * head_dim); rows must be a multiple of seq"};
  const int half = t.d / 2;
  const std::size_t n = std::size_t(rows) * heads * half;
  if (n == 0) return {};
  rope_kernel<<<elementwise_blocks(n, kRopeThreads), kRopeThreads, 0, s>>>(t.cos, t.sin, t.seq, half, x, rows, heads,
                                                                            ld, sign);
  TESSEL_LAUNCH_CHECK();
  return {};
}

}  // namespace

Status rope_fwd(cudaStream_t s, const RopeTableView& t, float* x, int rows, int heads, int ld) {
  return rope_launch(s, t, x, rows, heads, ld, 1.0f);
}

Status rope_bwd(cudaStream_t s, const RopeTableView& t, float* dx, int rows, int heads, int ld) {
  return rope_launch(s, t, dx, rows, heads, ld, -1.0f);
}

}  // namespace tessel::kernels::cuda
