// Differences between two schedules, for `tessel schedule diff` and golden-file tests.
#pragma once

#include <string>
#include <vector>

#include "sim/schedule/schedule.hpp"

namespace tessel::sched {

// One rank whose action lists differ: the first differing position, and the actions present in only one of
// the two (as multisets, in token order).
struct RankDiff {
  int rank = 0;
  std::size_t first = 0;        // index of the first difference (idle cells not counted)
  std::string first_a, first_b;  // the actions there ("<end>" past a list's end)
  std::size_t actions_a = 0, actions_b = 0;
  std::vector<std::string> only_a, only_b;
};

struct ScheduleDiff {
  std::vector<std::string> shape;  // "ranks: 4 vs 8", "stage_to_rank: [...] vs [...]"
  std::vector<RankDiff> ranks;     // every rank that differs, in rank order
  bool identical() const { return shape.empty() && ranks.empty(); }
};

ScheduleDiff diff_schedules(const Schedule& a, const Schedule& b);

// The same as text, bounded whatever the schedules' size: at most max_lines lines and max_tokens actions
// listed per line, each cut said with its count ("... 96 more"). Empty when the schedules are identical.
std::vector<std::string> diff(const Schedule& a, const Schedule& b, std::size_t max_lines = 40,
                              std::size_t max_tokens = 12);

}  // namespace tessel::sched
