// Event engine core: fixed-length chains, the fluid network model's sharing, cycles, determinism.
#include <doctest/doctest.h>

#include <vector>

#include "util/error.hpp"
#include "sim/engine/simulator.hpp"

using namespace tessel;
using namespace tessel::engine;

namespace {
constexpr double kTol = 1e-12;
}

TEST_CASE("engine: a chain and a fork of fixed tasks") {
  // System: a -> b -> d and a -> c -> d with durations 1, 2, 5, 1.
  // Expectations: b ends 3, c ends 6, d starts at max(3, 6) = 6 and ends 7; makespan 7.
  GraphBuilder b(1);
  const auto a = b.add_fixed(1), bb = b.add_fixed(2), c = b.add_fixed(5), d = b.add_fixed(1);
  b.edge(a, bb);
  b.edge(a, c);
  b.edge(bb, d);
  b.edge(c, d);
  const TaskGraph g = b.finish();
  Simulator sim(g);
  const RunResult r = sim.run();
  CHECK(r.end[bb] == doctest::Approx(3).epsilon(kTol));
  CHECK(r.start[d] == doctest::Approx(6).epsilon(kTol));
  CHECK(r.makespan == doctest::Approx(7).epsilon(kTol));
  CHECK(r.events == 8);  // 4 starts + 4 ends, no flows
}

TEST_CASE("engine: flows share a link proportionally") {
  // System: one link of capacity 1; flow x (work 2) starts at 0, flow y (work 1) starts at 1 (after a
  // fixed task of length 1). Expectations: alone x runs at rate 1 until t=1 (1 left); then both run at 1/2;
  // y needs 1 -> ends at t=3, x has 1 - 1 = 0 left at t=3 too (both at 1/2 for 2 s). Makespan 3.
  GraphBuilder b(1, {1.0});
  const std::uint32_t link[] = {0};
  const auto x = b.add_flow(2, link);
  const auto wait = b.add_fixed(1);
  const auto y = b.add_flow(1, link);
  b.edge(wait, y);
  const TaskGraph g = b.finish();
  Simulator sim(g);
  const RunResult r = sim.run();
  CHECK(r.end[y] == doctest::Approx(3).epsilon(1e-9));
  CHECK(r.end[x] == doctest::Approx(3).epsilon(1e-9));

  SUBCASE("a flow is limited by its slowest link") {
    // Links 0 (capacity 1) and 1 (capacity 0.5): a flow of work 1 on both runs at 0.5 -> ends at 2.
    GraphBuilder b2(1, {1.0, 0.5});
    const std::uint32_t both[] = {0, 1};
    const auto f = b2.add_flow(1, both);
    const TaskGraph g2 = b2.finish();
    Simulator s2(g2);
    CHECK(s2.run().end[f] == doctest::Approx(2).epsilon(kTol));
  }
}

TEST_CASE("engine: memory deltas give the peak per position") {
  // Position 0: +3 at a's start, +2 at b's start, -3 at a's end (a: 0..2, b: 1..4), -2 at b's end.
  // Expectations: held 3 at 0, 5 at 1, 2 at 2, 0 at 4 -> peak 5 reached at t = 1.
  GraphBuilder b(1);
  const auto a = b.add_fixed(2), w = b.add_fixed(1), bb = b.add_fixed(3);
  b.edge(w, bb);
  b.memory(a, 0, 3, -3);
  b.memory(bb, 0, 2, -2);
  const TaskGraph g = b.finish();
  Simulator sim(g);
  RunOptions o;
  o.memory_timeline = true;
  const RunResult r = sim.run(o);
  CHECK(r.peak_bytes[0] == doctest::Approx(5).epsilon(kTol));
  CHECK(r.peak_time[0] == doctest::Approx(1).epsilon(kTol));
  REQUIRE(r.memory.size() == 4);
  CHECK(r.memory.back().bytes == doctest::Approx(0).epsilon(kTol));
}

TEST_CASE("engine: a cycle is reported, not hung on") {
  GraphBuilder b(1);
  const auto a = b.add_fixed(1), c = b.add_fixed(1);
  b.edge(a, c);
  b.edge(c, a);
  const TaskGraph g = b.finish();
  Simulator sim(g);
  CHECK_THROWS_AS(sim.run(), InternalError);
}

TEST_CASE("engine: compute slows while communication on its position's links overlaps it") {
  // Two positions (links: NVLink 0, 1; NIC 2, 3), overlap slowdown s = 0.25 -> rate 1 / 1.25 = 0.8.
  // Compute c (work 1) on position 0 from t = 0; flow f (work 0.5) on position 0's NIC from t = 0, then
  // flow g (work 0.5) on position 1's links only, after f. Expectations: during f (0 to 0.5) c does 0.4;
  // the remaining 0.6 at full rate ends c at 1.1. g touches position 1 only: c is not slowed again.
  // Compute d (work 1) on position 1 starts at 0 and overlaps g (0.5 to 1.0): it does 0.5 alone, then
  // 0.4 during g, the last 0.1 alone -> ends at 1.1 too.
  GraphBuilder b(2, {1.0, 1.0, 1.0, 1.0});
  b.overlap(0.25, 2);
  const std::uint32_t nic0[] = {2}, pos1[] = {1, 3};
  const auto c = b.add_fixed(1.0);
  b.compute_on(c, 0);
  const auto d = b.add_fixed(1.0);
  b.compute_on(d, 1);
  const auto f = b.add_flow(0.5, nic0);
  const auto g = b.add_flow(0.5, pos1);
  b.edge(f, g);
  const TaskGraph graph = b.finish();
  Simulator sim(graph);
  const RunResult r = sim.run();
  CHECK(r.end[f] == doctest::Approx(0.5).epsilon(kTol));
  CHECK(r.end[c] == doctest::Approx(1.1).epsilon(1e-9));
  CHECK(r.end[g] == doctest::Approx(1.0).epsilon(kTol));
  CHECK(r.end[d] == doctest::Approx(1.1).epsilon(1e-9));

  SUBCASE("without a slowdown the same graph overlaps for free") {
    GraphBuilder b0(2, {1.0, 1.0, 1.0, 1.0});
    const auto c0 = b0.add_fixed(1.0);
    b0.compute_on(c0, 0);
    const auto f0 = b0.add_flow(0.5, nic0);
    (void)f0;
    const TaskGraph g0 = b0.finish();
    Simulator s0(g0);
    CHECK(s0.run().end[c0] == doctest::Approx(1.0).epsilon(kTol));
  }
}
