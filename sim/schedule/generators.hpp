// Internal: one function per generator family; generate() in generate.cpp checks the common parameters
// and dispatches here. Each function checks its own rules and throws InputError naming them.
#pragma once

#include "sim/schedule/schedule.hpp"

namespace tessel::sched::gen {

// Appends actions to one rank with per-stage micro-batch counters.
struct RankBuilder {
  std::vector<Action>* out;
  void add(ActionType t, int stage, int mb) { out->push_back(make(t, stage, mb)); }
  // One F&B block: the forward of (fs, fmb) with the backward of (bs, bmb).
  void add_fb(int fs, int fmb, int bs, int bmb) {
    out->push_back(make_overlap(make(ActionType::F, fs, fmb), make(ActionType::B, bs, bmb)));
  }
};

Schedule empty_schedule(const std::string& name, int pp, int vpp, int m, Placement placement);

Schedule gpipe(const GenParams& p);
Schedule one_f_one_b(const GenParams& p);
Schedule interleaved(const GenParams& p);
// Combined 1F1B (GenParams::combined) of the 1f1b (pp 1) or interleaved order: per rank, its F&B blocks
// counted by the forward's chunk a and the backward's chunk b (stages a pp + r and b pp + r), at [a v + b].
// The closed form prices the blocks from these counts without building the schedule. All zero when not
// combined.
std::vector<std::vector<int>> combined_block_counts(Kind k, const GenParams& p);
Schedule looped_bfs(const GenParams& p);
Schedule zb1p(const GenParams& p);
Schedule zbv(const GenParams& p);
Schedule dualpipev(const GenParams& p);
// ZB heuristic (arXiv:2401.10241 Sec. 3 / zb.py Graph.manual_order idea): greedy list scheduling with
// per-stage F/I/W costs and a per-rank activation limit. `name` is recorded as the generator.
Schedule zb_greedy(const GenParams& p, const std::string& name);

}  // namespace tessel::sched::gen
