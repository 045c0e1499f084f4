// tessel simulate: play one training step of a layout in the event simulator (sim/engine) and report step
// time, throughput, per-rank busy / bubble / exposed communication, peak memory and the critical path;
// --trace writes a Chrome trace (Perfetto), --svg a timeline.
#include <algorithm>
#include <functional>
#include <iostream>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "sim/engine/sim_trace.hpp"
#include "sim/engine/simulate.hpp"
#include "sim/workload.hpp"
#include "traces/chrome.hpp"
#include "traces/select.hpp"
#include "traces/svg.hpp"
#include "tools/commands.hpp"
#include "tools/format.hpp"
#include "tools/layer_ops.hpp"
#include "tools/spec_args.hpp"

namespace tessel::cmd {

namespace {

engine::Fidelity parse_fidelity(const std::string& v) {
  if (v == "cluster") return engine::Fidelity::cluster;
  if (v == "replica") return engine::Fidelity::replica;
  throw InputError("--fidelity " + v + ": must be cluster (every rank) or replica (one data-parallel replica)");
}

// X_RECOMPUTE in a schedule file places the layout's recompute (--recompute selective|full): the simulator
// charges the layout's recompute time there and no longer before each backward. Where that time is 0 (no
// recompute; the lowering check below guards any layout whose recompute costs nothing) the
// actions would cost nothing, and with some backwards left without one their recompute would be dropped:
// both are refused, as REDUCE_GRAD, UNSHARD and the other actions whose work the layout decides are.
void check_recompute_actions(const sched::Schedule& sch, const cli::Specs& s, const std::string& path) {
  const Recompute recompute = s.layout.recompute;
  using sched::ActionType;
  std::set<std::pair<int, int>> placed;
  const sched::Action* first = nullptr;
  for (const auto& rank : sch.ranks)
    for (const auto& a : rank)
      if (a.type == ActionType::RECOMPUTE) {
        placed.insert({a.stage, a.mb});
        if (!first) first = &a;
      }
  if (!first) return;
  if (recompute == Recompute::none)
    throw InputError("--schedule-file " + path + ": '" + first->token() + "' places the layout's recompute, and the "
                     "layout has --recompute none (it would cost 0 s); give --recompute selective or full, or drop the "
                     "X_RECOMPUTE actions");
  if (lower_layer(s.model, s.layout, s.system).t_recompute <= 0)
    throw InputError("--schedule-file " + path + ": '" + first->token() + "' places the layout's recompute, and --recompute " +
                     to_string(recompute) + " with --attention " + to_string(s.layout.attention) +
                     " recomputes nothing (it would cost 0 s); give --recompute full or --attention unfused, or drop "
                     "the X_RECOMPUTE actions");
  for (const auto& rank : sch.ranks)
    for (const auto& a : rank)
      for (const auto& part : a.type == ActionType::OVERLAP_F_B ? a.sub : std::vector<sched::Action>{a})
        if ((part.type == ActionType::B || part.type == ActionType::I) && !placed.count({part.stage, part.mb}))
          throw InputError("--schedule-file " + path + ": '" + part.token() + "' has no X_RECOMPUTE of stage " +
                           std::to_string(part.stage) + " micro-batch " + std::to_string(part.mb) +
                           ", but the file places others (for example '" + first->token() +
                           "'); with any X_RECOMPUTE the simulator recomputes only where the file says, so give "
                           "every backward its own or none");
}

// The built-in generator (and for interleaved the micro-batch rule: Megatron's first, then PyTorch's) whose
// schedule for the file's (pp, m, stages per rank) is the file's compute order, or none (files past
// kMaxActions are not compared: generating nine schedules of that size costs more than the simulation).
std::optional<std::pair<sched::Kind, sched::MicrobatchRule>> generator_matching(
    const sched::Schedule& f, int vpp, const std::function<bool(sched::Kind)>& fits) {
  constexpr std::size_t kMaxActions = 1 << 18;
  if (f.num_actions() > kMaxActions) return std::nullopt;
  const sched::Schedule mine = sched::strip_comms(f);
  for (const sched::Family& fam : sched::families()) {
    if (!fits(fam.kind)) continue;
    for (sched::MicrobatchRule rule : {sched::MicrobatchRule::megatron, sched::MicrobatchRule::torch}) {
      if (rule == sched::MicrobatchRule::torch && !fam.takes_microbatch_rule) continue;
      sched::GenParams p;
      p.pp = f.num_ranks;
      p.microbatches = f.num_microbatches;
      p.vpp = vpp;
      p.rule = rule;
      try {
        const sched::Schedule g = sched::generate(fam.kind, p);
        if (g.stage_to_rank == f.stage_to_rank && g.ranks == mine.ranks) return std::pair{fam.kind, rule};
      } catch (const InputError&) {  // the generator's shape rules refuse these parameters
      }
    }
  }
  return std::nullopt;
}

// An interleaved file follows PyTorch's micro-batch rule where its sidecar says so, or where Megatron's
// refuses its m and PyTorch's takes it (the orders agree wherever both take m); a --mb-rule or --layout
// given decides instead.
void rule_from_file(cli::Specs& s, const sched::Schedule& f, const cli::CommandLine& cl) {
  Layout& l = s.layout;
  if (cl.has("--mb-rule") || cl.has("--layout") || !sched::family(l.schedule).takes_microbatch_rule) return;
  const int m = f.num_microbatches;
  using sched::MicrobatchRule;
  if (f.rule == MicrobatchRule::torch || (sched::microbatch_problem(l.schedule, l.pp, m, MicrobatchRule::megatron) &&
                                          !sched::microbatch_problem(l.schedule, l.pp, m, MicrobatchRule::torch)))
    l.microbatch_rule = MicrobatchRule::torch;
}

// REDUCE_GRAD, X_OPTIMIZER_STEP, UNSHARD and RESHARD place work the layout decides (its ZeRO stage and
// optimizer): the simulator does not play them from a file. Refused where they stand in it.
void check_layout_actions(const sched::Schedule& sch, const std::string& path) {
  using sched::ActionType;
  for (std::size_t r = 0; r < sch.ranks.size(); ++r)
    for (std::size_t p = 0; p < sch.ranks[r].size(); ++p) {
      const sched::Action& a = sch.ranks[r][p];
      if (a.type != ActionType::REDUCE_GRAD && a.type != ActionType::WAIT_REDUCE_GRAD &&
          a.type != ActionType::OPTIMIZER_STEP && a.type != ActionType::UNSHARD &&
          a.type != ActionType::RESHARD)
        continue;
      std::string at;  // built by append: GCC 12 warns (-Wrestrict, falsely) on ":" + std::string here
      if (r < sch.cells.size() && p < sch.cells[r].size())
        at.append(":").append(std::to_string(r + 1)).append(":").append(std::to_string(sch.cells[r][p]));
      throw InputError("--schedule-file " + path + at + ": '" + a.token() + "' is not simulated (REDUCE_GRAD, "
                       "X_OPTIMIZER_STEP, UNSHARD and RESHARD come from the layout: --zero and the optimizer); "
                       "drop them from the file to simulate its order");
    }
}

// Without --schedule or --layout a schedule file decides the schedule's shape: its stages per rank and
// placement, and its name: the sidecar's generator name where that is a layout schedule, else the built-in
// generator that makes the same order; the default layout's interleaved with 3 chunks per rank would
// contradict a file of one stage per rank. A file no generator makes is named by its shape (V placement
// with 2 stages per rank zbv, one stage per rank 1f1b, several in loop placement interleaved, looped-bfs
// where neither of interleaved's micro-batch rules holds) and the returned note says so. A --vpp given keeps
// its value (the schedule's rules then name any mismatch with the file's).
std::string shape_from_file(cli::Specs& s, const sched::Schedule& f, const std::string& path, const cli::CommandLine& cl) {
  if (cl.has("--layout") || cl.has("--schedule") || cl.has("--like")) return "";
  Layout& l = s.layout;
  if (f.num_ranks != l.pp || l.pp == 1 || f.num_stages % f.num_ranks != 0) return "";
  const int vpp = f.num_stages / f.num_ranks;
  const bool v = vpp == 2 && f.stage_to_rank == sched::stage_to_rank(f.num_ranks, f.num_stages, sched::Placement::V);
  const bool loop = f.stage_to_rank == sched::stage_to_rank(f.num_ranks, f.num_stages, sched::Placement::Loop);
  if (!v && !loop) return "";
  // The sidecar's generator name (Tessel's, or PyTorch's class names as its exporters write them).
  std::optional<sched::Kind> name;
  const std::string prefix = path + " (";
  if (f.generator.rfind(prefix, 0) == 0 && f.generator.back() == ')')
    if (const sched::Family* fam = sched::find_family(f.generator.substr(prefix.size(), f.generator.size() - prefix.size() - 1)))
      name = fam->kind;
  // A layout schedule of this shape: placement and stages per rank as the layout rules take them.
  auto fits = [&](sched::Kind k) {
    const sched::Family& fam = sched::family(k);
    return fam.layout_schedule && (fam.placement == sched::Placement::V) == v && !sched::layout_vpp_problem(k, vpp);
  };
  if (!name || !fits(*name)) {
    const auto match = generator_matching(f, vpp, fits);
    if (match) name = match->first;
  }
  std::string note;
  if (!name) {
    const bool divides = l.global_batch % (static_cast<long long>(l.micro_batch) * l.dp) == 0;
    const auto interleaved_takes = [&](sched::MicrobatchRule r) {
      return divides && !sched::microbatch_problem(sched::Kind::interleaved, l.pp, l.num_microbatches(), r);
    };
    if (v) name = sched::Kind::zbv;
    else if (vpp == 1) name = sched::Kind::one_f_one_b;
    else if (interleaved_takes(sched::MicrobatchRule::megatron) || interleaved_takes(sched::MicrobatchRule::torch))
      name = sched::Kind::interleaved;
    else name = sched::Kind::looped_bfs;
    note = path + " names no schedule in a sidecar and is not the order a layout schedule makes for pp " +
           std::to_string(l.pp) + " with " + std::to_string(vpp) + " stage" + (vpp > 1 ? "s" : "") +
           " per rank; the layout calls it " + sched::name(*name) + " after its shape, and the simulation plays the file's order";
  }
  l.schedule = *name;
  if (!cl.has("--vpp")) l.vpp = vpp;
  return note;
}

void print_table(const engine::SimReport& r, const cli::Specs& s, std::size_t max_ranks, std::size_t max_path) {
  std::cout << s.model.name << " on " << r.gpus << " x " << s.system.gpu.name << " (" << s.system.name << "), "
            << s.layout.describe() << ", " << r.microbatches << " micro-batches, schedule " << r.schedule.generator
            << ", fidelity " << engine::to_string(r.fidelity)
            << (s.layout.precision == Precision::fp8 ? ", fp8 with " + to_string(s.layout.fp8_recipe) + " scaling" : std::string())
            << (s.layout.runs_fa2() ? ", FlashAttention-2" : "")
            << (s.layout.unfused.any() ? ", unfused " + to_string(s.layout.unfused) : std::string()) << "\n\n";
  std::vector<std::vector<std::string>> rows = {
      {"metric", "value"},
      {"step time", fmt::seconds(r.step_s)},
      {"tokens/s", fmt::si(r.tokens_per_s, "tokens/s")},
      {"model TFLOP/s/GPU", fmt::rate(r.model_tflops_per_gpu)},
      {"MFU", fmt::pct(r.mfu)},
      {"peak memory", fmt::gib(r.peak_bytes) + " on rank " + std::to_string(r.peak_rank) + " of " + fmt::gib(r.capacity_bytes) +
                          (s.system.min_headroom_bytes > 0 ? " with " + fmt::gib(s.system.min_headroom_bytes) + " kept free" : std::string()) +
                          (r.fits ? " (fits)" : " (DOES NOT FIT)")},
      {"events / tasks", std::to_string(r.events) + " / " + std::to_string(r.tasks)},
      {"simulator time", fmt::seconds(r.build_s) + " build (" + fmt::seconds(r.schedule_s) + " schedule), " + fmt::seconds(r.run_s) + " run, " +
                             fmt::seconds(r.analysis_s) + " analysis"},
  };
  std::cout << fmt::table(rows) << "\n";
  std::vector<std::vector<std::string>> t = {{"rank", "pp", "dp", "cp", "busy", "bubble", "exposed comm", "comm", "peak memory"}};
  const std::size_t step = std::max<std::size_t>(1, (r.ranks.size() + max_ranks - 1) / max_ranks);
  for (std::size_t i = 0; i < r.ranks.size(); i += step) {
    const auto& k = r.ranks[i];
    t.push_back({std::to_string(k.global_rank), std::to_string(k.pp), std::to_string(k.dp), std::to_string(k.cp),
                 fmt::seconds(k.busy_s), fmt::seconds(k.bubble_s), fmt::seconds(k.exposed_comm_s), fmt::seconds(k.comm_s),
                 fmt::gib(k.peak_bytes)});
  }
  std::cout << "per rank" << (step > 1 ? " (every " + std::to_string(step) + "th position)" : "")
            << ", each standing for its " << s.layout.tp << " tp ranks:\n"
            << fmt::table(t) << "\n";
  std::cout << "critical path: " << r.critical_path.size() << " ops";
  if (r.critical_path.size() > max_path) std::cout << " (first and last " << max_path / 2 << " shown)";
  std::cout << "\n";
  for (std::size_t i = 0; i < r.critical_path.size(); ++i) {
    if (r.critical_path.size() > max_path && i == max_path / 2) {
      std::cout << "  ...\n";
      i = r.critical_path.size() - max_path / 2;
    }
    const auto& op = r.critical_path[i];
    std::cout << "  " << fmt::seconds(op.start_s) << "  rank " << op.global_rank << "  " << op.what << "\n";
  }
  if (!r.fits)
    std::cout << "\nwarning: the layout does not fit in memory (peak " << fmt::gib(r.peak_bytes)
              << (s.system.min_headroom_bytes > 0 ? " + " + fmt::gib(s.system.min_headroom_bytes) + " kept free" : std::string())
              << " > " << fmt::gib(r.capacity_bytes) << ")\n";
}

// --like RUN.json: the model and layout a measured trace records (otherData, as `tessel run --trace` writes
// them), on --system (default: the cpu preset for a CPU run's trace), with the trace host's cores when the
// system shares a host's cores. The CPU runtime overlaps no communication (docs/runtime.md), whatever its
// recorded overlap flags say, so a CPU run's layout is simulated without overlap.
cli::Specs specs_like(const cli::CommandLine& cl, const std::string& path) {
  for (const cli::OptionSpec& o : cli::spec_options())
    if (o.name != "--system" && cl.has(o.name))
      throw InputError(o.name + ": cannot be combined with --like " + path + " (the trace gives the model and layout)");
  refuse_directory(path, "--like ");
  const trace::Trace t = trace::read_chrome_trace(path);
  const Json& od = t.other_data;
  if (!od.is_object() || !od.contains("model") || !od.contains("layout"))
    throw InputError("--like " + path + ": otherData must hold the model and layout (a trace of `tessel run --trace`)");
  const std::string ran_on = od.contains("system") && od["system"].is_string() ? od["system"].get<std::string>() : "";
  if (ran_on != "cpu" && !cl.has("--system"))
    throw InputError("--like " + path + ": a run on '" + ran_on + "', not the CPU runtime; give --system (a profile of that "
                     "machine from tessel calibrate, or a preset)");
  cli::Specs s;
  s.model = parse_model(od["model"], "--like " + path + ": otherData.model");
  s.layout = parse_layout(od["layout"], "--like " + path + ": otherData.layout");
  if (ran_on == "cpu") s.layout.overlap_grad_reduce = s.layout.overlap_param_gather = s.layout.overlap_p2p = false;
  s.system = load_system(cl.get_or("--system", "cpu"));
  if (s.system.host.cores > 0 && od.contains("host") && od["host"].is_object() && od["host"].contains("cores") &&
      od["host"]["cores"].is_number_integer() && od["host"]["cores"].get<int>() > 0)
    s.system.host.cores = od["host"]["cores"].get<int>();
  s.gpus = s.layout.gpus();
  return s;
}

}  // namespace

int simulate(const Args& args) {
  auto opts = cli::spec_options();
  opts.push_back({"--json", false, "print one JSON document"});
  opts.push_back({"--ops", false, kOpsHelp});
  opts.push_back({"--trace", true, "write a Chrome trace (Perfetto) of the simulated step to this path"});
  opts.push_back({"--svg", true, "write an SVG timeline to this path (identical ranks drawn once)"});
  opts.push_back({"--trace-ranks", true, "only these ranks in --trace and --svg: 0-7,64 [all]"});
  opts.push_back({"--schedule-file", true, "play this PyTorch-style CSV schedule instead of generating one (its stages "
                                           "per rank and placement set --schedule and --vpp unless given)"});
  opts.push_back({"--legacy-bw", false, "read --schedule-file in PyTorch's older dialect: B = input grad, BW = full backward"});
  opts.push_back({"--fidelity", true, "cluster (every rank) or replica (one DP replica, others' load counted) [cluster]"});
  opts.push_back({"--like", true, "a measured trace (tessel run --trace): simulate its model and layout (and its host's "
                                  "cores) instead of the model and layout flags"});
  cli::CommandLine cl("simulate", args, opts, 0);
  if (cl.print_help()) return 0;
  // The schedule file first: a file that cannot be read is the error to report, before any layout rule.
  std::optional<sched::Schedule> file;
  if (auto f = cl.get("--schedule-file")) file = sched::read_csv(*f, cl.flag("--legacy-bw"), "--schedule-file ");
  else if (cl.flag("--legacy-bw")) throw InputError("--legacy-bw: reads a --schedule-file, and none is given");
  cli::Specs s = cl.has("--like") ? specs_like(cl, *cl.get("--like")) : cli::read_specs(cl, true);
  engine::SimOptions o;
  o.fidelity = parse_fidelity(cl.get_or("--fidelity", "cluster"));
  // Output paths are checked before the (possibly long) simulation: a bad path fails first, writes nothing.
  const auto trace_path = cl.get("--trace");
  const auto svg_path = cl.get("--svg");
  if (trace_path) check_writable(*trace_path, "--trace");
  if (svg_path) check_writable(*svg_path, "--svg");
  std::string name_note;
  if (auto f = cl.get("--schedule-file")) {
    o.schedule = std::move(file);
    // A file of another pipeline depth fails every later rule for a reason that is not its own (the default
    // layout's stages per rank); this is the mismatch to name.
    if (o.schedule->num_ranks != s.layout.pp)
      throw InputError("--schedule-file " + *f + ": the file has " + std::to_string(o.schedule->num_ranks) +
                       " rank rows (pp " + std::to_string(o.schedule->num_ranks) + "), the layout pp " +
                       std::to_string(s.layout.pp) + "; give --pp " + std::to_string(o.schedule->num_ranks) +
                       " (and --gpus to match) or a file of " + std::to_string(s.layout.pp) + " ranks");
    name_note = shape_from_file(s, *o.schedule, *f, cl);
    rule_from_file(s, *o.schedule, cl);
    cli::resolve_specs_split(cl, s);  // for the file's stages per rank and micro-batch rule
    check_layout_actions(*o.schedule, *f);
    check_recompute_actions(*o.schedule, s, *f);
  }
  o.memory_timeline = trace_path || svg_path;
  if (s.gpus != s.layout.gpus())
    throw InputError("--gpus " + std::to_string(s.gpus) + ": the layout uses tp*pp*dp*cp = " + std::to_string(s.layout.gpus()) +
                     " GPUs; the simulator plays exactly the layout's ranks");
  const engine::SimReport r = [&] {
    try {
      return engine::simulate(s.model, s.layout, s.system, o);
    } catch (const InputError& e) {
      // A file in PyTorch's older dialect fails as "W without I": say how to read it.
      const auto f = cl.get("--schedule-file");
      const std::string hint = f && !cl.flag("--legacy-bw") ? sched::legacy_bw_hint(*f, *o.schedule, {}) : "";
      if (hint.empty()) throw;
      throw InputError(std::string(e.what()) + "; " + hint);
    }
  }();
  if (trace_path || svg_path) {
    trace::Trace t = engine::to_trace(r, s.system);
    if (auto ranks = cl.get("--trace-ranks")) t = trace::select_ranks(t, trace::parse_rank_list(*ranks, "--trace-ranks", r.gpus));
    if (trace_path) trace::write_chrome_trace(t, *trace_path);
    if (svg_path) {
      trace::SvgOptions so;
      so.title = s.model.name + " " + s.layout.describe() + " (" + r.schedule.generator + "), step " + fmt::seconds(r.step_s);
      write_file_atomic(*svg_path, trace::timeline_svg(trace::collapse_identical_ranks(t), so));
    }
  }
  if (cl.flag("--json")) {
    Json j = engine::report_to_json(r);
    j["tool"] = std::string("tessel ") + TESSEL_VERSION;
    if (!name_note.empty()) j["schedule_note"] = name_note;
    if (cl.flag("--ops")) add_layer_ops_json(s.model, s.layout, s.system, j);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  if (!name_note.empty()) std::cout << "note: " << name_note << "\n";
  print_table(r, s, 32, 24);
  if (cl.flag("--ops")) print_layer_ops(s.model, s.layout, s.system);
  return 0;
}

std::function<double(const Model&, const Layout&, const System&)> des_step_time() {
  return [](const Model& m, const Layout& l, const System& sys) {
    engine::SimOptions o;
    o.fidelity = engine::Fidelity::replica;  // the other replicas' traffic is counted on shared links
    o.critical_path = false;
    return engine::simulate(m, l, sys, o).step_s;
  };
}

}  // namespace tessel::cmd
