// Critical path: the longest path through the executed DAG with each task weighted by the time it took
// when played (a flow slowed by contention counts its contended time), ending at the step's last task: the
// step_end task that ends last, whose end is step_s. Work after the step (ZeRO-1/2 with
// overlap_param_gather: the parameter all-gathers past the first bucket, which belong to the next step's
// forward and do not hold this step, docs/simulator.md) is not on it, so the path ends where step_s does.
// Boost.Graph, after the run (not in the hot loop).
#include <algorithm>
#include <limits>

#include <utility>
#include <vector>

#include <boost/graph/compressed_sparse_row_graph.hpp>
#include <boost/graph/dag_shortest_paths.hpp>

#include "util/error.hpp"
#include "sim/engine/simulate.hpp"

namespace tessel::engine {

std::vector<std::uint32_t> critical_path(const Job& job, const RunResult& run) {
  // Compressed sparse rows: one allocation for the edges instead of one per vertex (a 2,048-GPU step has
  // millions of tasks).
  using Graph = boost::compressed_sparse_row_graph<boost::directedS, boost::no_property, double, boost::no_property,
                                                   std::uint32_t, std::uint32_t>;
  const TaskGraph& g = job.graph;
  const std::uint32_t n = g.size();
  if (n == 0) return {};
  // Vertex n is a source joined to every task without predecessors. Weights are negated durations of the
  // edge's target, so the shortest path from the source is the longest in time. Edges by ascending source.
  auto dur = [&](std::uint32_t t) { return run.end[t] - run.start[t]; };
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges;
  std::vector<double> weights;
  std::size_t m = 0;
  for (std::uint32_t t = 0; t < n; ++t) m += g.successors(t).size() + (g.num_preds[t] == 0);
  TESSEL_CHECK(m < (std::size_t(1) << 32), "critical path: " << m << " edges exceed the graph's 32-bit edge index");
  edges.reserve(m);
  weights.reserve(m);
  for (std::uint32_t t = 0; t < n; ++t)
    for (auto s : g.successors(t)) {
      edges.emplace_back(t, s);
      weights.push_back(-dur(s));
    }
  for (std::uint32_t t = 0; t < n; ++t)
    if (g.num_preds[t] == 0) {
      edges.emplace_back(n, t);
      weights.push_back(-dur(t));
    }
  const Graph bg(boost::edges_are_sorted, edges.begin(), edges.end(), weights.begin(), n + 1);
  std::vector<double> dist(n + 1);
  std::vector<std::size_t> pred(n + 1);
  boost::dag_shortest_paths(bg, n,
                            boost::distance_map(dist.data()).predecessor_map(pred.data()).weight_map(get(boost::edge_bundle, bg)));
  // The path ends at the task that sets step_s (simulate.cpp: the latest end among step_end); among
  // step_end tasks ending together, the one with the longest path. Without step ends (a bare job in
  // tests), the longest path of all.
  std::uint32_t last = n;
  auto later = [&](std::uint32_t t) {
    if (last == n) return true;
    if (run.end[t] != run.end[last]) return run.end[t] > run.end[last];
    return dist[t] < dist[last];
  };
  for (std::uint32_t t : job.step_end)
    if (t < n && later(t)) last = t;
  if (last == n) {
    last = 0;
    for (std::uint32_t t = 1; t < n; ++t)
      if (dist[t] < dist[last]) last = t;
  }
  std::vector<std::uint32_t> path;
  for (std::size_t v = last; v != n; v = pred[v]) {
    path.push_back(static_cast<std::uint32_t>(v));
    TESSEL_CHECK(path.size() <= n, "predecessor loop in the critical path");
    if (pred[v] == v) break;
  }
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace tessel::engine
