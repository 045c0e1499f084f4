// The host model (sim/engine/host_model.hpp): ranks sharing a host's cores, each rank on its home core. The
// rate formula, the engine's re-rating as ops start and end, and whole simulations on a host with fewer cores
// than ranks.
#include <doctest/doctest.h>

#include "sim/engine/host_model.hpp"
#include "sim/engine/simulate.hpp"
#include "sim/engine/simulator.hpp"

using namespace tessel;
using namespace tessel::engine;

namespace {
constexpr double kRel = 1e-9;

// `n` compute tasks, one per position, task i of work alone[i] / busy[i], started after `delay[i]` seconds of
// a task that is no compute (it takes no share of the cores). Position p's threads are ranks p * threads + i,
// each on its home core.
TaskGraph host_graph(const std::vector<double>& alone, const std::vector<double>& busy, const std::vector<double>& delay,
                     int cores, int threads) {
  const int n = static_cast<int>(alone.size());
  GraphBuilder b(n);
  std::vector<std::uint32_t> ops;
  for (int i = 0; i < n; ++i) {
    const auto t = b.add_fixed(alone[i]);
    b.compute_on(t, i);
    if (delay[i] > 0) b.edge(b.add_fixed(delay[i]), t);
    ops.push_back(t);
  }
  TaskGraph g = b.finish();
  g.host_cores = cores;
  g.host_threads = threads;
  g.work_busy.assign(g.size(), 0.0);
  for (int i = 0; i < n; ++i) g.work_busy[ops[i]] = busy[i];
  for (int r = 0; r < n * threads; ++r) g.thread_core.push_back(home_core(r, cores));
  return g;
}

// What the CPU runtime executes (fp32, no recompute, the unfused attention, no SP), 1F1B.
Layout cpu_layout(int tp, int pp, int dp, int global_batch) {
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.global_batch = global_batch;
  l.schedule = sched::Kind::one_f_one_b;
  l.precision = Precision::fp32;
  l.recompute = Recompute::none;
  l.attention = AttentionImpl::unfused;
  l.sequence_parallel = false;
  return l;
}

// The cpu preset with a host of `cores` cores and no contention.
System host_system(int cores) {
  System sys = load_system("cpu");
  sys.host = {};
  sys.host.cores = cores;
  return sys;
}
}  // namespace

TEST_CASE("host rate: a share of its core over the time at the cores' busy level") {
  // rate = (1 / crowd) / (alone + (busy - alone)(busy_cores - 1)/(C - 1)).
  // C = 2, alone 1 s, busy 1.5 s: alone on a core, the other idle -> 1/1; the other busy too -> 1/1.5;
  // two on this core, the other busy -> 0.5/1.5.
  CHECK(host_rate(1, 1.5, 1, 1, 2) == doctest::Approx(1.0).epsilon(kRel));
  CHECK(host_rate(1, 1.5, 1, 2, 2) == doctest::Approx(1 / 1.5).epsilon(kRel));
  CHECK(host_rate(1, 1.5, 2, 2, 2) == doctest::Approx(0.5 / 1.5).epsilon(kRel));
  // C = 4, 2 busy: a third of the way from alone to busy ((2 - 1)/(4 - 1) = 1/3): 1 / (1 + 0.5/3).
  CHECK(host_rate(1, 1.5, 1, 2, 4) == doctest::Approx(1 / (1 + 0.5 / 3)).epsilon(kRel));
  // One core: no busy level to interpolate; two threads halve it.
  CHECK(host_rate(2, 9, 2, 1, 1) == doctest::Approx(0.25).epsilon(kRel));
  // An op of no work ends at once.
  CHECK(host_rate(0, 0, 3, 2, 2) > 1e200);
  // No thread on its core, or more busy cores than cores: a caller's error, not a rate.
  CHECK_THROWS(host_rate(1, 1, 0, 1, 2));
  CHECK_THROWS(host_rate(1, 1, 1, 3, 2));
}

TEST_CASE("home core: ranks round-robin over the cores, as Linux places threads created in rank order") {
  CHECK(home_core(0, 2) == 0);
  CHECK(home_core(1, 2) == 1);
  CHECK(home_core(2, 2) == 0);
  CHECK(home_core(3, 2) == 1);
  CHECK(home_core(5, 4) == 1);
  CHECK(home_core(7, 1) == 0);
}

TEST_CASE("engine with a host: ops share the cores and are re-rated as others start and end") {
  SUBCASE("two ranks on two cores run at the busy rate") {
    // Both start at 0 with 2 threads on 2 cores: each at 1/busy = 1/2 -> both end at 2.
    const TaskGraph g = host_graph({1, 1}, {2, 2}, {0, 0}, 2, 1);
    Simulator sim(g);
    const RunResult r = sim.run();
    CHECK(r.makespan == doctest::Approx(2).epsilon(kRel));
  }
  SUBCASE("a late op slows the running one; the work is conserved on one core") {
    // One core. Op A (2 s alone) starts at 0; op B (1 s) at 1, after a non-compute task. [0, 1): A alone,
    // rate 1/2, half done. Then n = 2: A at 0.5/2 = 1/4 per s, B at 0.5/1. B ends at 1 + 2 = 3; A has
    // 1/2 left at 1 and 1/4 x 2 = 1/2 done by 3: ends at 3 too. 3 s of work on one core: makespan 3.
    const TaskGraph g = host_graph({2, 1}, {2, 1}, {0, 1}, 1, 1);
    Simulator sim(g);
    const RunResult r = sim.run();
    CHECK(r.end[0] == doctest::Approx(3).epsilon(kRel));
    CHECK(r.makespan == doctest::Approx(3).epsilon(kRel));
  }
  SUBCASE("a position of two threads counts twice") {
    // Two positions of tp 2 (ranks 0-3) on 2 cores, no contention (busy = alone = 1): each core holds a
    // thread of both, so each runs at 1/2 -> both end at 2.
    const TaskGraph g = host_graph({1, 1}, {1, 1}, {0, 0}, 2, 2);
    Simulator sim(g);
    CHECK(sim.run().makespan == doctest::Approx(2).epsilon(kRel));
  }
  SUBCASE("three ranks on two cores: the two that share a core run at half, the third alone") {
    // Ranks 0 and 2 on core 0, rank 1 on core 1, 1 s each, no contention. Rank 1 ends at 1; ranks 0 and 2
    // progress at 1/2 and end at 2. One pool of both cores would give each 2/3 and end all three at 1.5.
    const TaskGraph g = host_graph({1, 1, 1}, {1, 1, 1}, {0, 0, 0}, 2, 1);
    Simulator sim(g);
    const RunResult r = sim.run();
    CHECK(r.end[1] == doctest::Approx(1).epsilon(kRel));
    CHECK(r.end[0] == doctest::Approx(2).epsilon(kRel));
    CHECK(r.end[2] == doctest::Approx(2).epsilon(kRel));
  }
  SUBCASE("a core freed by its other rank speeds the one left") {
    // Ranks 0 and 2 on core 0: rank 0's op of 1 s, rank 2's of 3 s. Both at 1/2 until rank 0 ends at 2
    // (rank 2 has 2 s left), then rank 2 alone at 1: ends at 4. Rank 1 (core 1) idle all along.
    const TaskGraph g = host_graph({1, 0, 3}, {1, 0, 3}, {0, 0, 0}, 2, 1);
    Simulator sim(g);
    const RunResult r = sim.run();
    CHECK(r.end[0] == doctest::Approx(2).epsilon(kRel));
    CHECK(r.end[2] == doctest::Approx(4).epsilon(kRel));
  }
}

TEST_CASE("simulate with a host: ranks beyond the cores time-share them; contention slows all-busy moments") {
  // tiny, tp 2, one position (2 threads), dp 1 pp 1: no flows, so the step is the sum of its compute ops.
  const Model m = load_model("tiny");
  const Layout l = cpu_layout(2, 1, 1, 4);
  System sys = host_system(0);
  const double free_step = simulate(m, l, sys).step_s;
  // One core, no contention: the 2 threads share it, every op takes twice as long: the step doubles.
  sys.host.cores = 1;
  CHECK(simulate(m, l, sys).step_s == doctest::Approx(2 * free_step).epsilon(1e-9));
  // Two cores, every kind 1.5x slower when both are busy: 2 threads keep both busy all step: 1.5x.
  sys.host.cores = 2;
  sys.host.contention.fill(1.5);
  CHECK(simulate(m, l, sys).step_s == doctest::Approx(1.5 * free_step).epsilon(1e-9));
  // Four cores, the same contention: 2 of 4 busy is a third of the way: 1 + 0.5/3.
  sys.host.cores = 4;
  CHECK(simulate(m, l, sys).step_s == doctest::Approx((1 + 0.5 / 3) * free_step).epsilon(1e-9));
}

TEST_CASE("simulate with a host: a pipeline's stages wait for neighbours slowed by their share") {
  // tiny pp 2 (1F1B, 4 micro-batches) as 2 ranks on 1 core against 2 cores (no contention): with one core the
  // ranks' overlapping compute shares it, so the step is longer, but never more than the whole work done
  // serially (work conserving: the sum of every rank's busy time alone).
  const Model m = load_model("tiny");
  const Layout l = cpu_layout(1, 2, 1, 4);
  System sys = host_system(2);
  const SimReport two = simulate(m, l, sys);
  sys.host.cores = 1;
  const SimReport one = simulate(m, l, sys);
  double work = 0;
  for (const RankSummary& k : two.ranks) work += k.busy_s;
  CHECK(one.step_s > 1.2 * two.step_s);
  CHECK(one.step_s <= work + two.step_s - std::max(two.ranks[0].busy_s, two.ranks[1].busy_s) + 1e-9);
  CHECK(one.step_s >= work - 1e-9);  // one core does all compute work
}

TEST_CASE("simulate with a host: each position's threads sit on their ranks' home cores") {
  const Model m = load_model("tiny");
  // pp 4: stages 0 and 2 on core 0, 1 and 3 on core 1.
  CHECK(simulate(m, cpu_layout(1, 4, 1, 8), host_system(2)).job.graph.thread_core == std::vector<int>{0, 1, 0, 1});
  // tp 2 dp 2: position (dp 0) holds ranks 0 and 1, position (dp 1) ranks 2 and 3: a thread of each per core.
  CHECK(simulate(m, cpu_layout(2, 1, 2, 8), host_system(2)).job.graph.thread_core == std::vector<int>{0, 1, 0, 1});
  // tp 2 on 1 core: both threads there.
  CHECK(simulate(m, cpu_layout(2, 1, 1, 4), host_system(1)).job.graph.thread_core == std::vector<int>{0, 0});
}
