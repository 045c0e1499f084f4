// Internal: one function per generator family; generate() in generate.cpp checks the common parameters
// and dispatches here. Each function checks its own rules and throws InputError naming them.
#pragma once

#include "sim/schedule/schedule.hpp"

namespace tessel::sched::gen {

// Appends actions to one rank with per-stage micro-batch counters.
struct RankBuilder {
  std::vector<Action>* out;
  void add(ActionType t, int stage, int mb) { out->push_back(make(t, stage, mb)); }
};

Schedule empty_schedule(const std::string& name, int pp, int vpp, int m, Placement placement);

Schedule gpipe(const GenParams& p);
Schedule one_f_one_b(const GenParams& p);
Schedule interleaved(const GenParams& p);
Schedule looped_bfs(const GenParams& p);
Schedule zb1p(const GenParams& p);
Schedule zbv(const GenParams& p);
Schedule dualpipev(const GenParams& p);
// ZB heuristic (arXiv:2401.10241 Sec. 3 / zb.py Graph.manual_order idea): greedy list scheduling with
// per-stage F/I/W costs and a per-rank activation limit. `name` is recorded as the generator.
Schedule zb_greedy(const GenParams& p, const std::string& name);

}  // namespace tessel::sched::gen
