// Critical path: the longest path through the executed DAG with each task weighted by the time it took
// when played (a flow slowed by contention counts its contended time). Every task starts when its last
// predecessor ends, so the path's length is the makespan. Boost.Graph, after the run (not in the hot loop).
#include <algorithm>
#include <limits>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/dag_shortest_paths.hpp>

#include "models/util/error.hpp"
#include "sim/engine/simulate.hpp"

namespace tessel::engine {

std::vector<std::uint32_t> critical_path(const Job& job, const RunResult& run) {
  using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS, boost::no_property,
                                      boost::property<boost::edge_weight_t, double>>;
  const TaskGraph& g = job.graph;
  const std::uint32_t n = g.size();
  if (n == 0) return {};
  // Vertex n is a source joined to every task without predecessors. Weights are negated durations of the
  // edge's target, so the shortest path from the source is the longest in time.
  Graph bg(n + 1);
  auto dur = [&](std::uint32_t t) { return run.end[t] - run.start[t]; };
  for (std::uint32_t t = 0; t < n; ++t) {
    if (g.num_preds[t] == 0) boost::add_edge(n, t, -dur(t), bg);
    for (auto s : g.successors(t)) boost::add_edge(t, s, -dur(s), bg);
  }
  std::vector<double> dist(n + 1);
  std::vector<std::size_t> pred(n + 1);
  boost::dag_shortest_paths(bg, n,
                            boost::distance_map(dist.data()).predecessor_map(pred.data()));
  std::uint32_t last = 0;
  for (std::uint32_t t = 1; t < n; ++t)
    if (dist[t] < dist[last]) last = t;
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
