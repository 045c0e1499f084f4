// The attention entry point: check the call against its variant's rules, then hand it to that variant's
// kernels (attention_kernels.hpp) or to cuDNN (attention_cudnn.hpp).
#include "kernels/cuda/attention.hpp"

#include "kernels/cuda/attention_cudnn.hpp"
#include "kernels/cuda/attention_kernels.hpp"
#include "kernels/cuda/nvtx.hpp"

namespace tessel::kernels::cuda {

Attention::Attention(AttentionConfig config) : config_(config) {}

Status Attention::forward(cudaStream_t s, const AttentionArgs& a) {
  TESSEL_NVTX_FN();
  if (const std::string rule = attention_args_rule(config_, a, false); !rule.empty()) return {1, rule};
  switch (config_.variant) {
    case AttentionVariant::fp32: return detail::fp32_attention_fwd(s, a);
    case AttentionVariant::tc: return detail::tc_attention_fwd(s, a, config_.tc_block_warps);
    case AttentionVariant::cudnn: return cudnn_attention_fwd(cudnn_, s, a);
    case AttentionVariant::tc2: return detail::tc2_attention_fwd(s, a);
    case AttentionVariant::tc3: return detail::tc3_attention_fwd(s, a, config_.tc3_swizzle, config_.tc3_overlap);
  }
  return {1, "attention: unknown variant"};
}

Status Attention::backward(cudaStream_t s, const AttentionArgs& a) {
  TESSEL_NVTX_FN();
  if (const std::string rule = attention_args_rule(config_, a, true); !rule.empty()) return {1, rule};
  switch (config_.variant) {
    case AttentionVariant::fp32: return detail::fp32_attention_bwd(s, a);
    case AttentionVariant::tc: return detail::tc_attention_bwd(s, a, config_.tc_block_warps);
    case AttentionVariant::cudnn: return cudnn_attention_bwd(cudnn_, s, a);
    case AttentionVariant::tc2: return detail::tc2_attention_bwd(s, a);
    case AttentionVariant::tc3: return detail::tc3_attention_bwd(s, a, config_.tc3_swizzle);
  }
  return {1, "attention: unknown variant"};
}

}  // namespace tessel::kernels::cuda
