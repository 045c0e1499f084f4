// explore: enumeration against restrictions, accounting of every candidate, deterministic ranking,
// the Pareto front, the event-simulated tier's re-ranking, explain.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "sim/engine/simulate.hpp"
#include "sim/explore/explore.hpp"

using namespace tessel;

namespace {
struct Fixture {
  Model m = load_model("megatron-7.5b");
  System sys = load_system("dgx-a100");
  int gpus = 64;
  int gbs = 256;
};
}  // namespace

TEST_CASE("every enumerated layout is scored or rejected with a rule") {
  Fixture f;
  explore::Options o;
  o.threads = 2;
  const explore::Result r = explore::run(f.m, f.sys, f.gpus, f.gbs, {}, o);
  long long rejected = 0;
  for (const auto& x : r.rejected) {
    CHECK(x.count > 0);
    CHECK_FALSE(x.example.empty());
    rejected += x.count;
  }
  CHECK(r.enumerated == r.scored + rejected);
  REQUIRE(!r.top.empty());
  CHECK(r.top.size() == 10);
  // Sorted by the ranking rule, every row fits, the tier is named.
  for (std::size_t i = 0; i + 1 < r.top.size(); ++i) CHECK_FALSE(explore::better(r.top[i + 1], r.top[i]));
  for (const auto& s : r.top) {
    CHECK(s.peak_memory_bytes <= s.capacity_bytes);
    CHECK(s.tier == "analytical");
  }
}

TEST_CASE("restrictions are honoured") {
  Fixture f;
  explore::Space sp;
  sp.tp = {4};
  sp.schedules = {sched::Kind::one_f_one_b};
  sp.zero = {1};
  explore::Options o;
  o.top_n = 50;
  const explore::Result r = explore::run(f.m, f.sys, f.gpus, f.gbs, sp, o);
  REQUIRE(!r.top.empty());
  for (const auto& s : r.top) {
    CHECK(s.layout.tp == 4);
    CHECK(s.layout.zero_stage == 1);
    if (s.layout.pp > 1) CHECK(s.layout.schedule == sched::Kind::one_f_one_b);
  }
}

TEST_CASE("ranking is deterministic across thread counts") {
  Fixture f;
  explore::Options one, two;
  one.threads = 1;
  two.threads = 2;
  one.top_n = two.top_n = 25;
  const auto a = explore::run(f.m, f.sys, f.gpus, f.gbs, {}, one);
  const auto b = explore::run(f.m, f.sys, f.gpus, f.gbs, {}, two);
  REQUIRE(a.top.size() == b.top.size());
  for (std::size_t i = 0; i < a.top.size(); ++i) {
    CHECK(a.top[i].layout.describe() == b.top[i].layout.describe());
    CHECK(a.top[i].step_s == b.top[i].step_s);
  }
  CHECK(a.scored == b.scored);
}

TEST_CASE("Pareto front: memory rises, step time falls") {
  Fixture f;
  const auto r = explore::run(f.m, f.sys, f.gpus, f.gbs, {}, {});
  REQUIRE(r.pareto.size() >= 2);
  for (std::size_t i = 0; i + 1 < r.pareto.size(); ++i) {
    CHECK(r.pareto[i].peak_memory_bytes <= r.pareto[i + 1].peak_memory_bytes);
    CHECK(r.pareto[i].step_s > r.pareto[i + 1].step_s);
  }
  // Its fastest point is the overall winner.
  CHECK(r.pareto.back().step_s == doctest::Approx(r.top.front().step_s));
}

TEST_CASE("simulated tier re-ranks: the final top equals the brute-force top under the simulator") {
  Fixture f;
  // A stand-in simulator that makes the ten analytical favourites 30% slower. The adaptive tier must return
  // exactly the five best layouts by this simulator over ALL fitting layouts (computed here by brute force).
  std::vector<std::string> favourites;
  explore::Options all;
  all.top_n = 100000;
  const auto everything = explore::run(f.m, f.sys, f.gpus, f.gbs, {}, all);
  for (int i = 0; i < 10; ++i) favourites.push_back(everything.top[i].layout.describe());
  auto sim = [&](const Layout& l) {
    const Estimate e = estimate(f.m, l, f.sys, f.gpus);
    explore::SimScore sc;
    const bool fav = std::find(favourites.begin(), favourites.end(), l.describe()) != favourites.end();
    sc.step_s = e.step_s * (fav ? 1.3 : 1.0);
    sc.peak_memory_bytes = e.peak_memory_bytes;
    return sc;
  };
  std::vector<explore::Scored> brute = everything.top;
  for (auto& s : brute) s.step_s = sim(s.layout).step_s;
  std::sort(brute.begin(), brute.end(), explore::better);
  explore::Options o;
  o.top_n = 5;
  o.simulate = sim;
  const auto r = explore::run(f.m, f.sys, f.gpus, f.gbs, {}, o);
  REQUIRE(r.top.size() == 5);
  CHECK(r.simulated >= 16);
  CHECK(r.simulated < everything.scored);  // it did not need to simulate everything
  for (std::size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(r.top[i].tier == "des");
    CHECK(r.top[i].layout.describe() == brute[i].layout.describe());
    CHECK(r.top[i].step_s == doctest::Approx(brute[i].step_s));
  }
}

TEST_CASE("a model that fits nowhere: no top, the smallest peak reported") {
  const Model m = load_model("megatron-1t");
  const System sys = load_system("dgx-a100");
  const auto r = explore::run(m, sys, 8, 8, {}, {});
  CHECK(r.top.empty());
  CHECK(r.smallest_peak > sys.gpu.memory_bytes);
  bool memory_rule = false;
  for (const auto& x : r.rejected) memory_rule = memory_rule || (x.rule == "memory" && x.example.find("needs ") == 0);
  CHECK(memory_rule);
}

TEST_CASE("explain: a rejected layout names the rule; one that does not fit lists what would") {
  Fixture f;
  const auto r = explore::run(f.m, f.sys, f.gpus, f.gbs, {}, {});
  Layout bad;
  bad.tp = 3;
  bad.pp = 1;
  bad.dp = 21;
  bad.micro_batch = 1;
  bad.global_batch = f.gbs;
  CHECK(explore::explain(f.m, f.sys, f.gpus, bad, r).find("rejected by rule 'gpu-count'") != std::string::npos);
  Layout big;
  big.tp = 1;
  big.pp = 1;
  big.dp = 64;
  big.micro_batch = 4;
  big.global_batch = f.gbs;
  const std::string e = explore::explain(f.m, f.sys, f.gpus, big, r);
  CHECK(e.find("rejected: needs") != std::string::npos);
  CHECK(e.find("with recompute full") != std::string::npos);
  const std::string w = explore::explain(f.m, f.sys, f.gpus, r.top.front().layout, r);
  CHECK(w.find("ranks #1") != std::string::npos);
}

TEST_CASE("why nothing fits: given sizes that cannot divide the GPU count, in the order given") {
  Fixture f;
  explore::Space sp;
  sp.tp = {3, 8};
  sp.pp = {5};
  const explore::Result r = explore::run(f.m, f.sys, f.gpus, f.gbs, sp, {});
  REQUIRE(r.enumerated == 0);  // pp 5 divides no GPU count of 64 with any tp
  // 64 % 3 = 1 and 64 % 5 = 4; 64 % 8 = 0, so tp 8 is not named.
  const explore::NothingFits why = explore::why_nothing_fits(f.m, f.sys, f.gpus, f.gbs, sp, r, {});
  REQUIRE(why.indivisible.size() == 2);
  CHECK(why.indivisible[0].dimension == "tp");
  CHECK(why.indivisible[0].size == 3);
  CHECK(why.indivisible[1].dimension == "pp");
  CHECK(why.indivisible[1].size == 5);
  CHECK(why.lift.empty());  // the sizes are the answer; no lift is tried
}

TEST_CASE("why nothing fits: the restriction whose lift alone lets the most layouts fit") {
  // Megatron 7.5B on one GPU's worth of model state: tp1 pp1 without ZeRO holds 16 bytes per parameter
  // (bf16 weights and gradients, fp32 master weights and Adam moments), 120 GB > 80 GiB, so nothing fits.
  Fixture f;
  explore::Space sp;
  sp.tp = {1};
  sp.pp = {1};
  sp.zero = {0};
  explore::Options o;
  o.threads = 2;
  const explore::Result r = explore::run(f.m, f.sys, f.gpus, f.gbs, sp, o);
  REQUIRE(r.enumerated > 0);
  REQUIRE(r.top.empty());
  const explore::NothingFits why = explore::why_nothing_fits(f.m, f.sys, f.gpus, f.gbs, sp, r, o);
  CHECK(why.indivisible.empty());
  // Expected: each restricted dimension lifted alone, counted here; the largest count wins (the first of
  // tp, pp, zero on a tie).
  std::string best;
  long long most = 0;
  const std::pair<const char*, std::vector<int> explore::Space::*> dims[] = {
      {"tp", &explore::Space::tp}, {"pp", &explore::Space::pp}, {"zero", &explore::Space::zero}};
  for (const auto& [dim, member] : dims) {
    explore::Space s2 = sp;
    (s2.*member).clear();
    const long long fit = explore::run(f.m, f.sys, f.gpus, f.gbs, s2, o).scored;
    if (fit > most) {
      most = fit;
      best = dim;
    }
  }
  REQUIRE(most > 0);
  CHECK(why.lift == best);
  CHECK(why.lift_fit == most);
}

TEST_CASE("event-simulated tier: the busiest rank's idle share and exposed communication") {
  Fixture f;
  Layout l;
  l.tp = 2;
  l.pp = 4;
  l.dp = 8;
  l.micro_batch = 1;
  l.global_batch = f.gbs;
  l.schedule = sched::Kind::one_f_one_b;
  const explore::SimScore sc = explore::event_simulator(f.m, f.sys)(l);
  // Expected: the engine's own report at replica fidelity; the rank with the most busy time gives the
  // bubble as (step - busy - exposed) / step (sim/engine/simulate.hpp: RankSummary).
  engine::SimOptions o;
  o.fidelity = engine::Fidelity::replica;
  o.critical_path = false;
  const engine::SimReport rep = engine::simulate(f.m, l, f.sys, o);
  const engine::RankSummary* busiest = &rep.ranks.front();
  for (const auto& rk : rep.ranks)
    if (rk.busy_s > busiest->busy_s) busiest = &rk;
  CHECK(sc.step_s == rep.step_s);
  CHECK(sc.peak_memory_bytes == rep.peak_bytes);
  CHECK(sc.exposed_comm_s == busiest->exposed_comm_s);
  CHECK(sc.bubble == doctest::Approx((rep.step_s - busiest->busy_s - busiest->exposed_comm_s) / rep.step_s));
  CHECK(sc.bubble > 0);  // 1F1B on 4 stages idles (p - 1) / (m + p - 1) of the step at least
}
