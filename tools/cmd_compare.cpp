// tessel compare A B: align two traces op by op (Tessel traces), or compare per-step summaries when one
// side is a PyTorch profiler (Kineto) trace. A is the reference: errors are (B - A) / A. Exit 0 even when
// they differ, 1 when --max-error is given and |step-time error| exceeds it, 2 on bad input.
// A Tessel trace of several steps is compared one step (traces/steps.hpp) against the other trace's one.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <variant>

#include "models/model.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"
#include "traces/chrome.hpp"
#include "traces/compare.hpp"
#include "traces/event_reader.hpp"
#include "traces/kineto.hpp"
#include "tools/collectives_report.hpp"
#include "traces/steps.hpp"
#include "traces/summary.hpp"
#include "traces/svg.hpp"

namespace tessel::cmd {

namespace {

using Loaded = std::variant<trace::Trace, trace::kineto::KinetoTrace>;

// The format is decided by content, not by name: Kineto's marks (schemaVersion, kernel/cpu_op events).
Loaded load(const std::string& path) {
  std::string bytes = trace::read_trace_bytes(path);
  if (trace::kineto::sniff_kineto(bytes)) return trace::kineto::parse_kineto(bytes, path);
  return trace::parse_chrome_trace(bytes, path);
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// Rows paired by rank id, never by position: a simulated trace of a tp layout holds one rank per tp group
// (otherData.tp_folded), so the measured trace's other ranks have no row of A to be compared with.
void print_ranks(const trace::Comparison& c, const trace::Trace& a) {
  std::printf("\n%-6s %12s %12s %12s | %12s %12s %12s\n", "rank", "busy A us", "bubble A", "exp.comm A", "busy B us",
              "bubble B", "exp.comm B");
  std::map<int, std::pair<const trace::RankStats*, const trace::RankStats*>> rows;
  for (const auto& r : c.ranks_a) rows[r.rank].first = &r;
  for (const auto& r : c.ranks_b) rows[r.rank].second = &r;
  auto cell = [](const trace::RankStats* r, char side) {
    char buf[64];
    if (!r) std::snprintf(buf, sizeof buf, "%38s", (std::string("(not in ") + side + ")").c_str());
    else std::snprintf(buf, sizeof buf, "%12.3f %12.3f %12.3f", r->busy_us, r->bubble_us, r->exposed_comm_us);
    return std::string(buf);
  };
  for (const auto& [rank, r] : rows) std::printf("%-6d %s | %s\n", rank, cell(r.first, 'A').c_str(), cell(r.second, 'B').c_str());
  std::string why;
  if (a.other_data.is_object() && a.other_data.contains("tp_folded") && a.other_data["tp_folded"].is_string())
    why = " (A: " + a.other_data["tp_folded"].get<std::string>() + ")";
  if (!c.ranks_only_in_b.empty())
    std::printf("B's ranks %s have no counterpart in A%s\n", join(c.ranks_only_in_b).c_str(), why.c_str());
  if (!c.ranks_only_in_a.empty()) std::printf("A's ranks %s have no counterpart in B\n", join(c.ranks_only_in_a).c_str());
}

// The dp_* kinds whose ops the two sides split differently, merged per rank before pairing: one line per
// kind, the ops and bytes of its first rank, and the ranks where it happened.
void print_merged(const trace::Comparison& c) {
  if (c.merged.empty()) return;
  std::printf("\nmerged per rank (the two sides split these data-parallel collectives differently; each side's ops "
              "of the kind on a rank are summed, duration and bytes, and compared as one):\n");
  std::map<std::string, std::vector<const trace::MergedCollectives*>> by_op;
  for (const auto& m : c.merged) by_op[m.op].push_back(&m);
  for (const auto& [op, v] : by_op) {
    std::vector<int> ranks;
    for (const auto* m : v) ranks.push_back(m->rank);
    const auto& m = *v.front();
    std::printf("  %-20s ranks %s: e.g. rank %d A %zu op(s) %.0f bytes, B %zu op(s) %.0f bytes\n", op.c_str(),
                join(ranks).c_str(), m.rank, m.ops_a, m.bytes_a, m.ops_b, m.bytes_b);
  }
}

void print_op_comparison(const trace::Comparison& c, const trace::Trace& a, const trace::Trace&) {
  std::printf("step time   A %12.3f us   B %12.3f us   error %+.2f%%\n", c.step_a_us, c.step_b_us, c.step_error_pct);
  const std::string merged = c.merged.empty() ? "" : " (" + std::to_string(c.merged.size()) + " of them merged, below)";
  std::printf("ops         A %zu   B %zu   matched %zu%s   only in A %zu   only in B %zu\n\n", c.events_a, c.events_b,
              c.matched, merged.c_str(), c.unmatched_a.size(), c.unmatched_b.size());
  if (!c.meta_diffs.empty()) {
    std::printf("otherData differs (compared what aligns anyway):\n");
    for (const auto& d : c.meta_diffs) std::printf("  %-32s A %s   B %s\n", d.path.c_str(), d.a.c_str(), d.b.c_str());
    std::printf("\n");
  }
  std::printf("%-20s %8s %14s %14s %12s %12s\n", "op kind", "matched", "total A us", "total B us", "median err%", "p90 |err|%");
  for (const auto& k : c.kinds) {
    std::printf("%-20s %8zu %14.3f %14.3f %+12.2f %12.2f\n", k.op.c_str(), k.matched, k.total_a_us, k.total_b_us,
                k.median_error_pct, k.p90_abs_error_pct);
  }
  print_merged(c);
  print_ranks(c, a);
  if (!c.top.empty()) {
    std::printf("\nlargest differences (B - A):\n");
    for (const auto& d : c.top) {
      const auto& e = a.events[d.a];
      std::printf("  rank %-4d %-28s %12.3f -> %12.3f us  (%+.3f)\n", e.rank, e.name.c_str(), d.a_us, d.b_us,
                  d.delta_us);
    }
  }
  for (int side = 0; side < 2; ++side) {
    const auto& only = side == 0 ? c.only_in_a : c.only_in_b;
    for (const auto& o : only) {
      std::printf("%s only in %c: %zu x %s (e.g. %s)\n", side == 0 && &o == &only.front() ? "\n" : "", side == 0 ? 'A' : 'B',
                  o.count, o.op.c_str(), o.examples.front().c_str());
    }
  }
}

void print_summary(const trace::TraceSummary& a, const trace::TraceSummary& b) {
  std::printf("not comparable op by op (%s vs %s): per-step summaries, per rank\n\n", a.source.c_str(), b.source.c_str());
  auto row = [](const char* name, double x, double y) {
    std::printf("%-22s %14.3f %14.3f %+10.2f%%\n", name, x, y, x > 0 ? (y - x) / x * 100 : 0.0);
  };
  std::printf("%-22s %14s %14s %11s\n", "", "A us", "B us", "error");
  row("step time", a.step_us, b.step_us);
  row("compute busy", a.compute_us, b.compute_us);
  row("communication", a.comm_us, b.comm_us);
  row("exposed comm", a.exposed_comm_us, b.exposed_comm_us);
  for (int side = 0; side < 2; ++side) {
    const auto& s = side == 0 ? a : b;
    std::printf("\n%c (%s, %d rank(s), %d step(s)): time per category per step\n", side == 0 ? 'A' : 'B', s.source.c_str(),
                s.ranks, s.steps);
    for (const auto& c : s.categories) std::printf("  %-20s %10.1f x %14.3f us\n", c.name.c_str(), c.count, c.total_us);
  }
}

// One side of the comparison. A Tessel trace is compared one step at a time: its chosen step (steps.hpp);
// a profiler trace is summarised as the mean of its ProfilerSteps.
struct Side {
  std::string path;
  Loaded loaded;
  std::optional<trace::StepChoice> step;  // Tessel traces only
  trace::Trace compared;                  // a Tessel trace's chosen step; empty for a profiler trace
};

// What --svg draws: the step compared, or a profiler trace's kernels.
trace::Trace drawn(const Side& s) {
  if (const auto* k = std::get_if<trace::kineto::KinetoTrace>(&s.loaded)) return trace::kineto::to_trace(*k);
  return s.compared;
}

Side load_side(const std::string& path, std::optional<int> step) {
  Side s{path, load(path), std::nullopt, {}};
  if (auto* t = std::get_if<trace::Trace>(&s.loaded)) {
    const trace::StepSplit split = trace::split_steps(*t, path);
    s.step = trace::choose_step(split, step, "--step", path);
    s.compared = s.step->count > 1 ? trace::step_trace(*t, split, s.step->step) : *t;
  }
  return s;
}

// otherData.model is a name in a simulated trace (`tessel simulate` writes the preset's or the model file's
// name) and the whole model object in a measured one (`tessel run`), so compared as JSON the two always
// differed, even for the same model. A name against an object is compared by meaning: a preset name is
// resolved to the preset's fields, so only fields that really differ are listed (e.g. /model/seq_len); a
// name that is no preset is compared with the object's name (all a simulated trace says of its model).
void compare_models_semantically(trace::Trace& a, trace::Trace& b) {
  if (!a.other_data.is_object() || !b.other_data.is_object() || !a.other_data.contains("model") ||
      !b.other_data.contains("model"))
    return;
  nlohmann::json& ma = a.other_data["model"];
  nlohmann::json& mb = b.other_data["model"];
  if (!(ma.is_string() && mb.is_object()) && !(ma.is_object() && mb.is_string())) return;  // like with like
  nlohmann::json& name = ma.is_string() ? ma : mb;
  const nlohmann::json& object = ma.is_string() ? mb : ma;
  const std::string n = name.get<std::string>();
  const std::vector<std::string> presets = model_preset_names();
  if (std::find(presets.begin(), presets.end(), n) != presets.end()) {
    name = model_to_json(load_model(n));
    return;
  }
  if (object.contains("name") && object["name"] == name) name = object;
}

// "5 steps, compared step 3 (median of steps 2-5 by duration; step 1 is warm-up): 107234.1 80112.4 ... us";
// a resumed run's trace says which steps it holds ("4 steps (7 to 10), compared step 8"), every number as
// `tessel run` printed it, so two traces whose compared steps differ each say their own.
void print_steps(const Side& s, char name) {
  if (const auto* k = std::get_if<trace::kineto::KinetoTrace>(&s.loaded)) {
    std::printf("steps       %c %s: %s\n", name, s.path.c_str(), k->step_time_rule().c_str());
    return;
  }
  const trace::StepChoice& c = *s.step;
  if (c.count == 1) {
    std::printf("steps       %c %s: 1 step\n", name, s.path.c_str());
    return;
  }
  const std::string held = c.first == 1 ? "" : " (" + std::to_string(c.first) + " to " +
                                                  std::to_string(c.first + c.count - 1) + ")";
  std::printf("steps       %c %s: %d steps%s, compared step %d (%s); each step's us:", name, s.path.c_str(), c.count,
              held.c_str(), c.first + c.step, c.rule.c_str());
  for (double d : c.durations_us) std::printf(" %.1f", d);
  std::printf("\n");
}

nlohmann::json steps_json(const Side& s) {
  if (const auto* k = std::get_if<trace::kineto::KinetoTrace>(&s.loaded))
    return {{"count", k->steps.size()},
            {"compared", nullptr},
            {"rule", k->steps.empty() ? "no ProfilerSteps: the kernel span" : "mean of the ProfilerSteps"}};
  return trace::to_json(*s.step);
}

trace::TraceSummary summary_of(const Side& s) {
  if (const auto* k = std::get_if<trace::kineto::KinetoTrace>(&s.loaded)) return trace::summarize(*k);
  trace::TraceSummary out = trace::summarize(s.compared);
  out.steps = s.step->count;
  return out;
}

}  // namespace

int compare(const Args& args) {
  cli::CommandLine cl("compare", args,
                      {{"--json", false, "print one JSON document instead of tables"},
                       {"--svg", true, "write both timelines, one above the other, to this SVG file"},
                       {"--max-error", true, "exit 1 when |step-time error| exceeds this many percent"},
                       {"--top", true, "how many of the largest op differences to list (default 10)"},
                       {"--system", true, "system for predicting a profiler trace's collectives [from its GPU name]"},
                       {"--step", true, "compare step N (numbered as tessel run printed it) of each multi-step Tessel trace [median after the first]"}},
                      2);
  if (cl.print_help("", "\nA.json B.json: Tessel traces (Chrome JSON, optionally gzip) align op by op; a PyTorch "
                        "profiler\ntrace on either side gives a per-step summary comparison. A is the reference: "
                        "error = (B - A) / A.\nA Tessel trace of several steps (tessel run --steps) is compared one step against the other "
                        "trace:\nits step of median duration after the first (warm-up), or --step N; a one-step trace "
                        "(tessel simulate)\nis its step. A profiler trace is the mean of its ProfilerSteps.\n"))
    return 0;
  if (cl.positional().size() != 2) {
    throw InputError("compare: expected two traces, A and B, got " + std::to_string(cl.positional().size()) + " arguments");
  }
  auto svg = cl.get("--svg");
  if (svg) check_writable(*svg, "--svg");
  auto max_error = cl.get_double("--max-error", 0, 1e9);
  auto top = static_cast<std::size_t>(cl.get_int("--top", 0, 100000).value_or(10));
  auto step = cl.get_int("--step", 1, 1 << 30);
  Side sa = load_side(cl.positional()[0], step), sb = load_side(cl.positional()[1], step);
  compare_models_semantically(sa.compared, sb.compared);
  const std::string &pa = sa.path, &pb = sb.path;

  double step_error = 0;
  bool op_by_op = std::holds_alternative<trace::Trace>(sa.loaded) && std::holds_alternative<trace::Trace>(sb.loaded);
  trace::Comparison c;
  if (op_by_op) {
    const auto& a = sa.compared;
    const auto& b = sb.compared;
    c = trace::compare_traces(a, b, top);
    step_error = c.step_error_pct;
    if (cl.flag("--json")) {
      auto j = trace::to_json(c, a, b);
      j["mode"] = "op_by_op";
      j["a"] = pa;
      j["b"] = pb;
      j["steps"] = {{"a", steps_json(sa)}, {"b", steps_json(sb)}};
      std::cout << j.dump(2) << "\n";
    } else {
      print_steps(sa, 'A');
      print_steps(sb, 'B');
      const trace::StepChoice &ca = *sa.step, &cb = *sb.step;
      if (ca.count > 1 && cb.count > 1 && ca.first + ca.step != cb.first + cb.step)
        std::printf("note        A's step %d is compared with B's step %d, each numbered as its run printed it\n",
                    ca.first + ca.step, cb.first + cb.step);
      print_op_comparison(c, a, b);
    }
  } else {
    auto ma = summary_of(sa), mb = summary_of(sb);
    auto j = trace::summary_json(ma, mb);
    j["steps"] = {{"a", steps_json(sa)}, {"b", steps_json(sb)}};
    step_error = j["step_error_pct"].get<double>();
    // Each profiler trace's collectives, measured against the communication model on its GPU's system.
    std::vector<std::pair<std::string, std::string>> tables;
    for (int i = 0; i < 2; ++i) {
      const Side& side = i == 0 ? sa : sb;
      const auto* k = std::get_if<trace::kineto::KinetoTrace>(&side.loaded);
      if (!k || k->collectives.empty()) continue;
      const System sys = system_for_trace(*k, cl.get_or("--system", ""));
      const auto rows = predict_collectives(*k, sys);
      j[i == 0 ? "collectives_a" : "collectives_b"] = collectives_json(rows, sys);
      tables.emplace_back(side.path, collectives_table(rows, sys));
    }
    if (cl.flag("--json")) {
      std::cout << j.dump(2) << "\n";
    } else {
      print_steps(sa, 'A');
      print_steps(sb, 'B');
      std::printf("\n");
      print_summary(ma, mb);
      for (const auto& [path, table] : tables) std::cout << "\ncollectives of " << path << ":\n" << table;
    }
  }
  if (svg) {
    const trace::Trace a = drawn(sa), b = drawn(sb);
    if (!op_by_op) {
      c = trace::Comparison{};  // nothing aligns: draw both, highlight nothing
      c.step_a_us = trace::trace_end_us(a) - trace::trace_begin_us(a);
      c.step_b_us = trace::trace_end_us(b) - trace::trace_begin_us(b);
    }
    write_file_atomic(*svg, trace::compare_svg(a, pa, b, pb, c, trace::SvgOptions{}));
  }
  if (max_error && std::fabs(step_error) > *max_error) {
    std::cerr << "tessel compare: step-time error " << step_error << "% exceeds --max-error " << *max_error << "%\n";
    return 1;
  }
  return 0;
}

}  // namespace tessel::cmd
