#include "kernels/cpu/permute.hpp"

#include <cstddef>

namespace tessel::kernels::cpu {

void gather_rows(const float* src, const std::int32_t* index, const float* scale, int n, int width, float* dst) {
  const std::size_t w = static_cast<std::size_t>(width);
  for (int i = 0; i < n; ++i) {
    const float* s = src + static_cast<std::size_t>(index[i]) * w;
    float* d = dst + static_cast<std::size_t>(i) * w;
    const float f = scale ? scale[i] : 1.0f;
    for (std::size_t c = 0; c < w; ++c) d[c] = scale ? f * s[c] : s[c];
  }
}

void combine_rows(const float* src, const float* w, int tokens, int k, int width, float* dst, bool accumulate) {
  const std::size_t wd = static_cast<std::size_t>(width);
  for (int t = 0; t < tokens; ++t) {
    float* d = dst + static_cast<std::size_t>(t) * wd;
    for (std::size_t c = 0; c < wd; ++c) {
      float acc = accumulate ? d[c] : 0.0f;
      for (int j = 0; j < k; ++j) {
        const std::size_t slot = static_cast<std::size_t>(t) * k + j;
        acc += (w ? w[slot] : 1.0f) * src[slot * wd + c];
      }
      d[c] = acc;
    }
  }
}

void row_dots(const float* a, const float* b, int n, int k, int width, float* out) {
  const std::size_t w = static_cast<std::size_t>(width);
  for (int i = 0; i < n; ++i) {
    const float* x = a + static_cast<std::size_t>(i / k) * w;
    const float* y = b + static_cast<std::size_t>(i) * w;
    double d = 0;
    for (std::size_t c = 0; c < w; ++c) d += double(x[c]) * y[c];
    out[i] = static_cast<float>(d);
  }
}

}  // namespace tessel::kernels::cpu
