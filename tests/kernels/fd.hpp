// Finite-difference helpers for the kernel tests: a scalar loss L(x) = sum(w * f(x)) with fixed random
// weights w, whose gradient dL/dx the backward kernels compute from dy = w.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace tessel::test {

// Deterministic values in [lo, hi) (splitmix64), so failures reproduce.
inline std::vector<float> random_vec(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  std::uint64_t s = seed;
  for (auto& x : v) {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x = lo + (hi - lo) * static_cast<float>((z >> 40) * (1.0 / 16777216.0));
  }
  return v;
}

// Central difference (L(x + h e_i) - L(x - h e_i)) / 2h; truncation error O(h^2), fp32 rounding
// O(eps_f |L| / h). loss() reads x.
inline double central_difference(std::vector<float>& x, std::size_t i, double h, const std::function<double()>& loss) {
  const float keep = x[i];
  x[i] = static_cast<float>(keep + h);
  const double lp = loss();
  x[i] = static_cast<float>(keep - h);
  const double lm = loss();
  x[i] = keep;
  return (lp - lm) / (2 * h);
}

inline double weighted_sum(const std::vector<float>& y, const std::vector<float>& w) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * w[i];
  return s;
}

// With h = 1e-2 on O(1) inputs: truncation ~1e-4 * |f'''|, rounding ~1e-7 * |L| / 1e-2 ~ 1e-4: a gradient
// is right when it agrees within 2e-3 absolute plus 2e-3 relative.
constexpr double kFdStep = 1e-2;
constexpr double kFdTol = 2e-3;
inline bool fd_close(double analytic, double numeric) {
  return std::abs(analytic - numeric) <= kFdTol * (1.0 + std::abs(numeric));
}

}  // namespace tessel::test
