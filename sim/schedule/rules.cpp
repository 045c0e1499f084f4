#include "sim/schedule/rules.hpp"

#include <algorithm>

namespace tessel::sched {

namespace {
std::string s(long long v) { return std::to_string(v); }
}  // namespace

std::optional<ShapeProblem> vpp_problem(const std::string& name, int vpp) {
  if (name == "gpipe" || name == "1f1b" || name == "zb2p" || name == "zb-greedy") {
    // gen_basic.cpp require_single_stage, gen_greedy.cpp: one stage per rank.
    if (vpp != 1) return ShapeProblem{"schedule-vpp", name + " takes one stage per rank (vpp 1), got vpp " + s(vpp)};
  } else if (name == "zbv" || name == "dualpipev") {
    // gen_v.cpp require_v2: the V placement puts stages r and 2p-1-r on rank r.
    if (vpp != 2)
      return ShapeProblem{"schedule-vpp", name + " needs exactly 2 stages per rank (vpp 2: the V placement), got vpp " + s(vpp)};
  }
  // interleaved, looped-bfs and zb1p take any vpp.
  return std::nullopt;
}

std::optional<ShapeProblem> microbatch_problem(const std::string& name, int pp, int m) {
  const std::string got = ", got m = " + s(m) + " with pp " + s(pp);
  if (name == "dualpipev" && m < 2 * pp)
    return ShapeProblem{"schedule-microbatches", "dualpipev needs micro-batches m >= 2*pp = " + s(2 * pp) + got +
                                                     " (DeepSeek dualpipev.py: every stage needs a micro-batch in flight)"};
  // Megatron: microbatch_group_size_per_vp_stage (default pp) must lie in [pp, m], and a last group of
  // 0 < m mod pp < pp micro-batches is refused ("dependency bubbles"); with the group at pp both say
  // m >= pp and m mod pp == 0.
  if (name == "interleaved" && (m < pp || m % pp != 0))
    return ShapeProblem{"schedule-microbatches", "interleaved needs micro-batches m to be a multiple of pp " + s(pp) +
                                                     " (Megatron's micro-batch group is pp and must divide m)" + got};
  if (name == "zb1p") {
    // PyTorch ScheduleInterleavedZeroBubble: rounds = max(1, m // pp) must divide m.
    const int rounds = std::max(1, m / std::max(1, pp));
    if (m % rounds != 0)
      return ShapeProblem{"schedule-microbatches", "zb1p needs micro-batches m divisible by its number of rounds "
                                                   "max(1, m // pp) = " + s(rounds) + got +
                                                       " (PyTorch ScheduleInterleavedZeroBubble)"};
  }
  // gpipe, 1f1b, looped-bfs, zbv, zb2p and zb-greedy take any m >= 1.
  return std::nullopt;
}

std::optional<ShapeProblem> shape_problem(const std::string& name, int pp, int vpp, int m) {
  if (auto p = vpp_problem(name, vpp)) return p;
  return microbatch_problem(name, pp, m);
}

int default_vpp(const std::string& name, int interleaved_default) {
  if (name == "zbv" || name == "dualpipev") return 2;
  if (name == "interleaved" || name == "looped-bfs") return interleaved_default;
  return 1;
}

}  // namespace tessel::sched
