// `tessel bench --backend cuda` (CUDA builds only; tools/cmd_bench.cpp calls it): the GPU's rows of the
// bench document `tessel calibrate --bench` reads (sim/calibrate/bench_data.hpp). Plain C++: no CUDA header.
#pragma once

#include <string>

#include "sim/calibrate/bench_data.hpp"

namespace tessel::cmd {

struct CudaBenchOptions {
  bool gemm = true, membw = true, kernels = true, collectives = true;
  std::string precision = "bf16";  // the document's precision: bf16 (bf16 GEMMs, fp32 accumulation) or fp32 (TF32 GEMMs)
  std::string attention_kernel;    // --attention-kernel: the variant the attention rows time ("" = the default)
  bool quick = false;              // small shapes: checks the command, not a calibration
};

// Fills `out` (backend "cuda", gemm_backend "cublaslt") on GPU 0, collectives over NCCL across every visible
// GPU when there are several. InputError "--backend cuda: no CUDA device ..." (exit 2) without one.
void bench_cuda(calib::BenchData& out, const CudaBenchOptions& o);

}  // namespace tessel::cmd
