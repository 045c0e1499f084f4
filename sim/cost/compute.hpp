// Compute cost model: the time of one GPU kernel from its shape, by roofline with efficiency curves.
//
// GEMMs: the output is cut into tiles; a tile costs 2*tm*tn*(K + k_overhead) FLOPs at the per-SM share of
// peak*efficiency, and tiles run in waves of `sms` (one tile per SM at a time). So a GEMM pays for padding
// to a tile multiple (tile quantization) and for a last, partly filled wave (wave quantization): a 129-wide
// GEMM costs like a 256-wide one on 128-wide tiles, not 1% more than a 128-wide one. Like cuBLAS's heuristic,
// the cheapest of the candidate tile shapes is used. The memory roofline bounds it from below.
// (Wave quantization: NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background".)
#pragma once

#include <cstdint>

#include "sim/system.hpp"

namespace tessel::cost {

struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t batch = 1;
};

// FLOPs of the mathematical GEMM (2*m*n*k*batch).
double gemm_flops(const GemmShape& g);
// Seconds for one GEMM in `p` on `gpu` (operands of bytes_per_element(p) each).
double gemm_time(const GpuSpec& gpu, Precision p, const GemmShape& g);
// Seconds for a memory-bound kernel moving `bytes` (reads + writes), `kernels` launches: at the measured rate
// of its kind and direction when the profile has one (GpuSpec::kernel_Bps), else memory_bw_Bps x
// memory_efficiency; times the kind's time factor.
double memory_time(const GpuSpec& gpu, double bytes, int kernels = 1, CostKind kind = CostKind::memory,
                   bool backward = false);
// What a fused attention kernel's rate depends on beside its FLOPs: the kernel (FlashAttention-2 or the
// fused one), the direction, the key length one call sees (the sequence, or a context-parallel chunk of it, or
// a window) and the head dim (0: not given, no shape applied); and how many tiles it has to spread over the
// SMs: the micro-batch times this rank's query heads (`batch_heads`), the queries one call sees, and whether
// the tiles are a causal triangle (0 batch_heads: not given, no occupancy applied).
struct AttentionKernel {
  bool fa2 = false;
  bool backward = false;
  double seq = 0, head_dim = 0;
  double batch_heads = 0, queries = 0;
  bool causal = false;
};
// The share of `slots` SMs a flash attention kernel keeps busy, by its tiles. FlashAttention-2 and -3 and
// cuDNN's fused kernel give one thread block a head's block of kAttentionBlock queries (forward) or keys
// (backward), and a block runs on one SM at a time (FA3's and cuDNN's Hopper kernels are persistent, one block
// an SM). Without a mask every tile costs alike and they run in waves: T = batch_heads x ceil(queries / 128)
// tiles take ceil(T / slots) waves, so the share is T / (slots x ceil(T / slots)) (wave quantization, as a
// GEMM's). Under a causal mask tile i of a head (i = 1 .. n, n = ceil(queries / 128)) holds i key blocks; run
// longest first, as flash-attention's causal tile scheduler does (SingleTileLPTScheduler), the kernel takes
// max(work / slots, n) block-steps, so the share is
// min(1, batch_heads x (n + 1) / (2 x slots)): a few heads of a short sequence leave SMs idle while the
// longest row of the triangle finishes. 1 when `slots` or the tiles are not given.
inline constexpr double kAttentionBlock = 128;
// The kernel's tiles: batch_heads x ceil(queries / kAttentionBlock), one a head's block of queries.
double attention_tiles(double batch_heads, double queries);
double attention_occupancy(int slots, double batch_heads, double queries, bool causal);
// The factor the kernel's occupancy puts on its rate: its occupancy over that of the shape the GPU's rate was
// measured at (AttentionCurve's tokens and hidden size; without them, or without a curve, the measured rate is
// taken as fully occupied), at most 1: no shape runs faster than the measurement.
double attention_wave_factor(const GpuSpec& gpu, const AttentionKernel& k);
// GpuSpec::attention_curve's factor at `seq` and `head_dim` in that direction: rate(head_dim, seq) over
// rate(reference head dim, longest length), log-linear in both between the table's points, the nearest point
// outside them. 1 without a curve or without a shape.
double attention_curve_factor(const GpuSpec& gpu, bool backward, double seq, double head_dim);
// Fused (flash) attention of `flops` (QK^T + AV): matrix peak times attention efficiency, times
// GpuSpec::attention_fa2 when the kernel is FlashAttention-2, times the curve's factor for its shape, times
// the wave factor of its tiles.
double attention_time(const GpuSpec& gpu, Precision p, double flops, double bytes, const AttentionKernel& k = {});
// The attention core measured as one kernel (GpuSpec::attention_flops): `exec_flops` (the flash path's
// executed count) at the measured rate of its direction, whatever the layout's attention path.
// `launches` kernel overheads are added (the unfused path's second GEMM is part of the one measured kernel: 0).
bool measured_attention_core(const GpuSpec& gpu);
double attention_core_time(const GpuSpec& gpu, double exec_flops, bool backward, int launches = 1);

// AdamW's step is memory-bound. Bytes moved per parameter of the GPU's shard under mixed precision (the state
// of memory.hpp's StateBytes): read the fp32 master weight, both moments and the fp32 main gradient (16),
// write the master and moments back (12) and the 16-bit model copy (2). Launches: an allowance of this model
// (Megatron-LM runs the step as a few fused multi-tensor kernels), not a measurement.
inline constexpr double kAdamWBytesPerParam = 30.0;
inline constexpr int kAdamWKernels = 4;
// Seconds of the optimizer step over `params` parameters held by one GPU: at the measured rate for that size
// when the GPU has one by size (adamw_rate), else the optimizer kind's (memory_time).
double adamw_time(const GpuSpec& gpu, double params);
// One pass over `bytes` of gradients beside the optimizer step (the norm's read, the zeroing's write): one
// memory-bound kernel at the optimizer kind's rate (memory_time), 0 for no bytes.
double grad_pass_time(const GpuSpec& gpu, double bytes);
// AdamW's rate (bytes/s) at `params` from gpu.optimizer_params/_Bps: log-log between the measured sizes, the
// nearest one's outside them; 0 without sizes.
double adamw_rate(const GpuSpec& gpu, double params);

}  // namespace tessel::cost
