// Helpers of the emulation tests (no doctest: each is a plain program that prints one line per check and
// exits non-zero on a failure): seeded random inputs and the relative error ||out - ref|| / ||ref|| of
// tests/cuda/gpu_util.hpp, with a non-finite output counting as infinitely wrong; exact checks of fused
// outputs against the same kernel's unfused ones.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace tessel::test {

inline std::vector<float> random_vec(std::mt19937& rng, std::size_t n, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<std::int32_t> random_tokens(std::mt19937& rng, std::size_t n, int vocab) {
  std::uniform_int_distribution<int> d(0, vocab - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline double rel_error(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    num += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// bf16 bits of a finite float, rounded to nearest even (what __float2bfloat16 does to finite values).
inline std::uint16_t bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Elements where a kernel's bf16 output is not exactly the rounding of its own fp32 output: a fused
// kernel writing both forms of one result must agree with itself bit for bit.
inline std::size_t bf16_mismatches(const std::vector<std::uint16_t>& half, const std::vector<float>& full) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < full.size(); ++i) bad += half[i] != bf16_bits(full[i]);
  return bad;
}

// Elements where out != a + b exactly (a fused add must be the float add itself).
inline std::size_t sum_mismatches(const std::vector<float>& out, const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < out.size(); ++i) bad += !(out[i] == a[i] + b[i]);
  return bad;
}

}  // namespace tessel::test
