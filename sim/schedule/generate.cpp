// generate(): common parameter checks, then the family's generator (sim/schedule/registry.cpp).
#include <string>

#include "util/error.hpp"
#include "sim/schedule/registry.hpp"

namespace tessel::sched {

Schedule generate(Kind kind, const GenParams& p) {
  if (p.pp < 1) throw InputError("--pp " + std::to_string(p.pp) + ": must be >= 1");
  if (p.microbatches < 1) throw InputError("--mb " + std::to_string(p.microbatches) + ": must be >= 1");
  if (p.vpp < 1) throw InputError("--vpp " + std::to_string(p.vpp) + ": must be >= 1");
  // A schedule holds a few actions per stage and micro-batch, and the simulator a few tasks per action
  // (sim/engine/simulate.cpp limits those to 2^22): beyond 2^22 stage-micro-batches that is gigabytes (a
  // 4096-stage, 2^20 micro-batch request would be hundreds), which no pipeline in practice comes near
  // (Megatron's runs: tens of stages, hundreds of micro-batches).
  constexpr long long kMaxStageMicrobatches = 1LL << 22;
  const long long work = static_cast<long long>(p.pp) * p.vpp * p.microbatches;
  if (work > kMaxStageMicrobatches)
    throw InputError("pipeline schedule of pp " + std::to_string(p.pp) + " x vpp " + std::to_string(p.vpp) + " stages x " +
                     std::to_string(p.microbatches) + " micro-batches = " + std::to_string(work) +
                     " stage-micro-batches: over the limit of " + std::to_string(kMaxStageMicrobatches) +
                     " (use fewer micro-batches: a larger micro-batch or a smaller global batch)");
  if (p.mem_limit && *p.mem_limit < 1)
    throw InputError("--mem-limit " + std::to_string(*p.mem_limit) + ": must be >= 1 activation per rank");
  return family(kind).generate(p);
}

Schedule generate(std::string_view name, const GenParams& p) {
  return generate(parse_schedule(name, "schedule generator"), p);
}

}  // namespace tessel::sched
