// tessel run: train the GPT for real on the CPU runtime (ranks as threads, or MPI processes under mpirun),
// print per-step loss, step time and tokens/s; optionally write a measured trace and recovery checkpoints.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <mutex>
#include <thread>

#include "kernels/cpu/gemm.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/comm/thread_comm.hpp"
#include "runtime/trace_gather.hpp"
#include "runtime/trainer_checkpoint.hpp"
#include "sim/estimate.hpp"
#include "sim/system.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"
#include "tools/format.hpp"
#include "tools/spec_args.hpp"
#include "traces/chrome.hpp"
#ifdef TESSEL_HAVE_CUDA
#include "runtime/cuda/run_cuda.hpp"
#endif
#ifdef TESSEL_HAVE_MPI
#include "runtime/comm/mpi_comm.hpp"
#endif

namespace tessel::cmd {

namespace {

std::vector<cli::OptionSpec> run_options() {
  return {
      {"--backend", true, "cpu or cuda (cuda needs a build with CUDA/NCCL and a GPU) [cpu]"},
      {"--only-rank", true, "cuda: run world rank R of the layout alone (synthesised inputs, comm recorded)"},
      {"--precision", true, "cuda GEMM operands: bf16|tf32|fp32 [bf16]"},
      {"--profile-kernels", false, "cuda: time each kernel kind and print where the step goes"},
      {"--gpu-threads", false, "cuda: every rank of the layout as a thread on one GPU (functional check of tp/pp/dp)"},
      {"--model", true, "model preset or JSON file [tiny]"},
      {"--layout", true, "layout JSON file (instead of the layout flags)"},
      {"--tp", true, "tensor-parallel size [1]"},
      {"--pp", true, "pipeline-parallel size [1]"},
      {"--dp", true, "data-parallel size [1]"},
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
      {"--save-every", true, "save a recovery checkpoint every N steps (needs --checkpoint-dir)"},
      {"--checkpoint-dir", true, "folder of recovery checkpoints"},
      {"--resume", true, "resume from the step this folder's `latest` publishes (or from one step folder)"},
  };
}

Layout read_layout(const cli::CommandLine& cl) {
  const char* flags[] = {"--tp", "--pp", "--dp", "--vpp", "--mbs", "--gbs", "--schedule", "--recompute",
                         "--recompute-method", "--recompute-layers", "--sp", "--zero", "--no-overlap", "--overlap-p2p"};
  Layout l;
  if (auto path = cl.get("--layout")) {
    for (const char* f : flags)
      if (cl.has(f)) throw InputError(std::string(f) + ": cannot be combined with --layout " + *path);
    l = parse_layout(parse_json_file(*path, "--layout "), *path);
  } else {
    l.tp = static_cast<int>(cl.get_int("--tp", 1, 4096).value_or(1));
    l.pp = static_cast<int>(cl.get_int("--pp", 1, 4096).value_or(1));
    l.dp = static_cast<int>(cl.get_int("--dp", 1, 4096).value_or(1));
    l.schedule = sched::parse_schedule(cl.get_or("--schedule", "1f1b"), "--schedule");
    l.vpp = static_cast<int>(cl.get_int("--vpp", 1, 1024).value_or(l.pp > 1 ? sched::default_vpp(l.schedule, 2) : 1));
    l.micro_batch = static_cast<int>(cl.get_int("--mbs", 1, 1 << 20).value_or(1));
    l.global_batch = static_cast<int>(cl.get_int("--gbs", 1, 1 << 30).value_or(l.micro_batch * l.dp * 2 * l.pp * l.vpp));
    l.recompute = parse_recompute(cl.get_or("--recompute", "none"), "--recompute");
    const std::string method = cl.get_or("--recompute-method", "uniform");
    if (method != "uniform" && method != "block")
      throw InputError("--recompute-method " + method + ": must be uniform or block");
    l.recompute_method = method == "uniform" ? RecomputeMethod::uniform : RecomputeMethod::block;
    l.recompute_layers = static_cast<int>(cl.get_int("--recompute-layers", 1, 1 << 20).value_or(0));
    cli::check_recompute_flags(cl, l);
    l.sequence_parallel = cl.flag("--sp");
    l.zero_stage = static_cast<int>(cl.get_int("--zero", 0, 3).value_or(0));
    l.overlap_grad_reduce = l.overlap_param_gather = !cl.flag("--no-overlap");
    l.overlap_p2p = cl.flag("--overlap-p2p");
  }
  l.precision = Precision::fp32;  // the CPU runtime computes in fp32
  return l;
}

struct RunConfig {
  Model model;
  Layout layout;
  rt::TrainOptions opt;
  int steps = 10;
  int save_every = 0;
  std::string checkpoint_dir, resume, trace_path;
  int start_step = 0;  // the resumed checkpoint's step; 0 for a fresh run
};

// --checkpoint-dir D before any rank starts: D, or the nearest folder above it that exists (the saver
// creates the rest), must be a writable folder, a `latest` in it the saver's file, and D must hold no
// checkpoints but those this run continues: a fresh run would stop at its first save over them, losing what
// it trained, and continuing an older step than D's published one would save over its successors.
void check_checkpoint_dir(const std::string& dir, const std::string& resume, int resume_step) {
  namespace fs = std::filesystem;
  const std::string flag = "--checkpoint-dir " + dir;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) throw InputError(flag + ": is a file, not a folder");
  fs::path have = fs::path(dir).lexically_normal();
  while (!have.empty() && !fs::exists(have, ec)) have = have.parent_path();
  if (have.empty()) have = ".";
  if (!fs::is_directory(have, ec)) throw InputError(flag + ": " + have.string() + " is a file, not a folder");
  if (::access(have.c_str(), W_OK | X_OK) != 0)
    throw InputError(flag + ": folder " + have.string() + " is not writable");
  if (fs::exists(fs::path(dir) / "manifest.json", ec))
    throw InputError(flag + ": is one step folder of a checkpoint; give the folder that holds the step folders");
  const std::vector<std::string> entries = rt::CheckpointReader::checkpoint_entries(dir);
  if (entries.empty()) return;
  std::optional<std::int64_t> published;
  try {
    published = rt::CheckpointReader::latest_step(dir);
  } catch (const InputError& e) {
    throw InputError(flag + ": " + e.what());
  }
  // What is there, briefly: the published step and up to 3 step-* names.
  std::string held = published ? "latest publishes " + rt::step_folder_name(*published) : "no latest";
  std::vector<std::string> steps_there;
  for (const std::string& e : entries)
    if (e != "latest") steps_there.push_back(e);
  for (std::size_t i = 0; i < steps_there.size() && i < 3; ++i) held += (i == 0 ? "; " : ", ") + steps_there[i];
  if (steps_there.size() > 3) held += " and " + std::to_string(steps_there.size() - 3) + " more";
  if (resume.empty())
    throw InputError(flag + ": holds checkpoints already (" + held + "); this run would stop at its first save over "
                     "them: resume them (--resume " + dir + ") or choose an empty folder");
  fs::path root = fs::path(resume).lexically_normal();
  if (root.filename().empty()) root = root.parent_path();
  if (fs::is_regular_file(root / "manifest.json", ec)) root = root.has_parent_path() ? root.parent_path() : ".";
  if (!fs::equivalent(root, dir, ec))
    throw InputError(flag + ": holds other checkpoints (" + held + ") than --resume " + resume + "'s; save into " +
                     root.string() + " to continue them, or into an empty folder");
  if (published && *published > resume_step)
    throw InputError("--resume " + resume + ": step " + std::to_string(resume_step) + " is older than the one " + dir +
                     "/latest publishes (" + std::to_string(*published) + "); continuing it there would save over "
                     "its later steps: save into an empty folder (--checkpoint-dir)");
}

// The recovery-checkpoint flags of either backend, checked before any rank starts: --save-every and
// --checkpoint-dir go together; a checkpoint to resume is verified (checksums, metadata), of this model,
// seed and data source, and short of --steps (which counts from step 0, as Megatron's --train-iters: a run
// resumed at or past it would train nothing); the run must reach a step that --save-every saves; and the
// checkpoint folder must be able to take the saves (check_checkpoint_dir). Returns the step the run
// starts from: the checkpoint's, 0 for a fresh run.
int check_checkpoint_flags(int save_every, const std::string& dir, const std::string& resume, const Model& m,
                            int steps, std::uint64_t seed, const std::string& data_file) {
  if (save_every > 0 && dir.empty()) throw InputError("--save-every: needs --checkpoint-dir");
  if (!dir.empty() && save_every == 0) throw InputError("--checkpoint-dir: needs --save-every N");
  int start = 0;
  if (!resume.empty()) {
    rt::CheckpointReader r(resume);
    start = rt::check_resume(r, m, seed, data_file).step;
    if (start >= steps)
      throw InputError("--steps " + std::to_string(steps) + ": the checkpoint " + resume + " is at step " +
                       std::to_string(start) + " already, so there is nothing to train (--steps counts from step 0; "
                       "give more than " + std::to_string(start) + ")");
  }
  if (save_every == 0) return start;
  if ((static_cast<std::int64_t>(start) / save_every + 1) * save_every > steps) {
    if (resume.empty())
      throw InputError("--save-every " + std::to_string(save_every) + ": must be <= --steps " + std::to_string(steps) +
                       ", or nothing would be saved");
    throw InputError("--save-every " + std::to_string(save_every) + ": this run trains steps " +
                     std::to_string(start + 1) + " to " + std::to_string(steps) + " (resumed at step " +
                     std::to_string(start) + ", --steps " + std::to_string(steps) + ") and none is a multiple of " +
                     std::to_string(save_every) + ", so nothing would be saved");
  }
  check_checkpoint_dir(dir, resume, start);
  return start;
}

// One rank's whole run; rank 0 prints. Returns this rank's part of the trace (events, name, peak counter).
// Every line is flushed as it is printed: with stdout in a file or a pipe it is block-buffered, and a run
// killed (SIGTERM, SIGKILL, the job's time limit) would otherwise lose every line it had printed.
trace::Trace run_rank(const RunConfig& c, rt::Comm& world, rt::Recorder::Clock::time_point t0) {
  rt::Trainer t(c.model, c.layout, c.opt, world, t0);
  if (!c.resume.empty()) rt::load_checkpoint(t, c.resume, c.opt.seed);  // returns once every rank loaded
  const double tokens = static_cast<double>(c.layout.global_batch) * c.model.seq_len;
  const bool talk = world.rank() == 0;
  if (talk)
    std::printf("tessel run: %s, %s, %d rank(s) as %s, gemm %s, data %s%s\n", c.model.name.c_str(),
                c.layout.describe().c_str(), world.size(), world.backend().c_str(),
                kernels::cpu::gemm_backend().c_str(), c.opt.data_file.empty() ? "synthetic" : c.opt.data_file.c_str(),
                c.resume.empty() ? "" : (", resumed at step " + std::to_string(t.steps_done()) + " (" +
                                         std::to_string(t.consumed_samples()) + " samples consumed)").c_str());
  if (talk) std::fflush(stdout);
  while (t.steps_done() < c.steps) {
    const rt::StepStats s = t.step();
    if (talk)
      std::printf("step %4d  loss %.6f  grad_norm %.4f  time %8.2f ms  %10.0f tokens/s\n", s.step + 1, s.loss,
                  s.grad_norm, s.seconds * 1e3, tokens / s.seconds);
    if (talk) std::fflush(stdout);
    if (c.save_every > 0 && t.steps_done() % c.save_every == 0) rt::save_checkpoint(t, c.checkpoint_dir, c.opt.seed);
  }
  if (talk) {
    const rt::StateMemory& m = t.optimizer().state_memory();
    std::printf("peak activation memory on rank 0: %.3f MiB\n", t.recorder().peak_bytes() / 1048576.0);
    std::printf("state memory on rank 0: %.3f MiB between steps (parameters %.3f, gradients %.3f, Adam %.3f), "
                "peak %.3f MiB\n", m.persistent() / 1048576.0, m.weights / 1048576.0, m.grads / 1048576.0,
                m.optimizer / 1048576.0, m.peak / 1048576.0);
    std::fflush(stdout);
  }
  trace::Trace part;
  part.events = std::move(t.recorder().events());
  part.process_names[world.rank()] = t.process_name();
  part.counters.push_back({world.rank(), "peak_activation_MiB", 0.0, t.recorder().peak_bytes() / 1048576.0});
  return part;
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
void check_fits_in_memory(const RunConfig& c, bool one_rank_per_process) {
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
  for (const auto& mb : e.memory) need = one_rank_per_process ? std::max(need, mb.total() - mb.reserved_bytes)
                                                           : need + (mb.total() - mb.reserved_bytes) * l.tp * l.dp;
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

#ifdef TESSEL_HAVE_MPI
// One process per rank. The world size is checked first, on every rank, before any group or Trainer
// exists. Every rank prints the rule and waits at a barrier (mpirun kills the remaining processes as soon
// as one exits non-zero, so nobody exits before all have printed), returns normally (no MPI_Abort), and
// throws an InputError after MPI_Finalize: exit 2. The trace is gathered to rank 0, which alone writes it.
// Its times share one origin: every process reads its clock as it leaves one barrier (each process's own
// start differed by tens of milliseconds, and flows ended before they began); the origins then differ by
// the barrier's exit skew, microseconds on one host.
void run_under_mpi(const RunConfig& c, trace::Trace& tr) {
  bool mismatch = false;
  rt::run_mpi([&](rt::Comm& world) {
    if (world.size() != c.layout.gpus()) {
      std::fprintf(stderr, "tessel run: mpirun started %d processes (this is rank %d), but the layout %s needs "
                   "tp*pp*dp = %d: run mpirun -np %d\n", world.size(), world.rank(), c.layout.describe().c_str(),
                   c.layout.gpus(), c.layout.gpus());
      std::fflush(stderr);
      world.barrier();
      mismatch = true;
      return;
    }
    world.barrier();
    trace::Trace part = run_rank(c, world, rt::Recorder::Clock::now());
    if (c.opt.record_trace) tr = rt::gather_trace(world, part);
  });
  if (mismatch)
    throw InputError("mpirun -np: the process count differs from the layout's tp*pp*dp = " +
                     std::to_string(c.layout.gpus()) + " (every rank printed the details above)");
}
#endif

}  // namespace

int run(const Args& args) {
  cli::CommandLine cl("run", args, run_options(), 0);
  if (cl.print_help()) return 0;
  // A reader of the log that goes away (`tessel run ... | head`) must not kill a training run before it
  // saves its checkpoints and trace: writes to the closed pipe fail (EPIPE) and the run goes on.
  std::signal(SIGPIPE, SIG_IGN);
  const std::string backend = cl.get_or("--backend", "cpu");
  if (backend == "cuda") {
#ifdef TESSEL_HAVE_CUDA
    rt::cuda::CudaRunOptions o;
    o.model = load_model(cl.get_or("--model", "tiny"));
    o.layout = read_layout(cl);
    o.steps = static_cast<int>(cl.get_int("--steps", 1, 1 << 30).value_or(10));
    o.seed = static_cast<std::uint64_t>(cl.get_int("--seed", 0, INT64_MAX).value_or(1234));
    if (auto lr = cl.get_double("--lr", 0.0, 10.0)) o.lr = static_cast<float>(*lr);
    o.trace_path = cl.get_or("--trace", "");
    if (!o.trace_path.empty()) check_writable(o.trace_path, "--trace");
    o.only_rank = static_cast<int>(cl.get_int("--only-rank", 0, 1 << 20).value_or(-1));
    o.precision = cl.get_or("--precision", "bf16");
    o.gpu_threads = cl.flag("--gpu-threads");
    o.profile_kernels = cl.flag("--profile-kernels");
    o.data_file = cl.get_or("--data", "");
    o.save_every = static_cast<int>(cl.get_int("--save-every", 1, 1 << 30).value_or(0));
    o.checkpoint_dir = cl.get_or("--checkpoint-dir", "");
    o.resume = cl.get_or("--resume", "");
    if (!o.data_file.empty()) (void)rt::TokenStream::from_file(o.data_file, o.model.vocab);  // fail early
    o.start_step = check_checkpoint_flags(o.save_every, o.checkpoint_dir, o.resume, o.model, o.steps, o.seed, o.data_file);
    rt::check_runnable(o.model, o.layout);
    return rt::cuda::run_cuda(o);
#else
    throw InputError("--backend cuda: this build has no CUDA runtime (CUDA/NCCL not found at configure time); use --backend cpu");
#endif
  }
  if (backend != "cpu") throw InputError("--backend " + backend + ": unknown backend (choose cpu or cuda)");
  for (const char* f : {"--only-rank", "--precision", "--gpu-threads", "--profile-kernels", "--no-overlap", "--overlap-p2p"})
    if (cl.has(f))
      throw InputError(std::string(f) + ": only with --backend cuda (the CPU runtime is fp32, all ranks, and overlaps no communication)");
  RunConfig c;
  c.model = load_model(cl.get_or("--model", "tiny"));
  c.layout = read_layout(cl);
  // The CPU runtime keeps the softmax probabilities (Megatron's unfused core attention): say so in the
  // layout, so a simulation of it predicts its activation memory (docs/runtime.md).
  c.layout.attention = AttentionImpl::unfused;
  c.steps = static_cast<int>(cl.get_int("--steps", 1, 1 << 30).value_or(10));
  c.opt.seed = static_cast<std::uint64_t>(cl.get_int("--seed", 0, INT64_MAX).value_or(1234));
  if (auto lr = cl.get_double("--lr", 0.0, 10.0)) c.opt.optimizer.adamw.lr = static_cast<float>(*lr);
  c.opt.data_file = cl.get_or("--data", "");
  c.trace_path = cl.get_or("--trace", "");
  c.opt.record_trace = !c.trace_path.empty();
  c.save_every = static_cast<int>(cl.get_int("--save-every", 1, 1 << 30).value_or(0));
  c.checkpoint_dir = cl.get_or("--checkpoint-dir", "");
  c.resume = cl.get_or("--resume", "");
  if (!c.trace_path.empty()) check_writable(c.trace_path, "--trace");
  if (!c.opt.data_file.empty()) (void)rt::TokenStream::from_file(c.opt.data_file, c.model.vocab);  // fail early
  c.start_step = check_checkpoint_flags(c.save_every, c.checkpoint_dir, c.resume, c.model, c.steps, c.opt.seed,
                                        c.opt.data_file);
  rt::check_runnable(c.model, c.layout);

  kernels::cpu::gemm_set_single_thread();
  trace::Trace tr;
  const auto t0 = rt::Recorder::Clock::now();
  bool under_mpi = false;
#ifdef TESSEL_HAVE_MPI
  under_mpi = rt::launched_by_mpirun();
#endif
  check_fits_in_memory(c, under_mpi);
#ifdef TESSEL_HAVE_MPI
  if (under_mpi) run_under_mpi(c, tr);
#endif
  if (!under_mpi) {
    std::mutex mu;
    rt::run_threads(c.layout.gpus(), [&](rt::Comm& world) {
      trace::Trace part = run_rank(c, world, t0);
      std::lock_guard<std::mutex> lk(mu);
      merge_into(tr, std::move(part));
    });
  }
  // Under mpirun only rank 0 holds the gathered trace (process 0 has rank 0's name); others write nothing.
  if (!c.trace_path.empty() && !tr.process_names.empty()) {
    std::stable_sort(tr.events.begin(), tr.events.end(),
                     [](const trace::OpEvent& a, const trace::OpEvent& b) { return a.rank < b.rank; });
    std::stable_sort(tr.counters.begin(), tr.counters.end(),
                     [](const trace::Counter& a, const trace::Counter& b) { return a.rank < b.rank; });
    tr.other_data["model"] = model_to_json(c.model);
    tr.other_data["layout"] = layout_to_json(c.layout);
    tr.other_data["schedule"] = sched::name(c.layout.schedule);
    tr.other_data["system"] = "cpu";
    tr.other_data["tool"] = std::string("tessel ") + TESSEL_VERSION;
    // A resumed run's steps are numbered from the checkpoint's step + 1, as its step lines say; compare
    // numbers the trace's steps from here (absent: 1).
    if (c.start_step > 0) tr.other_data["first_step"] = c.start_step + 1;
    // Every rank a thread of this process: the cores they shared (calibrate warns when ranks outnumber them).
    // Under mpirun the ranks may span hosts, so nothing is claimed.
    if (!under_mpi && std::thread::hardware_concurrency() > 0)
      tr.other_data["host"] = {{"cores", std::thread::hardware_concurrency()}};
    trace::write_chrome_trace(tr, c.trace_path);
    std::printf("trace: %s (%zu events, %zu ranks)\n", c.trace_path.c_str(), tr.events.size(), tr.process_names.size());
  }
  return 0;
}

}  // namespace tessel::cmd
