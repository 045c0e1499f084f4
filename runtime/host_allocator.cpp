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
    // One arena. A thread's own arena is a chain of 64 MiB heaps, and glibc unmaps a heap of the chain as soon
    // as it is wholly free, whatever M_TRIM_THRESHOLD says; a rank whose step needs more than its first heap
    // (one rank of the closed-loop GPT at micro-batch 2: 53 MB of state and 22 MB of activations) unmapped
    // and re-faulted its second heap every micro-batch: 16-22 thousand page faults a step, 6-7% of it. The
    // main arena grows by brk and keeps what the trim threshold keeps. Its one lock costs the rank threads
    // nothing measurable (their blocks are large and few: dp4 and tp2 dp2 within run-to-run noise).
    mallopt(M_ARENA_MAX, 1);
    return true;
  }();
  (void)done;
#endif
}

}  // namespace tessel::rt
