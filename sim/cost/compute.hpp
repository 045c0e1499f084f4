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
// Seconds for a memory-bound kernel moving `bytes` (reads + writes), `kernels` launches.
double memory_time(const GpuSpec& gpu, double bytes, int kernels = 1);
// Fused (flash) attention forward of `flops` (QK^T + AV): matrix peak times attention efficiency.
double attention_time(const GpuSpec& gpu, Precision p, double flops, double bytes);

}  // namespace tessel::cost
