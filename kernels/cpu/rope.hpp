// Rotary position embeddings (Su et al. 2021, "RoFormer", arXiv 2104.09864, eq. 34) in the rotate-half
// convention of GPT-NeoX, Llama and Megatron-LM: within a head of width d, element j < d/2 pairs with
// element j + d/2, and the pair at position p turns by the angle p * inv_freq_j, inv_freq_j = theta^(-2j/d)
// (RoFormer eq. 15; theta = 10000 there and in Llama 2, 500000 in Llama 3):
//   y_j       = x_j cos(p w_j) - x_{j+d/2} sin(p w_j)
//   y_{j+d/2} = x_{j+d/2} cos(p w_j) + x_j sin(p w_j)
// Each pair is rotated by an orthogonal 2x2 matrix R(p w_j), so the backward applies R^T = R(-p w_j), and
// (R(a) q) . (R(b) k) = q . R(b - a) k depends on positions only through b - a: the relative property.
//
// Layout as kernels/cpu/attention.hpp: tokens are rows, sequence-major (row t = b * seq + i, position
// i = t % seq); head h occupies columns [h*d, (h+1)*d) of a row of stride ld.
#pragma once

#include <vector>

namespace tessel::kernels::cpu {

// cos/sin of p * inv_freq_j for p < seq, j < d/2, row-major [seq, d/2]. Angles and their cos/sin are
// computed in double and rounded once to float, so every implementation that does the same agrees to the
// last bit of the table (large p w_j loses accuracy in fp32 arithmetic: p = 4096, w = 1 gives 2e-4 rad).
struct RopeTable {
  int seq = 0;
  int d = 0;  // head dimension (even)
  std::vector<float> cos, sin;
};
RopeTable rope_table(int seq, int head_dim, double theta);

// x = R(position) x for each of `heads` heads of `rows` rows, in place. rows % table.seq == 0.
void rope_fwd(const RopeTable& t, float* x, int rows, int heads, int ld);

// dx = R(position)^T dx in place: the gradient through rope_fwd (and its inverse).
void rope_bwd(const RopeTable& t, float* dx, int rows, int heads, int ld);

}  // namespace tessel::kernels::cpu
