#include "tools/system_args.hpp"

#include "util/units.hpp"

namespace tessel::cli {

System read_system(const CommandLine& cl, const std::string& fallback) {
  System s = load_system(cl.get_or("--system", fallback));
  // Up to the largest GPU memory a preset describes; a margin larger than the GPU rejects every layout, which
  // explore then reports as memory with the margin named.
  if (auto h = cl.get_double("--min-headroom", 0, 1e4)) s.min_headroom_bytes = *h * kGiB;
  return s;
}

}  // namespace tessel::cli
