// The closed loop's statistics (sim/calibrate/loop_stats.hpp): Kendall's tau-b, the recompute folded into the
// backward as the runtimes record it, and per-op errors of a measured steady step against a simulated one.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "sim/calibrate/loop_stats.hpp"
#include "sim/calibrate/trace_events.hpp"

using namespace tessel;
using namespace tessel::calib;

namespace {
trace::OpEvent op(int rank, const char* kind, int stage, int mb, double start_us, double dur_us) {
  trace::OpEvent e;
  e.rank = rank;
  e.op = kind;
  e.name = std::string(kind) + " s" + std::to_string(stage) + " mb" + std::to_string(mb);
  e.stage = stage;
  e.chunk = 0;
  e.mb = mb;
  e.start_us = start_us;
  e.dur_us = dur_us;
  return e;
}
}  // namespace

TEST_CASE("Kendall's tau-b: orders, one swap, ties") {
  CHECK(kendall_tau({1, 2, 3, 4}, {10, 20, 30, 40}) == doctest::Approx(1.0));
  CHECK(kendall_tau({1, 2, 3, 4}, {40, 30, 20, 10}) == doctest::Approx(-1.0));
  // One adjacent swap among 4: 6 pairs, 5 concordant, 1 discordant: 4/6.
  CHECK(kendall_tau({1, 2, 3, 4}, {10, 30, 20, 40}) == doctest::Approx(4.0 / 6));
  // a = {1, 1, 2}, b = {1, 2, 3}: pairs (0,1) tied in a, (0,2) and (1,2) concordant: s = 2;
  // sqrt((3 - 1)(3 - 0)) = sqrt(6): 2 / sqrt(6).
  CHECK(kendall_tau({1, 1, 2}, {1, 2, 3}) == doctest::Approx(2 / std::sqrt(6.0)));
  CHECK(kendall_tau({5}, {7}) == 0.0);  // no pairs
}

TEST_CASE("fold_recompute: a recompute op's time goes into its backward, which then starts where it did") {
  trace::Trace t;
  t.events = {op(0, "forward", 0, 0, 0, 5), op(0, "recompute", 0, 0, 10, 2), op(0, "backward", 0, 0, 12, 3),
              op(1, "recompute", 1, 0, 4, 1), op(1, "input_grad", 1, 0, 5, 2), op(1, "weight_grad", 1, 0, 7, 1)};
  const trace::Trace f = fold_recompute(t);
  REQUIRE(f.events.size() == 4);
  CHECK(f.events[1].op == "backward");
  CHECK(f.events[1].start_us == 10);
  CHECK(f.events[1].dur_us == 5);
  CHECK(f.events[2].op == "input_grad");
  CHECK(f.events[2].dur_us == 3);  // 2 + the 1 of its recompute
  CHECK(f.events[3].dur_us == 1);  // weight_grad untouched
}

TEST_CASE("op_errors: the measured steady step against the simulated step, per op kind") {
  // Measured: 3 steps of forward (100 us), backward (200 us), optimizer (50 us) on 1 rank, but step 1 (warm-up)
  // slow and step 3's forward 120 us. Steps 2 and 3 last 350 and 370 us: the compared step is the median of the
  // steps after the first, the lower of two: step 2. Simulated: forward 110, backward 180, optimizer 50:
  // errors +10%, -10%, 0.
  trace::Trace m;
  const double fwd[3] = {400, 100, 120};
  double at = 0;
  for (int s = 0; s < 3; ++s) {
    m.events.push_back(op(0, "forward", 0, 0, at, fwd[s]));
    m.events.push_back(op(0, "backward", 0, 0, at + fwd[s], 200));
    trace::OpEvent o = op(0, "optimizer", -1, -1, at + fwd[s] + 200, 50);
    m.events.push_back(o);
    at += fwd[s] + 250 + 10;
  }
  trace::Trace sim;
  sim.events = {op(0, "forward", 0, 0, 0, 110), op(0, "backward", 0, 0, 110, 180), op(0, "optimizer", -1, -1, 290, 50)};
  const std::vector<OpError> e = op_errors(m, sim, "m.json");
  REQUIRE(e.size() == 3);
  CHECK(e[0].op == "forward");
  CHECK(e[0].measured_s == doctest::Approx(100e-6));
  CHECK(e[0].error == doctest::Approx(0.10));
  CHECK(e[1].error == doctest::Approx(-0.10));
  CHECK(e[2].op == "optimizer");
  CHECK(e[2].error == doctest::Approx(0.0));
}

TEST_CASE("measured ops: the median of the steady-state instances, their spread and the ranks computing beside") {
  // Two ranks, 4 steps. Rank 0's forward: 900 (warm-up, left out), 100, 140, 110 us: median 110, spread by
  // nearest rank on {100, 110, 140}: (v[2] - v[0]) / 110 = 40/110. Rank 1 computes beside rank 0's forward for
  // half of each steady instance: busy ranks 1.5.
  trace::Trace t;
  const double d0[4] = {900, 100, 140, 110};
  double at = 0;
  for (int s = 0; s < 4; ++s) {
    t.events.push_back(op(0, "forward", 0, 0, at, d0[s]));
    t.events.push_back(op(1, "forward", 1, 0, at + d0[s] / 2, d0[s] / 2));
    t.events.push_back(op(0, "optimizer", -1, -1, at + d0[s], 10));
    t.events.push_back(op(1, "optimizer", -1, -1, at + d0[s], 10));
    at += d0[s] + 20;
  }
  const MeasuredOps ops = measure_ops({t}, {"t.json"});
  const MeasuredOp& f0 = ops.ops.front();
  CHECK(f0.op == "forward");
  CHECK(f0.instances == 3);
  CHECK(f0.median_s == doctest::Approx(110e-6));
  CHECK(f0.spread == doctest::Approx(40.0 / 110));
  CHECK(f0.busy_ranks == doctest::Approx(1.5));
}

TEST_CASE("measured ops on a host: the ranks on the op's home core and the cores computing around it") {
  // 2 cores, 4 ranks: 0 and 2 on core 0, 1 and 3 on core 1. Two steps (the first warm-up), the second as
  // below from t = 1000. Rank 0's forward [0, 100); rank 2's [50, 100) on the same core: crowd 1.5. Core 1:
  // rank 1 over [0, 100) and rank 3 over [0, 40): busy the whole time once, however many of its ranks
  // compute (the union, not the sum): busy cores 2. The pool's count would be 1 + 0.5 + 1 + 0.4 = 2.9.
  trace::Trace t;
  for (int s = 0; s < 2; ++s) {
    const double at = 1000.0 * s;
    t.events.push_back(op(0, "forward", 0, 0, at, 100));
    t.events.push_back(op(2, "forward", 2, 0, at + 50, 50));
    t.events.push_back(op(1, "forward", 1, 0, at, 100));
    t.events.push_back(op(3, "forward", 3, 0, at, 40));
    for (int r = 0; r < 4; ++r) t.events.push_back(op(r, "optimizer", -1, -1, at + 200, 10));
  }
  const MeasuredOps ops = measure_ops({t}, {"t.json"}, 2);
  const MeasuredOp& f0 = ops.ops.front();
  REQUIRE(f0.rank == 0);
  CHECK(f0.busy_ranks == doctest::Approx(2.9));
  CHECK(f0.crowd == doctest::Approx(1.5));
  CHECK(f0.busy_cores == doctest::Approx(2.0));
  // Without the cores the host view is left at one rank on an otherwise idle host.
  const MeasuredOps pool = measure_ops({t}, {"t.json"});
  CHECK(pool.ops.front().crowd == 1);
  CHECK(pool.ops.front().busy_cores == 1);
}

TEST_CASE("tau between repeats: every pair of repeats' measured orders, in order (0,1), (0,2), (1,2)") {
  // Four layouts. Repeat 1 swaps the two middle ones (5 of 6 pairs agree: tau 4/6); repeat 2 reverses repeat 0
  // (tau -1 with it; with repeat 1, 1 of 6 pairs agrees: -4/6).
  const std::vector<std::vector<double>> m = {{1, 2, 3, 4}, {1, 3, 2, 4}, {4, 3, 2, 1}};
  const std::vector<double> t = tau_between_repeats(m);
  REQUIRE(t.size() == 3);
  CHECK(t[0] == doctest::Approx(4.0 / 6));
  CHECK(t[1] == doctest::Approx(-1.0));
  CHECK(t[2] == doctest::Approx(-4.0 / 6));
  // One repeat has no pair; repeats of different layouts are a caller's error.
  CHECK(tau_between_repeats({{1, 2, 3}}).empty());
  CHECK_THROWS(tau_between_repeats({{1, 2, 3}, {1, 2}}));
}

// What an exact prediction reaches against one noisy repeat, from how well two repeats agree: in
// [between, sqrt(between)]. Checked against the two ends of the inequality it rests on: every pair equally hard
// (one q for all, mean(q) = sqrt(mean(q^2)): the high end) and pairs either certain or a coin toss (q of 1
// or 0, mean(q) = mean(q^2): the low end).
TEST_CASE("error-free tau: the measured order's repeatability bounds what an exact prediction reaches") {
  const TauBounds b = error_free_tau(0.64);
  CHECK(b.low == doctest::Approx(0.64));
  CHECK(b.high == doctest::Approx(0.8));
  CHECK(error_free_tau(1.0).low == 1.0);
  CHECK(error_free_tau(1.0).high == 1.0);
  CHECK(error_free_tau(-0.2).low == 0.0);  // repeats that disagree more than chance: nothing to bound with
  CHECK(error_free_tau(-0.2).high == 0.0);
  // Simulated: 12 layouts, true steps 1..12; every measurement adds an independent error. Half the layouts'
  // errors are large (those pairs' orders a coin toss between repeats), half nil. Over many draws the exact
  // prediction's tau against one repeat falls within the bounds of the mean tau between two repeats.
  std::uint64_t state = 12345;
  const auto uniform = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53);
  };
  std::vector<double> truth(12);
  for (std::size_t i = 0; i < truth.size(); ++i) truth[i] = static_cast<double>(i + 1);
  double exact = 0, between = 0;
  const int draws = 2000;
  for (int d = 0; d < draws; ++d) {
    std::vector<double> m1 = truth, m2 = truth;
    for (std::size_t i = 0; i < truth.size(); i += 2) {
      m1[i] += 8 * (uniform() - 0.5);
      m2[i] += 8 * (uniform() - 0.5);
    }
    exact += kendall_tau(truth, m1) / draws;
    between += kendall_tau(m1, m2) / draws;
  }
  const TauBounds s = error_free_tau(between);
  CHECK(between < 0.95);  // the noise is felt
  CHECK(exact >= s.low);
  CHECK(exact <= s.high);
  CHECK(exact > between + 0.02);  // and the exact prediction is not held to the repeats' own agreement
}
