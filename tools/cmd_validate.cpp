// tessel validate FILE.json: predict published measurements and report the error per row and metric; with
// --explore-rank, where each row's published layout ranks in explore's search (sim/explore/published_rank.hpp).
#include <algorithm>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "sim/explore/published_rank.hpp"
#include "sim/system.hpp"
#include "sim/validate.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"
#include "tools/format.hpp"

namespace tessel::cmd {

namespace {

// One search's cell: the rank, the published layout's step (and the layout, when the search's options hold
// another of the row's layouts than validate's choice), the search's best.
std::string cell(const explore::Standing& s, const std::string& published) {
  auto step = [](double v) { return fmt::fixed(v, 3) + " s"; };
  const std::string best = s.ranked > 0 ? "best " + s.best.layout.describe() + " " + step(s.best.step_s) : "nothing fits";
  if (s.rank == 0) return "not ranked (" + s.why_not + "); " + best;
  const std::string mine = s.published.layout.describe();
  return "#" + std::to_string(s.rank) + " of " + std::to_string(s.ranked) + (s.enumerated ? "" : " (not enumerated by explore)") +
         ": " + step(s.published.step_s) + (mine == published ? "" : " as " + mine) + " vs " + best;
}

// The Markdown table docs/explore.md shows: one row per published row, its rank in each search; then what each
// source's software offered, and the rows that could not be modelled.
std::string explore_rank_markdown(const explore::PublishedRanks& r) {
  std::ostringstream os;
  os << "| row | published layout | rank in the full space | rank within the source's options |\n|---|---|---|---|\n";
  std::vector<std::string> sources;
  for (const auto& p : r.rows) {
    os << "| " << p.id << " | " << p.published << " | " << cell(p.full, p.published) << " | " << cell(p.source, p.published)
       << " |\n";
    if (std::find(sources.begin(), sources.end(), p.source_options) == sources.end()) sources.push_back(p.source_options);
  }
  os << "\nThe sources' options:\n\n";
  for (const auto& s : sources) os << "- " << s << "\n";
  if (!r.skipped.empty()) {
    os << "\nNot modelled:\n\n";
    for (const auto& k : r.skipped) os << "- " << k.id << ": " << k.reason << "\n";
  }
  return os.str();
}

}  // namespace

std::string validation_text(const ValidationResult& r) {
  std::ostringstream os;
  // Unstated fields are the source stack's defaults; where the fastest fitting choice differs, its error too.
  const bool any_best = std::any_of(r.rows.begin(), r.rows.end(), [](const MetricResult& m) { return m.best_case.has_value(); });
  auto err = [](double e, bool points) { return (e >= 0 ? "+" : "") + fmt::fixed(e, 1) + (points ? " pt" : "%"); };
  std::vector<std::vector<std::string>> t = {{"row", "metric", "measured", "predicted", "error"}};
  if (any_best) t[0].push_back("best case (unstated fields at their fastest)");
  for (const auto& m : r.rows) {
    t.push_back({m.id, m.metric, fmt::fixed(m.measured, 3), fmt::fixed(m.predicted, 3), err(m.error_pct, m.points)});
    if (!any_best) continue;
    std::string b;
    if (m.best_case) {
      std::string what;
      for (const auto& a : m.best_case->assumed) what += (what.empty() ? "" : ", ") + a;
      b = err(m.best_case->error_pct, m.points) + " (" + what + ")";
    }
    t.back().push_back(b);
  }
  os << fmt::table(t) << "\n";
  std::vector<std::vector<std::string>> s = {{"metric", "rows", "MAPE", "max |error|"}};
  std::map<std::string, int> counts;
  std::map<std::string, std::string> unit;  // bubble rates: percentage points of the pipeline's time
  for (const auto& m : r.rows) {
    counts[m.metric]++;
    unit[m.metric] = m.points ? " pt" : "%";
  }
  for (const auto& [metric, mape] : r.mape_pct)
    s.push_back({metric, std::to_string(counts[metric]), fmt::fixed(mape, 1) + unit[metric],
                 fmt::fixed(r.max_abs_pct.at(metric), 1) + unit[metric]});
  os << fmt::table(s);
  // Memory verdicts: a row that ran fit; one the source reports out of memory did not.
  const MemoryCounts n = count_memory_verdicts(r.memory);
  os << "\nmemory: " << n.ran_right << " of " << n.ran << " rows that ran predicted to fit";
  if (n.out_of_memory > 0)
    os << "; " << n.out_of_memory_right << " of " << n.out_of_memory << " rows measured out of memory predicted not to fit";
  os << "\n";
  for (const auto& v : r.memory)
    if (!v.right()) {
      os << "  " << v.id << ": " << (v.ran ? "ran, predicted " : "out of memory, predicted ") << fmt::fixed(v.peak_GiB, 1)
         << " of " << fmt::fixed(v.capacity_GiB, 1) << " GiB";
      if (v.fp8_weights_peak_GiB)
        os << " with 16-bit weights; " << fmt::fixed(*v.fp8_weights_peak_GiB, 1) << " GiB with fp8 primary weights";
      os << "\n";
    }
  if (!r.skipped.empty()) {
    os << "\nskipped " << r.skipped.size() << " rows:\n";
    for (const auto& k : r.skipped) os << "  " << k.id << ": " << k.reason << "\n";
  }
  return os.str();
}

int validate(const Args& args) {
  cli::CommandLine cl("validate", args,
                      {{"--json", false, "print one JSON document"},
                       {"--engine", true, "analytical|des: how step times are predicted [analytical]"},
                       {"--only", true, "comma-separated id prefixes to keep (e.g. korthikanti22,narayanan21_t2)"},
                       {"--system", true, "use this system (preset or JSON) for every row instead of mapping each row's GPU"},
                       {"--system-override", true, "same as --system"},
                       {"--explore-rank", false, "where each row's published layout ranks in explore's search (analytical tier)"}},
                      1);
  if (cl.help_requested() || cl.positional().empty()) {
    std::cout << "usage: tessel validate FILE.json [options]\n" << cl.usage();
    return cl.help_requested() ? 0 : 2;
  }
  const std::string path = cl.positional()[0];
  Json rows = parse_json_file(path);
  if (cl.get("--only")) rows = select_rows(rows, path, cl.get_list("--only"));
  const std::string engine = cl.get_or("--engine", "analytical");
  StepTimeFn step_fn;
  if (engine == "des") {
    step_fn = des_step_time();
  } else if (engine != "analytical") {
    throw InputError("--engine " + engine + ": must be analytical or des");
  }
  std::optional<System> sys;
  if (cl.has("--system") && cl.has("--system-override")) throw InputError("--system and --system-override: give one");
  if (auto v = cl.get("--system")) sys = load_system(*v);
  if (auto v = cl.get("--system-override")) sys = load_system(*v);
  if (cl.flag("--explore-rank")) {
    if (engine != "analytical")
      throw InputError("--explore-rank ranks by explore's analytical tier; --engine " + engine + " does not apply to it");
    const explore::PublishedRanks ranks = explore::rank_published(rows, path, sys ? &*sys : nullptr);
    if (cl.flag("--json")) std::cout << explore::published_ranks_to_json(ranks).dump(2) << "\n";
    else std::cout << explore_rank_markdown(ranks);
    return 0;
  }
  const ValidationResult r = validate_rows(rows, path, step_fn, sys ? &*sys : nullptr);
  // The error bands the presets carry are these, with the presets' own mapping: over published.json their
  // error_band, over published-moe.json their moe_error_band.
  const auto bands = sys ? std::map<std::string, ErrorBand>{} : step_error_bands(rows, r);
  if (cl.flag("--json")) {
    Json j = validation_to_json(r);
    j["error_bands"] = Json::object();
    for (const auto& [cls, b] : bands) j["error_bands"][cls] = {{"step_pct", b.step_pct}, {"rows", b.rows}};
    // Every scored row's step error under the system in use (--system included), whatever its class: what
    // a leave-one-source-out check reads (tools/validation_report.py).
    double sum = 0;
    const auto steps = step_errors(r);
    for (const auto& kv : steps) sum += std::fabs(kv.second);
    j["step_error"] = {{"rows", steps.size()}, {"mean_abs_pct", steps.empty() ? Json(nullptr) : Json(100 * sum / steps.size())}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << validation_text(r);
  if (!bands.empty()) {
    std::cout << "\nstep-time error by hardware class (one step metric per row):\n";
    for (const auto& [cls, b] : bands)
      std::cout << "  " << cls << ": " << fmt::fixed(b.step_pct, 1) << "% mean |error| over " << b.rows << " rows\n";
  }
  return 0;
}

}  // namespace tessel::cmd
