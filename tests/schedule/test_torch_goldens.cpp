// PyTorch 2.15's own schedules, both ways, from the goldens tools/torch_schedules.py wrote with PyTorch
// (tests/golden/schedules/torch/manifest.json): what its schedule classes write validates here (but for its
// Schedule1F1B, whose last rank's forwards are shifted by one micro-batch, which must be flagged), its orders
// equal Tessel's generators (its interleaved class's under PyTorch's micro-batch rule), the registry's
// bubble of that rule is the bubble of PyTorch's own orders, and Tessel's lowered files are still exactly
// the bytes PyTorch's _load_csv(format="compute_comms") accepted.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <string>

#include "sim/schedule/registry.hpp"
#include "tests/test_paths.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/json_reader.hpp"

using namespace tessel::sched;

namespace {

std::string golden_dir() { return tessel::test::source_root() + "/tests/golden/schedules/torch/"; }

tessel::Json manifest() {
  const std::string path = golden_dir() + "manifest.json";
  return tessel::parse_json_text(tessel::read_text_file(path), path);
}

// PyTorch's class -> Tessel's family: the registry's aliases.
Kind kind_of_class(const std::string& cls) { return parse_schedule(cls, "class"); }

Schedule without_reductions(Schedule s) {
  for (auto& r : s.ranks)
    std::erase_if(r, [](const Action& a) { return a.type == ActionType::REDUCE_GRAD || a.type == ActionType::WAIT_REDUCE_GRAD; });
  return s;
}

}  // namespace

TEST_CASE("every schedule PyTorch 2.15's classes write validates, and the shifted 1F1B order is flagged") {
  const tessel::Json m = manifest();
  CHECK(m.at("torch_version").get<std::string>() == "2.15.0");
  int valid = 0, flagged = 0;
  for (const auto& row : m.at("torch_to_tessel")) {
    const bool complete = row.at("forwards_complete").get<bool>();
    for (const auto& [level, file] : row.at("files").items()) {
      const std::string path = golden_dir() + file.get<std::string>();
      CAPTURE(path);
      const Schedule s = read_csv(path);
      const ValidationReport rep = validate(s);
      if (complete) {
        CHECK_MESSAGE(rep.ok(), (rep.ok() ? std::string() : rep.violations[0].rule + ": " + rep.violations[0].message));
        valid += rep.ok();
      } else {
        // The last rank runs F1..Fm: without a sidecar m is read as m + 1, so micro-batch 0's forward on that
        // stage and micro-batch m's on the others are missing.
        REQUIRE_FALSE(rep.ok());
        CHECK(rep.violations[0].rule == "completeness");
        ++flagged;
      }
    }
  }
  // 27 (class, shape) pairs, 47 files: 4 of them Schedule1F1B's (compute-only, as single-stage classes have
  // no lowered dump), the rest valid. A manifest that lost its files would pass an empty loop.
  CHECK(valid == 43);
  CHECK(flagged == 4);
}

// The micro-batch rule Tessel needs to build a PyTorch class's order: its interleaved class follows PyTorch's
// rounds (m a multiple of max(1, m // p)), which Megatron's rule (m a multiple of p) refuses for m = 3, 6, 10
// with p = 4 and m = 3 with p = 2.
MicrobatchRule rule_of(Kind k, int pp, int m) {
  if (k == Kind::interleaved && microbatch_problem(k, pp, m, MicrobatchRule::megatron)) return MicrobatchRule::torch;
  return MicrobatchRule::megatron;
}

TEST_CASE("PyTorch's compute orders are Tessel's generators', interleaved with any m under PyTorch's rule") {
  int same = 0, torch_rule = 0;
  const tessel::Json m = manifest();
  for (const auto& row : m.at("torch_to_tessel")) {
    if (!row.at("forwards_complete").get<bool>()) continue;
    const std::string file = row.at("files").at("compute_only").get<std::string>();
    CAPTURE(file);
    GenParams p;
    p.pp = row.at("pp").get<int>();
    p.microbatches = row.at("microbatches").get<int>();
    p.vpp = row.at("vpp").get<int>();
    const Kind k = kind_of_class(row.at("class").get<std::string>());
    p.rule = rule_of(k, p.pp, p.microbatches);
    REQUIRE_FALSE(shape_problem(k, p.pp, p.vpp, p.microbatches, p.rule));
    torch_rule += p.rule == MicrobatchRule::torch;
    const Schedule theirs = without_reductions(read_csv(golden_dir() + file));
    const Schedule mine = generate(k, p);
    CHECK(mine.stage_to_rank == theirs.stage_to_rank);
    CHECK(mine.ranks == theirs.ranks);
    same += mine.ranks == theirs.ranks;
  }
  // The 18 shapes both rules build, and the 5 interleaved ones (p2 m3 v2; p4 m3 v3, m6 v2, m6 v3, m10 v2)
  // only PyTorch's rule takes.
  CHECK(same == 23);
  CHECK(torch_rule == 5);
}

TEST_CASE("the unit-cost bubble of interleaved with m not a multiple of p is that of PyTorch's own order") {
  // For each of PyTorch's ScheduleInterleaved1F1B files whose m is not a multiple of p, the registry's closed
  // form under PyTorch's rule against the idle share of PyTorch's order played at T_F = T_B = T_W = 1.
  // Expected by hand, with g = m / max(1, m // p) and bubble (p - 1 + (v-1) max(0, p - g)) chunk passes of
  // F + B = 3 over v m of them: p4 m6 v2 (g 6): 3 / (12 + 3) = 20%; p4 m10 v2 (g 5): 3 / 23; p4 m6 v3:
  // 3 / 21; p2 m3 v2 (g 3): 1 / 7; p4 m3 v3 (g 3 < p: two waits of one chunk pass): (3 + 2) / (9 + 5) = 5/14.
  const std::map<std::string, double> by_hand = {{"p4_m6_v2", 3.0 / 15}, {"p4_m10_v2", 3.0 / 23}, {"p4_m6_v3", 3.0 / 21},
                                                 {"p2_m3_v2", 1.0 / 7},  {"p4_m3_v3", 5.0 / 14}};
  const Costs unit;
  int compared = 0;
  const tessel::Json m = manifest();
  for (const auto& row : m.at("torch_to_tessel")) {
    if (row.at("class").get<std::string>() != "ScheduleInterleaved1F1B") continue;
    const int p = row.at("pp").get<int>(), mb = row.at("microbatches").get<int>(), v = row.at("vpp").get<int>();
    if (mb % p == 0) continue;
    const std::string key = "p" + std::to_string(p) + "_m" + std::to_string(mb) + "_v" + std::to_string(v);
    CAPTURE(key);
    const Schedule theirs = without_reductions(read_csv(golden_dir() + row.at("files").at("compute_only").get<std::string>()));
    const double played = unit_cost_simulate(theirs, unit).bubble_rate;
    const auto formula = bubble_rate(Kind::interleaved, MicrobatchRule::torch, p, mb, v, unit);
    REQUIRE(formula);
    CHECK(*formula == doctest::Approx(played).epsilon(1e-12));
    REQUIRE(by_hand.count(key));
    CHECK(*formula == doctest::Approx(by_hand.at(key)).epsilon(1e-12));
    ++compared;
  }
  CHECK(compared == 5);
}

TEST_CASE("Tessel's lowered files are the bytes PyTorch 2.15's compute_comms loader accepted") {
  int compared = 0;
  const tessel::Json m = manifest();
  for (const auto& row : m.at("tessel_to_torch")) {
    const std::string file = row.at("file").get<std::string>();
    CAPTURE(file);
    CHECK(row.at("loads").get<bool>());
    GenParams p;
    p.pp = row.at("pp").get<int>();
    p.microbatches = row.at("microbatches").get<int>();
    p.vpp = row.at("vpp").get<int>();
    const Schedule s = for_dialect(lower(generate(row.at("generator").get<std::string>(), p)), Dialect::torch_2_15);
    CHECK(to_csv(s, Dialect::torch_2_15) == tessel::read_text_file(golden_dir() + file));
    // The waits are what PyTorch 2.15 asks of a lowered file; the older spelling has none and was refused
    // ("Pipeline sends at rank 0 have no matching wait").
    CHECK(to_csv(for_dialect(s, Dialect::torch_2025)).find("WAIT_SEND") == std::string::npos);
    ++compared;
  }
  CHECK(compared == 15);
}
