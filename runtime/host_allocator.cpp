#include "runtime/host_allocator.hpp"

#include <climits>  // also defines __GLIBC__ (through <features.h>) where the C library is glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace tessel::rt {

void keep_freed_memory() {
#if defined(__GLIBC__)
  // glibc's ceiling for the mmap threshold on 64-bit: 4 MiB x sizeof(long) (DEFAULT_MMAP_THRESHOLD_MAX).
  constexpr int kMmapThresholdMax = 4 * 1024 * 1024 * static_cast<int>(sizeof(long));
  static const bool done = [] {
    mallopt(M_MMAP_THRESHOLD, kMmapThresholdMax);
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
    return true;
  }();
  (void)done;
#endif
}

}  // namespace tessel::rt
