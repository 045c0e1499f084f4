#include "runtime/cuda/run_cuda.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <mutex>

#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/kernels.hpp"
#include "util/error.hpp"
#include "runtime/cuda/gpu_trainer.hpp"
#include "runtime/comm/thread_comm.hpp"
#include "runtime/cuda/nccl_comm.hpp"
#include "runtime/cuda/staged_comm.hpp"
#include "sim/system.hpp"
#include "sim/validate.hpp"
#include "traces/chrome.hpp"
#ifdef TESSEL_HAVE_MPI
#include "runtime/comm/mpi_comm.hpp"
#endif

namespace tessel::rt::cuda {

namespace kg = kernels::cuda;

int cuda_devices() { return kg::device_count(); }

double device_peak_flops(const std::string& device, const std::string& precision, std::string& what) {
  try {
    const std::string preset = system_for_gpu(device, "device");
    const System sys = load_system(preset);
    const double peak = precision == "tf32" ? sys.gpu.tf32_flops
                        : precision == "fp32" ? sys.gpu.peak(Precision::fp32) : sys.gpu.peak(Precision::bf16);
    what = precision + " dense peak of system preset " + preset;
    return peak;
  } catch (const InputError&) {
    what = "no system preset matches device '" + device + "'";
    return 0.0;
  }
}

double device_memory_bw(const std::string& device) {
  try {
    return load_system(system_for_gpu(device, "device")).gpu.memory_bw_Bps;
  } catch (const InputError&) {
    return 0.0;
  }
}

namespace {

kg::GemmType gemm_type(const std::string& p) {
  if (p == "bf16") return kg::GemmType::bf16_fp32;
  if (p == "tf32") return kg::GemmType::tf32;
  if (p == "fp32") return kg::GemmType::fp32;
  throw InputError("--precision " + p + ": must be bf16, tf32 or fp32");
}

// What the GPU runtime does not do yet, rejected up front with the rule (docs/cuda.md lists them).
void check_supported(const CudaRunOptions& o, int world) {
  const Layout& l = o.layout;
  if (o.only_rank >= 0) {
    if (o.gpu_threads) throw InputError("--gpu-threads: cannot be combined with --only-rank (one rank alone)");
    if (o.save_every > 0 || !o.resume.empty())
      throw InputError("--only-rank: runs on synthesised weights, so it neither saves nor resumes recovery checkpoints");
    if (o.only_rank >= l.gpus())
      throw InputError("--only-rank " + std::to_string(o.only_rank) + ": the layout has " + std::to_string(l.gpus()) +
                       " ranks (0.." + std::to_string(l.gpus() - 1) + ")");
    return;
  }
  if (world != l.gpus())
    throw InputError("--backend cuda: the layout needs " + std::to_string(l.gpus()) + " GPU processes, " +
                     std::to_string(world) + " started; launch one process per GPU (mpirun -n N, or torchrun-style "
                     "RANK/WORLD_SIZE), or measure one rank with --only-rank R");
}

// Where the step goes, per kernel scope: calls and milliseconds per step over the profiled steps, share of
// the step's wall time; what no scope covers (communication, host work, launch gaps) is the remainder.
// Scopes that state their work also show it per step (GFLOP, GB), its rates and how close they came to the roofline of the matched
// system preset: the time the FLOPs take at the dense peak or the bytes at the datasheet bandwidth,
// whichever is longer, over the time measured ("flop" or "mem" says which bound). peak / bw: 0 when no
// preset matches the device.
void print_kernel_profile(const CudaDevice& dev, int steps, double seconds, double peak, double bw) {
  if (steps <= 0) {
    std::printf("kernel profile: needs --steps 2 or more (the first step is warm-up)\n");
    return;
  }
  std::vector<std::pair<std::string, CudaDevice::KernelTotal>> rows(dev.kernel_totals().begin(), dev.kernel_totals().end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  const double step_ms = seconds * 1e3 / steps;
  double covered = 0;
  std::printf("kernel profile over %d step(s), %.2f ms per step:\n  %-20s %10s %12s %7s %11s %9s %9s %9s %14s\n", steps,
              step_ms, "scope", "calls/step", "ms/step", "share", "GFLOP/step", "GB/step", "TFLOP/s", "GB/s", "of roofline");
  for (const auto& r : rows) {
    const CudaDevice::KernelTotal& k = r.second;
    const double ms = k.ms / steps;
    covered += ms;
    std::printf("  %-20s %10.1f %12.3f %6.1f%%", r.first.c_str(), double(k.calls) / steps, ms, 100.0 * ms / step_ms);
    if ((k.flops > 0 || k.bytes > 0) && k.ms > 0) {
      const double s = k.ms * 1e-3;
      std::printf(" %11.1f %9.3f %9.1f %9.0f", k.flops / steps / 1e9, k.bytes / steps / 1e9, k.flops / s / 1e12,
                  k.bytes / s / 1e9);
      const double t_flop = peak > 0 ? k.flops / peak : 0.0, t_mem = bw > 0 ? k.bytes / bw : 0.0;
      if (peak > 0 && bw > 0) std::printf(" %8.1f%% %-4s", 100.0 * std::max(t_flop, t_mem) / s, t_flop >= t_mem ? "flop" : "mem");
      else std::printf(" %14s", "n/a");
    }
    std::printf("\n");
  }
  std::printf("  %-20s %10s %12.3f %6.1f%%\n", "(not in a scope)", "", step_ms - covered, 100.0 * (step_ms - covered) / step_ms);
  if (peak > 0 && bw > 0)
    std::printf("  roofline: %.1f TFLOP/s dense peak, %.0f GB/s memory bandwidth (matched system preset)\n", peak / 1e12,
                bw / 1e9);
  else
    std::printf("  roofline: n/a (no system preset matches this device)\n");
}

// dev: the rank's GPU; NCCL communicators must enqueue on dev.comm(), which the trainer orders against
// dev.compute() with events.

void run_rank(const CudaRunOptions& o, CudaDevice& dev, Comm* world, int world_rank, trace::Trace& tr) {
  GpuTrainOptions opt;
  opt.seed = o.seed;
  opt.optimizer.adamw.lr = o.lr;
  opt.record_trace = !o.trace_path.empty();
  opt.gemm = gemm_type(o.precision);
  opt.only_rank = o.only_rank;
  opt.data_file = o.data_file;
  // One time origin for every rank's trace: each reads its clock as it leaves one rendezvous, a one-float
  // all-reduce waited for (NcclComm::barrier only waits for its own stream, it is no rendezvous).
  if (world) {
    const DBuf one = dev.alloc_f32(1);
    throw_if_failed(kg::fill(dev.comm(), f32(one), 1, 0.0f));
    cuda_ok(cudaStreamSynchronize(dev.comm()), "stream synchronise");
    world->all_reduce(f32(one), 1);
    world->barrier();
  }
  const auto t0 = Recorder::Clock::now();
  GpuTrainer t(dev, o.model, o.layout, opt, world, t0);
  if (!o.resume.empty()) t.load_checkpoint(o.resume, o.seed);
  kg::DeviceInfo info;
  throw_if_failed(kg::device_info(info));
  const bool talk = world_rank == 0 || o.only_rank >= 0;
  const double tokens = double(o.layout.global_batch) * o.model.seq_len;
  if (talk)
    std::printf("tessel run: %s, %s, %s on %s (%d SMs), GEMMs %s%s%s\n", o.model.name.c_str(), o.layout.describe().c_str(),
                o.only_rank >= 0 ? ("only rank " + std::to_string(o.only_rank)).c_str()
                : o.gpu_threads  ? (std::to_string(o.layout.gpus()) + " rank(s) as threads on one GPU").c_str()
                                 : (std::to_string(o.layout.gpus()) + " GPU process(es)").c_str(),
                info.name.c_str(), info.sm_count, o.precision.c_str(),
                o.only_rank >= 0 ? ", synthesised inputs, communication recorded not waited"
                : o.gpu_threads  ? ", communication staged through host memory (times are not a multi-GPU run's)" : "",
                o.resume.empty() ? "" : (", resumed at step " + std::to_string(t.steps_done())).c_str());
  if (talk) std::fflush(stdout);
  dev.set_kernel_profile(o.profile_kernels);
  double profiled_s = 0;  // step time summed over the profiled steps (all but the first: warm-up)
  int profiled = 0;
  std::vector<double> times;  // step seconds, for the summary's median
  while (t.steps_done() < o.steps) {
    const StepStats s = t.step();
    times.push_back(s.seconds);
    if (profiled++ == 0) dev.reset_kernel_totals();
    else profiled_s += s.seconds;
    // Achieved model FLOP/s of this rank: 3x forward FLOPs (forward + backward) over the step time.
    if (talk)
      std::printf("step %4d  loss %.6f  grad_norm %.4f  time %8.2f ms  %10.0f tokens/s  %7.1f TFLOP/s\n", s.step + 1,
                  s.loss, s.grad_norm, s.seconds * 1e3, tokens / s.seconds, t.step_flops() / s.seconds / 1e12);
    if (talk) std::fflush(stdout);  // a killed run keeps every step line it printed (stdout in a file is block-buffered)
    if (o.save_every > 0 && t.steps_done() % o.save_every == 0) t.save_checkpoint(o.checkpoint_dir, o.seed);
  }
  if (talk && o.profile_kernels) {
    std::string what;
    print_kernel_profile(dev, profiled - 1, profiled_s, device_peak_flops(info.name, o.precision, what),
                         device_memory_bw(info.name));
  }
  // Median step after the first (warm-up), its throughput, and MFU: the model FLOPs this rank computes per
  // step (3x forward: forward and backward, recomputation not counted) over the step time and the peak.
  if (talk && !times.empty()) {
    std::vector<double> tail(times.size() > 1 ? times.begin() + 1 : times.begin(), times.end());
    std::nth_element(tail.begin(), tail.begin() + tail.size() / 2, tail.end());
    const double med = tail[tail.size() / 2], achieved = t.step_flops() / med;
    std::string what;
    const double peak = device_peak_flops(info.name, o.precision, what);
    char mfu[512];
    if (o.gpu_threads) std::snprintf(mfu, sizeof(mfu), "MFU n/a (the ranks share one GPU)");
    else if (peak > 0)
      std::snprintf(mfu, sizeof(mfu), "MFU %.1f%% of %.1f TFLOP/s (%s)", 100.0 * achieved / peak, peak / 1e12, what.c_str());
    else std::snprintf(mfu, sizeof(mfu), "MFU n/a (%s)", what.c_str());
    const std::string over = times.size() > 1 ? "over " + std::to_string(tail.size()) + " step(s) after the first"
                                              : "of the one step (its warm-up included)";
    std::printf("summary: median step %.2f ms %s, %.0f tokens/s, %.1f TFLOP/s, %s\n", med * 1e3, over.c_str(),
                tokens / med, achieved / 1e12, mfu);
  }
  if (talk) {
    const GpuParams::StateBytes sb = t.params().state_bytes();
    const double mib = 1048576.0;
    std::printf("device memory: peak %.1f MiB in use, %.1f MiB reserved; state between steps %.1f MiB (values %.1f, "
                "gradients %.1f, AdamW %.1f%s)\n",
                dev.memory().peak() / mib, dev.memory().reserved() / mib, sb.total() / mib, sb.values / mib, sb.grads / mib,
                sb.moments / mib, o.layout.zero_stage > 0 && o.layout.dp > 1 ? (", ZeRO-" + std::to_string(o.layout.zero_stage) + " shards").c_str() : "");
  }
  auto& ev = t.recorder().events();
  tr.events.insert(tr.events.end(), ev.begin(), ev.end());
  tr.process_names[t.world_rank()] = t.process_name();
  tr.counters.push_back({t.world_rank(), "peak_device_MiB", 0.0, dev.memory().peak() / 1048576.0});
}

void write_trace(const CudaRunOptions& o, trace::Trace& tr, int world_rank, int world) {
  if (o.trace_path.empty()) return;
  tr.other_data["model"] = model_to_json(o.model);
  tr.other_data["layout"] = layout_to_json(o.layout);
  tr.other_data["schedule"] = sched::name(o.layout.schedule);
  tr.other_data["system"] = "cuda";
  tr.other_data["precision"] = o.precision;
  if (o.only_rank >= 0) tr.other_data["only_rank"] = o.only_rank;
  if (o.start_step > 0) tr.other_data["first_step"] = o.start_step + 1;  // as the CPU runner: compare numbers steps from it
  tr.other_data["tool"] = std::string("tessel ") + TESSEL_VERSION;
  const std::string path = world > 1 ? o.trace_path + ".rank" + std::to_string(world_rank) : o.trace_path;
  trace::write_chrome_trace(tr, path);
  std::printf("trace: %s (%zu events)\n", path.c_str(), tr.events.size());
}

}  // namespace

int run_cuda(const CudaRunOptions& o) {
  if (kg::device_count() == 0)
    throw InputError("--backend cuda: no CUDA device is visible to this process (no GPU or no driver); "
                     "use --backend cpu");
  // Experiment switches for the tensor-core attention (docs/cuda.md): 1, the measured kernels, 2, or 3 (the
  // wgmma kernels, compute capability 9.0 only); TESSEL_ATTENTION_SWIZZLE 0 or 128 picks version 3's
  // shared-memory layout, TESSEL_ATTENTION_OVERLAP=1 its overlapped forward.
  if (const char* v = std::getenv("TESSEL_ATTENTION")) {
    const std::string s = v;
    if (s != "1" && s != "2" && s != "3")
      throw InputError("environment TESSEL_ATTENTION=" + s + ": must be 1, 2 or 3");
    if (s == "3" && !kg::attention_tc3_available())
      throw InputError("environment TESSEL_ATTENTION=3: the wgmma kernels need a GPU of compute capability 9.0 "
                       "(Hopper); use 1 or 2");
    throw_if_failed(kg::attention_tc_set_version(std::stoi(s)));
    std::printf("attention: version %s (TESSEL_ATTENTION)\n", s.c_str());
  }
  if (const char* v = std::getenv("TESSEL_ATTENTION_SWIZZLE")) {
    const std::string s = v;
    if (s != "0" && s != "128")
      throw InputError("environment TESSEL_ATTENTION_SWIZZLE=" + s + ": must be 0 or 128 (bytes)");
    throw_if_failed(kg::attention_tc3_set_layout(std::stoi(s)));
  }
  if (const char* v = std::getenv("TESSEL_ATTENTION_OVERLAP")) {  // version 3's overlapped forward
    const std::string s = v;
    if (s != "0" && s != "1") throw InputError("environment TESSEL_ATTENTION_OVERLAP=" + s + ": must be 0 or 1");
    kg::attention_tc3_set_overlap(s == "1");
    if (s == "1") std::printf("attention: version 3's overlapped forward (TESSEL_ATTENTION_OVERLAP)\n");
  }
  (void)gemm_type(o.precision);
  trace::Trace tr;
  if (o.gpu_threads && o.only_rank < 0 && o.layout.gpus() > 1) {
    check_supported(o, o.layout.gpus());
    std::mutex mu;
    run_threads(o.layout.gpus(), [&](Comm& host) {
      CudaDevice dev(0);
      DeviceStagedComm world(host, dev.comm());
      trace::Trace part;
      run_rank(o, dev, &world, host.rank(), part);
      std::lock_guard<std::mutex> lk(mu);
      tr.events.insert(tr.events.end(), part.events.begin(), part.events.end());
      tr.process_names.insert(part.process_names.begin(), part.process_names.end());
      tr.counters.insert(tr.counters.end(), part.counters.begin(), part.counters.end());
    });
    write_trace(o, tr, 0, 1);
    return 0;
  }
  if (o.only_rank >= 0 || o.layout.gpus() == 1) {
    check_supported(o, 1);
    CudaDevice dev(0);
    run_rank(o, dev, nullptr, o.only_rank >= 0 ? o.only_rank : 0, tr);
    write_trace(o, tr, 0, 1);
    return 0;
  }
#ifdef TESSEL_HAVE_MPI
  if (launched_by_mpirun()) {
    run_mpi([&](Comm& mpi) {
      check_supported(o, mpi.size());
      CudaDevice dev(mpi.rank() % kg::device_count());  // current before NCCL init
      NcclComm world(bootstrap_over(mpi), dev.comm());
      run_rank(o, dev, &world, mpi.rank(), tr);
      write_trace(o, tr, mpi.rank(), mpi.size());
    });
    return 0;
  }
#endif
  if (!launched_by_torchrun()) check_supported(o, 1);  // names the process-count rule
  const NcclBootstrap b = bootstrap_from_env();
  // Rank 0's id file goes however this ends (NcclComm removes it once every rank has joined; a failure
  // before that would leave it for the next launch to find).
  struct IdFileGuard {
    const NcclBootstrap& b;
    ~IdFileGuard() {
      if (!b.id_file.empty()) std::remove(b.id_file.c_str());
    }
  } id_file_guard{b};
  check_supported(o, b.world);
  CudaDevice dev(b.rank % kg::device_count());
  NcclComm world(b, dev.comm());
  run_rank(o, dev, &world, b.rank, tr);
  write_trace(o, tr, b.rank, b.world);
  return 0;
}

}  // namespace tessel::rt::cuda
