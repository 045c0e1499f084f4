// Greedy zero-bubble scheduler in the spirit of the ZB heuristic (Qi et al., arXiv:2401.10241, Sec. 3;
// zb.py Graph.manual_order): list scheduling in simulated time with per-stage F/I/W costs.
// At each moment an idle stage starts, in priority order:
//   1. the next input grad I if its inputs have arrived (frees the critical path of earlier stages),
//   2. the next forward F if it has arrived and the stage holds fewer than `mem_limit` activations,
//   3. the oldest pending weight grad W (it has no consumers, so it fills what would be a bubble).
// An activation lives from F to W (I does not release it: reference/schedules.md, invariant 8).
// Dependencies: F(s,i) <- F(s-1,i); I(s,i) <- I(s+1,i) (last stage: F(s,i)); W(s,i) <- I(s,i);
// per stage, each kind runs in micro-batch order. Cross-rank edges add costs.comm.
#include <algorithm>
#include <limits>
#include <set>

#include "util/error.hpp"
#include "sim/schedule/generators.hpp"

namespace tessel::sched::gen {

namespace {

constexpr double kUnknown = std::numeric_limits<double>::infinity();

struct StageState {
  int nf = 0, ni = 0, nw = 0;          // next F, I, W micro-batch
  double busy_until = 0;
  std::vector<double> f_end, i_end;    // completion per micro-batch (kUnknown until scheduled)
};

struct Started {
  double start;
  int stage;
  Action action;
};

}  // namespace

Schedule zb_greedy(const GenParams& p, const std::string& name) {
  if (p.vpp != 1)
    throw InputError("--vpp " + std::to_string(p.vpp) + ": " + name +
                     " schedules one stage per rank (--vpp 1)");
  const int S = p.pp, m = p.microbatches;
  const Costs costs = p.costs.value_or(Costs{});
  const int limit = p.mem_limit.value_or(m);
  if (limit < 1) throw InputError("--mem-limit " + std::to_string(limit) + ": must be >= 1 activation per rank");
  for (int s = 0; s < S; ++s)
    if (!(costs.f(s) > 0 && costs.b(s) > 0 && costs.w(s) >= 0))
      throw InputError("--costs: F and B must be > 0 and W >= 0 for every stage (stage " + std::to_string(s) + ")");

  std::vector<StageState> st(static_cast<std::size_t>(S));
  for (auto& x : st) x.f_end.assign(static_cast<std::size_t>(m), kUnknown), x.i_end = x.f_end;
  auto at = [&](int s) -> StageState& { return st[static_cast<std::size_t>(s)]; };
  const double c = costs.comm;  // one rank per stage: every stage boundary crosses ranks

  auto f_ready = [&](int s) {
    const StageState& x = at(s);
    if (x.nf >= m || x.nf - x.nw >= limit) return kUnknown;
    return s == 0 ? 0.0 : at(s - 1).f_end[static_cast<std::size_t>(x.nf)] + c;
  };
  auto i_ready = [&](int s) {
    const StageState& x = at(s);
    if (x.ni >= x.nf) return kUnknown;
    const double own = x.f_end[static_cast<std::size_t>(x.ni)];
    return s == S - 1 ? own : std::max(own, at(s + 1).i_end[static_cast<std::size_t>(x.ni)] + c);
  };

  std::vector<Started> started;
  std::set<double> events{0.0};
  std::size_t remaining = static_cast<std::size_t>(3 * S * m);
  while (remaining > 0) {
    TESSEL_CHECK(!events.empty(), "greedy scheduler made no progress for " << name);
    const double T = *events.begin();
    events.erase(events.begin());
    for (int s = 0; s < S; ++s) {
      StageState& x = at(s);
      if (x.busy_until > T) continue;
      const double ti = i_ready(s), tf = f_ready(s);
      Action a;
      double cost;
      if (ti <= T) {
        a = make(ActionType::I, s, x.ni);
        cost = costs.b(s);
        x.i_end[static_cast<std::size_t>(x.ni++)] = T + cost;
      } else if (tf <= T) {
        a = make(ActionType::F, s, x.nf);
        cost = costs.f(s);
        x.f_end[static_cast<std::size_t>(x.nf++)] = T + cost;
      } else if (x.nw < x.ni) {
        a = make(ActionType::W, s, x.nw++);
        cost = costs.w(s);
      } else {
        for (double t : {ti, tf})
          if (t != kUnknown) events.insert(t);  // wake up when a known input arrives
        continue;
      }
      started.push_back({T, s, a});
      x.busy_until = T + cost;
      events.insert(T + cost);
      if (c > 0) events.insert(T + cost + c);
      --remaining;
    }
  }
  // started is in time order already (T is non-decreasing); per rank it is the program order.
  Schedule out = empty_schedule(name, S, 1, m, Placement::Loop);
  for (const auto& e : started) out.ranks[static_cast<std::size_t>(e.stage)].push_back(e.action);
  return out;
}

}  // namespace tessel::sched::gen
