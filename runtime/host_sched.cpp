#include "runtime/host_sched.hpp"

#include <fstream>

namespace tessel::rt {

std::optional<ThreadSched> thread_sched() {
  std::ifstream in("/proc/thread-self/schedstat");
  unsigned long long run_ns = 0, delay_ns = 0;
  if (!(in >> run_ns >> delay_ns)) return std::nullopt;
  return ThreadSched{static_cast<double>(run_ns) * 1e-9, static_cast<double>(delay_ns) * 1e-9};
}

}  // namespace tessel::rt
