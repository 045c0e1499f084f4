// The variants behind kernels/cuda/attention.hpp's entry point, one pair per kernel file. Internal to
// kernels/cuda: the arguments have passed attention_args_rule (attention.cpp checks them first), so these
// only launch. tests/cuda_emu calls the hand-written ones directly on the CPU emulation.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/attention_variant.hpp"
#include "kernels/cuda/status.hpp"

namespace tessel::kernels::cuda::detail {

// attention.cu: fp32 on the CUDA cores.
Status fp32_attention_fwd(cudaStream_t s, const AttentionArgs& a);
Status fp32_attention_bwd(cudaStream_t s, const AttentionArgs& a);
// attention_tc.cu: bf16 mma.sync, fp32 operands rounded as they are loaded; block_warps 4 or 8.
Status tc_attention_fwd(cudaStream_t s, const AttentionArgs& a, int block_warps);
Status tc_attention_bwd(cudaStream_t s, const AttentionArgs& a, int block_warps);
// experimental/attention_tc2.cu.
Status tc2_attention_fwd(cudaStream_t s, const AttentionArgs& a);
Status tc2_attention_bwd(cudaStream_t s, const AttentionArgs& a);
// experimental/attention_tc3*.cu (sm_90a; a Status error on any other device).
bool tc3_attention_available();
Status tc3_attention_fwd(cudaStream_t s, const AttentionArgs& a, int swizzle, bool overlap);
Status tc3_attention_bwd(cudaStream_t s, const AttentionArgs& a, int swizzle);

// attention_rows.cu, for operands cuDNN takes in bf16: dst (compact bf16, rows x cols) = src (fp32, row
// stride ld) rounded to nearest even, and dst (fp32, row stride ld) = src (compact bf16) widened exactly.
// cols % 4 == 0; fp32 rows 16-byte aligned (ld % 4 == 0), bf16 ones 8-byte aligned.
Status round_rows_bf16(cudaStream_t s, const float* src, int ld, int rows, int cols, void* dst);
Status widen_rows_bf16(cudaStream_t s, const void* src, int rows, int cols, float* dst, int ld);

}  // namespace tessel::kernels::cuda::detail
