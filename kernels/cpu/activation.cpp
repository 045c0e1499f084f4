#include "kernels/cpu/activation.hpp"

#include <cmath>

namespace tessel::kernels::cpu {
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;              // Hendrycks & Gimpel's tanh-approximation constant
}  // namespace

void gelu_fwd(const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v)));
  }
}

// d/dx [0.5 x (1 + t)] with t = tanh(u), u = c (x + k x^3): 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2).
void gelu_bwd(const float* dy, const float* x, float* dx, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    const float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = dy[i] * d;
  }
}

void swiglu_fwd(const float* gate, const float* up, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-gate[i]));
    y[i] = gate[i] * s * up[i];
  }
}

// silu'(a) = s (1 + a (1 - s)), s = sigmoid(a).
void swiglu_bwd(const float* dy, const float* gate, const float* up, float* dgate, float* dup, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float a = gate[i];
    const float s = 1.0f / (1.0f + std::exp(-a));
    dgate[i] = dy[i] * up[i] * s * (1.0f + a * (1.0f - s));
    dup[i] = dy[i] * a * s;
  }
}

}  // namespace tessel::kernels::cpu
