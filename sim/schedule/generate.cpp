// generate(): common parameter checks and dispatch to the generator families.
#include <string>

#include "models/util/error.hpp"
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
