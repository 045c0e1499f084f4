// Critical path: the longest path through the executed DAG with each task weighted by the time it took
// when played (a flow slowed by contention counts its contended time), ending at the step's last task: the
// step_end task that ends last, whose end is step_s. Work after the step (ZeRO-1/2 with
// overlap_param_gather: the parameter all-gathers past the first bucket, which belong to the next step's
// forward and do not hold this step, docs/simulator.md) is not on it, so the path ends where step_s does.
// After the run (not in the hot loop): one pass in topological order (Kahn's, from the graph's own
// predecessor counts), linear in tasks and edges and with no copy of the edges; a 2,048-GPU step has millions
// of tasks (bench/simulate.md).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "util/error.hpp"
#include "sim/engine/simulate.hpp"

namespace tessel::engine {

std::vector<std::uint32_t> critical_path(const Job& job, const RunResult& run) {
  const TaskGraph& g = job.graph;
  const std::uint32_t n = g.size();
  if (n == 0) return {};
  constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();
  auto dur = [&](std::uint32_t t) { return run.end[t] - run.start[t]; };
  // len[t]: the longest path ending with t, t's own time included; pred[t]: the task before t on it (the first
  // found among equals).
  std::vector<double> len(n, 0.0);
  std::vector<std::uint32_t> pred(n, kNone);
  std::vector<std::uint32_t> waiting(g.num_preds.begin(), g.num_preds.end());
  std::vector<std::uint32_t> order;
  order.reserve(n);
  for (std::uint32_t t = 0; t < n; ++t)
    if (waiting[t] == 0) {
      order.push_back(t);
      len[t] = dur(t);
    }
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::uint32_t t = order[i];
    for (std::uint32_t s : g.successors(t)) {
      const double l = len[t] + dur(s);
      if (pred[s] == kNone || l > len[s]) {
        len[s] = l;
        pred[s] = t;
      }
      if (--waiting[s] == 0) order.push_back(s);
    }
  }
  TESSEL_CHECK(order.size() == n, "critical path: " << n - order.size() << " tasks lie on a cycle of the task graph");
  // The path ends at the task that sets step_s (simulate.cpp: the latest end among step_end); among
  // step_end tasks ending together, the one with the longest path. Without step ends (a bare job in
  // tests), the longest path of all.
  std::uint32_t last = kNone;
  auto later = [&](std::uint32_t t) {
    if (last == kNone) return true;
    if (run.end[t] != run.end[last]) return run.end[t] > run.end[last];
    return len[t] > len[last];
  };
  for (std::uint32_t t : job.step_end)
    if (t < n && later(t)) last = t;
  if (last == kNone) {
    last = 0;
    for (std::uint32_t t = 1; t < n; ++t)
      if (len[t] > len[last]) last = t;
  }
  std::vector<std::uint32_t> path;
  for (std::uint32_t v = last; v != kNone; v = pred[v]) path.push_back(v);
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace tessel::engine
