#include "tools/system_args.hpp"

#include "util/units.hpp"

namespace tessel::cli {

System read_system(const CommandLine& cl, const std::string& fallback) {
  System s = load_system(cl.get_or("--system", fallback));
  // Up to the largest GPU memory a preset describes; a margin larger than the GPU rejects every layout, which
  // explore then reports as memory with the margin named.
  if (auto h = cl.get_double("--min-headroom", 0, 1e4)) s.min_headroom_bytes = *h * kGiB;
  // The job's domains are then that size: every group, transfer and failure domain is counted over them.
  if (auto g = cl.get_int("--gpus-per-domain", 1, s.node.gpus_per_node)) s.node.gpus_per_node = static_cast<int>(*g);
  return s;
}

}  // namespace tessel::cli
