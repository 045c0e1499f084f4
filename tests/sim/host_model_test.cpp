// The host model (sim/engine/host_model.hpp): ranks sharing a host's cores. The rate formula, the engine's
// re-rating as ops start and end, and whole simulations on a host with fewer cores than ranks.
#include <doctest/doctest.h>

#include "sim/engine/host_model.hpp"
#include "sim/engine/simulate.hpp"
#include "sim/engine/simulator.hpp"

using namespace tessel;
using namespace tessel::engine;

namespace {
constexpr double kRel = 1e-9;

// `n` compute tasks, one per position, task i of work alone[i] / busy[i], started after `delay[i]` seconds of
// a task that is no compute (it takes no share of the cores).
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
  return g;
}
}  // namespace

TEST_CASE("host rate: a share of the cores over the time at the cores' busy level") {
  // rate = min(1, C/n) / (alone + (busy - alone)(min(n, C) - 1)/(C - 1)).
  // C = 2, alone 1 s, busy 1.5 s: n = 1 -> 1/1; n = 2 -> 1/1.5; n = 3 -> (2/3)/1.5 = 4/9; n = 4 -> 0.5/1.5.
  CHECK(host_rate(1, 1.5, 1, 2) == doctest::Approx(1.0).epsilon(kRel));
  CHECK(host_rate(1, 1.5, 2, 2) == doctest::Approx(1 / 1.5).epsilon(kRel));
  CHECK(host_rate(1, 1.5, 3, 2) == doctest::Approx(4.0 / 9).epsilon(kRel));
  CHECK(host_rate(1, 1.5, 4, 2) == doctest::Approx(0.5 / 1.5).epsilon(kRel));
  // C = 4, n = 2: half way from alone to busy in busy cores ((2 - 1)/(4 - 1) = 1/3): 1 / (1 + 0.5/3).
  CHECK(host_rate(1, 1.5, 2, 4) == doctest::Approx(1 / (1 + 0.5 / 3)).epsilon(kRel));
  // One core: no busy level to interpolate; two threads halve it.
  CHECK(host_rate(2, 9, 2, 1) == doctest::Approx(0.25).epsilon(kRel));
  // An op of no work ends at once.
  CHECK(host_rate(0, 0, 3, 2) > 1e200);
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
    // Two positions of tp 2 (4 threads) on 2 cores, no contention (busy = alone = 1): share 2/4 -> both end at 2.
    const TaskGraph g = host_graph({1, 1}, {1, 1}, {0, 0}, 2, 2);
    Simulator sim(g);
    CHECK(sim.run().makespan == doctest::Approx(2).epsilon(kRel));
  }
}

TEST_CASE("simulate with a host: ranks beyond the cores time-share them; contention slows all-busy moments") {
  // tiny, tp 2, one position (2 threads), dp 1 pp 1: no flows, so the step is the sum of its compute ops.
  const Model m = load_model("tiny");
  Layout l;
  l.tp = 2;
  l.pp = l.dp = 1;
  l.global_batch = 4;
  l.precision = Precision::fp32;
  l.recompute = Recompute::none;
  l.attention = AttentionImpl::unfused;
  l.sequence_parallel = false;
  System sys = load_system("cpu");
  sys.host = {};
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
  Layout l;
  l.tp = l.dp = 1;
  l.pp = 2;
  l.global_batch = 4;
  l.schedule = sched::Kind::one_f_one_b;
  l.precision = Precision::fp32;
  l.recompute = Recompute::none;
  l.attention = AttentionImpl::unfused;
  l.sequence_parallel = false;
  System sys = load_system("cpu");
  sys.host = {};
  sys.host.cores = 2;
  const SimReport two = simulate(m, l, sys);
  sys.host.cores = 1;
  const SimReport one = simulate(m, l, sys);
  double work = 0;
  for (const RankSummary& k : two.ranks) work += k.busy_s;
  CHECK(one.step_s > 1.2 * two.step_s);
  CHECK(one.step_s <= work + two.step_s - std::max(two.ranks[0].busy_s, two.ranks[1].busy_s) + 1e-9);
  CHECK(one.step_s >= work - 1e-9);  // one core does all compute work
}
