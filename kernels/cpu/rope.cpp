#include "kernels/cpu/rope.hpp"

#include <cmath>
#include <cstddef>

#include "util/error.hpp"

namespace tessel::kernels::cpu {

RopeTable rope_table(int seq, int head_dim, double theta) {
  TESSEL_CHECK(seq > 0 && head_dim > 0 && head_dim % 2 == 0 && theta > 0.0,
               "rotary table: seq " << seq << ", head_dim " << head_dim << " (must be even), theta " << theta);
  RopeTable t;
  t.seq = seq;
  t.d = head_dim;
  const int half = head_dim / 2;
  t.cos.resize(static_cast<std::size_t>(seq) * half);
  t.sin.resize(t.cos.size());
  for (int j = 0; j < half; ++j) {
    // inv_freq_j = theta^(-2j/d) (RoFormer eq. 15).
    const double inv_freq = std::pow(theta, -2.0 * j / head_dim);
    for (int p = 0; p < seq; ++p) {
      const double a = p * inv_freq;
      t.cos[static_cast<std::size_t>(p) * half + j] = static_cast<float>(std::cos(a));
      t.sin[static_cast<std::size_t>(p) * half + j] = static_cast<float>(std::sin(a));
    }
  }
  return t;
}

namespace {

// sign = +1 rotates by +angle (forward), -1 by -angle (the transpose).
void rotate(const RopeTable& t, float* x, int rows, int heads, int ld, float sign) {
  TESSEL_CHECK(t.seq > 0 && rows % t.seq == 0 && heads > 0 && ld >= heads * t.d,
               "rotary: rows " << rows << ", seq " << t.seq << ", heads " << heads << ", d " << t.d << ", ld " << ld);
  const int half = t.d / 2;
  for (int r = 0; r < rows; ++r) {
    const std::size_t p = static_cast<std::size_t>(r % t.seq) * half;
    const float* c = t.cos.data() + p;
    const float* s = t.sin.data() + p;
    for (int h = 0; h < heads; ++h) {
      float* v = x + static_cast<std::size_t>(r) * ld + static_cast<std::size_t>(h) * t.d;
      for (int j = 0; j < half; ++j) {
        const float a = v[j], b = v[j + half], sn = sign * s[j];
        v[j] = a * c[j] - b * sn;
        v[j + half] = b * c[j] + a * sn;
      }
    }
  }
}

}  // namespace

void rope_fwd(const RopeTable& t, float* x, int rows, int heads, int ld) { rotate(t, x, rows, heads, ld, 1.0f); }

void rope_bwd(const RopeTable& t, float* dx, int rows, int heads, int ld) { rotate(t, dx, rows, heads, ld, -1.0f); }

}  // namespace tessel::kernels::cpu
