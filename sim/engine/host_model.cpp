#include "sim/engine/host_model.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace tessel::engine {

double host_rate(double alone_s, double busy_s, int crowd, int busy_cores, int cores) {
  TESSEL_CHECK(cores > 0 && crowd > 0 && busy_cores > 0 && busy_cores <= cores,
               "host rate for " << crowd << " threads on a core, " << busy_cores << " of " << cores << " cores busy");
  const double share = 1.0 / crowd;
  const double phi = cores > 1 ? static_cast<double>(busy_cores - 1) / (cores - 1) : 0.0;
  const double w = alone_s + (busy_s - alone_s) * phi;
  constexpr double kInstant = 1e300;  // fraction per second of an op of no work
  return w > 0 ? share / w : kInstant;
}

int home_core(int rank, int cores) {
  TESSEL_CHECK(rank >= 0 && cores > 0, "home core of rank " << rank << " on " << cores << " cores");
  return rank % cores;
}

System busy_system(const System& s) {
  System b = s;
  for (int k = 0; k < kCostKinds; ++k) b.gpu.time_factor[static_cast<std::size_t>(k)] *= s.host.contention[static_cast<std::size_t>(k)];
  return b;
}

void attach_host(Job& job, const Job& busy, const System& sys, int threads_per_position, const std::vector<int>& first_rank) {
  TaskGraph& g = job.graph;
  TESSEL_CHECK(busy.graph.size() == g.size(), "the busy job has " << busy.graph.size() << " tasks, the job " << g.size());
  TESSEL_CHECK(sys.host.cores > 0 && threads_per_position > 0, "host of " << sys.host.cores << " cores");
  TESSEL_CHECK(static_cast<int>(first_rank.size()) == g.num_positions,
               first_rank.size() << " first ranks for " << g.num_positions << " positions");
  g.host_cores = sys.host.cores;
  g.host_threads = threads_per_position;
  g.work_busy.assign(g.size(), 0.0);
  for (std::uint32_t t = 0; t < g.size(); ++t) {
    if (g.compute_pos[t] < 0) continue;
    TESSEL_CHECK(busy.graph.compute_pos[t] == g.compute_pos[t], "task " << t << " differs in the busy job");
    g.work_busy[t] = busy.graph.work[t];
  }
  g.thread_core.resize(static_cast<std::size_t>(g.num_positions) * threads_per_position);
  for (int p = 0; p < g.num_positions; ++p)
    for (int i = 0; i < threads_per_position; ++i)
      g.thread_core[static_cast<std::size_t>(p) * threads_per_position + i] =
          home_core(first_rank[static_cast<std::size_t>(p)] + i, sys.host.cores);
}

}  // namespace tessel::engine
