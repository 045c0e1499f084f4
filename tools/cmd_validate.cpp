// tessel validate FILE.json: predict published measurements and report the error per row and metric.
#include <iostream>
#include <sstream>
#include <map>
#include <optional>

#include "sim/system.hpp"

#include "sim/validate.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"
#include "tools/format.hpp"

namespace tessel::cmd {

std::string validation_text(const ValidationResult& r) {
  std::ostringstream os;
  std::vector<std::vector<std::string>> t = {{"row", "metric", "measured", "predicted", "error"}};
  for (const auto& m : r.rows)
    t.push_back({m.id, m.metric, fmt::fixed(m.measured, 3), fmt::fixed(m.predicted, 3),
                 (m.error_pct >= 0 ? "+" : "") + fmt::fixed(m.error_pct, 1) + "%"});
  os << fmt::table(t) << "\n";
  std::vector<std::vector<std::string>> s = {{"metric", "rows", "MAPE", "max |error|"}};
  std::map<std::string, int> counts;
  for (const auto& m : r.rows) counts[m.metric]++;
  for (const auto& [metric, mape] : r.mape_pct)
    s.push_back({metric, std::to_string(counts[metric]), fmt::fixed(mape, 1) + "%", fmt::fixed(r.max_abs_pct.at(metric), 1) + "%"});
  os << fmt::table(s);
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
                       {"--system-override", true, "same as --system"}},
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
  const ValidationResult r = validate_rows(rows, path, step_fn, sys ? &*sys : nullptr);
  if (cl.flag("--json")) {
    std::cout << validation_to_json(r).dump(2) << "\n";
    return 0;
  }
  std::cout << validation_text(r);
  return 0;
}

}  // namespace tessel::cmd
