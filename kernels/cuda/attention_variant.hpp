// Causal attention on the GPU: which kernel runs it (the variant), what it is handed (AttentionArgs), and
// the rules each variant has for its shape and operands. Plain C++ (no CUDA header): the runtime checks a
// run's --attention-kernel before it touches the device, and the CPU emulation (tests/cuda_emu) builds the
// same arguments. The entry point itself is kernels/cuda/attention.hpp.
//
// Variants (docs/cuda.md, "Attention"):
//   fp32   attention.cu: fp32 on the CUDA cores; the reference of the GPU path and the --precision fp32 kernel
//   tc     attention_tc.cu: bf16 tensor cores (mma.sync), fp32 operands rounded as they are loaded; the
//          default under bf16 GEMMs, the only tensor-core kernel measured on a GPU (bench/h200/NOTES.md)
//   cudnn  cuDNN's fused scaled-dot-product attention through cudnn-frontend (bf16 operands); selectable,
//          not the default until a device measurement confirms it against the CPU reference
// and, selectable only by their experimental names (never measured on a GPU; kernels/cuda/experimental/):
//   experimental-tc2             cp.async double buffering and ldmatrix on mma.sync
//   experimental-tc3             wgmma (sm_90a only), 128-byte swizzled shared-memory operands
//   experimental-tc3-noswizzle   the same with 8 x 16-byte core-matrix operands
//   experimental-tc3-overlap     tc3 whose forward overlaps the softmax with the P V products
#pragma once

#include <string>
#include <vector>

#include "kernels/cpu/attention.hpp"

namespace tessel::kernels::cuda {

using cpu::AttentionShape;

enum class AttentionVariant { fp32, tc, cudnn, tc2, tc3 };

// The variant and the tuning of the variants that have any; the defaults are what a run uses.
struct AttentionConfig {
  AttentionVariant variant = AttentionVariant::fp32;
  int tc_block_warps = 8;    // tc: warps per block, 4 or 8 (16 query rows each); 8 was faster at every shape
                             // of the first H200 timing (bench/h200/NOTES.md: b2 s8192 h16 d128 fwd 54 vs 45,
                             // bwd 60 vs 41 TFLOP/s)
  int tc3_swizzle = 128;     // experimental tc3: shared-memory operand layout, 0 or 128 (bytes)
  bool tc3_overlap = false;  // experimental tc3: the overlapped forward
};

// The element type of q, k, v and dout. Outputs (out, lse, dq, dk, dv) are fp32 whatever the variant.
enum class AttnDtype { fp32, bf16 };

// One call's tensors (kernels/cpu/attention.hpp's layout: token-major rows t = b * seq + i, query head h in
// columns [h d, (h + 1) d), key/value head h / (hq / hkv)). Strides are in elements. The forward reads q, k,
// v and writes out and lse; the backward reads q, k, v, out, lse and dout and writes dq, dk, dv (dk and dv
// summed over the query heads of a group), using delta as scratch.
struct AttentionArgs {
  AttentionShape shape;
  AttnDtype dtype = AttnDtype::fp32;
  const void* q = nullptr;
  int ldq = 0;
  const void* k = nullptr;
  int ldk = 0;
  const void* v = nullptr;
  int ldv = 0;
  float* out = nullptr;  // [tokens, hq d] (ldo)
  int ldo = 0;
  float* lse = nullptr;  // [batch, hq, seq]: ln sum_j exp(s_ij) of the scaled scores, the backward's state
  const void* dout = nullptr;
  int lddo = 0;
  float* dq = nullptr;
  int lddq = 0;
  float* dk = nullptr;
  int lddk = 0;
  float* dv = nullptr;
  int lddv = 0;
  float* delta = nullptr;  // [batch, hq, seq] scratch: rowsum(dO * O) (FlashAttention-2's D_i)
};

// "fp32", "tc", "cudnn", "experimental-tc2", ... (the header's list), and every accepted name in that order.
std::string attention_kernel_name(const AttentionConfig& c);
const std::vector<std::string>& attention_kernel_names();

// The variant a run uses. `name` is --attention-kernel's value; empty picks the default: tc where the
// GEMMs take bf16 operands and tc's shape rule holds, else fp32. An unknown name, a bf16 variant under fp32
// GEMMs, a shape the variant has no kernel for, and cudnn in a build without cuDNN are InputErrors naming
// the flag, the value and the rule.
AttentionConfig resolve_attention_kernel(const std::string& name, bool bf16_gemms, const AttentionShape& shape);

// Whether the variant reads bf16 operands as they are (tc2, tc3, cudnn: the runtime then has its q, k, v
// GEMMs write bf16); fp32 and tc read fp32 ones.
bool attention_takes_bf16(AttentionVariant v);

// Shape rules: "" when the variant has a kernel for the shape, else the rule it breaks.
//   every variant: batch, seq, hq, hkv >= 1 and hq % hkv == 0
//   fp32: d <= 128;  tc, tc2, tc3: d 64 or 128;  cudnn: d a multiple of 8, at most 128
std::string attention_shape_rule(AttentionVariant v, const AttentionShape& a);

// The operand rules of one call: shape, dtype (fp32 and tc read fp32 only; bf16 operands have compact rows,
// hq d or hkv d wide), alignment (tc, tc2, tc3: fp32 operands 16-byte aligned with strides divisible by 4;
// bf16 operands 16-byte aligned; fp32 outputs 8-byte aligned with even strides), and the pointers the
// direction needs. "" when the call is valid, else the rule it breaks.
std::string attention_args_rule(const AttentionConfig& c, const AttentionArgs& a, bool backward);

// Whether this build has the cudnn variant (cuDNN and the cudnn-frontend headers found at configure time).
bool attention_cudnn_built();

}  // namespace tessel::kernels::cuda
