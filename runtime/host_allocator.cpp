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
  // glibc's HEAP_MAX_SIZE on 64-bit: twice the largest mmap threshold, the size of a thread arena's heap.
  constexpr int kThreadHeap = 2 * kMmapThresholdMax;
  static const bool done = [] {
    mallopt(M_MMAP_THRESHOLD, kMmapThresholdMax);
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
    // A thread's own arena is a chain of 64 MiB heaps, and glibc unmaps a heap of the chain as soon as it is
    // wholly free unless the top pad says to keep that much: a rank whose step needs more than its first heap
    // (one rank of the closed-loop GPT at micro-batch 2: 53 MB of state and 22 MB of activations) unmapped and
    // re-faulted its second heap every micro-batch, 16-22 thousand page faults a step and 6-7% of it. A pad
    // of one heap keeps them. (One arena for all threads, M_ARENA_MAX 1, did too, but its lock cost the
    // four-thread layouts that copy messages 3-5%: tp2 pp2 1F1B 306 against 291 ms.) The pad also makes the
    // heaps grow in steps of up to 64 MiB of address space, which is not touched until used.
    mallopt(M_TOP_PAD, kThreadHeap);
    return true;
  }();
  (void)done;
#endif
}

}  // namespace tessel::rt
