// AdamW and gradient-norm clipping, fp32 parameters and states.
//
// AdamW (Loshchilov & Hutter 2019, Algorithm 2; PyTorch torch.optim.AdamW's order of operations):
//   p <- p * (1 - lr * wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;
//   p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps),   t = step, starting at 1.
// Clipping (Pascanu et al. 2013): with the global norm N = sqrt(sum of every shard's sum_squares), all
// gradients are scaled by min(1, max_norm / (N + 1e-6)) (PyTorch clip_grad_norm_'s epsilon).
#pragma once

#include <cstddef>

namespace tessel::kernels::cpu {

struct AdamW {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

void adamw_step(float* param, const float* grad, float* m, float* v, std::size_t n, const AdamW& hp, int step);

// Sum of squares in double (the caller reduces it across shards and takes the square root).
double sum_squares(const float* x, std::size_t n);

// min(1, max_norm / (total_norm + 1e-6)).
float clip_coefficient(double total_norm, double max_norm);

void scale(float* x, std::size_t n, float factor);

}  // namespace tessel::kernels::cpu
