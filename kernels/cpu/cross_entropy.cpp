#include "kernels/cpu/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tessel::kernels::cpu {

void cross_entropy_fwd(const float* logits, int rows, int vocab_local, int vocab_start, const std::int32_t* targets,
                       float* loss, float* row_max, float* row_sum, const VocabReduce* hooks) {
  for (int r = 0; r < rows; ++r) {
    const float* z = logits + static_cast<long>(r) * vocab_local;
    row_max[r] = *std::max_element(z, z + vocab_local);
  }
  if (hooks) hooks->max(row_max, rows);
  std::vector<float> target_logit(rows, 0.0f);
  for (int r = 0; r < rows; ++r) {
    const float* z = logits + static_cast<long>(r) * vocab_local;
    double s = 0;
    for (int j = 0; j < vocab_local; ++j) s += std::exp(z[j] - row_max[r]);
    row_sum[r] = static_cast<float>(s);
    const int t = targets[r] - vocab_start;
    if (t >= 0 && t < vocab_local) target_logit[r] = z[t];  // the owning shard contributes, others add 0
  }
  if (hooks) {
    hooks->sum(row_sum, rows);
    hooks->sum(target_logit.data(), rows);
  }
  for (int r = 0; r < rows; ++r) loss[r] = row_max[r] + std::log(row_sum[r]) - target_logit[r];
}

void cross_entropy_bwd(const float* logits, int rows, int vocab_local, int vocab_start, const std::int32_t* targets,
                       const float* row_max, const float* row_sum, const float* dloss, float* dlogits) {
  for (int r = 0; r < rows; ++r) {
    const float* z = logits + static_cast<long>(r) * vocab_local;
    float* dz = dlogits + static_cast<long>(r) * vocab_local;
    const float inv = 1.0f / row_sum[r];
    for (int j = 0; j < vocab_local; ++j) dz[j] = dloss[r] * std::exp(z[j] - row_max[r]) * inv;
    const int t = targets[r] - vocab_start;
    if (t >= 0 && t < vocab_local) dz[t] -= dloss[r];
  }
}

}  // namespace tessel::kernels::cpu
