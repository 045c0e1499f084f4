// The shape rules of the schedule generators: which (schedule, pp, vpp, micro-batches) generate() builds.
// One statement of them, shared by every caller that must refuse a layout before a generator would:
// layout_problem() (and so estimate, simulate, run and explore's rejection counts) and `tessel schedule`.
#pragma once

#include <optional>
#include <string>

namespace tessel::sched {

struct ShapeProblem {
  std::string rule;     // "schedule-vpp" or "schedule-microbatches" (explore counts rejections by these keys)
  std::string message;  // the schedule, the values and the rule's source
};

// The first rule of generator `name` that pp ranks with vpp stages each and m micro-batches break, with
// interleaved's micro-batch group at Megatron's default (pp). These are exactly the generators' own
// preconditions (tests/schedule/test_rules.cpp checks both ways over a grid of (pp, vpp, m)); generate()'s
// common limits (pp, vpp, m >= 1, and its size limit) are not shape rules and are left to it.
// Unknown names give nullopt: generate() and the layout parsers name those.
std::optional<ShapeProblem> shape_problem(const std::string& name, int pp, int vpp, int m);
// Its two halves: the stages-per-rank rule alone (no micro-batch count needed; checked first), and the
// micro-batch rule for a vpp that passes it.
std::optional<ShapeProblem> vpp_problem(const std::string& name, int vpp);
std::optional<ShapeProblem> microbatch_problem(const std::string& name, int pp, int m);

// The vpp a schedule runs with when none is given: 2 for the V schedules (zbv, dualpipev: exactly two
// stages per rank), `interleaved_default` for interleaved and looped-bfs, 1 for the rest.
int default_vpp(const std::string& name, int interleaved_default);

}  // namespace tessel::sched
