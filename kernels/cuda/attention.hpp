// Causal attention on the GPU, flash style (no [seq, seq] matrix: keys stream through tiles with an online
// softmax, Milakov & Gimelshein 2018; Dao et al. 2022; the backward recomputes the probabilities from lse,
// FlashAttention-2, Dao 2023, Algorithm 2). One entry point for every variant (attention_variant.hpp):
// construct it with the variant, then forward and backward on AttentionArgs. The object holds what a variant
// keeps between calls (cuDNN's handle and its execution plans, built on the first call of each shape and
// direction), so give each thread its own.
//
// Every variant's contract is kernels/cpu/attention.hpp's (out, and lse as kernels::cpu::attention_lse), and
// the tests compare each with it (tests/cuda/test_attention.cpp on a GPU; tests/cuda_emu on the CPU for the
// hand-written tensor-core kernels). A call whose arguments break the variant's rules (attention_args_rule)
// returns a Status naming the rule and launches nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "kernels/cuda/attention_variant.hpp"
#include "kernels/cuda/status.hpp"

namespace tessel::kernels::cuda {

struct CudnnAttention;  // attention_cudnn.cpp: handle and plans
struct CudnnAttentionDeleter {
  void operator()(CudnnAttention* p) const;
};

class Attention {
 public:
  explicit Attention(AttentionConfig config = {});
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;
  Attention(Attention&&) noexcept = default;
  Attention& operator=(Attention&&) noexcept = default;

  // out, lse from q, k, v.
  Status forward(cudaStream_t s, const AttentionArgs& a);
  // dq, dk, dv (overwritten) from q, k, v, out, lse and dout; delta is scratch.
  Status backward(cudaStream_t s, const AttentionArgs& a);
  const AttentionConfig& config() const { return config_; }

 private:
  AttentionConfig config_;
  std::unique_ptr<CudnnAttention, CudnnAttentionDeleter> cudnn_;  // created on the cudnn variant's first call
};

}  // namespace tessel::kernels::cuda
