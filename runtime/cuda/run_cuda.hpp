// `tessel run --backend cuda` as one call: plain C++ (no CUDA header), so tools/cmd_run.cpp can include it
// when the CUDA runtime is built (TESSEL_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <string>

#include "models/model.hpp"
#include "sim/layout.hpp"

namespace tessel::rt::cuda {

struct CudaRunOptions {
  Model model;
  Layout layout;
  int steps = 10;
  std::uint64_t seed = 1234;
  float lr = 1e-3f;
  std::string trace_path;      // empty: no trace
  int only_rank = -1;          // >= 0: execute this world rank of the layout alone (synthesised inputs)
  std::string precision = "bf16";  // GEMM operands: bf16 (fp32 accumulate), tf32 or fp32
  bool profile_kernels = false;  // time named kernel scopes and print where the step goes
  bool gpu_threads = false;    // every rank of the layout as a thread on GPU 0, communicating through the host
  std::string data_file;       // token file; empty: the synthetic stream
  int save_every = 0;          // > 0: recovery checkpoint every N steps into checkpoint_dir
  std::string checkpoint_dir, resume;
  int start_step = 0;  // the resumed checkpoint's step (0: a fresh run); the trace numbers its steps from it + 1
};

// Number of CUDA devices this process sees (0 without a driver or GPU).
int cuda_devices();

// Runs and prints per-step loss, time, tokens/s, MFU inputs and the device memory peak; writes the trace.
// Without a GPU: InputError "--backend cuda: no CUDA device ..." (exit 2). A layout of several GPUs needs
// one process per GPU (mpirun, or torchrun-style RANK/WORLD_SIZE), or --only-rank, or --gpu-threads (all ranks
// as threads on one GPU: the multi-rank code paths checked on one device; times are not a multi-GPU run's).
int run_cuda(const CudaRunOptions& o);

// The dense peak FLOP/s of a device for the GEMM precision ("bf16", "tf32", "fp32"), from the system
// preset its name matches (the table `tessel validate` uses for published rows: H200 -> h200, H100 ->
// dgx-h100, ...); 0 when none does, `what` saying which preset or why not. run_cuda's summary line
// divides the achieved model FLOP/s by it: MFU.
double device_peak_flops(const std::string& device, const std::string& precision, std::string& what);
// The matched system preset's memory bandwidth (bytes/s, datasheet), 0 when none matches.
double device_memory_bw(const std::string& device);

}  // namespace tessel::rt::cuda
