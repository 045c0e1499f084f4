// When a search ranks nothing: which given sizes cannot divide the GPU count, which layout rules block, and
// which restriction to lift (explore.hpp: why_nothing_fits).
#include "sim/explore/explore.hpp"

namespace tessel::explore {

NothingFits why_nothing_fits(const Model& m, const System& sys, int gpus, int global_batch, const Space& space,
                             const Result& r, const Options& opt) {
  NothingFits out;
  if (r.enumerated == 0) {
    // Nothing to enumerate because a given size cannot divide the GPU count. (Sizes that divide it but leave
    // no dp that divides the batch are diagnosed with the rules below.)
    const std::pair<const char*, const std::vector<int>*> given[] = {{"tp", &space.tp}, {"pp", &space.pp}, {"cp", &space.cp}};
    for (const auto& [dim, sizes] : given)
      for (int v : *sizes)
        if (gpus % v != 0) out.indivisible.push_back({dim, v});
    if (!out.indivisible.empty()) return out;
  }
  // Which restriction, lifted alone, would let the most layouts fit (analytical tier only). A dimension is
  // restricted when its vector is given (empty means every sensible value).
  Options quick = opt;
  quick.simulate = nullptr;
  quick.progress = nullptr;
  auto lift = [&](const char* dim, auto member) {
    if ((space.*member).empty()) return;
    Space s2 = space;
    (s2.*member).clear();
    const long long fit = run(m, sys, gpus, global_batch, s2, quick).scored;
    if (fit > out.lift_fit) {
      out.lift_fit = fit;
      out.lift = dim;
    }
  };
  lift("tp", &Space::tp);
  lift("pp", &Space::pp);
  lift("cp", &Space::cp);
  lift("vpp", &Space::vpp);
  lift("mbs", &Space::mbs);
  lift("zero", &Space::zero);
  lift("schedule", &Space::schedules);
  lift("recompute", &Space::recompute);
  lift("sp", &Space::sp);
  // Which rules block: a rule that rejects layouts first need not be the one to lift, since those layouts
  // may break others too; the layouts that break one rule alone name what lifting it would open up.
  out.rules = diagnose(m, sys, gpus, global_batch, space);
  return out;
}

}  // namespace tessel::explore
