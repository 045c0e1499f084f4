// tessel schedule gen|validate|show|diff: pipeline schedules as files that CI can check.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/json_reader.hpp"
#include "util/suggest.hpp"
#include "sim/schedule/diff.hpp"
#include "sim/schedule/hb_graph.hpp"
#include "sim/schedule/registry.hpp"
#include "sim/schedule/schedule.hpp"
#include "sim/schedule/timeline.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"

namespace tessel::cmd {

namespace {

using namespace tessel::sched;

const char* kUsage =
    "usage: tessel schedule gen NAME --pp P --mb M [--vpp V] [--costs F,B,W,C] [--mem-limit N] [--mb-rule megatron|torch]\n"
    "                           [--lower] [-o FILE.csv]\n"
    "       tessel schedule validate FILE.csv [--comm eager|blocking|batched] [--mem-limit N] [--legacy-bw]\n"
    "                                [--max-violations N] [--json]\n"
    "       tessel schedule show FILE.csv [--costs F,B,W,C] [--comm MODEL] [--svg OUT.svg] [--width N] [--json]\n"
    "       tessel schedule diff A.csv B.csv [--max-lines N] [--json]\n"
    "exit codes: 0 valid / identical, 1 invalid / different, 2 bad input, 3 internal error\n";

// --costs F,B,W,C: per-op times (B = input grad; a full backward costs B + W) and comm latency.
Costs parse_costs(const cli::CommandLine& cl) {
  Costs c;
  if (!cl.has("--costs")) return c;
  const auto parts = cl.get_list("--costs");
  if (parts.size() != 4) throw InputError("--costs '" + *cl.get("--costs") + "': expected 4 numbers F,B,W,C");
  c.F = {cli::parse_double(parts[0], "--costs F", 1e-9, 1e9)};
  c.B = {cli::parse_double(parts[1], "--costs B", 1e-9, 1e9)};
  c.W = {cli::parse_double(parts[2], "--costs W", 0, 1e9)};
  c.comm = cli::parse_double(parts[3], "--costs C", 0, 1e9);
  return c;
}

std::optional<int> mem_limit(const cli::CommandLine& cl) {
  if (auto v = cl.get_int("--mem-limit", 1, 1 << 20)) return static_cast<int>(*v);
  return std::nullopt;
}

const std::string& positional(const cli::CommandLine& cl, std::size_t i, const char* what) {
  if (cl.positional().size() <= i) throw InputError(std::string("missing ") + what + "\n" + kUsage);
  return cl.positional()[i];
}

// `costs_given`: the makespan is in the units of --costs, else every op costs 1 (unit cost).
void print_summary(const Schedule& s, const SimResult& sim, bool costs_given, std::FILE* f) {
  std::fprintf(f, "%s: pp %d, %d stages, %d micro-batches, %zu actions; %s %.2f, bubble rate %.2f%% (span-based %.2f%%)\n",
               s.generator.c_str(), s.num_ranks, s.num_stages, s.num_microbatches, s.num_actions(),
               costs_given ? "makespan (--costs units)" : "unit-cost makespan", sim.makespan, 100.0 * sim.bubble_rate,
               100.0 * sim.span_bubble_rate);
}

// Without a sidecar m is 1 + the largest micro-batch index, so one mistyped index (3W9 in an 8-micro-batch
// file) makes every stage miss micro-batches 8 and 9, and those are the violations listed. When the largest
// index is used by at most half as many actions as micro-batch 0, say where it is, so the typo is found first.
std::string inferred_m_note(const std::string& path, const Schedule& s) {
  std::error_code ec;
  if (std::filesystem::exists(meta_path_for(path), ec) || s.num_microbatches < 2) return "";
  std::vector<long long> uses(static_cast<std::size_t>(s.num_microbatches), 0);
  std::pair<int, int> first{-1, -1};
  const int top = s.num_microbatches - 1;
  for (int r = 0; r < s.num_ranks; ++r)
    for (int p = 0; p < static_cast<int>(s.ranks[static_cast<std::size_t>(r)].size()); ++p) {
      const Action& a = s.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(p)];
      for (const auto& part : a.type == ActionType::OVERLAP_F_B ? a.sub : std::vector<Action>{a}) {
        if (part.mb < 0) continue;
        ++uses[static_cast<std::size_t>(part.mb)];
        if (part.mb == top && first.first < 0) first = {r, p};
      }
    }
  if (2 * uses[static_cast<std::size_t>(top)] > uses[0] || first.first < 0) return "";  // at most half as many uses
  const std::string at = sched::detail::where(s, {first.first, first.second});
  return "no sidecar, so m = " + std::to_string(s.num_microbatches) + " is read from the largest micro-batch index, first at " +
         at + "; micro-batch " + std::to_string(top) + " appears in " + std::to_string(uses[static_cast<std::size_t>(top)]) +
         " action(s), micro-batch 0 in " + std::to_string(uses[0]) +
         ": if that index is a typo, the missing actions below are its echo (a sidecar's num_microbatches fixes m)";
}

int gen(const Args& args) {
  cli::CommandLine cl("schedule gen", args,
                      {{"--pp", true, "pipeline ranks"},
                       {"--mb", true, "micro-batches"},
                       {"--vpp", true, "stages per rank [2 for zbv, dualpipev; 3 for interleaved, looped-bfs (2 or more); else 1; zb1p: any]"},
                       {"--costs", true, "F,B,W,C per-op times for zb-greedy/zb2p and the summary"},
                       {"--mem-limit", true, "activations per rank (zb-greedy, zb2p)"},
                       {"--mb-rule", true, "interleaved: megatron (m a multiple of pp) or torch (PyTorch's "
                                           "ScheduleInterleaved1F1B: m a multiple of max(1, m // pp)) [megatron "
                                           "where it takes --mb, else torch]"},
                       {"--lower", false, "insert SEND/RECV"},
                       {"--dialect", true, "how to write the CSV: torch-2.15 (PyTorch 2.15's format: a WAIT_SEND after each send of a lowered schedule), torch-2025 (no waits), torch-legacy (B = input grad, BW = full) [torch-2.15]"},
                       {"-o", true, "output CSV (a .meta.json sidecar is written beside it); default stdout"}},
                      2);
  if (cl.print_help(kUsage)) return 0;
  GenParams p;
  const std::string name = positional(cl, 1, "generator NAME");
  const Kind kind = parse_schedule(name, "tessel schedule gen");
  if (!cl.has("--pp") || !cl.has("--mb")) throw InputError("gen: --pp and --mb are required");
  p.pp = static_cast<int>(*cl.get_int("--pp", 1, 4096));
  p.microbatches = static_cast<int>(*cl.get_int("--mb", 1, 1 << 20));
  // Without --vpp, the schedule's own stages per rank (the V schedules 2, interleaved and looped BFS 3, as
  // estimate and simulate default them), so no rule is blamed on a --vpp the user never gave.
  p.vpp = static_cast<int>(cl.get_int("--vpp", 1, 256).value_or(default_vpp(kind, 3)));
  const Costs costs = parse_costs(cl);
  if (cl.has("--costs")) p.costs = costs;
  p.mem_limit = mem_limit(cl);
  if (p.mem_limit && !family(kind).takes_mem_limit)
    throw InputError("--mem-limit " + std::to_string(*p.mem_limit) + ": only zb-greedy and zb2p take an activation limit; " +
                     name + "'s in-flight activations are fixed by its algorithm (check them with schedule validate --mem-limit)");
  // The generators check their stages per rank, except that interleaved and looped BFS with one would
  // quietly emit plain 1F1B / GPipe (sim/layout.cpp refuses those layouts too).
  if (p.vpp < family(kind).layout_vpp_min)
    throw InputError("--vpp " + std::to_string(p.vpp) + ": " + name + " needs vpp > 1");
  // Both rules build the same order where Megatron's takes m, so the default is PyTorch's only where
  // Megatron's refuses; the sidecar names the rule (generator.params.mb_rule).
  if (auto r = cl.get("--mb-rule")) {
    if (!family(kind).takes_microbatch_rule)
      throw InputError("--mb-rule " + *r + ": only interleaved takes a micro-batch rule (" + name + " has its own)");
    p.rule = parse_microbatch_rule(*r, "--mb-rule");
  } else if (family(kind).takes_microbatch_rule && microbatch_problem(kind, p.pp, p.microbatches)) {
    p.rule = MicrobatchRule::torch;
  }
  if (auto out = cl.get("-o")) check_writable(*out, "-o");
  Schedule s = generate(kind, p);
  const Dialect dialect = parse_dialect(cl.get_or("--dialect", "torch-2.15"), "--dialect");
  if (cl.flag("--lower")) s = lower(s);
  s = for_dialect(s, dialect);
  if (auto out = cl.get("-o")) {
    // Into a device or a FIFO (-o /dev/null, a pipe to another tool) the CSV is written as it is, and no
    // sidecar is put beside it (that would be /dev/null.meta.json).
    std::error_code ec;
    const auto st = std::filesystem::status(*out, ec);
    const bool beside = ec || !std::filesystem::exists(st) || std::filesystem::is_regular_file(st);
    write_file_atomic(*out, to_csv(s, dialect));
    if (beside) write_file_atomic(meta_path_for(*out), to_meta_json(s, dialect));
    print_summary(s, unit_cost_simulate(s, costs), cl.has("--costs"), stdout);
    if (beside) std::printf("wrote %s and %s\n", out->c_str(), meta_path_for(*out).c_str());
    else std::printf("wrote %s (not a regular file: no sidecar beside it)\n", out->c_str());
  } else {
    std::cout << to_csv(s, dialect);
  }
  return 0;
}

int validate_cmd(const Args& args) {
  cli::CommandLine cl("schedule validate", args,
                      {{"--comm", true, "eager (default), blocking or batched"},
                       {"--mem-limit", true, "max in-flight activations per rank"},
                       {"--legacy-bw", false, "older PyTorch dialect: B = input grad, BW = full backward"},
                       {"--max-violations", true, "collect and list up to N violations [50 collected, 10 listed]"},
                       {"--json", false, "print one JSON document: the result and every violation collected"}},
                      2);
  if (cl.print_help(kUsage)) return 0;
  const std::string path = positional(cl, 1, "FILE.csv");
  ValidateOptions opt;
  opt.comm = parse_comm_model(cl.get_or("--comm", "eager"));
  opt.mem_limit = mem_limit(cl);
  const auto max_v = cl.get_int("--max-violations", 1, 1 << 20);
  if (max_v) opt.max_violations = static_cast<std::size_t>(*max_v);
  const Schedule s = read_csv(path, cl.flag("--legacy-bw"));
  const auto rep = validate(s, opt);
  const std::string hint = rep.ok() || cl.flag("--legacy-bw") ? "" : legacy_bw_hint(path, s, opt);
  const std::string m_note = rep.ok() ? "" : inferred_m_note(path, s);
  if (cl.flag("--json")) {
    Json j = {{"file", path},
              {"valid", rep.ok()},
              {"comm", comm_model_name(opt.comm)},
              {"ranks", s.num_ranks},
              {"stages", s.num_stages},
              {"microbatches", s.num_microbatches},
              {"peak_inflight", rep.peak_inflight},
              {"checked", rep.checked},
              {"violations_complete", rep.checked == "all" && rep.violations.size() < opt.max_violations},
              {"violations", Json::array()}};
    const auto pos = [](int x) { return x >= 0 ? Json(x) : Json(); };
    for (const auto& v : rep.violations)
      j["violations"].push_back({{"rule", v.rule}, {"message", v.message}, {"rank", pos(v.rank)},
                                 {"action_index", pos(v.index)}, {"line", pos(v.line)}, {"cell", pos(v.cell)}});
    if (!hint.empty()) j["hint"] = hint;
    if (!m_note.empty()) j["note"] = m_note;
    std::cout << j.dump(2) << "\n";
    return rep.ok() ? 0 : 1;
  }
  // One line however many ranks: the first kShownRanks, then the maximum over all of them.
  constexpr std::size_t kShownRanks = 64;
  std::string peaks;
  for (std::size_t r = 0; r < rep.peak_inflight.size() && r < kShownRanks; ++r) {
    if (r) peaks += ' ';
    peaks += std::to_string(rep.peak_inflight[r]);
  }
  if (rep.peak_inflight.size() > kShownRanks) {
    peaks += " ... (max ";
    peaks += std::to_string(*std::max_element(rep.peak_inflight.begin(), rep.peak_inflight.end()));
    peaks += " over ";
    peaks += std::to_string(rep.peak_inflight.size());
    peaks += " ranks)";
  }
  if (rep.ok()) {
    std::printf("%s: valid under %s comms; %d ranks, %d stages, %d micro-batches; peak in-flight activations per rank: %s\n",
                path.c_str(), comm_model_name(opt.comm), s.num_ranks, s.num_stages, s.num_microbatches, peaks.c_str());
    return 0;
  }
  // validate() stops collecting at max_violations; the first kShown of those are printed (all of them with
  // --max-violations).
  const std::size_t shown = max_v ? opt.max_violations : 10;
  const std::size_t n = rep.violations.size();
  std::printf("%s: INVALID under %s comms (%s%zu violation%s%s)\n", path.c_str(), comm_model_name(opt.comm),
              n >= opt.max_violations ? "at least " : "", n, n == 1 ? "" : "s",
              n > shown ? (", the first " + std::to_string(shown) + " shown; --max-violations N lists more").c_str() : "");
  if (!m_note.empty()) std::printf("note: %s\n", m_note.c_str());
  for (std::size_t i = 0; i < n && i < shown; ++i)
    std::printf("  [%s] %s\n", rep.violations[i].rule.c_str(), rep.violations[i].message.c_str());
  if (rep.checked != "all")
    std::printf("(checks after the %s phase run once these are fixed: they may find more)\n", rep.checked.c_str());
  if (!hint.empty()) std::printf("hint: %s\n", hint.c_str());
  return 1;
}

int show(const Args& args) {
  cli::CommandLine cl("schedule show", args,
                      {{"--costs", true, "F,B,W,C per-op times (default 1,1,1,0)"},
                       {"--comm", true, "eager (default), blocking or batched"},
                       {"--svg", true, "also write an SVG timeline here"},
                       {"--width", true, "max ASCII columns (default 120)"},
                       {"--legacy-bw", false, "older PyTorch dialect: B = input grad, BW = full backward"},
                       {"--json", false, "print one JSON document: makespan, bubble and peak in-flight activations per rank"}},
                      2);
  if (cl.print_help(kUsage)) return 0;
  // Every flag is checked before anything is printed: a bad --width must not follow a summary.
  const std::string path = positional(cl, 1, "FILE.csv");
  const Costs costs = parse_costs(cl);
  const CommModel comm = parse_comm_model(cl.get_or("--comm", "eager"));
  const int width = static_cast<int>(cl.get_int("--width", 20, 2000).value_or(120));
  if (auto svg = cl.get("--svg")) check_writable(*svg, "--svg");
  const Schedule s = read_csv(path, cl.flag("--legacy-bw"));
  SimResult sim;
  try {
    sim = unit_cost_simulate(s, costs, comm);
  } catch (const InputError& e) {
    ValidateOptions vo;
    vo.comm = comm;
    const std::string hint = cl.flag("--legacy-bw") ? "" : legacy_bw_hint(path, s, vo);
    if (hint.empty()) throw;
    throw InputError(std::string(e.what()) + "; " + hint);
  }
  if (cl.flag("--json")) {
    ValidateOptions vo;
    vo.comm = comm;
    const ValidationReport rep = validate(s, vo);  // unit_cost_simulate passed it: only its liveness is read
    Json ranks = Json::array();
    for (int r = 0; r < s.num_ranks; ++r) {
      const auto i = static_cast<std::size_t>(r);
      ranks.push_back({{"rank", r}, {"busy", sim.busy[i]}, {"bubble", sim.bubble[i]},
                       {"bubble_rate", sim.makespan > 0 ? sim.bubble[i] / sim.makespan : 0.0},
                       {"peak_inflight", rep.peak_inflight[i]}});
    }
    Json j = {{"file", path}, {"comm", comm_model_name(comm)}, {"cost_units", cl.has("--costs") ? "--costs" : "unit"},
              {"ranks", s.num_ranks}, {"stages", s.num_stages}, {"microbatches", s.num_microbatches},
              {"makespan", sim.makespan}, {"bubble_rate", sim.bubble_rate}, {"span_bubble_rate", sim.span_bubble_rate},
              {"per_rank", ranks}};
    if (auto svg = cl.get("--svg")) {
      write_file_atomic(*svg, svg_timeline(s, sim));
      j["svg"] = *svg;
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  print_summary(s, sim, cl.has("--costs"), stdout);
  std::cout << ascii_timeline(s, sim, width);
  if (auto svg = cl.get("--svg")) {
    write_file_atomic(*svg, svg_timeline(s, sim));
    std::printf("wrote %s\n", svg->c_str());
  }
  return 0;
}

int diff_cmd(const Args& args) {
  cli::CommandLine cl("schedule diff", args,
                      {{"--legacy-bw", false, "read both files in the older PyTorch dialect"},
                       {"--max-lines", true, "at most N lines of text, each listing at most 12 actions [40]"},
                       {"--json", false, "print one JSON document with every difference"}},
                      3);
  if (cl.print_help(kUsage)) return 0;
  const std::string pa = positional(cl, 1, "A.csv"), pb = positional(cl, 2, "B.csv");
  const auto max_lines = static_cast<std::size_t>(cl.get_int("--max-lines", 2, 1 << 20).value_or(40));
  const Schedule a = read_csv(pa, cl.flag("--legacy-bw"));
  const Schedule b = read_csv(pb, cl.flag("--legacy-bw"));
  if (cl.flag("--json")) {
    const ScheduleDiff d = diff_schedules(a, b);
    Json ranks = Json::array();
    for (const RankDiff& r : d.ranks)
      ranks.push_back({{"rank", r.rank}, {"first_difference", r.first}, {"first", r.first_a}, {"second", r.first_b},
                       {"actions_first", r.actions_a}, {"actions_second", r.actions_b}, {"only_in_first", r.only_a},
                       {"only_in_second", r.only_b}});
    const Json j = {{"first", pa}, {"second", pb}, {"identical", d.identical()}, {"shape", d.shape}, {"ranks", ranks}};
    std::cout << j.dump(2) << "\n";
    return d.identical() ? 0 : 1;
  }
  const auto lines = sched::diff(a, b, max_lines);
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  if (lines.empty()) std::printf("identical\n");
  return lines.empty() ? 0 : 1;
}

}  // namespace

int schedule(const Args& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kUsage << "generators:";
    for (const Family& f : families()) std::cout << " " << f.name;
    std::cout << "\n";
    return args.empty() ? 2 : 0;
  }
  const std::string& verb = args[0];
  if (verb == "gen") return gen(args);
  if (verb == "validate") return validate_cmd(args);
  if (verb == "show") return show(args);
  if (verb == "diff") return diff_cmd(args);
  throw InputError("unknown sub-command '" + verb + "' (gen, validate, show, diff)" +
                   did_you_mean(verb, {"gen", "validate", "show", "diff"}));
}

}  // namespace tessel::cmd
