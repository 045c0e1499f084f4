// tessel run --backend cuda: the flags of the CUDA runtime, one call of rt::cuda::run_cuda, and what it
// reports, printed as it goes (header, step lines) and at the end (kernel profile, summary, memory, trace),
// or as the --json document (tools/run_common.hpp). Built with the CUDA runtime only (TESSEL_HAVE_CUDA).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/cuda/run_cuda.hpp"
#include "tools/cli.hpp"
#include "tools/run_common.hpp"
#include "util/error.hpp"

namespace tessel::cmd {

namespace {

rt::cuda::CudaRunOptions cuda_options(const cli::CommandLine& cl, const RunFlags& f) {
  rt::cuda::CudaRunOptions o;
  static_cast<rt::RunSpec&>(o) = f;
  o.only_rank = static_cast<int>(cl.get_int("--only-rank", 0, 1 << 20).value_or(-1));
  o.precision = cl.get_or("--precision", "bf16");
  o.attention_kernel = cl.get_or("--attention-kernel", "");
  o.gpu_threads = cl.flag("--gpu-threads");
  o.profile_kernels = cl.flag("--profile-kernels");
  return o;
}

// The attention kernel was once chosen by environment variables; a script that still sets them would
// measure the default kernel while believing it measured another, so they are refused, naming the flag.
void refuse_attention_environment() {
  for (const char* name : {"TESSEL_ATTENTION", "TESSEL_ATTENTION_SWIZZLE", "TESSEL_ATTENTION_OVERLAP"})
    if (const char* v = std::getenv(name))
      throw InputError("environment " + std::string(name) + "=" + v + ": not read by tessel run; choose the attention "
                       "kernel with --attention-kernel NAME");
}

// "only rank 3", "4 rank(s) as threads on one GPU" or "4 GPU process(es)".
std::string ranks_text(const rt::cuda::CudaRunOptions& o) {
  if (o.only_rank >= 0) return "only rank " + std::to_string(o.only_rank);
  if (o.gpu_threads) return std::to_string(o.layout.gpus()) + " rank(s) as threads on one GPU";
  return std::to_string(o.layout.gpus()) + " GPU process(es)";
}

void print_header(const RunLog& log, const rt::cuda::CudaRunOptions& o, const rt::cuda::CudaRunStart& s) {
  const char* note = o.only_rank >= 0 ? ", synthesised inputs, communication recorded not waited"
                     : o.gpu_threads  ? ", communication staged through host memory (times are not a multi-GPU run's)"
                                      : "";
  const std::string resumed = s.resumed ? ", resumed at step " + std::to_string(s.resumed->step) : "";
  const std::string attention = o.attention_kernel.empty() ? "" : ", attention " + o.attention_kernel;
  log.line("tessel run: %s, %s, %s on %s (%d SMs), GEMMs %s%s%s%s", o.model.name.c_str(), o.layout.describe().c_str(),
           ranks_text(o).c_str(), s.device.c_str(), s.sm_count, o.precision.c_str(), attention.c_str(), note,
           resumed.c_str());
}

// Where the step goes, per kernel scope: calls and milliseconds per step over the profiled steps, share of
// the step's wall time; what no scope covers (communication, host work, launch gaps) is the remainder.
// Scopes that state their work also show it per step (GFLOP, GB), its rates and how close they came to the
// roofline of the matched system preset: the time the FLOPs take at the dense peak or the bytes at the
// datasheet bandwidth, whichever is longer, over the time measured ("flop" or "mem" says which bound).
// peak / bw: 0 when no preset matches the device.
void print_kernel_profile(const RunLog& log, const rt::cuda::CudaRunResult& r, double peak, double bw) {
  const int steps = r.profiled_steps;
  if (steps <= 0) {
    log.line("kernel profile: needs --steps 2 or more (the first step is warm-up)");
    return;
  }
  const double step_ms = r.profiled_seconds * 1e3 / steps;
  double covered = 0;
  log.line("kernel profile over %d step(s), %.2f ms per step:\n  %-20s %10s %12s %7s %11s %9s %9s %9s %14s", steps,
           step_ms, "scope", "calls/step", "ms/step", "share", "GFLOP/step", "GB/step", "TFLOP/s", "GB/s", "of roofline");
  for (const rt::cuda::KernelScopeTotal& k : r.kernels) {
    const double ms = k.ms / steps;
    covered += ms;
    char work[160] = "";
    if ((k.flops > 0 || k.bytes > 0) && k.ms > 0) {
      const double s = k.ms * 1e-3;
      const int n = std::snprintf(work, sizeof work, " %11.1f %9.3f %9.1f %9.0f", k.flops / steps / 1e9,
                                  k.bytes / steps / 1e9, k.flops / s / 1e12, k.bytes / s / 1e9);
      const double t_flop = peak > 0 ? k.flops / peak : 0.0, t_mem = bw > 0 ? k.bytes / bw : 0.0;
      if (peak > 0 && bw > 0)
        std::snprintf(work + n, sizeof work - n, " %8.1f%% %-4s", 100.0 * std::max(t_flop, t_mem) / s,
                      t_flop >= t_mem ? "flop" : "mem");
      else std::snprintf(work + n, sizeof work - n, " %14s", "n/a");
    }
    log.line("  %-20s %10.1f %12.3f %6.1f%%%s", k.scope.c_str(), double(k.calls) / steps, ms, 100.0 * ms / step_ms, work);
  }
  log.line("  %-20s %10s %12.3f %6.1f%%", "(not in a scope)", "", step_ms - covered, 100.0 * (step_ms - covered) / step_ms);
  if (peak > 0 && bw > 0)
    log.line("  roofline: %.1f TFLOP/s dense peak, %.0f GB/s memory bandwidth (matched system preset)", peak / 1e12,
             bw / 1e9);
  else
    log.line("  roofline: n/a (no system preset matches this device)");
}

// Median step after the first (warm-up), its throughput, and MFU: the model FLOPs this rank computes per
// step (3x forward: forward and backward, recomputation not counted) over the step time and the peak.
void print_summary(const RunLog& log, const rt::cuda::CudaRunOptions& o, const rt::cuda::CudaRunResult& r) {
  if (r.steps.empty()) return;
  std::vector<double> tail;
  for (std::size_t i = r.steps.size() > 1 ? 1 : 0; i < r.steps.size(); ++i) tail.push_back(r.steps[i].seconds);
  std::nth_element(tail.begin(), tail.begin() + tail.size() / 2, tail.end());
  const double med = tail[tail.size() / 2], achieved = r.start.step_flops / med;
  const double tokens = double(o.layout.global_batch) * o.model.seq_len;
  std::string what;
  const double peak = rt::cuda::device_peak_flops(r.start.device, o.precision, what);
  char mfu[512];
  if (o.gpu_threads) std::snprintf(mfu, sizeof(mfu), "MFU n/a (the ranks share one GPU)");
  else if (peak > 0)
    std::snprintf(mfu, sizeof(mfu), "MFU %.1f%% of %.1f TFLOP/s (%s)", 100.0 * achieved / peak, peak / 1e12, what.c_str());
  else std::snprintf(mfu, sizeof(mfu), "MFU n/a (%s)", what.c_str());
  const std::string over = r.steps.size() > 1 ? "over " + std::to_string(tail.size()) + " step(s) after the first"
                                              : "of the one step (its warm-up included)";
  log.line("summary: median step %.2f ms %s, %.0f tokens/s, %.1f TFLOP/s, %s", med * 1e3, over.c_str(), tokens / med,
           achieved / 1e12, mfu);
}

void print_memory(const RunLog& log, const rt::cuda::CudaRunOptions& o, const rt::RankMemory& m) {
  const double mib = 1048576.0;
  const std::string zero = o.layout.zero_stage > 0 && o.layout.dp > 1
                               ? ", ZeRO-" + std::to_string(o.layout.zero_stage) + " shards" : "";
  log.line("device memory: peak %.1f MiB in use, %.1f MiB reserved; state between steps %.1f MiB (values %.1f, "
           "gradients %.1f, AdamW %.1f%s)",
           m.device_peak_bytes.value_or(0) / mib, m.device_reserved_bytes.value_or(0) / mib,
           (m.parameter_bytes + m.gradient_bytes + m.optimizer_bytes) / mib, m.parameter_bytes / mib,
           m.gradient_bytes / mib, m.optimizer_bytes / mib, zero.c_str());
}

Json kernels_json(const rt::cuda::CudaRunResult& r) {
  Json a = Json::array();
  for (const rt::cuda::KernelScopeTotal& k : r.kernels)
    a.push_back({{"scope", k.scope}, {"calls", k.calls}, {"ms", k.ms}, {"flops", k.flops}, {"bytes", k.bytes}});
  return {{"steps", r.profiled_steps}, {"seconds", r.profiled_seconds}, {"scopes", a}};
}

void print_document(const RunFlags& f, const rt::cuda::CudaRunOptions& o, const rt::cuda::CudaRunResult& r) {
  Json config = run_config_json(f, "cuda", r.start.comm, r.schedule, r.start.first_step);
  config["device"] = r.start.device;
  config["precision"] = o.precision;
  config["attention_kernel"] = o.attention_kernel.empty() ? "default" : o.attention_kernel;
  config["mode"] = o.only_rank >= 0 ? "only_rank" : o.gpu_threads ? "gpu_threads" : "processes";
  if (o.only_rank >= 0) config["only_rank"] = o.only_rank;
  Json extra = {{"model_flops_per_step", r.start.step_flops}};
  if (o.profile_kernels) extra["kernel_profile"] = kernels_json(r);
  print_run_document(std::move(config), r.steps, r.memory, r.saved, r.start.resumed, trace_json(r.trace_file, r.trace_events),
                     extra);
}

}  // namespace

int run_cuda_backend(const cli::CommandLine& cl, const RunFlags& f) {
  refuse_attention_environment();
  const rt::cuda::CudaRunOptions o = cuda_options(cl, f);
  const RunLog log(f.json);
  rt::cuda::CudaRunCallbacks cb;
  double step_flops = 0;
  cb.started = [&](const rt::cuda::CudaRunStart& s) {
    step_flops = s.step_flops;
    print_header(log, o, s);
  };
  // The rank's achieved model TFLOP/s: its model FLOPs per step over the step time.
  cb.step = [&](const rt::StepRecord& s) { print_step(log, s, step_flops / s.seconds / 1e12); };
  const rt::cuda::CudaRunResult r = rt::cuda::run_cuda(o, cb);
  if (!r.reports) return 0;
  if (o.profile_kernels) {
    std::string what;
    print_kernel_profile(log, r, rt::cuda::device_peak_flops(r.start.device, o.precision, what),
                         rt::cuda::device_memory_bw(r.start.device));
  }
  print_summary(log, o, r);
  if (!r.memory.empty()) print_memory(log, o, r.memory.front());
  if (!r.trace_file.empty()) log.line("trace: %s (%zu events)", r.trace_file.c_str(), r.trace_events);
  if (f.json) print_document(f, o, r);
  return 0;
}

}  // namespace tessel::cmd
