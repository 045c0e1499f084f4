// tessel run: train the GPT for real on the CPU runtime (ranks as threads, or MPI processes under mpirun) or
// the CUDA runtime (tools/cmd_run_cuda.cpp); print per-step loss, step time and tokens/s, or with --json one
// document (tools/run_common.hpp); optionally write a measured trace and recovery checkpoints.
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <iterator>
#include <mutex>
#include <thread>

#include "kernels/cpu/gemm.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "runtime/comm/thread_comm.hpp"
#include "runtime/host_allocator.hpp"
#include "runtime/trace_gather.hpp"
#include "runtime/trainer_checkpoint.hpp"
#include "sim/estimate.hpp"
#include "sim/goodput.hpp"
#include "sim/layout_words.hpp"
#include "sim/stage_split.hpp"
#include "sim/system.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"
#include "tools/format.hpp"
#include "tools/run_common.hpp"
#include "tools/spec_args.hpp"
#include "traces/chrome.hpp"
#ifdef TESSEL_HAVE_MPI
#include "runtime/comm/mpi_comm.hpp"
#endif

namespace tessel::cmd {

namespace {

std::vector<cli::OptionSpec> run_options() {
  std::vector<cli::OptionSpec> o = {
      {"--backend", true, "cpu or cuda (cuda needs a build with CUDA/NCCL and a GPU) [cpu]"},
      {"--only-rank", true, "cuda: run world rank R of the layout alone (synthesised inputs, comm recorded)"},
      {"--precision", true, "cuda GEMM operands: bf16|tf32|fp32 [bf16]"},
      {"--profile-kernels", false, "cuda: time each kernel kind and print where the step goes"},
      {"--gpu-threads", false, "cuda: every rank of the layout as a thread on one GPU (functional check of tp/pp/dp)"},
      {"--attention-kernel", true, "cuda: the attention kernel's variant by name [the default]"},
      {"--json", false, "print one JSON document on stdout (the human lines go to stderr)"},
      {"--model", true, "model preset or JSON file [tiny]"},
      {"--layout", true, "a layout as explore prints it, or a layout JSON file (docs/layout.md); the flags below "
                         "override its fields"},
      {"--tp", true, "tensor-parallel size [1]"},
      {"--pp", true, "pipeline-parallel size [1]"},
      {"--dp", true, "data-parallel size [1]"},
      {"--ep", true, "expert-parallel size (MoE models; folded over tp x dp, as Megatron-Core) [1]"},
      {"--etp", true, "expert tensor-parallel size: each expert's FFN split over etp ranks, folded etp-fastest over tp x dp [tp, as Megatron-Core]"},
      {"--vpp", true, "stages per pipeline rank [2 for interleaved/looped-bfs/zbv/dualpipev, else 1]"},
      {"--mbs", true, "micro-batch size [1]"},
      {"--gbs", true, "global batch size [mbs * dp * 2 * pp]"},
      {"--schedule", true, "pipeline schedule generator [1f1b]"},
      {"--recompute", true, "none|selective|full [none]"},
      {"--recompute-method", true, "uniform|block [uniform]"},
      {"--recompute-layers", true, "full recompute: layers per block (uniform) [1] or recomputed per stage (block) [all]"},
      {"--sp", false, "sequence parallelism (tp > 1)"},
      {"--zero", true, "ZeRO stage: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters sharded over dp [0]"},
      {"--no-overlap", false, "cuda: fence the dp gradient reductions and ZeRO-3 gathers instead of overlapping them"},
      {"--overlap-p2p", false, "cuda: let compute go on while a pipeline send is in flight"},
      {"--steps", true, "optimizer steps to run [10]"},
      {"--seed", true, "seed of initialisation and synthetic data [1234]"},
      {"--lr", true, "AdamW learning rate [1e-3]"},
      {"--data", true, "train on this file's bytes (vocab >= 256) instead of synthetic tokens"},
      {"--trace", true, "write the measured Chrome trace here"},
      {"--save-every", true, "save a recovery checkpoint every N steps, or auto: Daly's interval for the measured save "
                             "and --mtbf-hours (needs --checkpoint-dir)"},
      {"--mtbf-hours", true, "with --save-every auto: the job's mean time between failures, in hours"},
      {"--checkpoint-dir", true, "folder of recovery checkpoints"},
      {"--resume", true, "resume from the step this folder's `latest` publishes (or from one step folder)"},
  };
  for (auto& f : cli::split_options()) o.push_back(std::move(f));
  return o;
}

// The layout: --layout (explore's words or a layout JSON file, docs/layout.md) with the flags given
// overriding its fields, or the flags alone (the defaults in run_options); then the split flags (or a
// Megatron-LM argument file's) resolved on the CPU system, as the planning verbs do.
Layout read_layout(const cli::CommandLine& cl, const Model& m) {
  const auto text = cl.get("--layout");
  const bool given = text.has_value();
  Layout l;
  if (given) l = parse_layout_words(*text, 1, "--layout");
  const auto int_or = [&](const char* flag, std::int64_t hi, int fallback) {
    return static_cast<int>(cl.get_int(flag, 1, hi).value_or(fallback));
  };
  l.tp = int_or("--tp", 4096, given ? l.tp : 1);
  l.pp = int_or("--pp", 4096, given ? l.pp : 1);
  l.dp = int_or("--dp", 4096, given ? l.dp : 1);
  l.ep = int_or("--ep", 4096, given ? l.ep : 1);
  if (cl.has("--etp")) l.etp = int_or("--etp", 4096, 1);
  if (auto sc = cl.get("--schedule")) l.schedule = sched::parse_schedule(*sc, "--schedule");
  else if (!given) l.schedule = sched::Kind::one_f_one_b;
  if (auto v = cl.get_int("--vpp", 1, 1024)) l.vpp = static_cast<int>(*v);
  else if (!given || cl.has("--schedule") || cl.has("--pp")) l.vpp = l.pp > 1 ? sched::default_vpp(l.schedule, 2) : 1;
  l.micro_batch = int_or("--mbs", 1 << 20, given ? l.micro_batch : 1);
  // The words carry no global batch (a JSON file does): --gbs, else two rounds of micro-batches per chunk.
  const bool words = given && text->find(".json") == std::string::npos;
  l.global_batch = int_or("--gbs", 1 << 30, given && !words ? l.global_batch : l.micro_batch * l.dp * 2 * l.pp * l.vpp);
  if (auto r = cl.get("--recompute")) l.recompute = parse_recompute(*r, "--recompute");
  if (auto method = cl.get("--recompute-method")) {
    if (*method != "uniform" && *method != "block")
      throw InputError("--recompute-method " + *method + ": must be uniform or block");
    l.recompute_method = *method == "uniform" ? RecomputeMethod::uniform : RecomputeMethod::block;
  }
  if (auto n = cl.get_int("--recompute-layers", 1, 1 << 20)) l.recompute_layers = static_cast<int>(*n);
  cli::check_recompute_flags(cl, l);
  if (cl.flag("--sp")) l.sequence_parallel = true;
  if (auto z = cl.get_int("--zero", 0, 3)) l.zero_stage = static_cast<int>(*z);
  if (cl.flag("--no-overlap")) l.overlap_grad_reduce = l.overlap_param_gather = false;
  if (cl.flag("--overlap-p2p")) l.overlap_p2p = true;
  l.precision = Precision::fp32;  // the CPU runtime computes in fp32
  if (l.stage_layers.size() != static_cast<std::size_t>(l.num_stages())) l.stage_layers.clear();
  resolve_split(l, cli::split_request(cl, cl.get_or("--model", "tiny"), l), m, load_system("cpu"));
  return l;
}

struct CpuRun {
  RunFlags f;
  rt::TrainOptions opt;
};

// --save-every auto (docs/goodput.md): the run saves after its first step, takes that save's time (the slowest
// rank's, so that every rank agrees) and the step's, and saves every Daly interval from then on.
struct AutoInterval {
  int first = 0;  // the step of the measured save
  int every = 0;  // steps between saves after it; 0 until measured
  double save_s = 0, step_s = 0, daly_s = 0;
};

bool save_due(const RunFlags& f, int step, const AutoInterval& a) {
  if (!f.save_auto) return f.save_every > 0 && step % f.save_every == 0;
  return a.every == 0 || (step - a.first) % a.every == 0;
}

// Collective: every rank passes its own save time and gets the same interval.
AutoInterval measure_interval(rt::Comm& world, int step, double step_s, double save_s, double mtbf_s) {
  float slowest = static_cast<float>(save_s);
  world.all_reduce(&slowest, 1, rt::ReduceOp::max);
  AutoInterval a;
  a.first = step;
  a.save_s = slowest;
  a.step_s = step_s;
  a.daly_s = goodput::daly_interval_s(a.save_s, mtbf_s);
  a.every = static_cast<int>(std::clamp<double>(std::round(a.daly_s / step_s), 1.0, 1 << 30));
  return a;
}

Json interval_json(const AutoInterval& a, double mtbf_s) {
  return {{"first_step", a.first}, {"save_s", a.save_s}, {"step_s", a.step_s}, {"mtbf_s", mtbf_s},
          {"daly_interval_s", a.daly_s}, {"every_steps", a.every}};
}

// What rank 0 reports of the run; every rank's part of the trace (events, name, peak counter).
struct RankResult {
  trace::Trace part;
  std::vector<rt::StepRecord> steps;
  std::vector<rt::RankMemory> memory;  // every rank's (a collective gathers them)
  std::vector<rt::CheckpointIo> saved;
  std::optional<rt::CheckpointIo> resumed;
  std::optional<AutoInterval> interval;  // --save-every auto
  std::string comm, schedule;
};

rt::RankMemory rank_memory(rt::Trainer& t, int rank) {
  const rt::StateMemory& m = t.optimizer().state_memory();
  rt::RankMemory r;
  r.rank = rank;
  r.parameter_bytes = m.weights;
  r.gradient_bytes = m.grads;
  r.optimizer_bytes = m.optimizer;
  r.peak_activation_bytes = t.recorder().peak_bytes();
  r.peak_state_bytes = m.peak;
  return r;
}

// One rank's whole run; rank 0 prints.
RankResult run_rank(const CpuRun& c, rt::Comm& world, rt::Recorder::Clock::time_point t0) {
  const RunFlags& f = c.f;
  const RunLog log(f.json);
  rt::Trainer t(f.model, f.layout, c.opt, world, t0);
  RankResult out;
  if (!f.resume.empty()) out.resumed = rt::load_checkpoint(t, f.resume, f.seed);  // returns once every rank loaded
  const double tokens = static_cast<double>(f.layout.global_batch) * f.model.seq_len;
  const bool talk = world.rank() == 0;
  if (talk)
    log.line("tessel run: %s, %s, %d rank(s) as %s, gemm %s, data %s%s", f.model.name.c_str(),
             f.layout.describe().c_str(), world.size(), world.backend().c_str(), kernels::cpu::gemm_backend().c_str(),
             f.data_file.empty() ? "synthetic" : f.data_file.c_str(),
             f.resume.empty() ? "" : (", resumed at step " + std::to_string(t.steps_done()) + " (" +
                                      std::to_string(t.consumed_samples()) + " samples consumed)").c_str());
  if (talk && out.resumed) print_checkpoint(log, *out.resumed, "loaded");
  AutoInterval interval;
  while (t.steps_done() < f.steps) {
    const rt::StepStats s = t.step();
    // MoE: the load-balancing loss beside the loss.
    out.steps.push_back({s.step + 1, s.loss, s.grad_norm, s.seconds, tokens / s.seconds,
                         f.model.moe.enabled() ? std::optional<double>(s.aux_loss) : std::nullopt, s.cpu_s, s.run_delay_s});
    if (talk) print_step(log, out.steps.back());
    if (!save_due(f, t.steps_done(), interval)) continue;
    out.saved.push_back(rt::save_checkpoint(t, f.checkpoint_dir, f.seed));
    if (talk) print_checkpoint(log, out.saved.back(), "saved");
    if (f.save_auto && interval.every == 0) {
      interval = measure_interval(world, t.steps_done(), s.seconds, out.saved.back().seconds, f.mtbf_s);
      out.interval = interval;
      if (talk)
        log.line("checkpoint interval (--save-every auto): the save took %.4f s (slowest rank) and the step %.4f s; "
                 "Daly's interval for a job MTBF of %.4g h is %.3f s: a save every %d steps", interval.save_s,
                 interval.step_s, f.mtbf_s / 3600, interval.daly_s, interval.every);
    }
  }
  out.memory = rt::gather_rank_memory(world, rank_memory(t, world.rank()));
  if (talk) {
    const rt::StateMemory& m = t.optimizer().state_memory();
    log.line("peak activation memory on rank 0: %.3f MiB", t.recorder().peak_bytes() / 1048576.0);
    log.line("state memory on rank 0: %.3f MiB between steps (parameters %.3f, gradients %.3f, Adam %.3f), "
             "peak %.3f MiB", m.persistent() / 1048576.0, m.weights / 1048576.0, m.grads / 1048576.0,
             m.optimizer / 1048576.0, m.peak / 1048576.0);
  }
  out.comm = world.backend();
  out.schedule = t.schedule().generator;
  out.part.events = std::move(t.recorder().events());
  out.part.process_names[world.rank()] = t.process_name();
  out.part.counters.push_back({world.rank(), "peak_activation_MiB", 0.0, t.recorder().peak_bytes() / 1048576.0});
  return out;
}

// Bytes this machine can still give (Linux /proc/meminfo MemAvailable), or 0 when unknown.
double available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
  std::fclose(f);
  return kib * 1024.0;
}

// Refuses a run whose parameters, gradients, Adam moments and activations (the cost model's per-rank
// memory at fp32, for every rank this process hosts) would not fit in the memory available now, instead
// of dying in an allocation half-way: all ranks with threads, one per process under mpirun.
void check_fits_in_memory(const RunFlags& c, bool one_rank_per_process) {
  const double avail = available_memory_bytes();
  if (avail <= 0) return;
  Layout l = c.layout;
  l.precision = Precision::fp32;
  // A generated schedule the cost model has no closed form for (zb-greedy) is bounded by GPipe's memory:
  // every micro-batch's activations held at once.
  const bool known = sched::family(l.schedule).layout_schedule;
  const std::string bound =
      known ? "" : " (" + std::string(sched::name(l.schedule)) + " bounded by GPipe's: every micro-batch's activations held)";
  if (!known) {
    l.schedule = sched::Kind::gpipe;
    if (l.vpp != 1) {  // GPipe has one chunk per rank
      l.vpp = 1;
      l.stage_layers.clear();
    }
  }
  const Estimate e = estimate(c.model, l, load_system("cpu"));
  double need = 0;
  for (const auto& mb : e.memory) need = one_rank_per_process ? std::max(need, mb.allocated())
                                                           : need + mb.allocated() * l.tp * l.dp;
  // 80%: the estimate leaves out allocator slack and the kernels' temporaries.
  if (need > 0.8 * avail) {
    throw InputError("--model " + c.model.name + ": this CPU run needs about " + fmt::gib(need) +
                     " (fp32 parameters, gradients, Adam moments and activations of " +
                     (one_rank_per_process ? "this process's rank" : "all ranks") + ", by the cost model" + bound + ") and this "
                     "machine has " + fmt::gib(avail) + " available; use a smaller model (--model tiny) or spread "
                     "ranks over machines with mpirun");
  }
}

void merge_into(trace::Trace& all, trace::Trace&& part) {
  all.events.insert(all.events.end(), std::make_move_iterator(part.events.begin()),
                    std::make_move_iterator(part.events.end()));
  all.counters.insert(all.counters.end(), part.counters.begin(), part.counters.end());
  all.process_names.insert(part.process_names.begin(), part.process_names.end());
}

// What the run reports: rank 0's result, with every rank's trace part merged into its own.
struct CpuOutcome {
  bool reports = false;  // this process holds rank 0 (under mpirun, the others print nothing)
  RankResult rank0;
  trace::Trace trace;
  bool under_mpi = false;
};

#ifdef TESSEL_HAVE_MPI
// One process per rank. The world size is checked first, on every rank, before any group or Trainer
// exists. Every rank prints the rule and waits at a barrier (mpirun kills the remaining processes as soon
// as one exits non-zero, so nobody exits before all have printed), returns normally (no MPI_Abort), and
// throws an InputError after MPI_Finalize: exit 2. The trace is gathered to rank 0, which alone writes it.
// Its times share one origin (rt::shared_origin): on one host rank 0's clock read as it leaves a barrier,
// exactly (each process's own start differed by tens of milliseconds, and flows ended before they began;
// each one's own reading at the barrier's exit was off by milliseconds under load).
void run_under_mpi(const CpuRun& c, CpuOutcome& out) {
  bool mismatch = false;
  const Layout& l = c.f.layout;
  rt::run_mpi([&](rt::Comm& world) {
    if (world.size() != l.gpus()) {
      std::fprintf(stderr, "tessel run: mpirun started %d processes (this is rank %d), but the layout %s needs "
                   "tp*pp*dp = %d: run mpirun -np %d\n", world.size(), world.rank(), l.describe().c_str(), l.gpus(),
                   l.gpus());
      std::fflush(stderr);
      world.barrier();
      mismatch = true;
      return;
    }
    world.barrier();
    RankResult r = run_rank(c, world, rt::shared_origin(world));
    if (c.opt.record_trace) out.trace = rt::gather_trace(world, r.part);
    out.reports = world.rank() == 0;
    if (out.reports) out.rank0 = std::move(r);
  });
  if (mismatch)
    throw InputError("mpirun -np: the process count differs from the layout's tp*pp*dp = " +
                     std::to_string(l.gpus()) + " (every rank printed the details above)");
}
#endif

CpuOutcome run_ranks(const CpuRun& c) {
  kernels::cpu::gemm_set_single_thread();
  CpuOutcome out;
#ifdef TESSEL_HAVE_MPI
  out.under_mpi = rt::launched_by_mpirun();
#endif
  check_fits_in_memory(c.f, out.under_mpi);
#ifdef TESSEL_HAVE_MPI
  if (out.under_mpi) {
    run_under_mpi(c, out);
    return out;
  }
#endif
  const auto t0 = rt::Recorder::Clock::now();
  std::mutex mu;
  rt::run_threads(c.f.layout.gpus(), [&](rt::Comm& world) {
    RankResult r = run_rank(c, world, t0);
    std::lock_guard<std::mutex> lk(mu);
    merge_into(out.trace, std::move(r.part));
    if (world.rank() == 0) out.rank0 = std::move(r);
  });
  out.reports = true;
  return out;
}

// The merged trace in rank order, with the run's identity in otherData.
void write_trace(const RunFlags& f, trace::Trace& tr, bool under_mpi) {
  std::stable_sort(tr.events.begin(), tr.events.end(),
                   [](const trace::OpEvent& a, const trace::OpEvent& b) { return a.rank < b.rank; });
  std::stable_sort(tr.counters.begin(), tr.counters.end(),
                   [](const trace::Counter& a, const trace::Counter& b) { return a.rank < b.rank; });
  tr.other_data["model"] = model_to_json(f.model);
  tr.other_data["layout"] = layout_to_json(f.layout);
  tr.other_data["schedule"] = sched::name(f.layout.schedule);
  tr.other_data["system"] = "cpu";
  tr.other_data["tool"] = std::string("tessel ") + TESSEL_VERSION;
  // A resumed run's steps are numbered from the checkpoint's step + 1, as its step lines say; compare
  // numbers the trace's steps from here (absent: 1).
  if (f.start_step > 0) tr.other_data["first_step"] = f.start_step + 1;
  // Every rank a thread of this process: the cores they shared (calibrate warns when ranks outnumber them).
  // Under mpirun the ranks may span hosts, so nothing is claimed.
  if (!under_mpi && std::thread::hardware_concurrency() > 0)
    tr.other_data["host"] = {{"cores", std::thread::hardware_concurrency()}};
  trace::write_chrome_trace(tr, f.trace_path);
}

// The flags of the CUDA backend alone, refused before anything else is read.
void reject_cuda_flags(const cli::CommandLine& cl) {
  if (auto name = cl.get("--attention-kernel"))
    throw InputError("--attention-kernel " + *name + ": only with --backend cuda (the CPU runtime has one attention "
                     "implementation, the reference kernels)");
  for (const char* flag : {"--only-rank", "--precision", "--gpu-threads", "--profile-kernels", "--no-overlap", "--overlap-p2p"})
    if (cl.has(flag))
      throw InputError(std::string(flag) + ": only with --backend cuda (the CPU runtime is fp32, all ranks, and "
                       "overlaps no communication)");
}

int run_cpu(RunFlags f) {
  rt::keep_freed_memory();  // before any rank allocates (runtime/host_allocator.hpp)
  // The CPU runtime keeps the softmax probabilities (Megatron's unfused core attention): say so in the
  // layout, so a simulation of it predicts its activation memory (docs/runtime.md).
  f.layout.attention = AttentionImpl::unfused;
  CpuRun c{f, {}};
  c.opt.seed = f.seed;
  c.opt.optimizer.adamw.lr = f.lr;
  c.opt.data_file = f.data_file;
  c.opt.record_trace = !f.trace_path.empty();
  CpuOutcome out = run_ranks(c);
  if (!out.reports) return 0;  // under mpirun rank 0's process reports
  const RunLog log(f.json);
  if (c.opt.record_trace) {
    write_trace(f, out.trace, out.under_mpi);
    log.line("trace: %s (%zu events, %zu ranks)", f.trace_path.c_str(), out.trace.events.size(),
             out.trace.process_names.size());
  }
  if (!f.json) return 0;
  const RankResult& r = out.rank0;
  Json config = run_config_json(f, "cpu", r.comm, r.schedule, f.start_step + 1);
  config["gemm"] = kernels::cpu::gemm_backend();
  Json extra = Json::object();
  if (r.interval) extra["checkpoint_interval"] = interval_json(*r.interval, f.mtbf_s);  // --save-every auto only
  print_run_document(std::move(config), r.steps, r.memory, r.saved, r.resumed,
                     trace_json(f.trace_path, out.trace.events.size()), extra);
  return 0;
}

// The flags both backends read, parsed and checked before any rank starts.
RunFlags read_run_flags(const cli::CommandLine& cl, bool cuda) {
  RunFlags f;
  f.model = load_model(cl.get_or("--model", "tiny"));
  // Both runtimes build dense transformers and mixtures of experts (rt::check_runnable names what they do
  // not build; the CUDA runtime's MoE limits: runtime/cuda/run_cuda.cpp). Refused before any rank starts.
  if (const std::string extra = f.model.beyond_dense(); !extra.empty() && cuda && !f.model.moe.enabled())
    throw InputError("--model " + f.model.name + ": " + extra + ": not yet executed by the CUDA runtime");
  f.layout = read_layout(cl, f.model);
  if (f.layout.tp_comm_overlap)
    throw InputError("tp-overlap (--tp-comm-overlap): the runtimes run TP collectives after their GEMMs, not overlapped; "
                     "leave it out to run this layout (estimate and simulate price it)");
  if (!f.layout.state.all_fp32())
    throw InputError("--layout: grads=, moments= and master= describe a simulated run's state dtypes; the runtime "
                     "keeps fp32 gradients, moments and master weights (drop them to run it)");
  f.steps = static_cast<int>(cl.get_int("--steps", 1, 1 << 30).value_or(10));
  f.seed = static_cast<std::uint64_t>(cl.get_int("--seed", 0, INT64_MAX).value_or(1234));
  if (auto lr = cl.get_double("--lr", 0.0, 10.0)) f.lr = static_cast<float>(*lr);
  f.data_file = cl.get_or("--data", "");
  f.trace_path = cl.get_or("--trace", "");
  if (cl.get("--save-every") == std::optional<std::string>("auto")) {
    const auto mtbf = cl.get_double("--mtbf-hours", 1e-6, 1e9);
    if (!mtbf) throw InputError("--save-every auto: needs --mtbf-hours H, the job's mean time between failures");
    f.save_auto = true;
    f.mtbf_s = *mtbf * 3600.0;
  } else {
    f.save_every = static_cast<int>(cl.get_int("--save-every", 1, 1 << 30).value_or(0));
    if (auto h = cl.get("--mtbf-hours"))
      throw InputError("--mtbf-hours " + *h + ": only with --save-every auto (it sets Daly's interval)");
  }
  f.checkpoint_dir = cl.get_or("--checkpoint-dir", "");
  f.resume = cl.get_or("--resume", "");
  f.json = cl.flag("--json");
  if (!f.trace_path.empty()) check_writable(f.trace_path, "--trace");
  if (!f.data_file.empty()) (void)rt::TokenStream::from_file(f.data_file, f.model.vocab);  // fail early
  // auto saves the first step it trains, so the checks are those of a save every step.
  f.start_step = check_checkpoint_flags(f.save_auto ? 1 : f.save_every, f.checkpoint_dir, f.resume, f.model, f.steps,
                                        f.seed, f.data_file);
  rt::check_runnable(f.model, f.layout);
  return f;
}

}  // namespace

int run(const Args& args) {
  cli::CommandLine cl("run", args, run_options(), 0);
  if (cl.print_help()) return 0;
  // A reader of the log that goes away (`tessel run ... | head`) must not kill a training run before it
  // saves its checkpoints and trace: writes to the closed pipe fail (EPIPE) and the run goes on.
  std::signal(SIGPIPE, SIG_IGN);
  const std::string backend = cl.get_or("--backend", "cpu");
  if (backend == "cuda") {
    if (cl.get("--save-every") == std::optional<std::string>("auto"))
      throw InputError("--save-every auto: the CPU runtime's (--backend cpu) for now; give the CUDA backend a step count");
#ifdef TESSEL_HAVE_CUDA
    return run_cuda_backend(cl, read_run_flags(cl, true));
#else
    throw InputError("--backend cuda: this build has no CUDA runtime (CUDA/NCCL not found at configure time); use --backend cpu");
#endif
  }
  if (backend != "cpu") throw InputError("--backend " + backend + ": unknown backend (choose cpu or cuda)");
  reject_cuda_flags(cl);
  return run_cpu(read_run_flags(cl, false));
}

}  // namespace tessel::cmd
