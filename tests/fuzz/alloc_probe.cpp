#include "tests/fuzz/alloc_probe.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

namespace tessel::fuzz {
namespace {
std::atomic<std::size_t> g_largest{0};

void note(std::size_t n) {
  std::size_t cur = g_largest.load(std::memory_order_relaxed);
  while (n > cur && !g_largest.compare_exchange_weak(cur, n, std::memory_order_relaxed)) {
  }
}

void* allocate(std::size_t n) {
  note(n);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}

void* allocate_aligned(std::size_t n, std::align_val_t al) {
  note(n);
  const auto a = static_cast<std::size_t>(al);
  // aligned_alloc needs a size that is a multiple of the alignment.
  if (void* p = std::aligned_alloc(a, (n + a - 1) / a * a)) return p;
  throw std::bad_alloc();
}
}  // namespace

void reset_largest_allocation() { g_largest.store(0); }
std::size_t largest_allocation() { return g_largest.load(); }

}  // namespace tessel::fuzz

// Replaceable global allocation functions ([new.delete]); malloc/free underneath, so sanitizers still see
// every block.
void* operator new(std::size_t n) { return tessel::fuzz::allocate(n); }
void* operator new[](std::size_t n) { return tessel::fuzz::allocate(n); }
void* operator new(std::size_t n, std::align_val_t a) { return tessel::fuzz::allocate_aligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return tessel::fuzz::allocate_aligned(n, a); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return tessel::fuzz::allocate(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return tessel::fuzz::allocate(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
