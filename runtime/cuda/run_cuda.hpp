// A training run on the CUDA runtime as one call, for `tessel run --backend cuda` (tools/cmd_run_cuda.cpp
// prints what it reports): plain C++ (no CUDA header), so the command can include it when the CUDA runtime
// is built (TESSEL_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "models/model.hpp"
#include "runtime/run_report.hpp"
#include "runtime/run_spec.hpp"
#include "runtime/trainer_checkpoint.hpp"
#include "sim/layout.hpp"

namespace tessel::rt::cuda {

struct CudaRunOptions : RunSpec {
  int only_rank = -1;          // >= 0: execute this world rank of the layout alone (synthesised inputs)
  std::string precision = "bf16";  // GEMM operands: bf16 (fp32 accumulate), tf32 or fp32
  std::string attention_kernel;    // the attention kernel's variant by name; empty: the default
  bool profile_kernels = false;  // time named kernel scopes (CudaRunResult::kernels)
  bool gpu_threads = false;    // every rank of the layout as a thread on GPU 0, communicating through the host
};

// How the run's ranks are played, as the reporting process sees it once its trainer is built.
struct CudaRunStart {
  std::string device;          // the driver's name of this process's GPU
  int sm_count = 0;
  int world_rank = 0;          // the rank that reports: 0, or --only-rank's
  std::string comm;            // the world communicator: "nccl", "staged:threads" (--gpu-threads), "none"
  int first_step = 1;          // 1, or the resumed checkpoint's step + 1
  std::optional<CheckpointIo> resumed;
  double step_flops = 0;       // this rank's model FLOPs per step (3x forward, recomputation not counted)
};

// Named kernel scopes (CudaDevice's profile) summed over the profiled steps: every step after the first.
struct KernelScopeTotal {
  std::string scope;
  std::int64_t calls = 0;
  double ms = 0, flops = 0, bytes = 0;
};

struct CudaRunResult {
  bool reports = false;        // this process reports the run (world rank 0, or --only-rank's only process)
  CudaRunStart start;
  std::string schedule;        // the schedule as played (runtime_schedule's generator)
  std::vector<StepRecord> steps;
  std::vector<RankMemory> memory;  // every rank in world order; --only-rank: that rank alone
  std::vector<CheckpointIo> saved;
  std::vector<KernelScopeTotal> kernels;  // with profile_kernels, largest time first
  int profiled_steps = 0;
  double profiled_seconds = 0;  // the profiled steps' time, summed
  std::string trace_file;       // the file this process wrote (PATH.rank<R> with one process per GPU)
  std::size_t trace_events = 0;
};

// Called on the reporting process only (others run silently), as the run goes: once its trainer is built
// (and resumed), after each step, after each checkpoint save.
struct CudaRunCallbacks {
  std::function<void(const CudaRunStart&)> started;
  std::function<void(const StepRecord&)> step;
  std::function<void(const CheckpointIo&)> saved;
};

// Number of CUDA devices this process sees (0 without a driver or GPU).
int cuda_devices();

// Runs the layout: one process per GPU (mpirun, or torchrun-style RANK/WORLD_SIZE), --only-rank (one rank
// of a larger layout alone), --gpu-threads (all ranks as threads on one GPU: the multi-rank code paths
// checked on one device; times are not a multi-GPU run's). Writes the trace when asked. Without a GPU:
// InputError "--backend cuda: no CUDA device ..."; other refusals name the flag and the rule.
CudaRunResult run_cuda(const CudaRunOptions& o, const CudaRunCallbacks& cb = {});

// The dense peak FLOP/s of a device for the GEMM precision ("bf16", "tf32", "fp32"), from the system
// preset its name matches (sim/system.hpp's system_preset_for_gpu: H200 -> dgx-h200, ...); 0 when none
// does, `what` saying which preset or why not: the denominator of MFU.
double device_peak_flops(const std::string& device, const std::string& precision, std::string& what);
// The matched system preset's memory bandwidth (bytes/s, datasheet), 0 when none matches.
double device_memory_bw(const std::string& device);

}  // namespace tessel::rt::cuda
