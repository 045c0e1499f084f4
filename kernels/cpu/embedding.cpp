#include "kernels/cpu/embedding.hpp"

#include <algorithm>

namespace tessel::kernels::cpu {

void embedding_fwd(const float* table, int vocab_local, int vocab_start, int dim, const std::int32_t* tokens,
                   int n, float* out) {
  for (int i = 0; i < n; ++i) {
    float* o = out + static_cast<long>(i) * dim;
    const int t = tokens[i] - vocab_start;
    if (t >= 0 && t < vocab_local) std::copy(table + static_cast<long>(t) * dim, table + static_cast<long>(t + 1) * dim, o);
    else std::fill(o, o + dim, 0.0f);
  }
}

void embedding_bwd(const float* dout, int vocab_local, int vocab_start, int dim, const std::int32_t* tokens, int n,
                   float* dtable) {
  for (int i = 0; i < n; ++i) {
    const int t = tokens[i] - vocab_start;
    if (t < 0 || t >= vocab_local) continue;
    const float* d = dout + static_cast<long>(i) * dim;
    float* g = dtable + static_cast<long>(t) * dim;
    for (int c = 0; c < dim; ++c) g[c] += d[c];
  }
}

}  // namespace tessel::kernels::cpu
