// Generators over PyTorch's 23 (v, m, p) cases and Megatron's (p, g, m, v) grid: validate, lower, simulate
// under all three comm models, liveness, closed-form bubble rates.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "util/error.hpp"
#include "sched_test_util.hpp"
#include "sim/schedule/registry.hpp"
#include "tests/sanitized.hpp"

using namespace tessel::sched;
using tessel::InputError;
using tessel::test::params;
using tessel::test::violations_text;

namespace {

constexpr double kExact = 1e-9;  // unit-cost times are sums of small integers

// Checks one accepted schedule end to end; returns how many comm models its lowering is deadlock-free
// under (3 expected of lower()'s default order, see GapOrder::Auto).
int check_schedule(const Schedule& s) {
  INFO(s.generator << " pp " << s.num_ranks << " stages " << s.num_stages << " m " << s.num_microbatches);
  const auto rep = validate(s);
  REQUIRE_MESSAGE(rep.ok(), violations_text(rep));
  const Schedule low = lower(s);
  CHECK(strip_comms(low).ranks == s.ranks);  // lowering only adds comm ops
  const auto eager = validate(low, {CommModel::Eager, {}, 5});
  REQUIRE_MESSAGE(eager.ok(), violations_text(eager));
  CHECK(eager.peak_inflight == rep.peak_inflight);
  // With free comms both the just-in-time lowering and the time-keyed default run exactly as the
  // compute-only schedule under eager comms: each recv sits before the first compute that starts after
  // its data exists, so it never waits.
  Costs unit;
  const double base = unit_cost_simulate(s, unit).makespan;
  CHECK(unit_cost_simulate(lower(s, GapOrder::SendsFirst), unit).makespan == doctest::Approx(base).epsilon(kExact));
  CHECK(unit_cost_simulate(low, unit).makespan == doctest::Approx(base).epsilon(kExact));
  Costs slow = unit;
  slow.comm = 0.5;
  const double eager_t = unit_cost_simulate(low, slow, CommModel::Eager).makespan;
  int ok_models = 1;
  for (CommModel m : {CommModel::Blocking, CommModel::Batched}) {
    const auto r = validate(low, {m, {}, 5});
    CHECK_MESSAGE(r.ok(), comm_model_name(m) << ": " << violations_text(r));
    if (!r.ok()) continue;
    ++ok_models;
    // Blocking has every eager edge with a weight at least as large (send done = max(posts) + comm), so
    // on the same op order it can only be slower; the validated entry point gives the same timing.
    const double t = unit_cost_simulate(low, slow, m).makespan;
    CHECK(unit_cost_simulate_validated(low, slow, m).makespan == t);
    if (m == CommModel::Blocking) CHECK(t >= eager_t - kExact);
  }
  return ok_models;
}

bool interleaved_accepts(int p, int m, int g) { return g >= p && g <= m && !(m % g != 0 && m % g < p); }
bool zb1p_accepts(int p, int m) { return m % std::max(1, m / p) == 0; }

}  // namespace

TEST_CASE("every generator over PyTorch's 23 (v, m, p) cases") {
  int accepted = 0, rejected = 0, blocking_and_batched = 0, left_out = 0;
  for (const auto& c : tessel::test::pytorch_cases()) {
    INFO("v " << c.v << " m " << c.m << " p " << c.p);
    // Under ASan (tests/sanitized.hpp) the one 64-rank case is left out: it has 8x the ops of the next largest,
    // and without it the whole schedule test took 138 s instead of 722 s there in CI. The same generators and
    // checks run on the other 22.
    if (tessel::test::kSanitized && c.p == 64) {
      ++left_out;
      continue;
    }
    const GenParams g = params(c.p, c.m, c.v);
    struct Expect {
      const char* name;
      bool ok;
      const char* rule;  // a word the rejection must name
    };
    const Expect multi[] = {
        {"interleaved", interleaved_accepts(c.p, c.m, c.p), "group size"},
        {"looped-bfs", true, ""},
        {"zb1p", zb1p_accepts(c.p, c.m), "rounds"},
        {"zbv", c.v == 2, "exactly 2 stages per rank"},
        {"dualpipev", c.v == 2 && c.m >= 2 * c.p, c.v == 2 ? ">= 2 * pp" : "exactly 2 stages per rank"},
        {"1f1b", false, "exactly 1 stage per rank"},
    };
    for (const auto& e : multi) {
      INFO(e.name);
      if (!e.ok) {
        CHECK_THROWS_WITH_AS(generate(e.name, g), doctest::Contains(e.rule), InputError);
        ++rejected;
        continue;
      }
      const Schedule s = generate(e.name, g);
      CHECK(s.num_stages == c.p * c.v);
      blocking_and_batched += check_schedule(s) == 3;
      ++accepted;
    }
    // Single-stage generators on the same (m, p).
    for (const char* name : {"gpipe", "1f1b", "zb1p", "zb2p", "zb-greedy"}) {
      INFO(name);
      blocking_and_batched += check_schedule(generate(name, params(c.p, c.m, 1))) == 3;
      ++accepted;
    }
  }
  MESSAGE("accepted " << accepted << ", rejected " << rejected << ", deadlock-free under all three comm models: "
                      << blocking_and_batched);
  // 23 cases x 5 single-stage generators + the multi-stage acceptances counted by the rules above; every
  // accepted combination lowers deadlock-free under eager, blocking and batched comms.
  CHECK(accepted + rejected + 11 * left_out == 23 * 11);
  CHECK(left_out == (tessel::test::kSanitized ? 1 : 0));
  CHECK(blocking_and_batched == accepted);
}

TEST_CASE("interleaved over Megatron's (p, g, m, v) grid") {
  // tests/unit_tests/pipeline_parallel/test_schedules.py::test_get_pipeline_parallel_order
  const std::pair<int, int> pg[] = {{1, 1}, {2, 2}, {2, 4}, {4, 4}, {4, 5}, {8, 9}, {8, 11}};
  for (const auto& pgi : pg)  // no structured binding: clang 14 cannot capture one in INFO
    for (int m : {8, 32})
      for (int v : {1, 2, 4, 8}) {
        const int p = pgi.first, grp = pgi.second;
        INFO("p " << p << " g " << grp << " m " << m << " v " << v);
        GenParams g = params(p, m, v);
        g.group_size = grp;
        if (!interleaved_accepts(p, m, grp)) {
          CHECK_THROWS_AS(generate("interleaved", g), InputError);
          continue;
        }
        const Schedule s = generate("interleaved", g);
        // Megatron's order assertions: 2 m v ops per rank, every chunk's backward after its forward.
        for (const auto& rank : s.ranks) CHECK(rank.size() == static_cast<std::size_t>(2 * m * v));
        check_schedule(s);
      }
}

TEST_CASE("1F1B lowered is deadlock-free under all three comm models") {
  for (int p : {2, 4, 8})
    for (int m : {1, 3, 8}) CHECK(check_schedule(generate("1f1b", params(p, m, 1))) == 3);
  // Megatron's parity order alone is enough for 1F1B...
  const Schedule s = generate("1f1b", params(4, 8, 1));
  CHECK(validate(lower(s, GapOrder::Parity), {CommModel::Blocking, {}, 5}).ok());
}

TEST_CASE("just-in-time orders deadlock where the time-keyed default does not") {
  // ...but not for interleaved or V schedules: a just-in-time recv on one rank waits for a peer whose
  // send comes after a recv from this rank (the 76-of-194 starting point). Expected: Parity and
  // SendsFirst report a deadlock under blocking for interleaved p4 m8 v2 and zbv p4 m8, Auto none.
  for (const auto& nv : {std::pair{"interleaved", 2}, std::pair{"zbv", 2}}) {
    const char* name = nv.first;  // no structured binding: clang 14 cannot capture one in INFO
    const int v = nv.second;
    INFO(name);
    const Schedule s = generate(name, params(4, 8, v));
    for (GapOrder o : {GapOrder::SendsFirst, GapOrder::Parity}) {
      const auto r = validate(lower(s, o), {CommModel::Blocking, {}, 5});
      REQUIRE_FALSE(r.ok());
      CHECK(r.violations[0].rule == "deadlock");
    }
    CHECK(validate(lower(s), {CommModel::Blocking, {}, 5}).ok());
  }
}

TEST_CASE("measured unit-cost bubble rates equal the closed forms (p = 4, 8; m = 8, 16, 32)") {
  struct Gen {
    const char* name;
    int v;
  };
  const Gen gens[] = {{"gpipe", 1}, {"1f1b", 1},  {"interleaved", 2}, {"looped-bfs", 2}, {"zb1p", 1},
                      {"zb1p", 2},  {"zb2p", 1},  {"zbv", 2},         {"dualpipev", 2}};
  const Costs unit;  // T_F = T_B = T_W = 1, as the ZB README table assumes
  std::string table = "\n| generator | v | p | m | measured | span-based | closed form |\n|---|---|---|---|---|---|---|\n";
  int compared = 0;
  for (const auto& g : gens)
    for (int p : {4, 8})
      for (int m : {8, 16, 32}) {
        INFO(g.name << " v " << g.v << " p " << p << " m " << m);
        if (std::string(g.name) == "dualpipev" && m < 2 * p) {
          CHECK_THROWS_AS(generate(g.name, params(p, m, g.v)), InputError);
          table += std::string("| ") + g.name + " | 2 | " + std::to_string(p) + " | " + std::to_string(m) +
                   " | rejected (m < 2p) | | |\n";
          continue;
        }
        const auto sim = unit_cost_simulate(generate(g.name, params(p, m, g.v)), unit);
        const auto formula = bubble_rate(parse_schedule(g.name, "case"), MicrobatchRule::megatron, p, m, g.v, unit);
        const bool span = std::string(g.name) == "zbv" || std::string(g.name) == "zb2p";
        char row[200];
        std::snprintf(row, sizeof row, "| %s | %d | %d | %d | %.2f%% | %.2f%% | %s |\n", g.name, g.v, p, m,
                      100 * sim.bubble_rate, 100 * sim.span_bubble_rate,
                      formula ? (std::to_string(100 * *formula).substr(0, 5) + "%").c_str() : "n/a");
        table += row;
        if (!formula) continue;
        CHECK((span ? sim.span_bubble_rate : sim.bubble_rate) == doctest::Approx(*formula).epsilon(kExact));
        ++compared;
      }
  MESSAGE(table);
  CHECK(compared >= 40);
}

TEST_CASE("interleaved with v = 4 reaches (p-1)/(v m + p-1)") {
  // Narayanan et al. SC'21: bubble fraction (1/v)(p-1)/m of the ideal time.
  for (int p : {2, 4})
    for (int m : {4, 8, 16}) {
      const auto sim = unit_cost_simulate(generate("interleaved", params(p, m, 4)), Costs{});
      CHECK(sim.bubble_rate == doctest::Approx((p - 1.0) / (4.0 * m + p - 1.0)).epsilon(kExact));
    }
}

TEST_CASE("peak in-flight activations per rank") {
  // 1F1B: min(m, p - r) (reference/schedules.md); GPipe: m; ZB1P (I keeps the activation until W): p,
  // as 1F1B's stage 0 (ZB README "1x"); DualPipeV: 2p + 1 chunk activations (DualPipe README "PP+1").
  for (int p : {2, 4, 8})
    for (int m : {1, 4, 16}) {
      const auto one = validate(generate("1f1b", params(p, m, 1)));
      const auto gp = validate(generate("gpipe", params(p, m, 1)));
      for (int r = 0; r < p; ++r) {
        CHECK(one.peak_inflight[r] == std::min(m, p - r));
        CHECK(gp.peak_inflight[r] == m);
      }
      if (m >= p)
        for (int peak : validate(generate("zb1p", params(p, m, 1))).peak_inflight) CHECK(peak == p);
      if (m >= 2 * p)
        for (int peak : validate(generate("dualpipev", params(p, m, 2))).peak_inflight) CHECK(peak == 2 * p + 1);
    }
}

TEST_CASE("zb-greedy honours its memory limit and uses per-stage costs") {
  GenParams g = params(4, 16, 1);
  g.mem_limit = 4;
  Costs c;
  c.F = {1.0, 1.0, 1.5, 1.0};
  c.B = {1.0, 1.2, 1.0, 2.0};
  c.W = {0.5, 1.0, 1.0, 0.5};
  g.costs = c;
  const Schedule s = generate("zb-greedy", g);
  ValidateOptions vo;
  vo.mem_limit = 4;
  const auto rep = validate(s, vo);
  REQUIRE_MESSAGE(rep.ok(), violations_text(rep));
  for (int peak : rep.peak_inflight) CHECK(peak <= 4);
  // Filling bubbles with deferred W can only help against 1F1B at the same 1F1B memory budget (p).
  CHECK(unit_cost_simulate(s, c).makespan <= unit_cost_simulate(generate("1f1b", params(4, 16, 1)), c).makespan);
  g.mem_limit = 0;
  CHECK_THROWS_WITH_AS(generate("zb-greedy", g), doctest::Contains("--mem-limit"), InputError);
}

TEST_CASE("regression: m < p generates valid, deadlock-free schedules where the order exists") {
  // pytorch/torchtitan#775 (1F1B, m=1 hung) and pytorch/PiPPy#1064 (GPipe, 1 mb): the orders are fine,
  // the hang was the runtime; GPipe worked with m < p before PR pytorch/pytorch#144702's check.
  for (const char* name : {"gpipe", "1f1b", "zb1p", "zb2p"})
    for (int m : {1, 2, 3}) CHECK(check_schedule(generate(name, params(4, m, 1))) >= 1);
  // Rules that do forbid m < p, each named in the message.
  CHECK_THROWS_WITH_AS(generate("interleaved", params(4, 3, 2)), doctest::Contains("[pp=4, microbatches=3]"), InputError);
  CHECK_THROWS_WITH_AS(generate("dualpipev", params(4, 3, 2)), doctest::Contains("must be >= 2 * pp = 8"), InputError);
}

TEST_CASE("generate rejects impossible parameters naming the rule") {
  CHECK_THROWS_WITH_AS(generate("zbv", params(4, 8, 3)), doctest::Contains("V schedule"), InputError);
  CHECK_THROWS_WITH_AS(generate("gpipe", params(4, 8, 2)), doctest::Contains("single-stage"), InputError);
  CHECK_THROWS_WITH_AS(generate("interleaved", params(4, 10, 2)), doctest::Contains("mod group size"), InputError);
  CHECK_THROWS_WITH_AS(generate("zb1p", params(4, 9, 2)), doctest::Contains("divisible by the number of rounds"), InputError);
  CHECK_THROWS_WITH_AS(generate("chimera", params(4, 8, 1)), doctest::Contains("unknown"), InputError);
  CHECK_THROWS_WITH_AS(generate("1f1b", params(0, 8, 1)), doctest::Contains("--pp 0"), InputError);
}
