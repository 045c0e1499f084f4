// tessel explore: rank the layouts of a model on a cluster (analytical tier for all, event-simulated tier
// for the best), with reasons for every rejection.
#include <algorithm>
#include <chrono>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <sstream>

#include "util/atomic_file.hpp"
#include "sim/engine/sim_trace.hpp"
#include "sim/engine/simulate.hpp"
#include "sim/explore/explore.hpp"
#include "sim/partition.hpp"
#include "sim/stage_split.hpp"
#include "sim/layout_words.hpp"
#include "sim/recipe.hpp"
#include "sim/stack.hpp"
#include "traces/chrome.hpp"
#include "traces/select.hpp"
#include "traces/svg.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"
#include "tools/format.hpp"
#include "tools/spec_args.hpp"
#include "util/csv.hpp"
#include "util/units.hpp"
#include "tools/goodput_args.hpp"
#include "tools/system_args.hpp"

namespace tessel::cmd {

namespace {
// The layout's first broken rule with the even split in place of its missing one: whether the partitioner may
// price it (a layout broken otherwise keeps its own rule for explain to report).
bool layout_problem_without_split(const Layout& l, const Model& m, int gpus) {
  Layout even = l;
  even.stage_layers = even_split(m.layers, l.num_stages());
  return layout_problem(even, m, gpus).has_value();
}
}  // namespace

namespace {


std::vector<Recompute> recompute_list(const cli::CommandLine& cl) {
  std::vector<Recompute> r;
  for (const auto& s : cl.get_list("--recompute")) r.push_back(parse_recompute(s, "--recompute"));
  return r;
}

// A progress bar on stderr per phase, with the time left estimated from the phase's rate so far; cleared
// when the phase ends. Only on a terminal and never under --json (explore() decides).
class ProgressBar {
 public:
  void operator()(const char* phase, double f) {
    const auto now = std::chrono::steady_clock::now();
    if (phase_ != phase) {
      phase_ = phase;
      start_ = now;
    }
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(std::clamp(f, 0.0, 1.0) * kWidth);
    std::string eta = "";
    if (f > 0.02 && f < 1.0) eta = "  about " + fmt::seconds(elapsed * (1.0 - f) / f) + " left";
    std::fprintf(stderr, "\r%-11s [%s%s] %3d%%%-28s", phase, std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, ' ').c_str(), static_cast<int>(100 * f), eta.c_str());
    if (f >= 1.0) std::fprintf(stderr, "\r%s\r", std::string(80, ' ').c_str());
    std::fflush(stderr);
  }

 private:
  std::string phase_;
  std::chrono::steady_clock::time_point start_;
};

// The time-to-train columns are there when the search was given the job (--tokens or --steps).
bool has_time_to_train(const std::vector<explore::Scored>& rows) { return !rows.empty() && rows.front().plan; }

// Numbers as the stream writes them (6 significant digits), so the CSV reads as before.
std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string csv_of(const explore::Result& r) {
  const bool ttt = has_time_to_train(r.top);
  std::vector<std::string> head = {"rank", "layout", "tier", "step_s", "tokens_per_s", "model_tflops_per_gpu", "mfu",
                                   "bubble_fraction", "exposed_comm_s", "peak_memory_GiB", "headroom_GiB"};
  if (ttt) head.insert(head.end(), {"days", "goodput", "save_s", "interval_s"});
  std::string out = csv_row(head);
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    const auto& s = r.top[i];
    const double scale = s.analytical_step_s / s.step_s;
    std::vector<std::string> row = {std::to_string(i + 1), s.layout.describe(), s.tier, num(s.step_s),
                                    num(s.tokens_per_s * scale), num(s.tflops_per_gpu * scale), num(s.mfu * scale),
                                    num(s.bubble), num(s.exposed_comm_s), num(s.peak_memory_bytes / kGiB),
                                    num((s.capacity_bytes - s.peak_memory_bytes) / kGiB)};
    if (ttt)
      row.insert(row.end(), {num(s.plan->days), num(s.plan->goodput), num(s.plan->ckpt.blocking_s), num(s.plan->interval_s)});
    out += csv_row(row);
  }
  return out;
}

void print_rows(const std::vector<explore::Scored>& rows) {
  const bool ttt = has_time_to_train(rows);
  std::vector<std::vector<std::string>> t = {{"#", "layout", "step", "tokens/s", "model TFLOP/s/GPU", "MFU", "bubble*",
                                              "exposed comm*", "peak mem", "headroom"}};
  if (ttt) t.front().insert(t.front().end(), {"days", "goodput", "save", "interval"});
  t.front().push_back("tier");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& s = rows[i];
    const double scale = s.analytical_step_s / s.step_s;
    t.push_back({std::to_string(i + 1), s.layout.describe(), fmt::seconds(s.step_s), fmt::si(s.tokens_per_s * scale, ""),
                 fmt::rate(s.tflops_per_gpu * scale), fmt::pct(s.mfu * scale), fmt::pct(s.bubble),
                 fmt::seconds(s.exposed_comm_s), fmt::gib(s.peak_memory_bytes), fmt::gib(s.capacity_bytes - s.peak_memory_bytes)});
    if (ttt)
      t.back().insert(t.back().end(), {fmt::fixed(s.plan->days, 1), fmt::pct(s.plan->goodput),
                                       fmt::seconds(s.plan->ckpt.blocking_s), fmt::seconds(s.plan->interval_s)});
    t.back().push_back(s.tier);
  }
  std::cout << fmt::table(t);
}

// What the columns are, one definition for both tiers (docs/explore.md says the same).
void print_legend() {
  std::cout << "model TFLOP/s/GPU and MFU count the model's forward and backward FLOPs (no recompute: estimate's "
               "'model TFLOP/s/GPU'; its 'TFLOP/s/GPU, Narayanan eq. 3 (full recompute)' counts a full recompute's forward too), "
               "attention counted full (non-causal) as Megatron-LM and PaLM do; --json's mfu_causal counts half of it.\n"
               "* of the busiest pipeline rank (the most busy time), in either tier: bubble is its idle share of the "
               "step; exposed comm the pipeline and data-parallel communication it waits on, not hidden behind its "
               "compute (TP and CP collectives block the compute stream: they are busy time).\n";
}

// What the time-to-train columns are (docs/goodput.md), and what ranked the rows.
void print_time_to_train_legend(const cli::CommandLine& cl, const goodput::Job& job, explore::Objective objective) {
  std::cout << "days, goodput: the expected time to train " << cli::job_length_text(cl, job)
            << " under failures at the row's step time (Daly's closed form); save: what each checkpoint stops training "
               "for; interval: Daly's, in whole steps (docs/goodput.md). Ranked by "
            << (objective == explore::Objective::time_to_train ? "the time to train" : "step time (--objective time-to-train ranks by days)")
            << ".\n";
}

// The search space from the restriction flags (empty: every sensible value), tp's node limit and precision.
explore::Space space_of(const cli::CommandLine& cl, const System& sys) {
  explore::Space space;
  for (auto v : cl.get_int_list("--tp", 1, 1 << 16)) space.tp.push_back(static_cast<int>(v));
  for (auto v : cl.get_int_list("--pp", 1, 1 << 16)) space.pp.push_back(static_cast<int>(v));
  for (auto v : cl.get_int_list("--cp", 1, 1 << 16)) space.cp.push_back(static_cast<int>(v));
  for (auto v : cl.get_int_list("--ep", 1, 1 << 16)) space.ep.push_back(static_cast<int>(v));
  for (auto v : cl.get_int_list("--etp", 1, 1 << 16)) space.etp.push_back(static_cast<int>(v));
  for (auto v : cl.get_int_list("--vpp", 1, 1024)) space.vpp.push_back(static_cast<int>(v));
  for (auto v : cl.get_int_list("--mbs", 1, 1 << 16)) space.mbs.push_back(static_cast<int>(v));
  for (auto v : cl.get_int_list("--zero", 0, 3)) space.zero.push_back(static_cast<int>(v));
  for (const auto& s : cl.get_list("--schedule")) {
    space.schedules.push_back(sched::parse_schedule(s, "--schedule", true));
  }
  if (cl.has("--recompute")) space.recompute = recompute_list(cl);
  if (auto sp = cl.get("--sp")) {
    if (*sp == "on") space.sp = {1};
    else if (*sp == "off") space.sp = {0};
    else if (*sp != "both") throw InputError("--sp " + *sp + ": must be on, off or both");
  }
  if (auto v = cl.get("--moe-a2a-overlap")) {
    if (*v == "on") space.a2a_overlap = {1};
    else if (*v == "off") space.a2a_overlap = {0};
    else if (*v != "both") throw InputError("--moe-a2a-overlap " + *v + ": must be on, off or both");
    const auto listed = [&](sched::Kind k) {
      return space.schedules.empty() || std::find(space.schedules.begin(), space.schedules.end(), k) != space.schedules.end();
    };
    const bool pp1 = space.pp.empty() || std::find(space.pp.begin(), space.pp.end(), 1) != space.pp.end();
    if (*v == "on" && !listed(sched::Kind::dualpipev) && !listed(sched::Kind::interleaved) && !pp1)
      throw InputError("--moe-a2a-overlap on: the overlap is modelled in F&B blocks, DualPipeV's or Megatron-Core's "
                       "combined 1F1B (interleaved, or pp 1), and neither --schedule nor --pp leaves one");
  }
  for (const auto& d : cl.get_list("--moe-dispatcher")) {
    if (d != "alltoall" && d != "deepep")
      throw InputError("--moe-dispatcher " + d + ": unknown dispatcher; list alltoall (NCCL's all-to-all) and/or deepep "
                       "(DeepEP's node-limited dispatch)");
    const int v = d == "deepep" ? 1 : 0;
    if (std::find(space.deepep.begin(), space.deepep.end(), v) == space.deepep.end()) space.deepep.push_back(v);
  }
  // tp stays within a node unless --allow-tp-across-nodes, or a --tp value above the node asks for more;
  // with --max-tp-inside-node given as well that request contradicts it and is refused.
  bool tp_beyond_node = false;
  for (int t : space.tp) {
    if (t <= sys.node.gpus_per_node) continue;
    if (cl.has("--max-tp-inside-node"))
      throw InputError("--tp " + std::to_string(t) + " exceeds the " + std::to_string(sys.node.gpus_per_node) +
                       " GPUs per node of " + sys.name + ", and --max-tp-inside-node keeps tp within one node; drop "
                       "one of them (or give --allow-tp-across-nodes instead)");
    tp_beyond_node = true;
  }
  space.max_tp_inside_node = !cl.has("--allow-tp-across-nodes") && !tp_beyond_node;
  space.uneven = !cl.has("--no-uneven");
  space.precision = parse_precision(cl.get_or("--precision", "bf16"), "--precision");
  if (sys.gpu.peak(space.precision) <= 0)
    throw InputError("--precision " + to_string(space.precision) + ": not supported by " + sys.gpu.name);
  return space;

}

// --trace-best / --svg-best: the winner's step with its memory timeline, as simulate --trace / --svg write it:
// one data-parallel replica (the others play the same schedule; their traffic still loads the shared links),
// the ranks --trace-ranks names, and in the SVG each run of identical ranks (a stage's tensor-parallel
// ranks) drawn once, so the picture of a 1,024-GPU layout is its pipeline.
void write_best(const Model& m, const System& sys, const Layout& winner, const cli::CommandLine& cl) {
  engine::SimOptions o;
  o.memory_timeline = true;
  o.fidelity = engine::Fidelity::replica;
  const engine::SimReport best = engine::simulate(m, winner, sys, o);
  trace::Trace t = engine::to_trace(best, sys);
  if (auto ranks = cl.get("--trace-ranks"))
    t = trace::select_ranks(t, trace::parse_rank_list(*ranks, "--trace-ranks", winner.gpus()));
  if (auto p = cl.get("--trace-best")) trace::write_chrome_trace(t, *p);
  if (auto p = cl.get("--svg-best")) {
    trace::SvgOptions so;
    so.title = m.name + " " + winner.describe() + ", one data-parallel replica, step " + fmt::seconds(best.step_s);
    write_file_atomic(*p, trace::timeline_svg(trace::collapse_identical_ranks(t), so));
  }
}

// The human report: the ranked rows, what the columns are, the counts, the rejections (and the Pareto front).
void print_text(const Model& m, const System& sys, int gpus, int gbs, const explore::Result& r, bool pareto,
                const cli::CommandLine& cl, const explore::Options& opt) {
  std::cout << m.name << " (" << fmt::fixed(m.total_params() / 1e9, 1) << "B) on " << gpus << " x " << sys.gpu.name
            << ", global batch " << gbs << ", sequence " << m.seq_len;
  if (auto rc = cl.get("--recipe")) std::cout << ", recipe " << *rc << " (stack " << load_recipe(*rc, m.name).stack << ")";
  else if (auto st = cl.get("--stack")) std::cout << ", stack " << load_stack(*st).name;
  if (!r.top.empty() && r.top.front().layout.precision == Precision::fp8)
    std::cout << ", fp8 with " << to_string(r.top.front().layout.fp8_recipe) << " scaling";
  if (!r.top.empty() && r.top.front().layout.runs_fa2())
    std::cout << ", FlashAttention-2";
  if (!r.top.empty() && r.top.front().layout.unfused.any())
    std::cout << ", unfused " << to_string(r.top.front().layout.unfused);
  std::cout << "\nstep times " << fmt::band(sys.step_band(m.moe.enabled()), m.moe.enabled()) << "\n";
  // Without a stack the search is wider than any one training stack runs: the rows may use a schedule, an
  // overlap and a kernel together that no published run combined (the band's rows each ran on one stack).
  if (!cl.has("--recipe") && !cl.has("--stack")) {
    std::string names;
    for (const std::string& n : stack_names()) names += (names.empty() ? "" : ", ") + n;
    std::cout << "no --stack: every schedule, recompute policy, ZeRO stage and overlap Tessel models, more than any one "
                 "training stack runs; --stack NAME searches what one runs ("
              << names << "; docs/stacks.md)\n";
  }
  std::cout << "\n";
  print_rows(r.top);
  print_legend();
  if (opt.job) print_time_to_train_legend(cl, *opt.job, opt.objective);
  std::cout << "\n" << r.enumerated << " layouts enumerated, " << r.scored << " fit and were scored analytically, "
            << r.simulated << " re-scored by the event simulator";
  if (r.too_large > 0)
    std::cout << " (" << r.too_large << " over its size limit kept the analytical score: tier 'analytical')";
  std::cout << "\n";
  std::cout << "rejected (by the first rule each layout breaks):\n";
  for (const auto& x : r.rejected) std::cout << "  " << x.count << " x " << x.rule << " (e.g. " << x.example << ")\n";
  if (pareto) {
    std::cout << "\nPareto front (step time vs peak memory):\n";
    print_rows(r.pareto);
  }
}

// The message when nothing fits: the sizes that cannot divide the GPU count, or the counts per first broken
// rule, the smallest peak memory, the nearest misses and the restriction flag to lift.
std::string nothing_fits_message(const Model& m, const System& sys, int gpus, int gbs, const explore::Result& r,
                                 const explore::NothingFits& why) {
  std::ostringstream os;
  if (!why.indivisible.empty()) {
    os << "no layout of " << m.name << " to enumerate on " << gpus << " GPUs with global batch " << gbs << ": ";
    for (std::size_t i = 0; i < why.indivisible.size(); ++i)
      os << (i ? "; " : "") << "--" << why.indivisible[i].dimension << " " << why.indivisible[i].size
         << " does not divide --gpus " << gpus;
    return os.str();
  }
  os << "no layout of " << m.name << " fits on " << gpus << " x " << sys.gpu.name << " with global batch " << gbs
     << " (" << r.enumerated << " enumerated";
  for (const auto& x : r.rejected) os << "; " << x.count << " rejected by " << x.rule << " first";
  os << ")";
  if (r.smallest_peak > 0)
    os << "; the smallest peak memory found was " << fmt::gib(r.smallest_peak) << " (" << r.smallest_peak_layout
       << ") of " << fmt::gib(sys.gpu.memory_bytes);
  // Counted over the space with the micro-batch sizes the batch does not divide (enumeration skips them).
  std::string only;
  for (const auto& c : why.rules)
    if (c.only > 0) only += std::string(only.empty() ? "" : "; ") + std::to_string(c.only) + " break only " + c.rule + " (e.g. " + c.example + ")";
  if (!only.empty())
    os << "; layouts that break a single layout rule (lifting it would leave them to the memory check): " << only;
  else if (!why.rules.empty())
    os << "; every layout of the space that breaks a layout rule breaks at least two, so no single rule is to blame";
  if (!why.lift.empty())
    os << "; the restriction that removed the most is --" << why.lift << " (without it " << why.lift_fit << " layouts fit)";
  return os.str();
}

}  // namespace

int explore(const Args& args) {
  std::vector<cli::OptionSpec> options = {
       {"--model", true, "model preset or JSON file [gpt3-175b]"},
       {"--system", true, "system preset or JSON file [dgx-a100]"},
       {"--min-headroom", true, cli::kMinHeadroomHelp},
       {"--fragmentation", true, cli::kFragmentationHelp},
       {"--gpus-per-domain", true, cli::kGpusPerDomainHelp},
       {"--gpus", true, "number of GPUs [1024]"},
       {"--gbs", true, "global batch size in sequences [1536]"},
       {"--seq", true, "sequence length (overrides the model's)"},
       {"--tp", true, "restrict tensor-parallel sizes (comma list; one above a node's GPUs implies --allow-tp-across-nodes)"},
       {"--pp", true, "restrict pipeline sizes"},
       {"--cp", true, "restrict context-parallel sizes"},
       {"--ep", true, "restrict expert-parallel sizes (MoE models) [powers of two dividing the experts]"},
       {"--etp", true, "restrict expert tensor-parallel sizes (MoE models) [1 and tp]"},
       {"--moe-a2a-overlap", true, "MoE all-to-alls hidden in F&B blocks (DualPipeV; Megatron-Core's combined 1F1B: interleaved, or pp 1): on, off or both [both, where ep > 1]"},
       {"--moe-dispatcher", true, "restrict MoE token dispatchers (alltoall,deepep) [both; deepep where the ep group crosses nodes]"},
       {"--vpp", true, "restrict chunks per rank (interleaved)"},
       {"--mbs", true, "restrict micro-batch sizes"},
       {"--schedule", true, "restrict schedules (gpipe,1f1b,interleaved,looped-bfs,zb1p,zb2p,zbv,dualpipev)"},
       {"--recompute", true, "restrict recompute policies (none,selective,full)"},
       {"--sp", true, "sequence parallel: on, off or both [both]"},
       {"--zero", true, "restrict optimizer sharding stages (0,1,2,3)"},
       {"--precision", true, "bf16|fp16|fp8|fp32 [bf16]"},
       {"--attention", true, "flash|unfused [flash]"},
       {"--fp8-recipe", true, "fp8 scaling: delayed, current or mxfp8 (Blackwell); needs --precision fp8 (docs/stacks.md) [delayed, or the stack's]"},
       {"--fp8-param-gather", false, cli::kFp8ParamGatherHelp},
       {"--no-fp8-param-gather", false, cli::kNoFp8ParamGatherHelp},
       {"--cross-entropy", true, "the LM loss: megatron, megatron-fused or te (docs/stacks.md) [megatron, or the stack's]"},
       {"--flash-kernel", true, "the flash attention kernel: cudnn or fa2 (docs/stacks.md) [cudnn, or the stack's]"},
       {"--unfused", true, "element-wise kernels run one op a kernel, as PyTorch eager runs them: norm, act, rope (comma-separated) or none (docs/stacks.md) [none, or the stack's]"},
       {"--main-grads", true, "every layout's gradient buffer and DP reduction: fp32 or bf16 [fp32]"},
       {"--moments", true, "every layout's Adam moments: fp32 or bf16 [fp32]"},
       {"--master-weights", true, "every layout's master weights: fp32, remainder or none [fp32]"},
       {"--stack", true, "software stack (preset or JSON): search only what it runs, with its attention and overlaps (docs/stacks.md)"},
       {"--recipe", true, "what a release ran for this model (sim/recipes/: nemo-24.07, dgxc-24.11): its stack, and its recompute, SP, TP overlap, loss and state dtypes on every layout unless a flag says otherwise (docs/stacks.md)"},
       {"--tp-comm-overlap", false, "sequence-parallel layouts overlap TP communication with the GEMMs (Megatron --tp-comm-overlap) [off]"},
       {"--allow-tp-across-nodes", false, "let tp exceed the GPUs of one node (default tp values up to 64)"},
       {"--max-tp-inside-node", false, "keep tp within one node (the default; a --tp value above the node is then refused)"},
       {"--no-uneven", false, "even splits only: no time-balanced split for each pp and vpp"},
       {"--top", true, "rows to show [10]"},
       {"--simulate-k", true, "layouts the event simulator re-scores [adaptive]"},
       {"--no-simulate", false, "analytical tier only"},
       {"--threads", true, "worker threads [all cores]"},
       {"--pareto", false, "also print the Pareto front of step time against peak memory"},
       {"--explain", true, "explain one layout (words as printed, or a layout JSON file)"},
       {"--json", false, "print one JSON document"},
       {"--csv", true, "also write the top rows as CSV to this file"},
       {"--trace-best", true, "write the simulator's Chrome trace of the winner"},
       {"--svg-best", true, "write the simulator's SVG timeline of the winner (one replica, identical ranks once)"},
       {"--trace-ranks", true, "only these ranks in --trace-best / --svg-best: 0-7,64 [one replica's]"},
       {"--objective", true, "rank by step or time-to-train (needs --tokens or --steps) [step]"}};
  for (auto& o : cli::goodput_options()) options.push_back(std::move(o));
  cli::CommandLine cl("explore", args, options, 0);
  if (cl.print_help()) return 0;
  Model m = load_model(cl.get_or("--model", "gpt3-175b"), cl.get_int("--seq", 1, 1 << 24));
  const System sys = cli::read_system(cl, "dgx-a100");
  const int gpus = static_cast<int>(cl.get_int("--gpus", 1, sys.max_gpus).value_or(1024));
  const int gbs = static_cast<int>(cl.get_int("--gbs", 1, 1 << 30).value_or(1536));
  if (cl.has("--allow-tp-across-nodes") && cl.has("--max-tp-inside-node"))
    throw InputError("--allow-tp-across-nodes and --max-tp-inside-node contradict each other");
  for (const char* f : {"--csv", "--trace-best", "--svg-best"})
    if (auto p = cl.get(f)) check_writable(*p, f);

  explore::Space space = space_of(cl, sys);
  if (!m.moe.enabled())
    for (const char* f : {"--ep", "--etp", "--moe-dispatcher", "--moe-a2a-overlap"})
      if (auto v = cl.get(f))
        throw InputError(std::string(f) + " " + *v + ": model " + m.name + " has no experts (expert parallelism needs a "
                         "mixture-of-experts model)");

  explore::Options opt;
  opt.top_n = static_cast<int>(cl.get_int("--top", 1, 10000000).value_or(10));
  opt.simulate_k = static_cast<int>(cl.get_int("--simulate-k", 1, 100000).value_or(0));
  opt.threads = static_cast<int>(cl.get_int("--threads", 1, 1024).value_or(0));
  if (!cl.has("--no-simulate")) opt.simulate = explore::event_simulator(m, sys);
  opt.job = cli::read_goodput_job(cl, m, gbs, sys);
  const std::string objective = cl.get_or("--objective", "step");
  if (objective != "step" && objective != "time-to-train")
    throw InputError("--objective " + objective + ": must be step or time-to-train");
  if (objective == "time-to-train" && !opt.job)
    throw InputError("--objective time-to-train: needs the job's length, --tokens N or --steps N");
  opt.objective = objective == "step" ? explore::Objective::step : explore::Objective::time_to_train;
  const bool json = cl.flag("--json");
  if (!json && ::isatty(2)) opt.progress = ProgressBar{};

  const std::string attn = cl.get_or("--attention", "flash");
  if (attn != "flash" && attn != "unfused") throw InputError("--attention " + attn + ": must be flash or unfused");
  space.attention = attn == "flash" ? AttentionImpl::flash : AttentionImpl::unfused;
  space.tp_comm_overlap = cl.flag("--tp-comm-overlap");
  if (auto c = cl.get("--cross-entropy")) space.cross_entropy = parse_cross_entropy(*c, "--cross-entropy");
  if (auto r = cl.get("--fp8-recipe")) {
    space.fp8_recipe = parse_fp8_recipe(*r, "--fp8-recipe");
    if (space.precision != Precision::fp8)
      throw InputError("--fp8-recipe " + *r + ": an fp8 recipe, but the precision is " + to_string(space.precision) +
                       "; add --precision fp8");
    if (*space.fp8_recipe == Fp8Recipe::mxfp8 && sys.gpu.arch != GpuArch::blackwell)
      throw InputError("--fp8-recipe mxfp8: Blackwell's block-scaled tensor cores only; " + sys.gpu.name + " is not one");
  }
  space.fp8_param_gather = cli::read_fp8_param_gather(cl);
  if (space.fp8_param_gather) {
    if (*space.fp8_param_gather && space.precision != Precision::fp8)
      throw InputError("--fp8-param-gather: fp8 primary weights need --precision fp8; the precision is " +
                       to_string(space.precision));
    if (*space.fp8_param_gather && !space.zero.empty() &&
        std::all_of(space.zero.begin(), space.zero.end(), [](int z) { return z == 0; }))
      throw InputError("--fp8-param-gather: fp8 primary weights need the distributed optimizer (a --zero stage of 1 or "
                       "more), as Megatron-Core asserts; --zero gives 0 only");
  }
  if (auto u = cl.get("--unfused")) space.unfused = parse_unfused(*u, "--unfused");
  space.flash_kernel = cli::read_flash_kernel(cl, space.attention);
  space.fragmentation = cl.get_double("--fragmentation", 0, 1);
  read_state_dtype_flags(cl, space.state);
  // --recipe: the release's stack, and its terms fixed on every layout unless a flag says otherwise.
  const cli::RecipeChoice choice = cli::read_recipe(cl, m.name);
  const std::optional<Recipe>& recipe = choice.recipe;
  if (const auto& v = choice.stack) {
    // What the stack runs bounds the enumeration, and each layout takes its attention and overlaps (sim/explore
    // enumerate, apply_stack); a restriction flag asking for something it lacks is an error, not an empty search.
    const Stack st = load_stack(*v);
    if (cl.has("--attention") && space.attention != st.attention)
      throw InputError("--attention " + to_string(space.attention) + ": stack " + st.name + " runs " + to_string(st.attention) + " attention");
    if (space.tp_comm_overlap && st.tp_comm_overlap == TpOverlap::none)
      throw InputError("--tp-comm-overlap: stack " + st.name + " does not overlap TP communication");
    for (sched::Kind k : space.schedules)
      if (std::find(st.schedules.begin(), st.schedules.end(), k) == st.schedules.end())
        throw InputError("--schedule " + std::string(sched::name(k)) + ": not one of stack " + st.name + "'s schedules");
    for (Recompute r : space.recompute)
      if (std::find(st.recompute.begin(), st.recompute.end(), r) == st.recompute.end())
        throw InputError("--recompute " + to_string(r) + ": not one of stack " + st.name + "'s policies");
    for (int z : space.zero)
      if (std::find(st.zero.begin(), st.zero.end(), z) == st.zero.end())
        throw InputError("--zero " + std::to_string(z) + ": not one of stack " + st.name + "'s ZeRO stages");
    if (!st.deepep && std::find(space.deepep.begin(), space.deepep.end(), 1) != space.deepep.end())
      throw InputError("--moe-dispatcher deepep: stack " + st.name + " has no DeepEP dispatcher (its \"deepep\" is not true)");
    if (!st.a2a_overlap && std::find(space.a2a_overlap.begin(), space.a2a_overlap.end(), 1) != space.a2a_overlap.end() &&
        cl.has("--moe-a2a-overlap"))
      throw InputError("--moe-a2a-overlap " + *cl.get("--moe-a2a-overlap") + ": stack " + st.name +
                       " does not overlap the expert all-to-alls (its \"a2a_overlap\" is not true)");
    if (!cl.has("--cross-entropy")) space.cross_entropy = st.cross_entropy;
    space.stack = st;
  }
  if (recipe) {
    const RecipeTerms& t = recipe->terms;  // without what a flag gives (read_recipe)
    if (t.recompute) space.recompute = {*t.recompute};
    if (t.sequence_parallel) space.sp = {*t.sequence_parallel ? 1 : 0};
    if (t.tp_comm_overlap) space.tp_comm_overlap = *t.tp_comm_overlap;
    // The stack's p2p overlap is what enumerate sets on each layout; the release's config says which it ran.
    if (t.overlap_p2p) space.stack->overlap_p2p = *t.overlap_p2p;
    if (t.cross_entropy) space.cross_entropy = *t.cross_entropy;
    if (t.main_grads) space.state.main_grads = *t.main_grads;
    if (t.moments) space.state.moments = *t.moments;
    if (t.master_weights) space.state.master_weights = *t.master_weights;
    if (t.fp8_param_gather) space.fp8_param_gather = *t.fp8_param_gather;
  }
  const explore::Result r = explore::run(m, sys, gpus, gbs, space, opt);

  if (auto e = cl.get("--explain")) {
    Layout l = parse_layout_words(*e, gbs);
    // Without layers=..., layers that do not divide over the stages take the split explore scores such a layout
    // with: the partitioner's time-balanced one, memory left to the estimate (explore.cpp resolve_balanced).
    if (l.stage_layers.empty() && m.layers % l.num_stages() != 0 && m.layers >= l.num_stages() - 2 &&
        !layout_problem_without_split(l, m, gpus) && sys.gpu.peak(l.precision) > 0) {
      const std::optional<Partition> p = partition(partition_costs(m, l, sys, nullptr, false));
      l.stage_layers = p ? p->layers : even_split(m.layers, l.num_stages());
    }
    if (json) std::cout << explore::explain_json(m, sys, gpus, l, r).dump(2) << "\n";
    else std::cout << explore::explain(m, sys, gpus, l, r);
    return 0;
  }
  if (r.top.empty())
    throw InputError(nothing_fits_message(m, sys, gpus, gbs, r, explore::why_nothing_fits(m, sys, gpus, gbs, space, r, opt)));
  if (auto p = cl.get("--csv")) write_file_atomic(*p, csv_of(r));
  if (cl.has("--trace-best") || cl.has("--svg-best")) write_best(m, sys, r.top.front().layout, cl);
  if (json) {
    Json j = explore::result_to_json(r);
    j["model"] = m.name;
    j["system"] = sys.name;
    j["gpus"] = gpus;
    j["global_batch"] = gbs;
    if (auto rc = cl.get("--recipe")) {
      j["recipe"] = *rc;
      j["stack"] = load_recipe(*rc, m.name).stack;
    } else if (auto st = cl.get("--stack")) {
      j["stack"] = load_stack(*st).name;
    }
    // The band of the system's hardware class for this kind of model (dense or MoE), the same for every row
    // (rows carry it as step_error_band_pct).
    j["error_band"] = error_band_to_json(sys.step_band(m.moe.enabled()));
    if (const auto& b = sys.step_band(m.moe.enabled()))
      for (auto& row : j["top"]) row["step_error_band_pct"] = b->step_pct;
    if (opt.job) j["objective"] = objective;  // with the job only: the document is otherwise unchanged
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  print_text(m, sys, gpus, gbs, r, cl.flag("--pareto"), cl, opt);
  return 0;
}

}  // namespace tessel::cmd
