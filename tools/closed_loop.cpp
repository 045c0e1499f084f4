// tessel calibrate --closed-loop (tools/closed_loop.hpp): the loop's layouts, its child processes, one repeat.
#include "tools/closed_loop.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "sim/calibrate/calibration.hpp"
#include "sim/calibrate/trace_events.hpp"
#include "sim/engine/sim_trace.hpp"
#include "sim/engine/simulate.hpp"
#include "traces/chrome.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/json_reader.hpp"

extern char** environ;

namespace tessel::cmd {

namespace {

namespace fs = std::filesystem;

// The closed-loop GPT: large enough that GEMMs, not per-op overheads, dominate a step; small enough that a
// step of 4 ranks takes well under a second on 2 cores. --quick: a tiny one for CI (mechanics only).
Json loop_model_json(bool quick) {
  Json m = {{"name", quick ? "quick-cpu" : "small-cpu"},
            {"source", "the closed loop's model (tessel calibrate --closed-loop, docs/calibration.md)"},
            {"params_b", quick ? 0.0001 : 0.0033}, {"layers", quick ? 2 : 4}, {"hidden", quick ? 64 : 256},
            {"heads", quick ? 4 : 8}, {"kv_heads", quick ? 4 : 8}, {"ffn", quick ? 256 : 1024},
            {"vocab", quick ? 256 : 512}, {"seq_len", quick ? 32 : 128}, {"activation", "gelu"}, {"norm", "layernorm"},
            {"position", "learned"}, {"tied_embeddings", true}, {"bias", true}, {"dropout", true}};
  return m;
}

LoopLayout L(std::string name, int tp, int pp, int dp, int mbs, int gbs, std::string schedule = "1f1b", int vpp = 1,
             std::string recompute = "none", bool sp = false, int zero = 0) {
  LoopLayout l;
  l.name = std::move(name);
  l.tp = tp, l.pp = pp, l.dp = dp, l.mbs = mbs, l.gbs = gbs, l.vpp = vpp;
  l.schedule = std::move(schedule), l.recompute = std::move(recompute), l.sp = sp, l.zero = zero;
  return l;
}

// Calibration runs: one rank alone (every kind at its alone rate, no waits) and a zero-bubble pipeline of two
// (input- and weight-gradient ops apart, so the weight-gradient class is told from the backward glue; both
// cores busy). Neither is among the held-out layouts.
// On a GPU the ranks of --gpu-threads share one device, which the scale fit (no per-kind bench rows there:
// trace_fit.hpp) does not model: the one-rank run alone.
std::vector<LoopLayout> calibration_layouts(const std::string& backend) {
  if (backend == "cuda") return {L("calib 1 rank", 1, 1, 1, 1, 4)};
  return {L("calib 1 rank", 1, 1, 1, 1, 4), L("calib pp2 zb1p", 1, 2, 1, 1, 8, "zb1p")};
}

// Held-out: 1, 2 and 4 ranks (on a 2-core machine: a core idle, both busy, ranks time-sharing them), every
// parallel dimension, schedules, micro-batch sizes and counts, recompute, SP and ZeRO.
std::vector<LoopLayout> held_out_layouts(bool quick, const std::string& backend) {
  if (quick) return {L("1 rank mbs2", 1, 1, 1, 2, 4), L("dp2", 1, 1, 2, 1, 4), L("tp2 pp2", 2, 2, 1, 1, 4)};
  if (backend == "cuda")
    return {L("1 rank mbs2 gbs8", 1, 1, 1, 2, 8), L("1 rank full recompute", 1, 1, 1, 1, 4, "1f1b", 1, "full"),
            L("tp2", 2, 1, 1, 1, 4), L("dp2 zero1 mbs2", 1, 1, 2, 2, 8, "1f1b", 1, "none", false, 1),
            L("pp2 1f1b", 1, 2, 1, 1, 8), L("pp2 interleaved", 1, 2, 1, 1, 8, "interleaved", 2), L("tp2 dp2", 2, 1, 2, 1, 8),
            L("tp2 pp2 1f1b", 2, 2, 1, 1, 8), L("pp2 dp2 zbv", 1, 2, 2, 1, 8, "zbv", 2), L("dp4", 1, 1, 4, 1, 8)};
  return {L("1 rank mbs2 gbs8", 1, 1, 1, 2, 8),
          L("1 rank full recompute", 1, 1, 1, 1, 4, "1f1b", 1, "full"),
          L("tp2", 2, 1, 1, 1, 4),
          L("tp2 sp selective mbs2", 2, 1, 1, 2, 8, "1f1b", 1, "selective", true),
          L("dp2 zero1 mbs2", 1, 1, 2, 2, 8, "1f1b", 1, "none", false, 1),
          L("dp2 full recompute", 1, 1, 2, 1, 8, "1f1b", 1, "full"),
          L("pp2 1f1b", 1, 2, 1, 1, 8),
          L("pp2 gpipe mbs2", 1, 2, 1, 2, 8, "gpipe"),
          L("pp2 interleaved", 1, 2, 1, 1, 8, "interleaved", 2),
          L("tp2 dp2", 2, 1, 2, 1, 8),
          L("tp2 pp2 1f1b", 2, 2, 1, 1, 8),
          L("pp2 dp2 zbv", 1, 2, 2, 1, 8, "zbv", 2),
          L("dp4", 1, 1, 4, 1, 8),
          L("pp4 1f1b", 1, 4, 1, 1, 8)};
}

// The same host model for ranks as processes (mpirun): two held-out layouts, where mpirun is found.
std::vector<LoopLayout> mpi_layouts() {
  LoopLayout a = L("dp2 (mpirun)", 1, 1, 2, 1, 8), b = L("tp2 pp2 1f1b (mpirun)", 2, 2, 1, 1, 8);
  a.mpi = b.mpi = true;
  return {a, b};
}

// What the runtime executes (docs/runtime.md): fp32 on the CPU, the unfused attention's memory (the
// probabilities kept), no communication overlapped (the CPU runtime reduces after the backward).
Layout to_layout(const LoopLayout& x, const std::string& backend) {
  Layout l;
  l.tp = x.tp, l.pp = x.pp, l.dp = x.dp, l.vpp = x.vpp, l.micro_batch = x.mbs, l.global_batch = x.gbs;
  l.schedule = sched::parse_schedule(x.schedule, "closed loop layout " + x.name);
  l.recompute = parse_recompute(x.recompute, "closed loop layout " + x.name);
  l.sequence_parallel = x.sp;
  l.zero_stage = x.zero;
  l.precision = backend == "cpu" ? Precision::fp32 : Precision::bf16;
  l.attention = backend == "cpu" ? AttentionImpl::unfused : AttentionImpl::flash;
  l.overlap_grad_reduce = l.overlap_param_gather = backend != "cpu";
  l.overlap_p2p = false;
  return l;
}

std::vector<std::string> run_flags(const LoopLayout& x) {
  std::vector<std::string> f = {"--tp", std::to_string(x.tp), "--pp", std::to_string(x.pp), "--dp", std::to_string(x.dp),
                                "--mbs", std::to_string(x.mbs), "--gbs", std::to_string(x.gbs), "--schedule", x.schedule,
                                "--vpp", std::to_string(x.vpp), "--recompute", x.recompute, "--zero", std::to_string(x.zero)};
  if (x.sp) f.push_back("--sp");
  return f;
}

double load_now() {
  double l[1] = {-1};
  return getloadavg(l, 1) == 1 ? l[0] : -1;
}

// Seconds of steal time the host's vCPUs have counted (/proc/stat's cpu line, eighth value, in USER_HZ
// ticks), or -1 where the kernel does not say.
double steal_s() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  unsigned long long v[8] = {};
  if (!(in >> cpu) || cpu != "cpu") return -1;
  for (auto& x : v)
    if (!(in >> x)) return -1;
  const long hz = sysconf(_SC_CLK_TCK);
  return hz > 0 ? static_cast<double>(v[7]) / static_cast<double>(hz) : -1;
}

std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }

// mpirun on the PATH, or "" (the loop then leaves its MPI layouts out).
std::string find_mpirun() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (std::size_t a = 0; a <= dirs.size();) {
    const std::size_t b = std::min(dirs.find(':', a), dirs.size());
    const fs::path p = fs::path(dirs.substr(a, b - a)) / "mpirun";
    if (b > a && ::access(p.c_str(), X_OK) == 0) return p.string();
    a = b + 1;
  }
  return "";
}

// Runs this executable with `args` (under `launcher`, e.g. mpirun and its flags, when given), stdout to
// `out`, stderr to `err`, and waits. A child that failed with bad input (exit 2) is an InputError with its
// message; any other failure an error naming the command.
void spawn_tessel(const std::vector<std::string>& args, const std::string& out, const std::string& err,
                  const std::vector<std::string>& launcher = {}) {
  const std::string self = self_exe();
  const std::string exe = launcher.empty() ? self : launcher.front();
  std::vector<std::string> all = launcher;
  all.push_back(self);
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("closed loop: cannot start " + exe + ": " + std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error("closed loop: waiting for tessel: " + std::string(std::strerror(errno)));
  std::string cmd = "tessel";
  for (const std::string& a : args) cmd += " " + a;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  std::string msg = read_text_file(err);
  if (msg.size() > 2000) msg = "..." + msg.substr(msg.size() - 2000);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 2) throw InputError("closed loop: `" + cmd + "` failed: " + msg);
  throw std::runtime_error("closed loop: `" + cmd + "` failed (status " + std::to_string(status) + "; stderr in " + err +
                           "): " + msg);
}

struct LoopContext {
  std::string backend = "cpu";
  std::string mpirun;  // its path; empty: no MPI layouts
  bool quick = false, gpu_threads = false;
  int steps = 6, cores = 1, runs = 3;
  std::string out, model_path;
  Model model;
};

std::vector<std::string> run_args(const LoopContext& c, const LoopLayout& x, const std::string& trace) {
  std::vector<std::string> a = {"run", "--backend", c.backend, "--model", c.model_path, "--steps", std::to_string(c.steps),
                                "--json", "--trace", trace};
  if (c.gpu_threads) a.push_back("--gpu-threads");
  const std::vector<std::string> f = run_flags(x);
  a.insert(a.end(), f.begin(), f.end());
  return a;
}

// The run's steady-state step time: the median of its steps after the first (warm-up), with their spread.
void measure(const LoopContext& c, const LoopLayout& x, const std::string& trace, LoopRow& row) {
  const std::string json = trace + ".run.json";
  // One process per rank under mpirun (--oversubscribe: more ranks than cores is the point; OpenMPI asks
  // root to say so), else every rank a thread of one process.
  std::vector<std::string> launcher;
  if (x.mpi)
    launcher = {c.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(x.ranks())};
  const double steal0 = steal_s();
  const auto wall0 = std::chrono::steady_clock::now();
  spawn_tessel(run_args(c, x, trace), json, trace + ".stderr", launcher);
  const double steal1 = steal_s();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  if (steal0 >= 0 && steal1 >= 0 && wall > 0) row.steal = std::max(0.0, steal1 - steal0) / (c.cores * wall);
  const Json doc = parse_json_file(json, "closed loop run ");
  std::vector<double> t, cpu, delay;
  for (const Json& s : doc.at("steps")) {
    t.push_back(s.at("seconds").get<double>());
    if (s.contains("cpu_s") && s.contains("run_delay_s")) {
      cpu.push_back(s.at("cpu_s").get<double>());
      delay.push_back(s.at("run_delay_s").get<double>());
    }
  }
  if (t.size() < 2) throw std::runtime_error("closed loop: " + json + " holds " + std::to_string(t.size()) + " steps");
  t.erase(t.begin());
  row.measured_s = calib::median_of(t);
  row.spread = calib::spread_of(t);
  if (cpu.size() == t.size() + 1) {
    cpu.erase(cpu.begin());
    delay.erase(delay.begin());
    std::vector<double> idle(t.size());  // the cores' time a step that no rank computed
    for (std::size_t i = 0; i < t.size(); ++i) idle[i] = c.cores * t[i] - cpu[i];
    row.measured_cpu_s = calib::median_of(cpu);
    row.measured_run_delay_s = calib::median_of(delay);
    row.measured_idle_s = calib::median_of(idle);
  }
}

std::vector<calib::BenchData> run_benches(const LoopContext& c, const std::string& dir) {
  std::vector<std::string> what = {"--what", c.quick ? "gemm,kernels,collectives" : "gemm,membw,kernels,collectives"};
  std::vector<calib::BenchData> benches;
  std::vector<int> threads = {1};
  if (c.backend == "cpu" && c.cores > 1) threads.push_back(c.cores);
  for (int n : threads) {
    std::vector<std::string> a = {"bench", "--backend", c.backend, "--json"};
    if (c.backend == "cpu") {
      a.insert(a.end(), what.begin(), what.end());
      if (n > 1) a.insert(a.end(), {"--concurrent", std::to_string(n)});
    } else if (c.quick) {
      // The mechanics only: the attention rows of small shapes (a fit of 3 quick GEMM rows on the fake CUDA's
      // CPU kernels, under load, can fail to determine a rate; the GEMMs then keep the base's numbers).
      a.insert(a.end(), {"--quick", "--what", "kernels"});
    }
    const std::string f = dir + "/bench_" + std::to_string(n) + ".json";
    spawn_tessel(a, f, f + ".stderr");
    benches.push_back(calib::load_bench(f));
  }
  return benches;
}

// Pass `pass` of a run's trace: <stem>.trace.json, <stem>.b.trace.json, <stem>.c.trace.json, ...
std::string pass_trace(const std::string& stem, int pass) {
  return stem + (pass == 0 ? "" : "." + std::string(1, static_cast<char>('a' + pass))) + ".trace.json";
}

// The runs of one layout by their median step, fastest first (ties in pass order): the first is the one kept.
std::vector<std::size_t> fastest_first(const std::vector<double>& steps) {
  std::vector<std::size_t> order(steps.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return steps[a] < steps[b]; });
  return order;
}

// `calib_runs`: every calibration run's median step, by layout and pass (the kept one, the fastest, is what the
// drift check measures again). `steal`: raised to the largest steal share of its runs.
calib::Calibration calibrate_repeat(const LoopContext& c, const std::string& dir, const std::vector<LoopLayout>& calib,
                                    std::string& profile_path, std::vector<std::vector<double>>& calib_runs,
                                    double& steal) {
  calib::CalibrationInputs in;
  in.benches = run_benches(c, dir);
  // The calibration layouts run --runs times too, a pass over them apart, and the fit takes the fastest run's
  // trace: a run slowed as a whole (a one-rank run measured at 299 ms a step against its usual 265-273 ms, 2026-12-06p)
  // would otherwise slow the whole profile, every held-out prediction with it.
  calib_runs.assign(calib.size(), {});
  for (int pass = 0; pass < c.runs; ++pass)
    for (std::size_t i = 0; i < calib.size(); ++i) {
      LoopRow run;
      measure(c, calib[i], pass_trace(dir + "/calib_" + std::to_string(i), pass), run);
      steal = std::max(steal, run.steal);
      calib_runs[i].push_back(run.measured_s);
    }
  for (std::size_t i = 0; i < calib.size(); ++i) {
    const int fast = static_cast<int>(fastest_first(calib_runs[i]).front());
    const std::string t = pass_trace(dir + "/calib_" + std::to_string(i), fast);
    in.traces.push_back(trace::read_chrome_trace(t));
    in.trace_origins.push_back(t);
  }
  in.base = load_system(c.backend == "cpu" ? "cpu" : "h200");
  in.name = "closed-loop";
  // The loop reports the noise instead of refusing: its numbers say how far a noisy fit goes.
  in.refuse_noise = 1e300;
  profile_path = dir + "/profile.json";
  in.output = profile_path;
  calib::Calibration cal = calib::calibrate(in);
  // --gpu-threads: every rank a thread on the one GPU, whose kernels they share as ranks share cores.
  if (c.backend == "cuda") {
    cal.fit.profile.host = HostSpec{};
    cal.fit.profile.host.cores = 1;
  }
  Json j = system_to_json(cal.fit.profile);
  j["source"] = cal.source;
  write_file_atomic(profile_path, j.dump(2) + "\n");
  return cal;
}

Json calibration_json(const calib::Calibration& cal) {
  Json j;
  Json kinds = Json::array();
  for (const auto& k : cal.fit.kinds)
    kinds.push_back({{"kind", to_string(k.kind)}, {"direction", k.backward ? "bwd" : "fwd"}, {"rate", k.rate}});
  j["kinds"] = kinds;
  Json cont = Json::object();
  for (const auto& k : cal.fit.contention) cont[to_string(k.kind)] = k.factor;
  j["contention"] = cont;
  j["bench_noise_pct"] = cal.fit.noise >= 0 ? Json(100 * cal.fit.noise) : Json(nullptr);
  if (cal.traced) {
    j["trace_method"] = cal.trace.method;
    j["trace_noise_pct"] = 100 * cal.trace.noise;
    j["glue_fwd_GBps"] = cal.trace.glue_fwd_Bps / 1e9;
    j["glue_bwd_GBps"] = cal.trace.glue_bwd_Bps / 1e9;
    j["wgrad_factor"] = cal.trace.wgrad_factor;
    Json ops = Json::array();
    for (const auto& k : cal.trace.kinds)
      ops.push_back({{"op", k.op}, {"measured_s", k.measured_s}, {"predicted_after_s", k.predicted_after_s}});
    j["trace_ops"] = ops;
    j["warnings"] = cal.trace.warnings;
  }
  return j;
}

// The prediction of one held-out layout on the profile, with its simulated trace for the per-op comparison.
void predict(const LoopContext& c, const LoopLayout& x, const System& profile, const std::string& measured_trace,
             LoopRow& row) {
  engine::SimOptions o;
  o.critical_path = false;
  const engine::SimReport r = engine::simulate(c.model, to_layout(x, c.backend), profile, o);
  row.predicted_s = r.step_s;
  row.error = row.predicted_s / row.measured_s - 1;
  const engine::TaskGraph& g = r.job.graph;
  if (g.host_cores > 0) {
    double cpu = 0;
    for (std::uint32_t k = 0; k < g.size(); ++k)
      if (g.compute_pos[k] >= 0) cpu += g.work[k] * g.host_threads;
    row.predicted_cpu_s = cpu;
    row.predicted_idle_s = g.host_cores * r.step_s - cpu;
  }
  const trace::Trace sim = engine::to_trace(r, profile);
  row.ops = calib::op_errors(trace::read_chrome_trace(measured_trace), sim, measured_trace);
}

// Held-out layout i's trace in pass 0, 1, 2, ...: heldout_<i>.trace.json, heldout_<i>.b.trace.json, .c, ...
std::string held_trace(const std::string& dir, std::size_t i, int pass) {
  return pass_trace(dir + "/heldout_" + std::to_string(i), pass);
}

std::string utc_now();

LoopRepeat one_repeat(const LoopContext& c, int rep, const std::vector<LoopLayout>& calib,
                      const std::vector<LoopLayout>& held) {
  LoopRepeat r;
  r.repeat = rep;
  r.load_before = load_now();
  const std::string dir = c.out + "/rep" + std::to_string(rep);
  fs::create_directories(dir);
  const calib::Calibration cal = calibrate_repeat(c, dir, calib, r.profile, r.calibration_runs_s, r.steal);
  r.calibration_noise = cal.noise;
  r.contention_noise = cal.contention_noise;
  r.contention_unsteady = calib::contention_unsteady_text(cal.fit);
  r.calibration = calibration_json(cal);
  // c.runs passes over the held-out layouts: a run disturbed as a whole (slower throughout, its steps steady)
  // is caught by the same layout's runs of the other passes, and the fastest is kept. Disturbances on this
  // host only slow a run, so the fastest of several is the run nearest the layout's own step (in the sets of
  // 2026-12-05t..06m, the predictions ranked the fastest of a layout's six runs over three repeats at tau
  // 0.66-0.93, against 0.56-0.91 for the faster of one repeat's two: docs/calibration.md).
  std::vector<std::vector<LoopRow>> runs(held.size(), std::vector<LoopRow>(static_cast<std::size_t>(c.runs)));
  for (int pass = 0; pass < c.runs; ++pass)
    for (std::size_t i = 0; i < held.size(); ++i) {
      LoopRow& run = runs[i][static_cast<std::size_t>(pass)];
      measure(c, held[i], held_trace(dir, i, pass), run);
      r.steal = std::max(r.steal, run.steal);
    }
  std::vector<double> pred, meas, abs_err, op_err, spreads, run_to_run;
  for (std::size_t i = 0; i < held.size(); ++i) {
    std::vector<double> steps;
    for (const LoopRow& run : runs[i]) steps.push_back(run.measured_s);
    const std::vector<std::size_t> order = fastest_first(steps);
    const int fast = static_cast<int>(order[0]);
    LoopRow row = runs[i][order[0]];
    row.layout = held[i].name;
    row.ranks = held[i].ranks();
    row.runs_s = steps;
    for (const LoopRow& run : runs[i]) row.steal = std::max(row.steal, run.steal);
    row.other_run_s = order.size() > 1 ? steps[order[1]] : 0;
    run_to_run.push_back(row.run_to_run());
    const std::string t = held_trace(dir, i, fast);
    predict(c, held[i], cal.fit.profile, t, row);
    pred.push_back(row.predicted_s);
    meas.push_back(row.measured_s);
    abs_err.push_back(std::abs(row.error));
    spreads.push_back(row.spread);
    for (const calib::OpError& e : row.ops) op_err.push_back(std::abs(e.error));
    std::cerr << "closed loop: repeat " << rep << ", " << row.layout << ": measured " << row.measured_s * 1e3
              << " ms (the next-fastest run " << row.other_run_s * 1e3 << "), predicted " << row.predicted_s * 1e3 << " ms ("
              << 100 * row.error << "%)\n";
    r.rows.push_back(std::move(row));
  }
  r.median_abs_error = calib::median_of(abs_err);
  r.op_median_abs_error = calib::median_of(op_err);
  r.kendall_tau = calib::kendall_tau(pred, meas);
  r.measurement_noise = calib::median_of(spreads);
  r.run_to_run = calib::median_of(run_to_run);
  for (std::size_t i = 0; i < calib.size(); ++i) {
    LoopRow again;
    measure(c, calib[i], dir + (i == 0 ? std::string("/drift") : "/drift_" + std::to_string(i)) + ".trace.json", again);
    const std::vector<double>& kept = r.calibration_runs_s[i];
    const double from = kept[fastest_first(kept).front()];
    const double moved = std::abs(again.measured_s / from - 1);
    if (moved >= r.drift) {
      r.drift = moved;
      r.drift_layout = calib[i].name;
      r.drift_from_s = from;
      r.drift_to_s = again.measured_s;
    }
    r.steal = std::max(r.steal, again.steal);
  }
  r.trusted = r.calibration_noise <= calib::kNoiseFlag && r.contention_noise <= calib::kNoiseFlag &&
              r.measurement_noise <= calib::kNoiseFlag && r.run_to_run <= calib::kNoiseFlag && r.drift <= calib::kNoiseFlag &&
              r.steal <= calib::kNoiseFlag;
  // The profile's own band (estimate and explore print it beside every step time): the mean |step error| of
  // the held-out layouts it was checked on, which replaces the base's band the fit dropped (calibrate.cpp).
  // An untrusted repeat's errors say more about the machine than about the profile: it gets none.
  if (r.trusted && !abs_err.empty()) {
    double sum = 0;
    for (double e : abs_err) sum += e;
    Json p = parse_json_file(r.profile);
    int lo = 1 << 30, hi = 0;
    for (const LoopRow& row : r.rows) lo = std::min(lo, row.ranks), hi = std::max(hi, row.ranks);
    std::ostringstream basis;
    basis << "tessel calibrate --closed-loop, repeat " << rep << " (" << utc_now() << "): mean |predicted / measured step - 1| of "
          << abs_err.size() << " held-out layouts (" << lo << " to " << hi << " ranks) run on this host, the profile fitted without them";
    p["error_band"] = error_band_to_json(ErrorBand{"held-out", 100 * sum / static_cast<double>(abs_err.size()),
                                                   static_cast<int>(abs_err.size()), basis.str(), "layouts run on this host"});
    write_file_atomic(r.profile, p.dump(2) + "\n");
  }
  r.load_after = load_now();
  return r;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

int closed_loop(const cli::CommandLine& cl) {
  for (const char* f : {"--bench", "--trace", "--published", "--only", "-o", "--base-system", "--comm", "--max-ranks",
                        "--name", "--max-noise"})
    if (cl.has(f))
      throw InputError(std::string(f) + ": not with --closed-loop, which measures its own bench and traces and writes "
                       "its profiles under --out");
  LoopContext c;
  c.backend = cl.get_or("--backend", "cpu");
  if (c.backend != "cpu" && c.backend != "cuda") throw InputError("--backend " + c.backend + ": expected cpu or cuda");
  c.gpu_threads = cl.flag("--gpu-threads");
  if (c.gpu_threads && c.backend != "cuda") throw InputError("--gpu-threads: only with --backend cuda (ranks as threads on one GPU)");
  if (c.backend == "cuda" && !c.gpu_threads)
    throw InputError("--backend cuda: the loop runs several ranks on the one GPU as threads; give --gpu-threads");
  c.quick = cl.flag("--quick");
  c.steps = static_cast<int>(cl.get_int("--steps", 3, 1000).value_or(c.quick ? 3 : 6));
  // At least 2: only a second run shows a disturbance that lasts a whole run (its steps steady).
  c.runs = static_cast<int>(cl.get_int("--runs", 2, 10).value_or(c.quick ? 2 : 3));
  const int repeats = static_cast<int>(cl.get_int("--repeats", 1, 100).value_or(1));
  c.out = cl.get_or("--out", "closed_loop");
  c.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  fs::create_directories(c.out);
  if (auto svg = cl.get("--svg")) check_writable(*svg, "--svg");
  c.model_path = c.out + "/model.json";
  const Json mj = loop_model_json(c.quick);
  write_file_atomic(c.model_path, mj.dump(2) + "\n");
  c.model = parse_model(mj, c.model_path);
  LoopResult res;
  res.backend = c.backend;
  res.quick = c.quick;
  res.cores = c.cores;
  res.runs = c.runs;
  res.model = c.model;
  res.calibration = calibration_layouts(c.backend);
  res.held_out = held_out_layouts(c.quick, c.backend);
  if (c.backend == "cpu" && !c.quick && !cl.flag("--no-mpi")) c.mpirun = find_mpirun();
  if (!c.mpirun.empty())
    for (const LoopLayout& l : mpi_layouts()) res.held_out.push_back(l);
  for (int rep = 0; rep < repeats; ++rep) res.repeats.push_back(one_repeat(c, rep, res.calibration, res.held_out));
  res.date = utc_now();
  const Json doc = loop_to_json(res);
  write_file_atomic(c.out + "/results.json", doc.dump(2) + "\n");
  if (auto svg = cl.get("--svg")) write_file_atomic(*svg, loop_svg(res));
  if (cl.flag("--json")) std::cout << doc.dump(2) << "\n";
  else print_loop(res);
  return 0;
}

}  // namespace tessel::cmd
