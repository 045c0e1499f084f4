// Validator invariants and the user-reported failures of reference/schedules.md, each as a regression.
#include <doctest/doctest.h>

#include <string>

#include "util/error.hpp"
#include "sched_test_util.hpp"
#include "tests/test_paths.hpp"

using namespace tessel::sched;
using tessel::InputError;
using tessel::test::params;
using tessel::test::violations_text;

namespace {

CsvMeta meta(int pp, int stages, int m, std::vector<int> placement) {
  CsvMeta c;
  c.num_ranks = pp;
  c.num_stages = stages;
  c.num_microbatches = m;
  c.stage_to_rank = std::move(placement);
  return c;
}

bool has_rule(const ValidationReport& r, const std::string& rule, const std::string& text) {
  for (const auto& v : r.violations)
    if (v.rule == rule && v.message.find(text) != std::string::npos) return true;
  return false;
}

const std::string kOneFOneB = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";  // 1F1B, p = 2, m = 2

}  // namespace

TEST_CASE("a valid hand-written schedule passes, with its peak activations") {
  const auto r = validate(parse_csv(kOneFOneB, "t", meta(2, 2, 2, {0, 1})));
  CHECK_MESSAGE(r.ok(), violations_text(r));
  CHECK(r.peak_inflight == std::vector<int>{2, 1});  // 1F1B: min(m, p - r)
}

TEST_CASE("regression: duplicated action is an error (multiset completeness)") {
  // PyTorch _validate_schedule counts sets, so a duplicate op went undetected.
  const auto r = validate(parse_csv("0F0,0F1,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", "t", meta(2, 2, 2, {0, 1})));
  CHECK(has_rule(r, "completeness", "duplicated action 0F1"));
}

TEST_CASE("regression: W without I, I without W, missing backward") {
  const auto w = validate(parse_csv("0F0,0F1,0B0,0W1\n1F0,1B0,1F1,1B1\n", "t", meta(2, 2, 2, {0, 1})));
  CHECK(has_rule(w, "completeness", "W without I"));
  CHECK(has_rule(w, "completeness", "missing backward for stage 0 mb 1"));
  const auto i = validate(parse_csv("0F0,0F1,0B0,0I1\n1F0,1B0,1F1,1B1\n", "t", meta(2, 2, 2, {0, 1})));
  CHECK(has_rule(i, "completeness", "I without W"));
}

TEST_CASE("per-stage order: W before its I, B before its F") {
  const auto r = validate(parse_csv("0F0,0F1,0B0,0W1,0I1\n1F0,1B0,1B1,1F1\n", "t", meta(2, 2, 2, {0, 1})));
  CHECK(has_rule(r, "order", "'0W1' (line 1 cell 4) runs before its input rank 0 #4 '0I1' (line 1 cell 5)"));
  CHECK(has_rule(r, "order", "'1B1' (line 2 cell 3) runs before its input"));
}

TEST_CASE("cross-stage order on one rank and across ranks") {
  // V placement: stages 1 and 2 share rank 1; 2F0 before 1F0 on that rank is a causality violation.
  const auto same = validate(parse_csv("0F0,3F0,3B0,0B0\n2F0,1F0,1B0,2B0\n", "t", meta(2, 4, 1, {0, 1, 1, 0})));
  CHECK(has_rule(same, "causality", "'2F0' (line 2 cell 1) runs before its input rank 1 #1 '1F0' (line 2 cell 2)"));
  CHECK(has_rule(same, "causality", "'1B0' (line 2 cell 3) runs before its input rank 1 #3 '2B0' (line 2 cell 4)"));
  // A backward before its own forward is a per-stage order error.
  const auto own = validate(parse_csv("0B0,0F0\n1F0,1B0\n", "t", meta(2, 2, 1, {0, 1})));
  CHECK(has_rule(own, "order", "'0B0' (line 1 cell 1) runs before its input"));
  // Across ranks any order is fine unless it cannot execute: rank 1 runs 1F1 first, which needs 0F1,
  // which rank 0 runs after 0B0, which needs 1B0, which comes after 1F1 - a cycle, reported as its ops.
  const auto dead = validate(parse_csv("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n", "t", meta(2, 2, 2, {0, 1})));
  REQUIRE(dead.violations.size() == 1);
  CHECK(dead.violations[0].rule == "deadlock");
  CHECK(dead.violations[0].message.find("rank 1 #0 '1F1' (line 2 cell 1)") != std::string::npos);
  // Swapping micro-batches on the last stage alone is executable.
  const auto swapped = validate(parse_csv("0F0,0F1,0B1,0B0\n1F1,1F0,1B0,1B1\n", "t", meta(2, 2, 2, {0, 1})));
  CHECK_MESSAGE(swapped.ok(), violations_text(swapped));
}

TEST_CASE("regression: V schedule on loop placement (pytorch/torchtitan#774)") {
  // titan placed ZBV's stages loop style (rank 0: 0, 4); ZBV needs V (rank 0: 0, 7 for p = 4).
  Schedule s = generate("zbv", params(4, 8, 2));
  REQUIRE(s.stage_to_rank == std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0});
  s.stage_to_rank = stage_to_rank(4, 8, Placement::Loop);
  const auto r = validate(s);
  CHECK(has_rule(r, "structure", "stage 7 belongs to rank 3 under this placement"));
}

TEST_CASE("regression: pytorch/pytorch#172668 deadlocks under blocking sends, runs under eager and batched") {
  const std::string path = tessel::test::source_root() + "/tests/golden/schedules/regressions/deadlock_172668.csv";
  const Schedule s = read_csv(path);
  CHECK(validate(s, {CommModel::Eager, {}, 10}).ok());
  CHECK(validate(s, {CommModel::Batched, {}, 10}).ok());  // batch_isend_irecv posts both together
  const auto b = validate(s, {CommModel::Blocking, {}, 10});
  REQUIRE(b.violations.size() == 1);
  // rank0 [... 0SEND_F1, 2RECV_F0, ...], rank1 [... 1SEND_F0, 1RECV_F1, ...]: each send waits for a recv
  // that its peer posts only after its own send.
  CHECK(b.violations[0].rule == "deadlock");
  CHECK(b.violations[0].message ==
        "deadlock under blocking comms: cycle rank 0 #3 '0SEND_F1' (line 1 cell 4) -> rank 0 #4 '2RECV_F0' (line 1 cell 5) -> rank 1 #2 '1SEND_F0' (line 2 cell 3) -> "
        "rank 1 #3 '1RECV_F1' (line 2 cell 4) -> back to the first (each must happen before the next)");
  CHECK_THROWS_WITH_AS(unit_cost_simulate(s, Costs{}, CommModel::Blocking), doctest::Contains("deadlock"), InputError);
  // Tessel's own lowering of the same compute order avoids it (both sides of each transfer under one key).
  CHECK(validate(lower(strip_comms(s)), {CommModel::Blocking, {}, 10}).ok());
}

TEST_CASE("send/recv matching: missing, extra, and same-rank comm ops") {
  const Schedule low = lower(generate("1f1b", params(2, 2, 1)));
  Schedule missing = low;
  std::erase_if(missing.ranks[1], [](const Action& a) { return a.type == ActionType::RECV_F && a.mb == 1; });
  CHECK(has_rule(validate(missing), "send-recv", "needs exactly one 0SEND_F1 and one 1RECV_F1; found 1 and 0"));
  Schedule extra = low;
  extra.ranks[0].push_back(make(ActionType::SEND_F, 0, 1));
  CHECK(has_rule(validate(extra), "send-recv", "found 2 and 1"));
  // V placement: stages 3 and 4 share rank 3 (p = 4), so a send between them is wrong.
  Schedule v = lower(generate("zbv", params(4, 8, 2)));
  v.ranks[3].insert(v.ranks[3].begin(), make(ActionType::SEND_F, 3, 0));
  CHECK(has_rule(validate(v), "send-recv", "share rank 3; same-rank edges pass tensors locally"));
  // Lowering puts no comm between same-rank stages at all.
  const Schedule lowered_zbv = lower(generate("zbv", params(4, 8, 2)));  // named: ranks[3] of a temporary dangles
  for (const auto& a : lowered_zbv.ranks[3])
    if (is_comm(a.type)) CHECK(a.peer != 3);
}

TEST_CASE("memory limit: peak in-flight activations against --mem-limit") {
  const Schedule s = generate("1f1b", params(4, 8, 1));
  ValidateOptions vo;
  vo.mem_limit = 3;  // rank 0 holds min(m, p) = 4
  const auto r = validate(s, vo);
  REQUIRE(r.violations.size() == 1);
  CHECK(has_rule(r, "memory", "rank 0 holds 4 activations"));
  vo.mem_limit = 4;
  CHECK(validate(s, vo).ok());
}

TEST_CASE("unit-cost simulation: 1F1B makespan (m + p - 1)(F + B + W) and comm under each model") {
  // p = 4, m = 8, F = B = W = 1: (8 + 3) * 3 = 33 (ZB README: 1F1B cost).
  CHECK(unit_cost_simulate(generate("1f1b", params(4, 8, 1)), Costs{}).makespan == doctest::Approx(33.0));
  // Compute-only with comm c adds c per hop on the critical path: 2 (p - 1) hops of the first micro-batch's
  // forward and backward, so 33 + 6 c in the fill/drain; steady state hides it for c <= F.
  Costs c;
  c.comm = 0.25;
  const auto sim = unit_cost_simulate(generate("1f1b", params(4, 8, 1)), c);
  CHECK(sim.makespan >= 33.0 + 6 * 0.25 - 1e-9);
}

TEST_CASE("a rank without actions is a structure violation") {
  // A row of idle cells (or a sidecar placing no stage on a rank): the rank's work is missing or elsewhere.
  const auto r = validate(parse_csv("0F0,0B0\n,,\n", "t", meta(2, 1, 1, {0})));
  CHECK(has_rule(r, "structure", "rank 1 has no actions (line 2 of the file is empty or holds only idle cells)"));
}

TEST_CASE("REDUCE_GRAD and X_OPTIMIZER_STEP run once per stage") {
  const auto once = validate(parse_csv("0F0,0B0,0REDUCE_GRAD,0X_OPTIMIZER_STEP\n1F0,1B0,1REDUCE_GRAD,1X_OPTIMIZER_STEP\n", "t",
                                       meta(2, 2, 1, {0, 1})));
  CHECK_MESSAGE(once.ok(), violations_text(once));
  // QA: a second REDUCE_GRAD of stage 0 passed; it would reduce the gradients twice.
  const auto twice = validate(parse_csv("0F0,0B0,0REDUCE_GRAD,0REDUCE_GRAD\n1F0,1B0,1REDUCE_GRAD\n", "t", meta(2, 2, 1, {0, 1})));
  CHECK(has_rule(twice, "completeness",
                 "duplicated action 0REDUCE_GRAD at rank 0 #2 '0REDUCE_GRAD' (line 1 cell 3), rank 0 #3 '0REDUCE_GRAD' (line 1 cell 4) (once per stage and step)"));
  const auto steps = validate(parse_csv("0F0,0B0,0X_OPTIMIZER_STEP\n1F0,1B0,1X_OPTIMIZER_STEP,1X_OPTIMIZER_STEP\n", "t",
                                        meta(2, 2, 1, {0, 1})));
  CHECK(has_rule(steps, "completeness", "duplicated action 1X_OPTIMIZER_STEP"));
  // UNSHARD and RESHARD may repeat: FSDP reshards a stage between its uses.
  const auto fsdp = validate(parse_csv("0UNSHARD,0F0,0RESHARD,0UNSHARD,0B0,0RESHARD\n1F0,1B0\n", "t", meta(2, 2, 1, {0, 1})));
  CHECK_MESSAGE(fsdp.ok(), violations_text(fsdp));
}

TEST_CASE("X_RECOMPUTE: once per micro-batch, after its forward and before its backward") {
  const auto ok = validate(parse_csv("0F0,0X_RECOMPUTE0,0B0\n1F0,1X_RECOMPUTE0,1B0\n", "t", meta(2, 2, 1, {0, 1})));
  CHECK_MESSAGE(ok.ok(), violations_text(ok));
  const auto twice = validate(parse_csv("0F0,0X_RECOMPUTE0,0X_RECOMPUTE0,0B0\n1F0,1B0\n", "t", meta(2, 2, 1, {0, 1})));
  CHECK(has_rule(twice, "completeness", "duplicated action 0X_RECOMPUTE0 at rank 0 #1 '0X_RECOMPUTE0' (line 1 cell 2), rank 0 #2"));
  const auto late = validate(parse_csv("0F0,0B0,0X_RECOMPUTE0\n1F0,1B0\n", "t", meta(2, 2, 1, {0, 1})));
  CHECK(has_rule(late, "order", "rank 0 #2 '0X_RECOMPUTE0' (line 1 cell 3) recomputes after its backward rank 0 #1 '0B0' (line 1 cell 2)"));
  const auto early = validate(parse_csv("0X_RECOMPUTE0,0F0,0B0\n1F0,1B0\n", "t", meta(2, 2, 1, {0, 1})));
  CHECK(has_rule(early, "order", "'0X_RECOMPUTE0' (line 1 cell 1) runs before its input"));
}

TEST_CASE("FSDP and gradient actions in order (invariant 7)") {
  // QA: each of these passed. A schedule author's slips: REDUCE_GRAD before the stage's last backward, an
  // optimizer step first, a stage left without its REDUCE_GRAD, compute before the UNSHARD, RESHARD first.
  const auto m = meta(2, 2, 2, {0, 1});
  const std::string r1 = "1F0,1B0,1F1,1B1,1REDUCE_GRAD,1X_OPTIMIZER_STEP\n";
  const auto good = validate(parse_csv("0UNSHARD,0F0,0F1,0B0,0B1,0RESHARD,0REDUCE_GRAD,0X_OPTIMIZER_STEP\n" + r1, "t", m));
  CHECK_MESSAGE(good.ok(), violations_text(good));
  const auto early_rg = validate(parse_csv("0F0,0F1,0B0,0REDUCE_GRAD,0B1,0X_OPTIMIZER_STEP\n" + r1, "t", m));
  CHECK(has_rule(early_rg, "fsdp", "rank 0 #3 '0REDUCE_GRAD' (line 1 cell 4) runs before rank 0 #4 '0B1' (line 1 cell 5); it must follow every B and W of stage 0"));
  // Split backward: the weight gradients are complete after the last W, not the last I.
  const auto split = validate(parse_csv("0F0,0F1,0I0,0I1,0W0,0REDUCE_GRAD,0W1,0X_OPTIMIZER_STEP\n" + r1, "t", m));
  CHECK(has_rule(split, "fsdp", "'0REDUCE_GRAD' (line 1 cell 6) runs before rank 0 #6 '0W1' (line 1 cell 7)"));
  const auto early_opt = validate(parse_csv("0X_OPTIMIZER_STEP,0F0,0F1,0B0,0B1,0REDUCE_GRAD\n" + r1, "t", m));
  CHECK(has_rule(early_opt, "fsdp", "rank 0 #0 '0X_OPTIMIZER_STEP' (line 1 cell 1) runs before rank 0 #3 '0B0' (line 1 cell 4)"));
  const auto opt_before_rg = validate(parse_csv("0F0,0F1,0B0,0B1,0X_OPTIMIZER_STEP,0REDUCE_GRAD\n" + r1, "t", m));
  CHECK(has_rule(opt_before_rg, "fsdp", "'0X_OPTIMIZER_STEP' (line 1 cell 5) runs before rank 0 #5 '0REDUCE_GRAD' (line 1 cell 6)"));
  const auto missing = validate(parse_csv("0F0,0F1,0B0,0B1\n" + r1, "t", m));
  CHECK(has_rule(missing, "fsdp", "stage 0 has no REDUCE_GRAD while stage 1 has 1REDUCE_GRAD"));
  CHECK(has_rule(missing, "fsdp", "stage 0 has no X_OPTIMIZER_STEP while stage 1 has 1X_OPTIMIZER_STEP"));
  const auto late_unshard = validate(parse_csv("0F0,0UNSHARD,0F1,0B0,0B1,0REDUCE_GRAD,0X_OPTIMIZER_STEP\n" + r1, "t", m));
  CHECK(has_rule(late_unshard, "fsdp", "rank 0 #0 '0F0' (line 1 cell 1) computes stage 0 while its parameters are sharded"));
  const auto reshard_first = validate(parse_csv("0RESHARD,0UNSHARD,0F0,0F1,0B0,0B1,0REDUCE_GRAD,0X_OPTIMIZER_STEP\n" + r1, "t", m));
  CHECK(has_rule(reshard_first, "fsdp", "rank 0 #0 '0RESHARD' (line 1 cell 1) reshards stage 0, which is not unsharded here"));
  const auto twice = validate(parse_csv("0UNSHARD,0F0,0UNSHARD,0F1,0B0,0B1,0REDUCE_GRAD,0X_OPTIMIZER_STEP\n" + r1, "t", m));
  CHECK(has_rule(twice, "fsdp", "rank 0 #2 '0UNSHARD' (line 1 cell 3) unshards stage 0 again; rank 0 #0 '0UNSHARD' (line 1 cell 1) already did"));
  // Compute between a RESHARD and the next UNSHARD is on sharded parameters too.
  const auto between = validate(parse_csv("0UNSHARD,0F0,0F1,0RESHARD,0B0,0UNSHARD,0B1,0REDUCE_GRAD,0X_OPTIMIZER_STEP\n" + r1, "t", m));
  CHECK(has_rule(between, "fsdp", "rank 0 #4 '0B0' (line 1 cell 5) computes stage 0 while its parameters are sharded"));
}

TEST_CASE("messages point into the file: line and cell, idle cells counted") {
  // #N is the action's index among its rank's actions (idle cells skipped); the cell is where it is in the
  // file (QA: "#2" for the 5th cell of line 2).
  const auto r = validate(parse_csv("0F0,0F1,0B0,0B1\n,,1F0,,1B1,1F1,1B0\n", "t", meta(2, 2, 2, {0, 1})));
  CHECK(has_rule(r, "order", "rank 1 #1 '1B1' (line 2 cell 5) runs before its input rank 1 #2 '1F1' (line 2 cell 6)"));
  // A generated schedule has no file positions.
  CHECK(generate("1f1b", params(2, 2, 1)).cells.empty());
  CHECK(lower(parse_csv(kOneFOneB, "t", meta(2, 2, 2, {0, 1}))).cells.empty());
}

TEST_CASE("PyTorch 2.15's waits: each send retired once, after it; one reduction pending per rank") {
  const CsvMeta m2 = meta(2, 2, 1, {0, 1});
  // 1F1B, p 2, m 1, lowered, with the waits where PyTorch puts them: 0WAIT_SEND_F0 after 0B0, 1WAIT_SEND_B0 last.
  const std::string ok = "0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0\n1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n";
  CHECK(validate(parse_csv(ok, "ok", m2)).ok());
  // A wait before its send, a send never waited for: named, under rule "wait".
  const ValidationReport early =
      validate(parse_csv("0F0,0WAIT_SEND_F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n", "early", m2));
  CHECK(has_rule(early, "wait", "rank 0 #1 '0WAIT_SEND_F0' (line 1 cell 2) waits for 0SEND_F0, which is not pending on rank 0"));
  CHECK(has_rule(early, "wait", "rank 0 #2 '0SEND_F0' (line 1 cell 3) has no WAIT_SEND after it on rank 0"));
  // Without any wait in the file (the 2025 dialect) sends need none.
  CHECK(validate(parse_csv("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n", "old", m2)).ok());
  // Reductions: two pending on one rank, and a wait for the wrong stage.
  const CsvMeta v2 = meta(1, 2, 1, {0, 0});
  const ValidationReport two = validate(
      parse_csv("0F0,1F0,1B0,1REDUCE_GRAD,0B0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,1WAIT_REDUCE_GRAD\n", "two", v2));
  CHECK(has_rule(two, "wait", "rank 0 #5 '0REDUCE_GRAD' (line 1 cell 6) starts a reduction while rank 0 #3 '1REDUCE_GRAD' (line 1 cell 4) is pending"));
  CHECK(validate(parse_csv("0F0,1F0,1B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,0B0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n", "pair", v2)).ok());
}

TEST_CASE("a sent activation stays live until its wait, and a wait ends after the receive is posted") {
  // p 2, m 2, GPipe order on rank 0 with both waits at the end: the first activation is released by 0B0 but
  // still referenced by its send until 0WAIT_SEND_F0, so rank 0 holds 2 where the order without waits holds 2
  // at the same point too; move 0B0 before 0F1 and the difference shows: 1 live without the wait, 2 with it.
  const CsvMeta m = meta(2, 2, 2, {0, 1});
  const std::string r1 = "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1WAIT_SEND_B0,1WAIT_SEND_B1\n";
  const ValidationReport waited = validate(parse_csv(
      "0F0,0SEND_F0,0RECV_B0,0B0,0F1,0SEND_F1,0RECV_B1,0B1,0WAIT_SEND_F0,0WAIT_SEND_F1\n" + r1, "w", m));
  REQUIRE(waited.ok());
  CHECK(waited.peak_inflight[0] == 2);
  const ValidationReport prompt = validate(parse_csv(
      "0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0F1,0SEND_F1,0RECV_B1,0B1,0WAIT_SEND_F1\n" + r1, "p", m));
  REQUIRE(prompt.ok());
  CHECK(prompt.peak_inflight[0] == 1);
  // Each rank waits for a send whose receive the other posts only after its own wait: rank 0's wait for
  // 0SEND_F1 needs 1RECV_F1, which follows 1WAIT_SEND_B0, which needs 0RECV_B0, which follows 0's wait. A
  // cycle only the waits make: the same orders without them run under eager sends.
  const std::string d0 = "0F0,0SEND_F0,0F1,0SEND_F1,0WAIT_SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0RECV_B1,0B1\n";
  const std::string d1 = "1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1WAIT_SEND_B1\n";
  const ValidationReport dead = validate(parse_csv(d0 + d1, "d", m));
  CHECK(has_rule(dead, "deadlock", "'0WAIT_SEND_F1'"));
  auto no_waits = [](std::string t) {
    std::string out;
    std::size_t i = 0;
    while (i < t.size()) {
      std::size_t j = t.find_first_of(",\n", i);
      const std::string cell = t.substr(i, j - i);
      if (cell.find("WAIT") == std::string::npos) out += (out.empty() || out.back() == '\n' ? "" : ",") + cell;
      if (t[j] == '\n') out += '\n';
      i = j + 1;
    }
    return out;
  };
  CHECK(validate(parse_csv(no_waits(d0 + d1), "d0", m)).ok());
}
