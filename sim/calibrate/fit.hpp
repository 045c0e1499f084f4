// Fits a Profile (a System with measured efficiency numbers) to benchmark rows by least squares against the
// cost model's own functions, so every fitted number means exactly what the simulator does with it.
//
// The cost model is linear in a few reciprocal rates once each GEMM's branch (compute or memory roofline)
// and tile shape are fixed (sim/cost/compute.hpp, sim/cost/comm.hpp):
//   GEMM, compute-bound:  t = A(g) u + B(g) v + c      u = 1/(peak*gemm_eff), v = k_overhead*u, c = kernel overhead
//   GEMM, memory-bound:   t = bytes(g) w + c           w = 1/(memory_bw_Bps*gemm_memory_eff), the copy rows' w
//   copy / triad kernel:  t = bytes w + c
//   collective on a link: t = steps(c,n) alpha + factor(c,n) S beta    alpha = latency, beta = 1/(bw*eff)
// The coefficients A, B, bytes, steps and factor are not re-derived here: they are read off the cost
// functions by evaluating them on probe systems (unit rate, one term switched on at a time), so a change in
// the cost model changes the fit with it. Rows are weighted by 1/measured, i.e. relative errors are
// minimised (the rows span four orders of magnitude of time). The roofline branch of each GEMM is chosen by
// iterating fit -> classify until it is stable; the tile shape by trying each candidate.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "sim/calibrate/bench_data.hpp"
#include "sim/system.hpp"

namespace tessel::calib {

struct FitOptions {
  std::string comm = "thread";        // whose collective rows set the intra-node link
  std::vector<GemmTile> tiles;        // candidate GEMM tiles; empty: the base system's, then 8..256 squares
  int max_ranks = 0;                  // ignore collective rows with more ranks (0: keep all)
};

// Relative residuals (predicted/measured - 1) of one category of rows under the final profile.
struct Residuals {
  std::string category;  // gemm, membw, all_reduce (thread), ...
  int rows = 0;
  double median_abs = 0, max_abs = 0, rms = 0;
};

// alpha/beta of one (communicator, collective) fitted on its own rows: the per-collective view the System's
// single intra link averages over.
struct LinkFit {
  std::string comm;
  std::string collective;
  int rows = 0;
  double alpha_s = 0;   // latency per step
  double bw = 0;        // achieved bytes/s in the bandwidth term (1/beta)
  // A second regime (fit_link_regimes): the bytes of a message past large_bytes at large_bw (0: one line).
  double large_bytes = 0, large_bw = 0;
  double rms = 0;       // relative
  double rms_one_line = 0;  // fit_link_regimes: the single line's, for comparison
};

// One collective's link from its bench rows (relative least squares, as the intra link): the alpha-beta line,
// or, where it fits the rows better, the line on the sizes up to a breakpoint (one of the rows' sizes, with
// at least two sizes on each side) and a slower rate for the bytes past it (a host's buffers leaving its
// caches: the thread all-reduce of 13 MB ran at 2.5 GB/s bus bandwidth where 1 MB ran at 3.6-4.0). The split
// is kept only where the line misses the rows by 1% or more (relative rms) and the split's rms is lower.
LinkFit fit_link_regimes(const std::vector<CollRow>& rows, const System& base);

// What the bench's kernel rows set, per kind and direction (sim/calibrate/kind_fit.hpp).
struct KindFit {
  CostKind kind = CostKind::memory;
  bool backward = false;
  int rows = 0;
  double rate = 0;        // bytes/s (element-wise) or FLOP/s (attention) of the cost model's charge
  double median_abs = 0;  // relative residual of the rows under the rate
};

// A kind's slowdown with every core busy (kind_fit.hpp).
struct ContentionFit {
  CostKind kind = CostKind::memory;
  int rows = 0;
  double factor = 1;  // time with every core busy over time alone (GEMM and STREAM rows: the median row's)
  // The steadiness of a grid kind's rows (GEMM shapes, STREAM sizes; one ratio busy / alone per row), when it
  // has kContentionSteadyRows rows or more; -1 otherwise and for kernel kinds (forward and backward ops that
  // differ by nature). The GEMM rows' quartiles and their interquartile range over the median (`spread`): a host
  // whose cores are shared unevenly while the bench runs slows some rows and not others (the STREAM rows differ
  // by nature, cache against DRAM, so they have none). `faster`: how much faster the rows ran with every core
  // busy than alone, max(0, 1 - factor): load cannot speed a kernel up, so a grid kind below 1 means the host
  // changed between the two benches.
  double q1 = 1, q3 = 1, spread = -1, faster = -1;
  double unsteadiness() const { return std::max(spread, faster); }
};

// A grid kind needs this many rows before its ratios say anything (the GEMM grid has 80-odd rows, the STREAM
// rows 10).
inline constexpr int kContentionSteadyRows = 8;

struct FitResult {
  System profile;
  GemmTile tile;
  double gemm_rate = 0;         // FLOP/s achieved at the ceiling (peak * gemm_efficiency)
  double k_overhead = 0;        // elements of K per tile
  double kernel_overhead_s = 0;
  double mem_rate = 0;          // bytes/s (memory_bw_Bps * memory_efficiency) in the profile
  double stream_rate = 0;       // bytes/s of the STREAM rows alone (0 without them)
  double gemm_memory_rate = 0;  // bytes/s of the GEMM roofline fitted with the GEMM (and STREAM) rows; 0: none
  double attention_rate = 0;    // FLOP/s of the attention kernel rows (peak * attention_eff); 0 without them
  double link_latency_s = 0;
  double link_bw = 0;           // bytes/s (intra_bw_Bps * intra_efficiency)
  int gemm_memory_bound = 0;    // GEMM rows fitted on the memory roofline
  std::vector<LinkFit> links;
  std::vector<KindFit> kinds;             // per-kind rates of the runtime kernel rows
  std::vector<ContentionFit> contention;  // per kind, from a bench of several threads at once
  double noise = -1;                      // the bench rows' median spread (repeat variation); -1: none measured
  // The largest unsteadiness of the contention fits (ContentionFit::unsteadiness); -1: none measured.
  double contention_noise = -1;
  std::vector<Residuals> residuals;
  std::vector<std::string> notes;  // what was kept from the base, what was raised to fit the bounds
};

// Kernel rows (the runtime's own element-wise, norm, attention and optimizer kernels), when present, set the
// profile's memory rate (memory path rows; they replace the STREAM rows' rate, which stays in the report) and
// its attention rate (attention path rows), each the rate that gets the rows' total time right with the kernel
// overhead of the GEMM fit held fixed (a step's time on a path is a sum dominated by its slowest kernels, so
// totals, not relative errors): what the runtime runs, not what a copy loop reaches. The GEMMs keep the memory
// roofline they were fitted with (the STREAM rows' rate), written apart as gpu.efficiency.gemm_memory, so the
// profile's GEMM predictions are the fit's and the reported residuals are the simulator's.
// InputError when a category has rows but too few to determine its parameters, or the fit is degenerate
// (a zero rate). Categories without rows keep the base system's numbers (said in notes).
FitResult fit_profile(const BenchData& bench, const System& base, const FitOptions& opts = {});

// Several bench documents of one machine (`tessel bench` and `tessel bench --concurrent N`): the one of the
// fewest threads at once is fitted as above, one of more threads sets the host's cores and contention
// (kind_fit.hpp). InputError when two documents share a thread count or the rows do not match.
FitResult fit_profile(const std::vector<BenchData>& benches, const System& base, const FitOptions& opts = {});

// The element-wise rate (gpu memory_efficiency) and the GEMM roofline's (gemm_memory_efficiency) on their
// shared datasheet bandwidth, which is replaced by the larger rate when one exceeds it or the smaller falls
// below the parser's range [kMinMemoryEfficiency, 1]. mem 0 or gemm < 0: keep that rate of g. Used by the
// bench fit and by the trace fit's memory scale (which moves the element-wise rate only).
void set_memory_rates(GpuSpec& g, double mem, double gemm, std::vector<std::string>& notes);

// The relative residuals of `rows` under `sys` (used for the report and by tests).
Residuals gemm_residuals(const std::vector<GemmRow>& rows, const System& sys, Precision p);
Residuals mem_residuals(const std::vector<MemRow>& rows, const System& sys);
// Residuals of the kernel rows on one path ("memory" or "attention") through the cost function of that path.
Residuals kernel_residuals(const std::vector<KernelRow>& rows, const std::string& path, const System& sys, Precision p);

// InputError naming `what` (the inputs and the output file) when the fitted profile must not be written: a
// rate of the fitted precision that is not positive and finite (peak FLOP/s, memory bandwidth), or any
// number the system parser would refuse (the profile is read back through parse_system), so a written
// profile always loads with --system. Absurd measurements (durations 1e300 times the prediction) end here.
void check_profile(const System& profile, Precision p, const std::string& what);

// What the trace fit did to a profile (sim/calibrate/trace_fit.hpp), for describe_fit.
struct TraceProvenance {
  std::string origins;         // the traces, as given; empty: no trace fit
  std::string method = "scales";  // trace_fit.hpp's TraceFit::method
  double compute_scale = 1, memory_scale = 1, comm_scale = 1;
  bool wgrad_fitted = false;   // per-op: the weight-gradient class refitted (else the bench's)
  double noise = -1;           // the traces' median spread; -1: none
  std::vector<std::string> notes;
};

// The profile's "source" text. Its numbers are read off `written`, the profile as it is written (after any
// trace scales), in the units of the report: GEMM ceiling (peak x gemm efficiency, GFLOP/s), K overhead,
// tiles, kernel overhead (us), element-wise memory and GEMM memory roofline (GB/s), attention (GFLOP/s),
// intra-node link (us, GB/s), each printed to 4 significant digits. Then which fit set which of them: the
// bench fit's fields (from `f`, empty bench_origin: none), those kept from the base system, and the trace
// fit's scales on top, with each fit's notes.
std::string describe_fit(const FitResult& f, const System& written, Precision p, const std::string& bench_origin,
                         const std::string& base_name, const TraceProvenance& traces);

}  // namespace tessel::calib
