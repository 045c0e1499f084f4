// The event-simulated tier's scoring of one layout (explore.hpp: event_simulator).
#include "sim/engine/simulate.hpp"
#include "sim/explore/explore.hpp"

namespace tessel::explore {

SimulateFn event_simulator(const Model& m, const System& sys) {
  return [m, sys](const Layout& l) {
    engine::SimOptions o;
    o.fidelity = engine::Fidelity::replica;  // the other replicas' traffic still loads the shared links
    o.critical_path = false;
    const engine::SimReport r = engine::simulate(m, l, sys, o);
    SimScore sc;
    sc.step_s = r.step_s;
    sc.peak_memory_bytes = r.peak_bytes;
    const engine::RankSummary* busiest = nullptr;
    for (const auto& rk : r.ranks)
      if (!busiest || rk.busy_s > busiest->busy_s) busiest = &rk;
    if (busiest) {
      sc.bubble = busiest->bubble_s / r.step_s;
      sc.exposed_comm_s = busiest->exposed_comm_s;
    }
    return sc;
  };
}

}  // namespace tessel::explore
