#include "sim/engine/host_model.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace tessel::engine {

double host_rate(double alone_s, double busy_s, int threads, int cores) {
  TESSEL_CHECK(cores > 0 && threads > 0, "host rate for " << threads << " threads on " << cores << " cores");
  const double share = threads > cores ? static_cast<double>(cores) / threads : 1.0;
  const double busy_cores = std::min(threads, cores);
  const double phi = cores > 1 ? (busy_cores - 1) / (cores - 1) : 0.0;
  const double w = alone_s + (busy_s - alone_s) * phi;
  constexpr double kInstant = 1e300;  // fraction per second of an op of no work
  return w > 0 ? share / w : kInstant;
}

System busy_system(const System& s) {
  System b = s;
  for (int k = 0; k < kCostKinds; ++k) b.gpu.time_factor[static_cast<std::size_t>(k)] *= s.host.contention[static_cast<std::size_t>(k)];
  return b;
}

void attach_host(Job& job, const Job& busy, const System& sys, int threads_per_position) {
  TaskGraph& g = job.graph;
  TESSEL_CHECK(busy.graph.size() == g.size(), "the busy job has " << busy.graph.size() << " tasks, the job " << g.size());
  TESSEL_CHECK(sys.host.cores > 0 && threads_per_position > 0, "host of " << sys.host.cores << " cores");
  g.host_cores = sys.host.cores;
  g.host_threads = threads_per_position;
  g.work_busy.assign(g.size(), 0.0);
  for (std::uint32_t t = 0; t < g.size(); ++t) {
    if (g.compute_pos[t] < 0) continue;
    TESSEL_CHECK(busy.graph.compute_pos[t] == g.compute_pos[t], "task " << t << " differs in the busy job");
    g.work_busy[t] = busy.graph.work[t];
  }
}

}  // namespace tessel::engine
