#include "runtime/host_sched.hpp"

#include <time.h>

#include <fstream>

namespace tessel::rt {

std::optional<ThreadSched> thread_sched() {
  // The run-queue delay from schedstat; the CPU time from the thread's CPU clock, which the kernel brings up
  // to date when read (schedstat's first field lags by up to a timer tick for a running thread).
  std::ifstream in("/proc/thread-self/schedstat");
  unsigned long long run_ns = 0, delay_ns = 0;
  if (!(in >> run_ns >> delay_ns)) return std::nullopt;
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return std::nullopt;
  return ThreadSched{static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9,
                     static_cast<double>(delay_ns) * 1e-9};
}

}  // namespace tessel::rt
