// Element-wise MLP activations, fp32, n elements.
//
// GELU, tanh form (Hendrycks & Gimpel 2016, eq. for the approximation; GPT-2's and PyTorch's
// gelu(approximate="tanh")): y = 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi).
// SwiGLU (Shazeer 2020): y = silu(gate) * up, silu(a) = a * sigmoid(a).
// Backward kernels take the forward inputs (recomputing the cheap non-linearity) and write input grads.
#pragma once

#include <cstddef>

namespace tessel::kernels::cpu {

void gelu_fwd(const float* x, float* y, std::size_t n);
void gelu_bwd(const float* dy, const float* x, float* dx, std::size_t n);

void swiglu_fwd(const float* gate, const float* up, float* y, std::size_t n);
void swiglu_bwd(const float* dy, const float* gate, const float* up, float* dgate, float* dup, std::size_t n);

}  // namespace tessel::kernels::cpu
