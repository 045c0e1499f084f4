// Fuzz targets for the sim spec formats: system JSON, layout JSON and published validation rows. Each
// parses as the tool does, then hands the result to the first consumer that trusts it (the layout rules,
// the analytical estimate), because a parser that accepts a value its consumers cannot handle is the bug
// we are looking for.
#include <cmath>

#include "models/model.hpp"
#include "sim/calibrate/bench_data.hpp"
#include "sim/calibrate/fit.hpp"
#include "sim/estimate.hpp"
#include "sim/layout.hpp"
#include "sim/stack.hpp"
#include "sim/system.hpp"
#include "sim/validate.hpp"
#include "tests/fuzz/fuzz_check.hpp"
#include "tests/fuzz/targets.hpp"

namespace tessel::fuzz {

namespace {
const std::string kOrigin = "fuzz-input";
}  // namespace

void system_json(std::string_view data) {
  const System s = parse_system(parse_json_text(std::string(data), kOrigin), kOrigin);
  const Json j = system_to_json(s);
  FUZZ_CHECK(system_to_json(parse_system(j, "round-trip")) == j, "system JSON round trip changed the system");
  // The estimate of a small model on this system: every efficiency, bandwidth and peak gets divided by.
  const Model m = load_model("tiny");
  Layout l;
  l.global_batch = 8;
  const Estimate e = estimate(m, l, s, 1);
  FUZZ_CHECK(std::isfinite(e.step_s) && e.step_s >= 0, "negative step time on an accepted system");
}

void layout_json(std::string_view data) {
  const Layout l = parse_layout(parse_json_text(std::string(data), kOrigin), kOrigin);
  FUZZ_CHECK(l.gpus() >= 1, "accepted layout has no GPUs");
  const Json j = layout_to_json(l);
  FUZZ_CHECK(layout_to_json(parse_layout(j, "round-trip")) == j, "layout JSON round trip changed the layout");
  // The rules must answer without throwing for any parsed layout (explore calls them for every candidate).
  const Model m = load_model("tiny");
  if (!layout_problem(l, m, l.gpus()) && l.gpus() <= 64) {
    const Estimate e = estimate(m, l, load_system("dgx-a100"), l.gpus());
    FUZZ_CHECK(std::isfinite(e.step_s) && e.step_s >= 0, "negative step time on an accepted layout");
  }
}

void stack_json(std::string_view data) {
  // `--stack FILE`: strict reading, then the consumers that trust it on a layout of every schedule it lists.
  const Stack s = parse_stack(parse_json_text(std::string(data), kOrigin), kOrigin);
  FUZZ_CHECK(!s.schedules.empty() && !s.recompute.empty() && !s.zero.empty(), "accepted stack offers nothing");
  for (sched::Kind k : s.schedules) {
    Layout l;
    l.pp = 2;
    l.schedule = k;
    l.vpp = sched::default_vpp(k, 2);
    l.global_batch = 8;
    apply_stack(s, l);
    (void)stack_problem(s, l);
  }
}

void validation_rows(std::string_view data) {
  const Json rows = parse_json_text(std::string(data), kOrigin);
  const ValidationResult r = validate_rows(rows, kOrigin);
  (void)validation_to_json(r).dump();
}

void bench_json(std::string_view data) {
  // `tessel calibrate --bench`: strict reading, a round trip, then the fit that trusts every row.
  const calib::BenchData b = calib::parse_bench(parse_json_text(std::string(data), kOrigin), kOrigin);
  const Json j = calib::bench_to_json(b);
  FUZZ_CHECK(calib::bench_to_json(calib::parse_bench(j, "round-trip")) == j, "bench JSON round trip changed it");
  const calib::FitResult r = calib::fit_profile(b, load_system("cpu"));
  (void)system_to_json(r.profile).dump();
}

}  // namespace tessel::fuzz
