// runtime/host_allocator.hpp: after keep_freed_memory(), blocks up to glibc's largest mmap threshold (32 MiB)
// come from the heap instead of their own mappings, so the runtime's per-op buffers do not re-fault fresh pages
// every step. Its own executable: the allocator's settings are process-wide, and the check needs a process whose
// largest freed block is known. Under AddressSanitizer malloc is ASan's, whose blocks mallinfo2 does not count:
// skipped there.
#include <doctest/doctest.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#include <thread>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#include <sys/resource.h>
#endif

#include "runtime/host_allocator.hpp"
#include "tests/sanitized.hpp"

namespace {

#if defined(__GLIBC__) && !defined(TESSEL_TEST_ASAN)
constexpr std::size_t kMiB = std::size_t{1} << 20;

// Blocks held in their own mappings after allocating (and touching) `bytes`, less before; the block is freed.
long mapped_by(std::size_t bytes) {
  const long before = static_cast<long>(mallinfo2().hblks);
  void* p = std::malloc(bytes);
  REQUIRE(p != nullptr);
  std::memset(p, 1, bytes);
  const long after = static_cast<long>(mallinfo2().hblks);
  std::free(p);
  return after - before;
}

long thread_faults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}
#endif

}  // namespace

TEST_CASE("keep_freed_memory: blocks up to 32 MiB come from the heap") {
#if !defined(__GLIBC__) || defined(TESSEL_TEST_ASAN)
  MESSAGE("not glibc's malloc here (another C library, or AddressSanitizer's): nothing to check");
#else
  // glibc's default: a 16 MiB block is its own mapping; freeing it raises the dynamic threshold to 16 MiB.
  CHECK(mapped_by(16 * kMiB) == 1);
  CHECK(mapped_by(24 * kMiB) == 1);  // above the raised threshold (24 MiB now): mapped again
  tessel::rt::keep_freed_memory();
  CHECK(mapped_by(30 * kMiB) == 0);  // would be mapped (above 24 MiB) without the call
  CHECK(mapped_by(30 * kMiB) == 0);
  tessel::rt::keep_freed_memory();   // idempotent
  CHECK(mapped_by(30 * kMiB) == 0);
#endif
}

TEST_CASE("keep_freed_memory: a thread that holds 48 MiB and churns 32 MiB faults its pages once, not every round") {
#if !defined(__GLIBC__) || defined(TESSEL_TEST_ASAN)
  MESSAGE("not glibc's malloc here (another C library, or AddressSanitizer's): nothing to check");
#else
  // A rank thread's step: state that stays, activations allocated and freed every micro-batch, together past
  // one 64 MiB heap of a thread arena. glibc unmapped the emptied second heap after every round (whatever the
  // trim threshold; only the top pad keeps it), and the next round re-faulted 5,121 of its 8,192 pages
  // (measured with glibc 2.36).
  tessel::rt::keep_freed_memory();
  constexpr std::size_t kBlock = 2 * kMiB;
  constexpr long kPages = 16 * kBlock / 4096;
  std::vector<long> per_round;
  std::thread rank([&] {
    std::vector<void*> state;
    for (int i = 0; i < 24; ++i) state.push_back(std::memset(std::malloc(kBlock), 1, kBlock));
    for (int round = 0; round < 4; ++round) {
      const long before = thread_faults();
      std::vector<void*> acts;
      for (int i = 0; i < 16; ++i) acts.push_back(std::memset(std::malloc(kBlock), 1, kBlock));
      for (void* p : acts) std::free(p);
      per_round.push_back(thread_faults() - before);
    }
    for (void* p : state) std::free(p);
  });
  rank.join();
  REQUIRE(per_round.size() == 4);
  CHECK(per_round[0] >= kPages / 2);  // the first round touches fresh pages (the check measures faults at all)
  for (int r = 1; r < 4; ++r) {
    INFO("round " << r << ": " << per_round[static_cast<std::size_t>(r)] << " faults of " << kPages << " pages");
    CHECK(per_round[static_cast<std::size_t>(r)] < kPages / 20);
  }
#endif
}
