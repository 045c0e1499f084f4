#include "runtime/cuda/run_cuda.hpp"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <vector>

#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/kernels.hpp"
#include "runtime/comm/thread_comm.hpp"
#include "runtime/cuda/gpu_trainer.hpp"
#include "runtime/cuda/nccl_comm.hpp"
#include "runtime/cuda/staged_comm.hpp"
#include "sim/system.hpp"
#include "traces/chrome.hpp"
#include "util/error.hpp"
#ifdef TESSEL_HAVE_MPI
#include "runtime/comm/mpi_comm.hpp"
#endif

namespace tessel::rt::cuda {

namespace kg = kernels::cuda;

int cuda_devices() { return kg::device_count(); }

double device_peak_flops(const std::string& device, const std::string& precision, std::string& what) {
  const std::optional<std::string> preset = system_preset_for_gpu(device);
  if (!preset) {
    what = "no system preset matches device '" + device + "'";
    return 0.0;
  }
  const System sys = load_system(*preset);
  what = precision + " dense peak of system preset " + *preset;
  return precision == "tf32" ? sys.gpu.tf32_flops
         : precision == "fp32" ? sys.gpu.peak(Precision::fp32) : sys.gpu.peak(Precision::bf16);
}

double device_memory_bw(const std::string& device) {
  const std::optional<std::string> preset = system_preset_for_gpu(device);
  return preset ? load_system(*preset).gpu.memory_bw_Bps : 0.0;
}

namespace {

kg::GemmType gemm_type(const std::string& p) {
  if (p == "bf16") return kg::GemmType::bf16_fp32;
  if (p == "tf32") return kg::GemmType::tf32;
  if (p == "fp32") return kg::GemmType::fp32;
  throw InputError("--precision " + p + ": must be bf16, tf32 or fp32");
}

// A mixture of experts runs over any tp, pp, dp, ep and etp, with ZeRO-1; what else it lacks on this
// runtime is named (the CPU runtime runs each of these).
void check_moe_supported(const CudaRunOptions& o) {
  const Layout& l = o.layout;
  const auto lacks = [&](const std::string& what) {
    throw InputError(what + ": not yet with a mixture of experts on the CUDA runtime (--backend cpu runs it)");
  };
  if (l.zero_stage > 1) lacks("--zero " + std::to_string(l.zero_stage) + " (ZeRO-1 shards the experts' states over edp)");
  if (o.only_rank >= 0) lacks("--only-rank");
}

// What the GPU runtime does not do yet, rejected up front with the rule (docs/cuda.md lists them).
void check_supported(const CudaRunOptions& o, int world) {
  const Layout& l = o.layout;
  if (o.model.moe.enabled()) check_moe_supported(o);
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

// This rank's state between steps and its device allocator's peaks; every rank's where there is a world.
std::vector<RankMemory> rank_memory(GpuTrainer& t, CudaDevice& dev, bool gather) {
  GpuParams::StateBytes sb = t.params().state_bytes();
  if (const GpuParams* e = t.experts()) {  // a MoE model's routed experts, in their own store
    const GpuParams::StateBytes x = e->state_bytes();
    sb.values += x.values;
    sb.grads += x.grads;
    sb.moments += x.moments;
  }
  RankMemory m;
  m.rank = t.world_rank();
  m.parameter_bytes = static_cast<std::int64_t>(sb.values);
  m.gradient_bytes = static_cast<std::int64_t>(sb.grads);
  m.optimizer_bytes = static_cast<std::int64_t>(sb.moments);
  m.device_peak_bytes = static_cast<std::int64_t>(dev.memory().peak());
  m.device_reserved_bytes = static_cast<std::int64_t>(dev.memory().reserved());
  return gather ? gather_rank_memory(t.host_world(), m) : std::vector<RankMemory>{m};
}

std::vector<KernelScopeTotal> kernel_totals(const CudaDevice& dev) {
  std::vector<KernelScopeTotal> rows;
  for (const auto& [scope, k] : dev.kernel_totals()) rows.push_back({scope, k.calls, k.ms, k.flops, k.bytes});
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
  return rows;
}

// One rank's run. dev: the rank's GPU; NCCL communicators must enqueue on dev.comm(), which the trainer
// orders against dev.compute() with events. The reporting rank fills `out` and calls back.
void run_rank(const CudaRunOptions& o, const CudaRunCallbacks& cb, CudaDevice& dev, Comm* world, int world_rank,
              trace::Trace& tr, CudaRunResult& out) {
  GpuTrainOptions opt;
  opt.seed = o.seed;
  opt.optimizer.adamw.lr = o.lr;
  opt.record_trace = !o.trace_path.empty();
  opt.gemm = gemm_type(o.precision);
  opt.attention_kernel = o.attention_kernel;
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
  GpuTrainer t(dev, o.model, o.layout, opt, world, Recorder::Clock::now());
  const bool reports = world_rank == 0 || o.only_rank >= 0;
  CudaRunStart start;
  if (!o.resume.empty()) start.resumed = t.load_checkpoint(o.resume, o.seed);
  kg::DeviceInfo info;
  throw_if_failed(kg::device_info(info));
  start.device = info.name;
  start.sm_count = info.sm_count;
  start.world_rank = t.world_rank();
  start.comm = world ? world->backend() : "none";
  start.first_step = t.steps_done() + 1;
  start.step_flops = t.step_flops();
  if (reports && cb.started) cb.started(start);
  const double tokens = double(o.layout.global_batch) * o.model.seq_len;
  dev.set_kernel_profile(o.profile_kernels);
  std::vector<StepRecord> steps;
  std::vector<CheckpointIo> saved;
  int run = 0;
  double profiled_s = 0;  // step time summed over the profiled steps (all but the first: warm-up)
  while (t.steps_done() < o.steps) {
    const StepStats s = t.step();
    if (run++ == 0) dev.reset_kernel_totals();
    else profiled_s += s.seconds;
    steps.push_back({s.step + 1, s.loss, s.grad_norm, s.seconds, tokens / s.seconds,
                     o.model.moe.enabled() ? std::optional<double>(s.aux_loss) : std::nullopt, std::nullopt, std::nullopt});
    if (reports && cb.step) cb.step(steps.back());
    if (o.save_every > 0 && t.steps_done() % o.save_every == 0) {
      saved.push_back(t.save_checkpoint(o.checkpoint_dir, o.seed));
      if (reports && cb.saved) cb.saved(saved.back());
    }
  }
  std::vector<RankMemory> memory = rank_memory(t, dev, world && o.only_rank < 0);
  auto& ev = t.recorder().events();
  tr.events.insert(tr.events.end(), ev.begin(), ev.end());
  tr.process_names[t.world_rank()] = t.process_name();
  tr.counters.push_back({t.world_rank(), "peak_device_MiB", 0.0, dev.memory().peak() / 1048576.0});
  if (!reports) return;
  out.reports = true;
  out.start = start;
  out.schedule = t.schedule().generator;
  out.steps = std::move(steps);
  out.memory = std::move(memory);
  out.saved = std::move(saved);
  if (o.profile_kernels) {
    out.kernels = kernel_totals(dev);
    out.profiled_steps = std::max(0, run - 1);
    out.profiled_seconds = profiled_s;
  }
}

void write_trace(const CudaRunOptions& o, trace::Trace& tr, int world_rank, int world, CudaRunResult& out) {
  if (o.trace_path.empty()) return;
  tr.other_data["model"] = model_to_json(o.model);
  tr.other_data["layout"] = layout_to_json(o.layout);
  tr.other_data["schedule"] = sched::name(o.layout.schedule);
  tr.other_data["system"] = "cuda";
  tr.other_data["precision"] = o.precision;
  if (o.only_rank >= 0) tr.other_data["only_rank"] = o.only_rank;
  if (o.start_step > 0) tr.other_data["first_step"] = o.start_step + 1;  // as the CPU runner: compare numbers steps from it
  tr.other_data["tool"] = std::string("tessel ") + TESSEL_VERSION;
  out.trace_file = world > 1 ? o.trace_path + ".rank" + std::to_string(world_rank) : o.trace_path;
  trace::write_chrome_trace(tr, out.trace_file);
  out.trace_events = tr.events.size();
}

// Every rank of the layout as a thread on GPU 0, the world staged through the host (run_threads).
CudaRunResult run_gpu_threads(const CudaRunOptions& o, const CudaRunCallbacks& cb) {
  check_supported(o, o.layout.gpus());
  CudaRunResult out;
  trace::Trace tr;
  std::mutex mu;
  run_threads(o.layout.gpus(), [&](Comm& host) {
    CudaDevice dev(0);
    DeviceStagedComm world(host, dev.comm());
    trace::Trace part;
    CudaRunResult mine;
    run_rank(o, cb, dev, &world, host.rank(), part, mine);
    std::lock_guard<std::mutex> lk(mu);
    tr.events.insert(tr.events.end(), part.events.begin(), part.events.end());
    tr.process_names.insert(part.process_names.begin(), part.process_names.end());
    tr.counters.insert(tr.counters.end(), part.counters.begin(), part.counters.end());
    if (mine.reports) out = std::move(mine);
  });
  write_trace(o, tr, 0, 1, out);
  return out;
}

// One process per GPU, launched by torchrun or a similar launcher (RANK, WORLD_SIZE and a rendezvous).
CudaRunResult run_launched(const CudaRunOptions& o, const CudaRunCallbacks& cb) {
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
  CudaRunResult out;
  trace::Trace tr;
  run_rank(o, cb, dev, &world, b.rank, tr, out);
  write_trace(o, tr, b.rank, b.world, out);
  return out;
}

}  // namespace

CudaRunResult run_cuda(const CudaRunOptions& o, const CudaRunCallbacks& cb) {
  if (o.model.moe.enabled()) check_moe_supported(o);  // bad input whatever the machine
  if (kg::device_count() == 0)
    throw InputError("--backend cuda: no CUDA device is visible to this process (no GPU or no driver); "
                     "use --backend cpu");
  (void)gemm_type(o.precision);
  if (o.gpu_threads && o.only_rank < 0 && o.layout.gpus() > 1) return run_gpu_threads(o, cb);
  if (o.only_rank >= 0 || o.layout.gpus() == 1) {
    check_supported(o, 1);
    CudaDevice dev(0);
    CudaRunResult out;
    trace::Trace tr;
    run_rank(o, cb, dev, nullptr, o.only_rank >= 0 ? o.only_rank : 0, tr, out);
    write_trace(o, tr, 0, 1, out);
    return out;
  }
#ifdef TESSEL_HAVE_MPI
  if (launched_by_mpirun()) {
    CudaRunResult out;
    run_mpi([&](Comm& mpi) {
      check_supported(o, mpi.size());
      CudaDevice dev(mpi.rank() % kg::device_count());  // current before NCCL init
      NcclComm world(bootstrap_over(mpi), dev.comm());
      trace::Trace tr;
      run_rank(o, cb, dev, &world, mpi.rank(), tr, out);
      write_trace(o, tr, mpi.rank(), mpi.size(), out);
    });
    return out;
  }
#endif
  if (!launched_by_torchrun()) check_supported(o, 1);  // names the process-count rule
  return run_launched(o, cb);
}

}  // namespace tessel::rt::cuda
