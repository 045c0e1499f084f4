// Causal attention in the flash-attention manner (Dao et al. 2022; FlashAttention-2, Dao 2023): keys and
// values stream through shared-memory tiles, each query row keeps a running max m, a running sum l and
// an output accumulator (online softmax, Milakov & Gimelshein 2018: attention_softmax.cuh, shared with the
// tensor-core kernels), so no [seq, seq] matrix is ever written. fp32 on the CUDA cores: the reference of
// the GPU path (attention variant fp32) and the kernel of --precision fp32 runs.
//
// Work split: a block is 4 warps; a warp owns 4 rows (query rows in the forward and dQ kernels, key rows
// in the dK/dV kernel). For the 32 rows of the streamed tile, lane j takes row j of the tile for the dot
// products (shared-memory rows padded to an odd pitch, so the 32 lanes hit 32 banks), and lane c takes
// columns c, c + 32, ... of the accumulators (consecutive addresses across the warp).
#include "kernels/cuda/attention_kernels.hpp"
#include "kernels/cuda/attention_prep.cuh"
#include "kernels/cuda/attention_softmax.cuh"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"

namespace tessel::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kOwn = 4;                 // rows a warp owns
constexpr int kOwnRows = kWarps * kOwn; // 16 rows owned per block
constexpr int kTile = kWarp;            // 32 streamed rows per tile: one per lane
constexpr int kMaxHeadDim = 128;

template <int DV>
__host__ __device__ constexpr int pitch() { return DV * kWarp + 1; }  // odd: row j of lane j lands in bank (j * pitch + c) % 32

struct Dims {
  int S, HQ, HKV, D;
  float scale;   // 1 / sqrt(D)
  float scale2;  // scale log2(e): scores in the base-2 units of attention_softmax.cuh
};

// rows [row0, row0 + n) of a head's [S, D] slice of a token-major matrix (b's tokens start at row b*S);
// rows past S are zero so they add nothing.
__device__ void load_rows(float* dst, int pitch, const float* __restrict__ src, int ld, std::size_t base_row,
                          int col0, int row0, int n, int S, int D) {
  for (int idx = threadIdx.x; idx < n * D; idx += blockDim.x) {
    const int r = idx / D, c = idx % D, i = row0 + r;
    dst[r * pitch + c] = i < S ? src[(base_row + i) * ld + col0 + c] : 0.0f;
  }
}

__device__ inline float dot_rows(const float* a, const float* b, int D) {
  float s = 0;
  for (int c = 0; c < D; ++c) s = fmaf(a[c], b[c], s);
  return s;
}

// grid (ceil(S / 16), HQ, B). lse[b, h, i] in natural units (attention_softmax.cuh).
template <int DV>
__global__ void __launch_bounds__(kWarps * kWarp) attention_fwd_kernel(
    Dims d, const float* __restrict__ q, int ldq, const float* __restrict__ k, int ldk, const float* __restrict__ v,
    int ldv, float* __restrict__ out, int ldo, float* __restrict__ lse) {
  constexpr int P = pitch<DV>();
  extern __shared__ float smem[];
  float* Qs = smem;                 // [16][P]
  float* Ks = Qs + kOwnRows * P;    // [32][P]
  float* Vs = Ks + kTile * P;       // [32][P]
  const int i0 = blockIdx.x * kOwnRows, h = blockIdx.y, b = blockIdx.z, hk = h / (d.HQ / d.HKV);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const std::size_t base = std::size_t(b) * d.S;
  load_rows(Qs, P, q, ldq, base, h * d.D, i0, kOwnRows, d.S, d.D);

  SoftmaxRow row[kOwn];
  float o[kOwn][DV];
#pragma unroll
  for (int r = 0; r < kOwn; ++r)
#pragma unroll
    for (int u = 0; u < DV; ++u) o[r][u] = 0;
  const int last_key = min(d.S, i0 + kOwnRows);  // causal: no row of this block sees a later key
  for (int j0 = 0; j0 < last_key; j0 += kTile) {
    __syncthreads();  // the previous tile is no longer read
    load_rows(Ks, P, k, ldk, base, hk * d.D, j0, kTile, d.S, d.D);
    load_rows(Vs, P, v, ldv, base, hk * d.D, j0, kTile, d.S, d.D);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kOwn; ++r) {
      const int rr = warp * kOwn + r, i = i0 + rr, j = j0 + lane;
      if (i >= d.S) continue;  // uniform across the warp
      float s = dot_rows(Qs + rr * P, Ks + lane * P, d.D) * d.scale2;
      if (j > i || j >= d.S) s = -INFINITY;
      const float alpha = row[r].next_tile(warp_max(s));
      const float p = row[r].weight(s);
      row[r].l += warp_sum(p);
#pragma unroll
      for (int u = 0; u < DV; ++u) o[r][u] *= alpha;
      for (int jj = 0; jj < kTile; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
        for (int u = 0; u < DV; ++u) o[r][u] = fmaf(pj, Vs[jj * P + u * kWarp + lane], o[r][u]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kOwn; ++r) {
    const int i = i0 + warp * kOwn + r;
    if (i >= d.S) continue;
    const float inv = 1.0f / row[r].l;  // every lane holds the row's whole sum (warp_sum)
#pragma unroll
    for (int u = 0; u < DV; ++u) {
      const int c = u * kWarp + lane;
      if (c < d.D) out[(base + i) * ldo + h * d.D + c] = o[r][u] * inv;
    }
    if (lane == 0) lse[stat_index(b, h, i, d.HQ, d.S)] = row[r].lse(row[r].l);
  }
}

// grid (ceil(S / 16), HKV, B): a warp owns 4 keys; query tiles of 32 rows stream through, for every query
// head of the group. dV_j = sum_i P_ij dO_i; dK_j = scale sum_i dS_ij Q_i, dS = P (dP - delta), dP = dO V^T.
template <int DV>
__global__ void __launch_bounds__(kWarps * kWarp) attention_dkdv_kernel(
    Dims d, const float* __restrict__ q, int ldq, const float* __restrict__ k, int ldk, const float* __restrict__ v,
    int ldv, const float* __restrict__ lse, const float* __restrict__ delta, const float* __restrict__ dout, int lddo,
    float* __restrict__ dk, int lddk, float* __restrict__ dv, int lddv) {
  constexpr int P = pitch<DV>();
  extern __shared__ float smem[];
  float* Ks = smem;                 // [16][P] owned keys
  float* Vs = Ks + kOwnRows * P;    // [16][P]
  float* Qs = Vs + kOwnRows * P;    // [32][P] streamed queries
  float* Os = Qs + kTile * P;       // [32][P] their dO
  float* Ls = Os + kTile * P;       // [32] lse
  float* Ds = Ls + kTile;           // [32] delta
  const int j0 = blockIdx.x * kOwnRows, hk = blockIdx.y, b = blockIdx.z, group = d.HQ / d.HKV;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const std::size_t base = std::size_t(b) * d.S;
  load_rows(Ks, P, k, ldk, base, hk * d.D, j0, kOwnRows, d.S, d.D);
  load_rows(Vs, P, v, ldv, base, hk * d.D, j0, kOwnRows, d.S, d.D);
  float gk[kOwn][DV], gv[kOwn][DV];
#pragma unroll
  for (int r = 0; r < kOwn; ++r)
#pragma unroll
    for (int u = 0; u < DV; ++u) gk[r][u] = gv[r][u] = 0;

  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const float* lse_h = lse + (std::size_t(b) * d.HQ + h) * d.S;
    const float* delta_h = delta + (std::size_t(b) * d.HQ + h) * d.S;
    for (int i0 = (j0 / kTile) * kTile; i0 < d.S; i0 += kTile) {  // causal: queries i >= j only
      __syncthreads();
      load_rows(Qs, P, q, ldq, base, h * d.D, i0, kTile, d.S, d.D);
      load_rows(Os, P, dout, lddo, base, h * d.D, i0, kTile, d.S, d.D);
      if (threadIdx.x < kTile) {
        const int i = i0 + threadIdx.x;
        Ls[threadIdx.x] = i < d.S ? lse_h[i] : 0.0f;
        Ds[threadIdx.x] = i < d.S ? delta_h[i] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kOwn; ++r) {
        const int row = warp * kOwn + r, j = j0 + row, i = i0 + lane;
        if (j >= d.S) continue;
        const float s = dot_rows(Qs + lane * P, Ks + row * P, d.D) * d.scale2;
        const float p = (i >= j && i < d.S) ? prob_from_lse(s, Ls[lane]) : 0.0f;
        const float ds = p * (dot_rows(Os + lane * P, Vs + row * P, d.D) - Ds[lane]);
        for (int ii = 0; ii < kTile; ++ii) {
          const float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
          for (int u = 0; u < DV; ++u) {
            gv[r][u] = fmaf(pi, Os[ii * P + u * kWarp + lane], gv[r][u]);
            gk[r][u] = fmaf(dsi, Qs[ii * P + u * kWarp + lane], gk[r][u]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kOwn; ++r) {
    const int j = j0 + warp * kOwn + r;
    if (j >= d.S) continue;
#pragma unroll
    for (int u = 0; u < DV; ++u) {
      const int c = u * kWarp + lane;
      if (c >= d.D) continue;
      dk[(base + j) * lddk + hk * d.D + c] = gk[r][u] * d.scale;
      dv[(base + j) * lddv + hk * d.D + c] = gv[r][u];
    }
  }
}

// grid (ceil(S / 16), HQ, B): a warp owns 4 query rows; key tiles stream through. dQ_i = scale sum_j dS_ij K_j.
template <int DV>
__global__ void __launch_bounds__(kWarps * kWarp) attention_dq_kernel(
    Dims d, const float* __restrict__ q, int ldq, const float* __restrict__ k, int ldk, const float* __restrict__ v,
    int ldv, const float* __restrict__ lse, const float* __restrict__ delta, const float* __restrict__ dout, int lddo,
    float* __restrict__ dq, int lddq) {
  constexpr int P = pitch<DV>();
  extern __shared__ float smem[];
  float* Qs = smem;                 // [16][P] owned queries
  float* Os = Qs + kOwnRows * P;    // [16][P] their dO
  float* Ks = Os + kOwnRows * P;    // [32][P]
  float* Vs = Ks + kTile * P;       // [32][P]
  const int i0 = blockIdx.x * kOwnRows, h = blockIdx.y, b = blockIdx.z, hk = h / (d.HQ / d.HKV);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const std::size_t base = std::size_t(b) * d.S;
  load_rows(Qs, P, q, ldq, base, h * d.D, i0, kOwnRows, d.S, d.D);
  load_rows(Os, P, dout, lddo, base, h * d.D, i0, kOwnRows, d.S, d.D);
  float li[kOwn], di[kOwn], g[kOwn][DV];
#pragma unroll
  for (int r = 0; r < kOwn; ++r) {
    const int i = i0 + warp * kOwn + r;
    const std::size_t at = (std::size_t(b) * d.HQ + h) * d.S + min(i, d.S - 1);
    li[r] = lse[at];
    di[r] = delta[at];
#pragma unroll
    for (int u = 0; u < DV; ++u) g[r][u] = 0;
  }
  const int last_key = min(d.S, i0 + kOwnRows);
  for (int j0 = 0; j0 < last_key; j0 += kTile) {
    __syncthreads();
    load_rows(Ks, P, k, ldk, base, hk * d.D, j0, kTile, d.S, d.D);
    load_rows(Vs, P, v, ldv, base, hk * d.D, j0, kTile, d.S, d.D);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kOwn; ++r) {
      const int row = warp * kOwn + r, i = i0 + row, j = j0 + lane;
      if (i >= d.S) continue;
      const float s = dot_rows(Qs + row * P, Ks + lane * P, d.D) * d.scale2;
      const float p = (j <= i && j < d.S) ? prob_from_lse(s, li[r]) : 0.0f;
      const float ds = p * (dot_rows(Os + row * P, Vs + lane * P, d.D) - di[r]);
      for (int jj = 0; jj < kTile; ++jj) {
        const float dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
        for (int u = 0; u < DV; ++u) g[r][u] = fmaf(dsj, Ks[jj * P + u * kWarp + lane], g[r][u]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kOwn; ++r) {
    const int i = i0 + warp * kOwn + r;
    if (i >= d.S) continue;
#pragma unroll
    for (int u = 0; u < DV; ++u) {
      const int c = u * kWarp + lane;
      if (c < d.D) dq[(base + i) * lddq + h * d.D + c] = g[r][u] * d.scale;
    }
  }
}

Dims dims_of(const AttentionShape& a) {
  const float scale = 1.0f / sqrtf(static_cast<float>(a.d));
  return {a.seq, a.hq, a.hkv, a.d, scale, score_scale(scale)};
}

template <int DV>
Status fwd(cudaStream_t s, const AttentionShape& a, const float* q, int ldq, const float* k, int ldk, const float* v,
           int ldv, float* out, int ldo, float* lse) {
  static_assert(DV >= 1 && DV * kWarp <= kMaxHeadDim, "head_dim tiles: 1..4 columns per lane");
  const dim3 grid(static_cast<unsigned>(ceil_div(a.seq, kOwnRows)), a.hq, a.batch);
  const std::size_t smem = sizeof(float) * pitch<DV>() * (kOwnRows + 2 * kTile);
  return attn_launch("attention (fp32)", attention_fwd_kernel<DV>, grid, kWarps * kWarp, smem, s, dims_of(a), q, ldq,
                     k, ldk, v, ldv, out, ldo, lse);
}

template <int DV>
Status bwd(cudaStream_t s, const AttentionShape& a, const float* q, int ldq, const float* k, int ldk, const float* v,
           int ldv, const float* lse, const float* delta, const float* dout, int lddo, float* dq, int lddq, float* dk,
           int lddk, float* dv, int lddv) {
  const Dims d = dims_of(a);
  const unsigned row_blocks = static_cast<unsigned>(ceil_div(a.seq, kOwnRows));
  const std::size_t smem_kv = sizeof(float) * (pitch<DV>() * (2 * kOwnRows + 2 * kTile) + 2 * kTile);
  TESSEL_STATUS_CHECK(attn_launch("attention (fp32)", attention_dkdv_kernel<DV>, dim3(row_blocks, a.hkv, a.batch),
                                  kWarps * kWarp, smem_kv, s, d, q, ldq, k, ldk, v, ldv, lse, delta, dout, lddo, dk,
                                  lddk, dv, lddv));
  const std::size_t smem_q = sizeof(float) * pitch<DV>() * (2 * kOwnRows + 2 * kTile);
  return attn_launch("attention (fp32)", attention_dq_kernel<DV>, dim3(row_blocks, a.hq, a.batch), kWarps * kWarp,
                     smem_q, s, d, q, ldq, k, ldk, v, ldv, lse, delta, dout, lddo, dq, lddq);
}

const float* f32(const void* p) { return static_cast<const float*>(p); }

}  // namespace

namespace detail {

Status fp32_attention_fwd(cudaStream_t s, const AttentionArgs& g) {
  const AttentionShape& a = g.shape;
  const float *q = f32(g.q), *k = f32(g.k), *v = f32(g.v);
  switch (ceil_div(a.d, kWarp)) {
    case 1: return fwd<1>(s, a, q, g.ldq, k, g.ldk, v, g.ldv, g.out, g.ldo, g.lse);
    case 2: return fwd<2>(s, a, q, g.ldq, k, g.ldk, v, g.ldv, g.out, g.ldo, g.lse);
    case 3: return fwd<3>(s, a, q, g.ldq, k, g.ldk, v, g.ldv, g.out, g.ldo, g.lse);
    default: return fwd<4>(s, a, q, g.ldq, k, g.ldk, v, g.ldv, g.out, g.ldo, g.lse);
  }
}

Status fp32_attention_bwd(cudaStream_t s, const AttentionArgs& g) {
  const AttentionShape& a = g.shape;
  const float *q = f32(g.q), *k = f32(g.k), *v = f32(g.v), *dout = f32(g.dout);
  TESSEL_STATUS_CHECK(attention_delta(s, a.batch, a.seq, a.hq, a.d, g.out, g.ldo, dout, g.lddo, g.delta));
  switch (ceil_div(a.d, kWarp)) {
    case 1: return bwd<1>(s, a, q, g.ldq, k, g.ldk, v, g.ldv, g.lse, g.delta, dout, g.lddo, g.dq, g.lddq, g.dk, g.lddk, g.dv, g.lddv);
    case 2: return bwd<2>(s, a, q, g.ldq, k, g.ldk, v, g.ldv, g.lse, g.delta, dout, g.lddo, g.dq, g.lddq, g.dk, g.lddk, g.dv, g.lddv);
    case 3: return bwd<3>(s, a, q, g.ldq, k, g.ldk, v, g.ldv, g.lse, g.delta, dout, g.lddo, g.dq, g.lddq, g.dk, g.lddk, g.dv, g.lddv);
    default: return bwd<4>(s, a, q, g.ldq, k, g.ldk, v, g.ldv, g.lse, g.delta, dout, g.lddo, g.dq, g.lddq, g.dk, g.lddk, g.dv, g.lddv);
  }
}

}  // namespace detail

}  // namespace tessel::kernels::cuda
