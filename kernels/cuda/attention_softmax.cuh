// What every hand-written attention kernel shares (attention.cu, attention_tc.cu, experimental/): the
// online softmax of one query row and the epilogue that turns a row's accumulators into out and lse.
//
// Online softmax (Milakov & Gimelshein 2018; FlashAttention-2, Dao 2023, Algorithm 1) in base 2: a kernel
// scales its scores by log2(e) / sqrt(d) once (score_scale), so every exponential is exp2. A row keeps m,
// the largest scaled score seen, and l, the sum of exp2(s - m) over the keys seen (a kernel may keep partial
// sums in several threads and add them at the end: a lane's or a quad's share). Per tile of keys:
//   alpha = exp2(m_old - m_new) rescales l and the output accumulators (0 on the first tile: m_old = -inf),
//   p = exp2(s - m_new) is each key's weight, added to l and multiplied into V.
// Every row of a causal tile sees key 0 in its first tile, so m is finite from then on.
// lse is stored in natural units, ln 2 (m + log2 l), as kernels::cpu::attention_lse computes it, so any
// variant's forward serves any variant's backward; the backward rebuilds p = exp2(s - lse log2 e).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace tessel::kernels::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// log2(e) / sqrt(d): multiplies q . k into base-2 units.
__host__ __device__ inline float score_scale(float inv_sqrt_d) { return inv_sqrt_d * kLog2e; }

struct SoftmaxRow {
  float m = -INFINITY;  // largest scaled score so far
  float l = 0.0f;       // this thread's share of sum exp2(s - m)

  // A tile whose largest score in this row is tile_max (already reduced over the threads holding the row):
  // moves m, rescales l, and returns alpha for the accumulators.
  __device__ float next_tile(float tile_max) {
    const float m_new = fmaxf(m, tile_max);
    const float alpha = exp2f(m - m_new);
    m = m_new;
    l *= alpha;
    return alpha;
  }
  // A key's weight against the current m (0 for a masked score, -inf).
  __device__ float weight(float s) const { return exp2f(s - m); }
  // The row's log-sum-exp in natural units, given the full sum over its threads' shares.
  __device__ float lse(float total) const { return kLn2 * (m + log2f(total)); }
};

// The probability of a score s (scaled, base 2) from the row's stored lse (natural units): the backward's P.
__device__ inline float prob_from_lse(float s, float lse) { return exp2f(s - lse * kLog2e); }

// Index of row i of query head h of sequence b in the [batch, hq, seq] lse and delta arrays.
__host__ __device__ inline std::size_t stat_index(int b, int h, int i, int HQ, int S) {
  return (std::size_t(b) * HQ + h) * S + i;
}

// Epilogue of an mma.m16n8 accumulator row (fragment layout: attention_tc.cu's header): this thread holds
// columns 8 n + 2 t and + 1 of the row, for n < D / 8, at acc[n][2 r] and acc[n][2 r + 1] (r: the thread's
// first or second row). Writes them times `scale` to dst (the row's first column) as float2s.
template <int D>
__device__ inline void store_acc_row(float* __restrict__ dst, const float (&acc)[D / 8][4], int r, int t, float scale) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
    *reinterpret_cast<float2*>(dst + n * 8 + 2 * t) = make_float2(acc[n][2 * r] * scale, acc[n][2 * r + 1] * scale);
}

}  // namespace tessel::kernels::cuda
