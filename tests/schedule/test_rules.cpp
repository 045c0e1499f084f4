// The shape rules of the schedule registry (sim/schedule/registry.hpp) against the generators themselves: over a grid of
// (pp, vpp, m) for every generator, shape_problem() refuses exactly what generate() refuses, and what both
// accept validates. layout_problem(), and through it estimate, simulate and explore, refuse with this rule,
// so a layout that passes them is one the generator builds (zb1p's rounds rule was missing from them once:
// explore --gpus 224 died in its simulated tier on tp2 pp14 dp8 zb1p, m = 192, rounds 13).
#include <doctest/doctest.h>

#include <optional>
#include <string>

#include "util/error.hpp"
#include "sched_test_util.hpp"
#include "sim/schedule/registry.hpp"

using namespace tessel::sched;
using tessel::InputError;
using tessel::test::params;
using tessel::test::violations_text;

TEST_CASE("shape_problem accepts exactly the (pp, vpp, m) the generators build, under either micro-batch rule") {
  int accepted = 0, refused = 0;
  for (const Family& f : families())
    for (MicrobatchRule rule : {MicrobatchRule::megatron, MicrobatchRule::torch})
      for (int pp = 1; pp <= 7; ++pp)
        for (int vpp = 1; vpp <= 3; ++vpp)
          for (int m = 1; m <= 3 * pp + 2; ++m) {
            if (rule == MicrobatchRule::torch && !f.takes_microbatch_rule) continue;
            const std::string name = f.name;
            INFO(name << " rule " << rule_name(rule) << " pp " << pp << " vpp " << vpp << " m " << m);
            const auto problem = shape_problem(f.kind, pp, vpp, m, rule);
            std::optional<Schedule> s;
            std::string error;
            try {
              GenParams g = params(pp, m, vpp);
              g.rule = rule;
              s = generate(f.kind, g);
            } catch (const InputError& e) {
              error = e.what();
            }
            const std::string rule_says = problem ? problem->rule + ": " + problem->message : std::string("accepted");
            CAPTURE(rule_says);
            CAPTURE(error);
            CHECK(problem.has_value() == !s.has_value());
            if (problem) {
              ++refused;
              CHECK((problem->rule == "schedule-vpp" || problem->rule == "schedule-microbatches"));
              CHECK(problem->message.find(name) != std::string::npos);
            }
            if (s) {
              ++accepted;
              const auto rep = validate(*s);
              CHECK_MESSAGE(rep.ok(), violations_text(rep));
            }
          }
  MESSAGE("accepted " << accepted << ", refused " << refused);
  // Both sides are exercised for every kind of rule (vpp and micro-batch count).
  CHECK(accepted > 500);
  CHECK(refused > 500);
}

TEST_CASE("shape_problem names the values: zb1p rounds, dualpipev's minimum, interleaved's multiple") {
  // zb1p, pp 14, m 192: rounds = max(1, 192 // 14) = 13, 192 mod 13 = 10 (explore --gpus 224's layout).
  const auto zb = shape_problem(Kind::zb1p, 14, 1, 192);
  REQUIRE(zb);
  CHECK(zb->rule == "schedule-microbatches");
  CHECK(zb->message.find("max(1, m // pp) = 13, got m = 192 with pp 14") != std::string::npos);
  // m = 196 = 14 * 14: 14 rounds of 14.
  CHECK_FALSE(shape_problem(Kind::zb1p, 14, 1, 196));
  const auto dual = shape_problem(Kind::dualpipev, 2, 2, 2);
  REQUIRE(dual);
  CHECK(dual->message.find("needs micro-batches m >= 2*pp = 4, got m = 2") != std::string::npos);
  CHECK(shape_problem(Kind::interleaved, 4, 2, 6)->message.find("multiple of pp 4") != std::string::npos);
  // PyTorch's rule: m 6 with pp 4 is one round of 6; m 9 is two rounds, which do not divide it.
  CHECK(shape_problem(Kind::interleaved, 4, 2, 6)->message.find("PyTorch's rule (mb-rule=torch) takes it") != std::string::npos);
  CHECK_FALSE(shape_problem(Kind::interleaved, 4, 2, 6, MicrobatchRule::torch));
  const auto nine = shape_problem(Kind::interleaved, 4, 2, 9, MicrobatchRule::torch);
  REQUIRE(nine);
  CHECK(nine->message.find("max(1, m // pp) = 2, got m = 9 with pp 4") != std::string::npos);
  CHECK(shape_problem(Kind::interleaved, 4, 2, 9)->message.find("takes it") == std::string::npos);
  CHECK(shape_problem(Kind::zbv, 4, 1, 8)->rule == "schedule-vpp");
  CHECK_FALSE(shape_problem(Kind::looped_bfs, 3, 3, 1));
}

TEST_CASE("default_vpp follows the schedule") {
  CHECK(default_vpp(Kind::zbv, 3) == 2);
  CHECK(default_vpp(Kind::dualpipev, 3) == 2);
  CHECK(default_vpp(Kind::interleaved, 3) == 3);
  CHECK(default_vpp(Kind::looped_bfs, 2) == 2);
  CHECK(default_vpp(Kind::one_f_one_b, 3) == 1);
  CHECK(default_vpp(Kind::zb1p, 3) == 1);
}

TEST_CASE("every family is found by its name and aliases, and an unknown name lists the known ones") {
  for (const Family& f : families()) {
    CAPTURE(f.name);
    REQUIRE(find_family(f.name));
    CHECK(find_family(f.name)->kind == f.kind);
    CHECK(&family(f.kind) == &f);
    for (const char* a : f.aliases) CHECK(find_family(a)->kind == f.kind);
  }
  // PyTorch's class names as its exporters write them in a sidecar.
  CHECK(parse_schedule("ScheduleInterleaved1F1B", "--schedule") == Kind::interleaved);
  CHECK(parse_schedule("DualPipeV", "--schedule") == Kind::dualpipev);
  try {
    parse_schedule("zigzag", "--schedule");
    FAIL("zigzag was accepted");
  } catch (const InputError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("--schedule zigzag: unknown schedule; choose one of gpipe, 1f1b, interleaved") != std::string::npos);
  }
  // zb-greedy is a generator without a closed form: a layout the analytical model prices cannot name it.
  CHECK(parse_schedule("zb-greedy", "--schedule") == Kind::zb_greedy);
  CHECK_THROWS_AS(parse_schedule("zb-greedy", "--schedule", true), InputError);
  CHECK(known_names(true).find("zb-greedy") == std::string::npos);
  CHECK(known_names(false).find("zb-greedy") != std::string::npos);
}

TEST_CASE("the layout's stages-per-rank rule is at least the generator's") {
  // Interleaved and looped BFS with one chunk are 1F1B and GPipe under another name: the layout refuses them,
  // the generator builds them; zb1p's generator takes several chunks, the layout model one.
  CHECK_FALSE(vpp_problem(Kind::interleaved, 1));
  CHECK(layout_vpp_problem(Kind::interleaved, 1)->message == "interleaved needs vpp > 1 (got vpp 1)");
  CHECK_FALSE(vpp_problem(Kind::zb1p, 2));
  CHECK(layout_vpp_problem(Kind::zb1p, 2)->message == "zb1p takes one stage per rank (vpp 1), got vpp 2");
  for (const Family& f : families())
    for (int vpp = 1; vpp <= 4; ++vpp)
      if (vpp_problem(f.kind, vpp)) CHECK(layout_vpp_problem(f.kind, vpp));
}
