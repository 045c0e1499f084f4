// The cudnn variant of kernels/cuda/attention.hpp: cuDNN's fused scaled-dot-product attention (forward and
// backward, bf16, causal, grouped-query heads) driven through cudnn-frontend's graph API. Defined by
// attention_cudnn.cpp where the build found cuDNN and the frontend headers, else by attention_cudnn_none.cpp
// (every call an error; attention_cudnn_built() false, so a run cannot select it).
//
// Numerics: q, k, v (and dout) in bf16 (fp32 operands rounded to nearest even, as the hand-written kernels
// round them), fp32 accumulation and softmax inside cuDNN; out and dq, dk, dv come out of cuDNN in bf16 and
// are widened into the caller's fp32 tensors; lse is cuDNN's softmax statistic (ln sum exp of the scaled
// scores, natural units: kernels::cpu::attention_lse's quantity). The backward rounds the fp32 out it is
// handed back to bf16, which gives the forward's bf16 output exactly.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "kernels/cuda/attention.hpp"

namespace tessel::kernels::cuda {

using CudnnAttentionPtr = std::unique_ptr<CudnnAttention, CudnnAttentionDeleter>;

// `state` is created on the first call (libcudnn loaded, a handle made) and keeps one execution plan per
// shape and direction.
Status cudnn_attention_fwd(CudnnAttentionPtr& state, cudaStream_t s, const AttentionArgs& a);
Status cudnn_attention_bwd(CudnnAttentionPtr& state, cudaStream_t s, const AttentionArgs& a);

}  // namespace tessel::kernels::cuda
