// Critical path: the longest path through the executed DAG with each task weighted by the time it took
// when played (a flow slowed by contention counts its contended time), ending at the step's last task: the
// step_end task that ends last, whose end is step_s. Work after the step (ZeRO-1/2 with
// overlap_param_gather: the parameter all-gathers past the first bucket, which belong to the next step's
// forward and do not hold this step, docs/simulator.md) is not on it, so the path ends where step_s does.
// The engine starts a task the moment its last predecessor ends, so a task's end is the length of the
// longest path to it, and that path runs through the predecessor that released it (RunResult::released_by,
// recorded as the run plays): the path is those links followed back, linear in its length, with no pass over
// the graph's millions of tasks and edges (bench/partition-results.md). Among predecessors ending at the same
// instant, the one whose end the engine processed last is on the path.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "util/error.hpp"
#include "sim/engine/simulate.hpp"

namespace tessel::engine {

std::vector<std::uint32_t> critical_path(const Job& job, const RunResult& run) {
  const std::uint32_t n = job.graph.size();
  if (n == 0) return {};
  constexpr std::uint32_t kNone = RunResult::kNoTask;
  TESSEL_CHECK(run.released_by.size() == n && run.end.size() == n,
               "critical path: a run of " << run.end.size() << " tasks for a graph of " << n);
  // The path ends at the task that sets step_s (simulate.cpp: the latest end among step_end, the first of
  // those ending together). Without step ends (a bare job in tests), the task that ends last.
  std::uint32_t last = kNone;
  for (std::uint32_t t : job.step_end)
    if (t < n && (last == kNone || run.end[t] > run.end[last])) last = t;
  if (last == kNone) {
    last = 0;
    for (std::uint32_t t = 1; t < n; ++t)
      if (run.end[t] > run.end[last]) last = t;
  }
  std::vector<std::uint32_t> path;
  for (std::uint32_t v = last; v != kNone; v = run.released_by[v]) {
    TESSEL_CHECK(path.size() < n, "critical path: the release links form a cycle");
    path.push_back(v);
  }
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace tessel::engine
