// Softmax cross-entropy over a (possibly vocab-sharded) row-major [rows, vocab_local] logits matrix.
//
// loss_r = log(sum_j exp(z_rj)) - z_r,target = (m_r + log s_r) - z_r,target, with m_r = max_j z_rj and
// s_r = sum_j exp(z_rj - m_r). Vocab-parallel (Megatron-LM, Shoeybi et al. 2019, section 3): each tensor
// rank holds columns [vocab_start, vocab_start + vocab_local); the row max, the sum of exponentials and
// the target logit are combined across shards by the caller-provided all-reduce hooks (max, sum, sum).
// With hooks = nullptr the shard is the whole vocabulary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace tessel::kernels::cpu {

struct VocabReduce {
  std::function<void(float*, std::size_t)> max;  // element-wise all-reduce max over the tensor group
  std::function<void(float*, std::size_t)> sum;  // element-wise all-reduce sum over the tensor group
};

// Writes loss[rows] and the softmax statistics row_max[rows], row_sum[rows] (sum of exp(z - max)) that
// the backward needs.
void cross_entropy_fwd(const float* logits, int rows, int vocab_local, int vocab_start, const std::int32_t* targets,
                       float* loss, float* row_max, float* row_sum, const VocabReduce* hooks);

// dlogits = dloss_r * (softmax(z_r) - onehot(target_r)) on this shard's columns.
void cross_entropy_bwd(const float* logits, int rows, int vocab_local, int vocab_start, const std::int32_t* targets,
                       const float* row_max, const float* row_sum, const float* dloss, float* dlogits);

}  // namespace tessel::kernels::cpu
