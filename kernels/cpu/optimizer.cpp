#include "kernels/cpu/optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "util/error.hpp"

namespace tessel::kernels::cpu {

void adamw_step(float* param, const float* grad, float* m, float* v, std::size_t n, const AdamW& hp, int step) {
  TESSEL_CHECK(step >= 1, "AdamW step counts from 1, got " << step);
  // Bias corrections in double, as PyTorch computes them in Python floats.
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), step);
  const float step_size = static_cast<float>(hp.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - hp.lr * hp.weight_decay;
  for (std::size_t i = 0; i < n; ++i) {
    param[i] *= decay;
    m[i] += (1.0f - hp.beta1) * (grad[i] - m[i]);  // PyTorch: exp_avg.lerp_(grad, 1 - beta1)
    v[i] = hp.beta2 * v[i] + (1.0f - hp.beta2) * grad[i] * grad[i];
    const float denom = std::sqrt(v[i]) / bc2_sqrt + hp.eps;
    param[i] -= step_size * (m[i] / denom);
  }
}

double sum_squares(const float* x, std::size_t n) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

float clip_coefficient(double total_norm, double max_norm) {
  return static_cast<float>(std::min(1.0, max_norm / (total_norm + 1e-6)));
}

void scale(float* x, std::size_t n, float factor) {
  for (std::size_t i = 0; i < n; ++i) x[i] *= factor;
}

}  // namespace tessel::kernels::cpu
