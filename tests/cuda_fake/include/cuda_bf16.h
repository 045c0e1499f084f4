// Fake (tests/cuda_fake): bfloat16 as 16 raw bits, converted by round-to-nearest-even like the device's
// __float2bfloat16 (NaN stays NaN).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  std::uint16_t x;
};

inline __nv_bfloat16 __float2bfloat16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return {0x7fc0};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<std::uint16_t>(u >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 h) {
  const std::uint32_t u = std::uint32_t(h.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
