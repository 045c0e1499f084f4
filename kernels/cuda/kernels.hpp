// Launchers of Tessel's own CUDA kernels (llm.c's layout: kernels in the .cu files, then thin launchers
// that take an explicit stream, check the launch and name an NVTX range). Every launcher has the contract
// of its CPU reference in kernels/cpu (same argument order, same row-major layout, fp32 in and out) plus
// the stream; the tests in tests/cuda compare each one with that reference. Fused extras, each defaulted
// to the plain contract: a bf16 copy of an output written in the same pass (`*16` pointers; the fp32
// output may then be null), a residual added to a backward's dx (`dres`), a gradient scale and a bf16
// parameter copy in AdamW.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/optimizer.hpp"
#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/status.hpp"

namespace tessel::kernels::cuda {

using cpu::AdamW;

// ---- norms (kernels/cpu/norm.hpp): one warp per row; dgamma/dbeta ADD (nullptr skips them) ----
Status layernorm_fwd(cudaStream_t s, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                     float* rstd, int rows, int cols, float eps, __nv_bfloat16* y16 = nullptr);
Status layernorm_bwd(cudaStream_t s, const float* dy, const float* x, const float* gamma, const float* mean,
                     const float* rstd, float* dx, float* dgamma, float* dbeta, int rows, int cols,
                     const float* dres = nullptr);
Status rmsnorm_fwd(cudaStream_t s, const float* x, const float* gamma, float* y, float* rstd, int rows, int cols,
                   float eps, __nv_bfloat16* y16 = nullptr);
Status rmsnorm_bwd(cudaStream_t s, const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                   float* dgamma, int rows, int cols, const float* dres = nullptr);

// ---- activations (kernels/cpu/activation.hpp) ----
Status gelu_fwd(cudaStream_t s, const float* x, float* y, std::size_t n, __nv_bfloat16* y16 = nullptr);
Status gelu_bwd(cudaStream_t s, const float* dy, const float* x, float* dx, std::size_t n,
                __nv_bfloat16* dx16 = nullptr);
Status swiglu_fwd(cudaStream_t s, const float* gate, const float* up, float* y, std::size_t n,
                  __nv_bfloat16* y16 = nullptr);
Status swiglu_bwd(cudaStream_t s, const float* dy, const float* gate, const float* up, float* dgate, float* dup,
                  std::size_t n, __nv_bfloat16* dgate16 = nullptr, __nv_bfloat16* dup16 = nullptr);
// The same on bf16 tensors (the mixed-precision runtime's MLP activations, written by bf16-output GEMMs):
// inputs widened exactly, fp32 arithmetic as above, outputs rounded once. Bit for bit the fp32 kernels'
// bf16 outputs given the widened inputs.
Status gelu_fwd_bf16(cudaStream_t s, const __nv_bfloat16* x, __nv_bfloat16* y, std::size_t n);
Status gelu_bwd_bf16(cudaStream_t s, const __nv_bfloat16* dy, const __nv_bfloat16* x, __nv_bfloat16* dx, std::size_t n);
Status swiglu_fwd_bf16(cudaStream_t s, const __nv_bfloat16* gate, const __nv_bfloat16* up, __nv_bfloat16* y,
                       std::size_t n);
Status swiglu_bwd_bf16(cudaStream_t s, const __nv_bfloat16* dy, const __nv_bfloat16* gate, const __nv_bfloat16* up,
                       __nv_bfloat16* dgate, __nv_bfloat16* dup, std::size_t n);

// ---- causal attention: kernels/cuda/attention.hpp (one entry point, the variant chosen explicitly) ----

// ---- rotary position embeddings (kernels/cpu/rope.hpp), in place on fp32 q or k ----
// The cos/sin table on the device: kernels::cpu::rope_table's [seq, head_dim/2] arrays, uploaded once.
struct RopeTableView {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int seq = 0;
  int d = 0;  // head dimension (even)
};
// x = R(position) x for `heads` heads of `rows` rows (rows % seq == 0, position = row % seq); rope_bwd
// applies R^T (the gradient). Same float expressions as the CPU reference, without FMA contraction.
Status rope_fwd(cudaStream_t s, const RopeTableView& t, float* x, int rows, int heads, int ld);
Status rope_bwd(cudaStream_t s, const RopeTableView& t, float* dx, int rows, int heads, int ld);

// ---- softmax cross-entropy over this shard's vocabulary columns (kernels/cpu/cross_entropy.hpp with
// hooks == nullptr: the shard's own statistics) ----
Status cross_entropy_fwd(cudaStream_t s, const float* logits, int rows, int vocab_local, int vocab_start,
                         const std::int32_t* targets, float* loss, float* row_max, float* row_sum);
Status cross_entropy_bwd(cudaStream_t s, const float* logits, int rows, int vocab_local, int vocab_start,
                         const std::int32_t* targets, const float* row_max, const float* row_sum,
                         const float* dloss, float* dlogits, __nv_bfloat16* dlogits16 = nullptr);
// Vocab-parallel forward in three passes with the caller's tp all-reduces between them, as the CPU
// reference's hooks (max, then sum of row_sum and of the target logit):
//   cross_entropy_max:     row_max[r] = max over the shard's columns;          then all-reduce(max)
//   cross_entropy_partial: sums[r] = sum_j exp(z_rj - row_max[r]), sums[rows + r] = z_r,target when the
//                          shard owns the target, else 0;                     then all-reduce(sum) of sums
//   cross_entropy_loss:    loss[r] = row_max[r] + log(sums[r]) - sums[rows + r]
Status cross_entropy_max(cudaStream_t s, const float* logits, int rows, int vocab_local, float* row_max);
Status cross_entropy_partial(cudaStream_t s, const float* logits, int rows, int vocab_local, int vocab_start,
                             const std::int32_t* targets, const float* row_max, float* sums);
Status cross_entropy_loss(cudaStream_t s, int rows, const float* row_max, const float* sums, float* loss);

// ---- embedding (kernels/cpu/embedding.hpp); the backward accumulates with atomics ----
Status embedding_fwd(cudaStream_t s, const float* table, int vocab_local, int vocab_start, int dim,
                     const std::int32_t* tokens, int n, float* out);
// The lookup from the table's bf16 copy (what the mixed-precision GEMMs read), each value widened exactly.
Status embedding_fwd_bf16(cudaStream_t s, const __nv_bfloat16* table, int vocab_local, int vocab_start, int dim,
                          const std::int32_t* tokens, int n, float* out);
Status embedding_bwd(cudaStream_t s, const float* dout, int vocab_local, int vocab_start, int dim,
                     const std::int32_t* tokens, int n, float* dtable);
// Learned positions: x[r, :] += pos[(row0 + r) % seq, :]; the backward adds dx rows into dpos.
Status add_positions(cudaStream_t s, float* x, const float* pos, int rows, int row0, int seq, int dim);
Status add_positions_bwd(cudaStream_t s, const float* dx, float* dpos, int rows, int row0, int seq, int dim);

// ---- optimizer (kernels/cpu/optimizer.hpp) ----
Status adamw_step(cudaStream_t s, float* param, const float* grad, float* m, float* v, std::size_t n, const AdamW& hp,
                  int step, float grad_scale = 1.0f, __nv_bfloat16* param16 = nullptr);

// ---- token permutation of a mixture-of-experts layer (kernels/cpu/permute.hpp): a block per row; row_dots
// sums in a block reduction, not the reference's order ----
Status gather_rows(cudaStream_t s, const float* src, const std::int32_t* index, const float* scale, int n, int width,
                   float* dst);
Status combine_rows(cudaStream_t s, const float* src, const float* w, int tokens, int k, int width, float* dst,
                    bool accumulate);
Status row_dots(cudaStream_t s, const float* a, const float* b, int n, int k, int width, float* out);

// ---- reductions and element-wise helpers ----
// *out (device, double) += sum of x^2: the global-norm input, reduced in double like the CPU reference.
Status sum_squares(cudaStream_t s, const float* x, std::size_t n, double* out);
Status scale(cudaStream_t s, float* x, std::size_t n, float factor);
// out = a + b (out may alias a or b).
Status add(cudaStream_t s, const float* a, const float* b, float* out, std::size_t n);
// x[r, c] += bias[c] for a row-major [rows, cols] x.
// out = (a + b) + bias[column] over [rows, cols] (bias may be null; out may be a or b).
Status residual_add(cudaStream_t s, const float* a, const float* b, const float* bias, float* out, int rows, int cols);
// db[c] += sum_r dy[r, c] (bias gradients; column sums in a fixed order, so deterministic).
Status col_sum(cudaStream_t s, const float* dy, int rows, int cols, float* db);
Status col_sum_bf16(cudaStream_t s, const __nv_bfloat16* dy, int rows, int cols, float* db);  // dy widened exactly
// Element-wise sum/max of `count` floats over `parts` rank-major blocks of in into out: the local step
// of a reduce-scatter and the checks of the collectives.
Status reduce_blocks(cudaStream_t s, const float* in, int parts, std::size_t count, float* out, bool max);
Status to_bf16(cudaStream_t s, const float* in, __nv_bfloat16* out, std::size_t n);
Status from_bf16(cudaStream_t s, const __nv_bfloat16* in, float* out, std::size_t n);
// Fills with a constant (the tests' poison, NaN for instance).
Status fill(cudaStream_t s, float* x, std::size_t n, float value);
// x[i] = uniform in [-bound, bound) from a counter hash of (seed, i): synthesised parameters and inputs
// of --only-rank runs, where the host-side seeded init of a 175B stage would take minutes.
Status fill_uniform(cudaStream_t s, float* x, std::size_t n, std::uint64_t seed, float bound);
// tokens[i] = hash(seed, i) mod vocab.
Status fill_tokens(cudaStream_t s, std::int32_t* tokens, std::size_t n, std::uint64_t seed, int vocab);

}  // namespace tessel::kernels::cuda
