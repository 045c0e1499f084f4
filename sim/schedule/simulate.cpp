// Unit-cost simulation (longest path of the happens-before graph) and the closed-form bubble rates.
#include <algorithm>
#include <numeric>

#include "util/error.hpp"
#include "sim/schedule/hb_graph.hpp"

namespace tessel::sched {

SimResult unit_cost_simulate(const Schedule& s, const Costs& costs, CommModel comm) {
  ValidateOptions vo;
  vo.comm = comm;
  vo.max_violations = 1;
  const auto rep = validate(s, vo);
  if (!rep.ok())
    throw InputError("cannot simulate schedule '" + s.generator + "': " + rep.violations[0].rule + ": " +
                     rep.violations[0].message);
  return detail::simulate_valid(s, costs, comm);
}

SimResult unit_cost_simulate_validated(const Schedule& s, const Costs& costs, CommModel comm) {
  return detail::simulate_valid(s, costs, comm);
}

SimResult detail::simulate_valid(const Schedule& s, const Costs& costs, CommModel comm) {
  const detail::OpIndex idx(s);
  const auto g = detail::build_hb_graph(s, idx, comm, costs);
  const auto t = detail::longest_path(g);

  SimResult res;
  const auto R = static_cast<std::size_t>(s.num_ranks);
  res.busy.assign(R, 0.0);
  res.first_start.assign(R, 0.0);
  res.last_end.assign(R, 0.0);
  res.times.resize(R);
  for (int r = 0; r < s.num_ranks; ++r) {
    bool any = false;
    for (int p = 0; p < static_cast<int>(s.ranks[r].size()); ++p) {
      const Action& a = s.ranks[r][static_cast<std::size_t>(p)];
      const Timed tm{t[static_cast<std::size_t>(g.post(r, p))], t[static_cast<std::size_t>(g.done(r, p))]};
      res.times[r].push_back(tm);
      if (!is_compute(a.type)) continue;
      res.busy[r] += costs.of(a);
      res.first_start[r] = any ? std::min(res.first_start[r], tm.start) : tm.start;
      res.last_end[r] = std::max(res.last_end[r], tm.end);
      any = true;
    }
    res.makespan = std::max(res.makespan, res.last_end[r]);
  }
  double max_span = 0, max_busy = 0, rate_sum = 0;
  for (std::size_t r = 0; r < R; ++r) {
    res.bubble.push_back(res.makespan - res.busy[r]);
    rate_sum += res.makespan > 0 ? res.bubble[r] / res.makespan : 0.0;
    max_span = std::max(max_span, res.last_end[r] - res.first_start[r]);
    max_busy = std::max(max_busy, res.busy[r]);
  }
  res.bubble_rate = R ? rate_sum / static_cast<double>(R) : 0.0;
  res.span_bubble_rate = max_span > 0 ? (max_span - max_busy) / max_span : 0.0;
  return res;
}

}  // namespace tessel::sched
