// generate(): common parameter checks and dispatch to the generator families.
#include <string>

#include "util/error.hpp"
#include "sim/schedule/generators.hpp"

namespace tessel::sched {

const std::vector<std::string>& generator_names() {
  static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved", "looped-bfs", "zb1p",
                                                 "zb2p",  "zbv",  "dualpipev",   "zb-greedy"};
  return names;
}

Schedule generate(const std::string& name, const GenParams& p) {
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
  if (name == "gpipe") return gen::gpipe(p);
  if (name == "1f1b") return gen::one_f_one_b(p);
  if (name == "interleaved") return gen::interleaved(p);
  if (name == "looped-bfs") return gen::looped_bfs(p);
  if (name == "zb1p") return gen::zb1p(p);
  if (name == "zbv") return gen::zbv(p);
  if (name == "dualpipev") return gen::dualpipev(p);
  if (name == "zb-greedy") return gen::zb_greedy(p, name);
  if (name == "zb2p") {
    // ZB-2p: the ZB heuristic with twice 1F1B's activation budget, 2p (arXiv:2401.10241, formulas.md).
    GenParams q = p;
    if (!q.mem_limit) q.mem_limit = 2 * p.pp;
    return gen::zb_greedy(q, name);
  }
  std::string all;
  for (const auto& n : generator_names()) all += (all.empty() ? "" : ", ") + n;
  throw InputError("schedule generator '" + name + "': unknown; choose one of " + all);
}

}  // namespace tessel::sched
