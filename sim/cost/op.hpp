// One lowered op as work (what the lowering in sim/workload.cpp says a GPU does: a GEMM's shape, an attention
// kernel's FLOPs and bytes, an element-wise kernel's bytes, a collective's kind, bytes and group) and its
// price (how long the cost models of compute.hpp and comm.hpp say it takes on a System). The lowering builds
// the work; price() fills the times; nothing else computes an op's time.
#pragma once

#include <cstdint>

#include "sim/cost/comm.hpp"
#include "sim/cost/compute.hpp"

namespace tessel::cost {

enum class OpClass : std::uint8_t { gemm, attention, elementwise, collective };

// One op of one layer (or of the embedding / head), for one micro-batch on one GPU.
struct WorkOp {
  const char* name = "";      // qkv, attn_scores, softmax_dropout, attn_v, flash_attn, proj, mlp_up, act, mlp_down,
                              // norm1, norm2, residual1, residual2, tp_*, logits (static strings: ops are copied
                              // per layout in explore's hot loop)
  OpClass cls = OpClass::gemm;
  Precision precision = Precision::bf16;  // the kernel's dtype (attention stays 16-bit under fp8 recipes)
  // Work.
  GemmShape gemm;             // gemm: the forward shape
  bool has_weights = true;    // gemm: a linear layer (its weight gradient is W); false for attention's batched GEMMs
  double flops_f = 0;         // model FLOPs forward
  double flops_b = 0;         // model FLOPs backward (input grad + weight grad)
  double exec_flops_f = 0;    // attention: FLOPs the kernel executes forward (causal: half the model count); a
                              // windowed layer's unfused GEMMs: their share of what a flash kernel would run
  double exec_flops_b = 0;    // attention: FLOPs the kernel executes backward (it recomputes the scores)
  double attn_seq = 0;        // attention: the key length one kernel call sees (AttentionKernel::seq)
  double attn_head_dim = 0;   // attention: the query-key head dim
  double attn_batch_heads = 0;  // attention: micro-batch x this rank's query heads (AttentionKernel::batch_heads)
  double attn_queries = 0;    // attention: the queries one kernel call sees
  bool attn_causal = false;   // attention: its tiles are a causal triangle (AttentionKernel::causal)
  double bytes_f = 0;         // memory traffic, forward
  double bytes_b = 0;         // memory traffic, backward
  // residual1 / residual2: the passes Tessel's CPU runtime makes over the layer's buffers beside its kernels
  // (workload.cpp's runtime_glue), priced instead of bytes_f / bytes_b by a profile with measured kind rates
  double runtime_bytes_f = 0, runtime_bytes_b = 0;
  bool runtime_priced = false;  // set by price(): these were the bytes priced
  int kernels = 1;            // element-wise: launches per pass
  int kernels_b = 0;          // element-wise: launches of the backward pass where they differ (0: kernels)
  Collective coll = Collective::all_reduce;
  GroupPlacement group;       // collective: its ranks
  double comm_bytes = 0;      // collective: buffer size as nccl-tests counts it, once forward and once backward
  DeepEpRouting deepep;       // an all-to-all run as DeepEP's dispatch / combine (comm.hpp), when enabled
  bool attention_core = false;   // recomputed under selective recompute
  // Price (price() below).
  double t_f = 0;             // seconds forward
  double t_i = 0;             // seconds backward for inputs (I)
  double t_w = 0;             // seconds backward for weights (W); 0 for ops without weights
  // A TP collective under tp_comm_overlap: the seconds of it hidden behind its GEMM, forward and backward
  // (t_f and t_i then hold what is not hidden, plus the GEMM's slowdown while they overlap).
  double hidden_f = 0, hidden_i = 0;
};

// Fills op.t_f, t_i, t_w from its work on `sys`:
// - gemm: forward m x n x k; input gradient dX = dY W^T (m x k output, inner n); weight gradient dW = X^T dY
//   (k x n output, inner m, the token count), which is an input gradient for a GEMM without weights. fp8
//   GEMMs also quantize their 16-bit inputs as fp8_cast says for the layout's recipe: the activation [m, k]
//   forward and the output gradient [m, n] backward. A linear layer's weight gradient written into fp32
//   main grads (main_grads fp32, a 16-bit or fp8 GEMM) takes GpuSpec::gemm_fp32_out times its time.
// - attention: compute.hpp's attention_time of the executed FLOPs and bytes, forward and backward, at the
//   op's key length and head dim (attn_seq, attn_head_dim) and its tiles (attn_batch_heads, attn_queries,
//   attn_causal).
// - elementwise: memory_time of the bytes moved, `kernels` launches a pass (`kernels_b` backward, when set).
// - collective: comm.hpp's collective_time, once forward and once backward.
void price(WorkOp& op, const System& sys, const Layout& l);
// An attention op's kernel as attention_time prices it, in one direction (`fa2`: Layout::runs_fa2()).
AttentionKernel attention_kernel(const WorkOp& op, bool fa2, bool backward);

// An fp8 GEMM's 16-bit input as Transformer Engine quantizes it under `r` (Layout::fp8_recipe): memory
// traffic per element and kernels a pass. Delayed scaling reads 2 bytes (the amax taken in the same pass) and
// writes the fp8 copy (1) and, on a GPU whose fp8 GEMMs take only the TN layout (Hopper, Ada), its transpose
// (1), which the weight gradient reads (TE's cast_transpose kernels): 4 bytes, 3 on Blackwell. Current scaling
// reads the tensor once more first, for its amax (TE's fp8_current_scaling docs: two reads), in a kernel of
// its own: 6 and 5. MXFP8 (Blackwell) quantizes the row-wise and column-wise copies apart from one read, each
// with one 1-byte scale per 32 elements: 2 + 2 x 33/32. The weights are cast once per step: Megatron-Core's
// TE layers cache their fp8 copy across the step's micro-batches (`is_first_microbatch`), which this
// per-micro-batch price leaves out.
struct Fp8Cast {
  double bytes = 0;
  int kernels = 1;
};
Fp8Cast fp8_cast(Fp8Recipe r, const GpuSpec& gpu);
// A cast to one fp8 copy, the layout the GEMM at hand reads (torchao's casts of a weight, one for the forward
// and one for the backward): the 16-bit read, the amax read first under current scaling, one byte written
// (MXFP8: its block scales too). 3, 5 and 2 + 33/32 bytes an element.
Fp8Cast fp8_cast_one_copy(Fp8Recipe r);

}  // namespace tessel::cost
