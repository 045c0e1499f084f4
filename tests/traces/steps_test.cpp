// split_steps / choose_step / step_trace: a measured run of many steps compared one step at a time.
#include <doctest/doctest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "util/error.hpp"
#include "tests/traces/trace_fixtures.hpp"
#include "traces/compare.hpp"
#include "traces/steps.hpp"

using namespace tessel;
using namespace tessel::trace;

namespace {

constexpr double kTol = 1e-12;  // relative: the spans are sums of a few scaled doubles

// Step k spans 120 * factor µs (one_step_trace's 0..120 µs scaled). Steps 2..5 take 120, 180, 144, 156 µs:
// ordered 120 (step 2), 144 (step 4), 156 (step 5), 180 (step 3); the lower median is step 4, 144 µs, which
// is neither the first, the last, the fastest nor the mean (150) of them.
const std::vector<double> kFactors = {2.0, 1.0, 1.5, 1.2, 1.3};
constexpr double kGapUs = 50;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

}  // namespace

TEST_CASE("steps are counted by optimizer ops and split by repeat order") {
  Trace t = test::multi_step_trace(kFactors, kGapUs);
  StepSplit s = split_steps(t, "run.json");
  REQUIRE(s.count() == 5);
  for (std::size_t k = 0; k < kFactors.size(); ++k) {
    CHECK(s.durations_us[k] == doctest::Approx(120 * kFactors[k]).epsilon(kTol));
    // one_step_trace holds 15 events: every step gets its 15, among them rank 0's all-gather that runs
    // after the optimizer (it starts where the optimizer ends, at 117 x factor within the step).
    Trace one = step_trace(t, s, static_cast<int>(k));
    CHECK(one.events.size() == 15);
    CHECK(trace_end_us(one) - trace_begin_us(one) == doctest::Approx(120 * kFactors[k]).epsilon(kTol));
  }
}

TEST_CASE("the compared step: median after the warm-up step, or the one asked for") {
  StepSplit s = split_steps(test::multi_step_trace(kFactors, kGapUs), "run.json");
  StepChoice c = choose_step(s, std::nullopt, "--step", "run.json");
  CHECK(c.count == 5);
  CHECK(c.step == 3);  // step 4 (from 1), see kFactors
  CHECK(c.step_us == doctest::Approx(144).epsilon(kTol));
  CHECK(c.rule.find("median of steps 2-5") != std::string::npos);

  c = choose_step(s, 3, "--step", "run.json");
  CHECK(c.step == 2);
  CHECK(c.step_us == doctest::Approx(180).epsilon(kTol));
  c = choose_step(s, 1, "--step", "run.json");  // the warm-up step, when asked for
  CHECK(c.step_us == doctest::Approx(240).epsilon(kTol));

  CHECK(message_of([&] { choose_step(s, 6, "--step", "run.json"); }) == "--step 6: run.json holds 5 steps; choose 1 to 5");
  CHECK(message_of([&] { choose_step(s, 0, "--step", "run.json"); }) == "--step 0: run.json holds 5 steps; choose 1 to 5");

  // Two steps: the second, the first being warm-up.
  StepSplit two = split_steps(test::multi_step_trace({1.0, 1.5}, kGapUs), "run.json");
  c = choose_step(two, std::nullopt, "--step", "run.json");
  CHECK(c.step == 1);
  CHECK(c.step_us == doctest::Approx(180).epsilon(kTol));
}

TEST_CASE("a resumed run's trace numbers its steps from otherData.first_step") {
  // The five steps of kFactors as the trace of a run resumed after step 6: steps 7 to 11. Step 8 is the
  // second (index 1, 120 µs); the default is still the median after the first (warm-up) step: index 3,
  // step 10, 144 µs.
  Trace t = test::multi_step_trace(kFactors, kGapUs);
  t.other_data["first_step"] = 7;
  StepSplit s = split_steps(t, "res.json");
  CHECK(s.first == 7);
  StepChoice c = choose_step(s, 8, "--step", "res.json");
  CHECK(c.step == 1);
  CHECK(c.step_us == doctest::Approx(120).epsilon(kTol));
  CHECK(to_json(c)["compared"] == 8);
  CHECK(to_json(c)["first"] == 7);
  c = choose_step(s, std::nullopt, "--step", "res.json");
  CHECK(c.step == 3);
  CHECK(to_json(c)["compared"] == 10);
  CHECK(c.rule == "median of steps 8-11 by duration; step 7 is warm-up");
  // A number the run never printed is refused, naming the steps the trace holds.
  const std::string held = "res.json holds 5 steps, numbered 7 to 11 (its run resumed after step 6); choose 7 to 11";
  CHECK(message_of([&] { choose_step(s, 2, "--step", "res.json"); }) == "--step 2: " + held);
  CHECK(message_of([&] { choose_step(s, 12, "--step", "res.json"); }) == "--step 12: " + held);
  // Two steps resumed after step 3: the second, step 5.
  Trace two = test::multi_step_trace({1.0, 1.5}, kGapUs);
  two.other_data["first_step"] = 4;
  c = choose_step(split_steps(two, "res.json"), std::nullopt, "--step", "res.json");
  CHECK(c.rule == "step 5: step 4 is warm-up");
  // Not a step number: refused naming the file and the key.
  for (const nlohmann::json& bad : {nlohmann::json(0), nlohmann::json("7"), nlohmann::json(2.5)}) {
    CAPTURE(bad.dump());
    t.other_data["first_step"] = bad;
    CHECK(message_of([&] { split_steps(t, "res.json"); }).find("res.json: otherData.first_step: value " + bad.dump()) == 0);
  }
}

TEST_CASE("a one-step trace is its step") {
  Trace t = test::one_step_trace();
  StepSplit s = split_steps(t, "sim.json");
  REQUIRE(s.count() == 1);
  StepChoice c = choose_step(s, 3, "--step", "sim.json");  // nothing else to choose
  CHECK(c.step == 0);
  CHECK(c.step_us == doctest::Approx(120));
  // No optimizer op at all (a hand-made trace): one step, the whole trace.
  CHECK(split_steps(test::two_stage_trace(), "x.json").durations_us == std::vector<double>{112});
}

TEST_CASE("a trace that is not whole steps is refused with the rank and op named") {
  Trace t = test::multi_step_trace({1.0, 1.0, 1.0}, kGapUs);
  Trace no_opt = t;
  for (auto it = no_opt.events.begin(); it != no_opt.events.end(); ++it) {
    if (it->rank == 1 && it->op == "optimizer") {
      no_opt.events.erase(it);
      break;
    }
  }
  CHECK(message_of([&] { split_steps(no_opt, "run.json"); }) ==
        "run.json: rank 1 has 2 optimizer ops, other ranks 3: every rank records one optimizer op per step");
  Trace short_one = t;
  short_one.events.erase(short_one.events.begin());  // rank 0's first forward of mb 0
  CHECK(message_of([&] { split_steps(short_one, "run.json"); }) ==
        "run.json: rank 0 has 2 x 'forward s0 mb0', not a multiple of its 3 steps (optimizer ops): a trace of whole "
        "steps repeats every op in every step");
}

TEST_CASE("one step of a run against the simulator's one step: times, ops and totals of that step") {
  Trace sim = test::one_step_trace();
  Trace run = test::multi_step_trace(kFactors, kGapUs);
  StepSplit s = split_steps(run, "run.json");
  StepChoice chosen = choose_step(s, std::nullopt, "--step", "run.json");
  Comparison c = compare_traces(sim, step_trace(run, s, chosen.step));
  // Step 4 is the simulated step scaled by 1.2: 144 vs 120 µs, +20%, every op matched once.
  CHECK(c.step_a_us == doctest::Approx(120).epsilon(kTol));
  CHECK(c.step_b_us == doctest::Approx(144).epsilon(kTol));
  CHECK(c.step_error_pct == doctest::Approx(20).epsilon(1e-9));
  CHECK(c.matched == 15);
  CHECK(c.unmatched_b.empty());
  for (const auto& k : c.kinds) {
    CHECK(k.total_b_us == doctest::Approx(1.2 * k.total_a_us).epsilon(kTol));
    CHECK(k.median_error_pct == doctest::Approx(20).epsilon(1e-9));
  }
}
