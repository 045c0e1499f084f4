// The shared shape rule (sim/schedule/rules.hpp) against the generators themselves: over a grid of
// (pp, vpp, m) for every generator, shape_problem() refuses exactly what generate() refuses, and what both
// accept validates. layout_problem(), and through it estimate, simulate and explore, refuse with this rule,
// so a layout that passes them is one the generator builds (zb1p's rounds rule was missing from them once:
// explore --gpus 224 died in its simulated tier on tp2 pp14 dp8 zb1p, m = 192, rounds 13).
#include <doctest/doctest.h>

#include <optional>
#include <string>

#include "util/error.hpp"
#include "sched_test_util.hpp"
#include "sim/schedule/rules.hpp"

using namespace tessel::sched;
using tessel::InputError;
using tessel::test::params;
using tessel::test::violations_text;

TEST_CASE("shape_problem accepts exactly the (pp, vpp, m) the generators build") {
  int accepted = 0, refused = 0;
  for (const auto& name : generator_names())
    for (int pp = 1; pp <= 7; ++pp)
      for (int vpp = 1; vpp <= 3; ++vpp)
        for (int m = 1; m <= 3 * pp + 2; ++m) {
          INFO(name << " pp " << pp << " vpp " << vpp << " m " << m);
          const auto problem = shape_problem(name, pp, vpp, m);
          std::optional<Schedule> s;
          std::string error;
          try {
            s = generate(name, params(pp, m, vpp));
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
  const auto zb = shape_problem("zb1p", 14, 1, 192);
  REQUIRE(zb);
  CHECK(zb->rule == "schedule-microbatches");
  CHECK(zb->message.find("max(1, m // pp) = 13, got m = 192 with pp 14") != std::string::npos);
  // m = 196 = 14 * 14: 14 rounds of 14.
  CHECK_FALSE(shape_problem("zb1p", 14, 1, 196));
  const auto dual = shape_problem("dualpipev", 2, 2, 2);
  REQUIRE(dual);
  CHECK(dual->message.find("needs micro-batches m >= 2*pp = 4, got m = 2") != std::string::npos);
  CHECK(shape_problem("interleaved", 4, 2, 6)->message.find("multiple of pp 4") != std::string::npos);
  CHECK(shape_problem("zbv", 4, 1, 8)->rule == "schedule-vpp");
  CHECK_FALSE(shape_problem("looped-bfs", 3, 3, 1));
}

TEST_CASE("default_vpp follows the schedule") {
  CHECK(default_vpp("zbv", 3) == 2);
  CHECK(default_vpp("dualpipev", 3) == 2);
  CHECK(default_vpp("interleaved", 3) == 3);
  CHECK(default_vpp("looped-bfs", 2) == 2);
  CHECK(default_vpp("1f1b", 3) == 1);
  CHECK(default_vpp("zb1p", 3) == 1);
}
