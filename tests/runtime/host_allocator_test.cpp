// runtime/host_allocator.hpp: after keep_freed_memory(), blocks up to glibc's largest mmap threshold (32 MiB)
// come from the heap instead of their own mappings, so the runtime's per-op buffers do not re-fault fresh pages
// every step. Its own executable: the allocator's settings are process-wide, and the check needs a process whose
// largest freed block is known. Under AddressSanitizer malloc is ASan's, whose blocks mallinfo2 does not count:
// skipped there.
#include <doctest/doctest.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "runtime/host_allocator.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define TESSEL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TESSEL_ASAN 1
#endif
#endif

namespace {

#if defined(__GLIBC__) && !defined(TESSEL_ASAN)
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
#endif

}  // namespace

TEST_CASE("keep_freed_memory: blocks up to 32 MiB come from the heap, larger ones are still mapped") {
#if !defined(__GLIBC__) || defined(TESSEL_ASAN)
  MESSAGE("not glibc's malloc here (another C library, or AddressSanitizer's): nothing to check");
#else
  // glibc's default: a 16 MiB block is its own mapping; freeing it raises the dynamic threshold to 16 MiB.
  CHECK(mapped_by(16 * kMiB) == 1);
  CHECK(mapped_by(24 * kMiB) == 1);  // above the raised threshold (24 MiB now): mapped again
  tessel::rt::keep_freed_memory();
  CHECK(mapped_by(30 * kMiB) == 0);  // would be mapped (above 24 MiB) without the call
  CHECK(mapped_by(30 * kMiB) == 0);
  CHECK(mapped_by(48 * kMiB) == 1);  // beyond glibc's ceiling: still its own mapping
  tessel::rt::keep_freed_memory();   // idempotent
  CHECK(mapped_by(30 * kMiB) == 0);
#endif
}
