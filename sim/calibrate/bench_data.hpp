// Benchmark measurements as `tessel bench --json` writes them and `tessel calibrate` reads them: plain rows,
// one per measured point, in the units of their key names. This is the contract between the two commands;
// the runners that produce the rows live above sim/ (tools/cmd_bench.cpp), the fit below (fit.hpp).
//
// Document shape (strict: unknown and missing keys are errors):
//   {"format": "tessel-bench", "version": 1, "backend": "cpu", "gemm_backend": "openblas", "precision": "fp32",
//    "concurrent": 1,   threads that ran the gemm/membw kernels at once (each row is one thread's time)
//    "gemm":        [{"m", "n", "k", "batch", "time_us", "class"}],   class optional: fwd (default) | dgrad | wgrad
//    "membw":       [{"kernel": "copy"|"triad", "bytes", "time_us"}],             bytes = read + written
//    "collectives": [{"comm": "thread"|"mpi"|"nccl", "collective", "ranks", "bytes", "count", "time_us",
//                     "algbw_GBps", "busbw_GBps"}],                               bytes as nccl-tests' S
//    derived columns (gemm gflops, GBps, count, type, redop, algbw/busbw) are optional and must agree with
//    the primaries (time_us and the size/shape): rates within 1%, count exactly
//    "kernels":     [{"kernel", "path": "memory"|"attention", "bytes", "flops", "per_step", "time_us"}]}  optional
// kernels rows time the runtime's own non-GEMM CPU kernels (layer norm, GELU, attention core, cross-entropy,
// AdamW, embedding) at a model's shapes; bytes and flops are what the cost model charges for that op
// (sim/workload.cpp, sim/estimate.cpp), so the fit puts them on the same path the simulator uses; per_step is
// how often the op runs in the reference training step the bench describes (the fit's weight).
// GEMM classes are the three GEMMs of a linear layer (sim/cost/op.cpp): fwd Y = X W, dgrad dX = dY W^T (the
// second operand transposed), wgrad dW = X^T dY (the first transposed); m x n is the output, k the inner size.
// Every row may carry "spread": the interquartile range of its repetitions over their median (a fraction),
// the repeat variation the fit reports as its noise (absent: not measured; collective rows have none).
// Optional documentation keys "host" and "notes" are accepted and ignored.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/json_reader.hpp"
#include "sim/cost/comm.hpp"

namespace tessel::calib {

enum class GemmClass { fwd, dgrad, wgrad };
const char* to_string(GemmClass c);

struct GemmRow {
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  double time_s = 0;
  GemmClass cls = GemmClass::fwd;
  double spread = -1;  // relative interquartile range of the repetitions; < 0: not measured
};

struct MemRow {
  std::string kernel;  // copy | triad
  double bytes = 0;    // read + written
  double time_s = 0;
  double spread = -1;
};

struct KernelRow {
  std::string kernel;   // e.g. layernorm_fwd
  std::string path;     // memory (cost::memory_time) | attention (cost::attention_time)
  double bytes = 0;     // bytes the cost model charges for the op
  double flops = 0;     // attention path: the FLOPs cost::attention_time is given (0 on the memory path)
  double per_step = 1;  // occurrences in the reference step (weight of the row in the fit)
  double time_s = 0;
  double spread = -1;
};

struct CollRow {
  std::string comm;    // thread | mpi | nccl
  cost::Collective collective = cost::Collective::all_reduce;
  int ranks = 2;
  double bytes = 0;    // S as nccl-tests counts it (cost::collective_time's `bytes`)
  std::int64_t count = 0;
  double time_s = 0;
};

struct BenchData {
  std::string origin = "bench";  // the file (for messages of the fit)
  std::string backend = "cpu";
  std::string gemm_backend;
  std::string precision = "fp32";
  int concurrent = 1;
  std::vector<GemmRow> gemm;
  std::vector<MemRow> membw;
  std::vector<CollRow> collectives;
  std::vector<KernelRow> kernels;
};

// Strict reading; InputError names `where`, the key path, the value and the rule. A document with no rows
// at all is an error (nothing to fit).
BenchData parse_bench(const Json& j, const std::string& where);
BenchData load_bench(const std::string& path);
Json bench_to_json(const BenchData& b);

// The runtime kernels `tessel bench` times (tools/cmd_bench.cpp) and the cost-model path each is charged on
// ("memory" or "attention"); kernel rows must name one of them, on its path.
const std::vector<std::string>& kernel_names();
std::string kernel_path(const std::string& name);

// "all_reduce" -> Collective; InputError listing the names otherwise.
cost::Collective parse_collective_name(const std::string& name, const std::string& where);

}  // namespace tessel::calib
