// One pre-LN transformer block on one tensor-parallel rank (Megatron-LM's partitioning, Shoeybi et al.
// 2019 Fig. 3): x2 = x + RowPar(Attn(ColPar(Norm1(x)))), out = x2 + RowPar(Act(ColPar(Norm2(x2)))).
// Column-parallel GEMMs (q, k, v, w1, wg) hold a slice of heads / ffn columns; row-parallel ones (wo, w2)
// produce partial sums that are all-reduced, or reduce-scattered by token under sequence parallelism
// (Korthikanti et al. 2022), where the norms see only this rank's tokens and their outputs are
// all-gathered before the column-parallel GEMMs.
//
// Backward is split as zero-bubble pipelines need it (Qi et al. 2024): layer_backward computes input
// gradients (and the cheap norm/row-parallel-bias gradients) and queues the weight GEMMs as jobs that the
// W action runs later; a fused B runs them at once.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cpu/rope.hpp"
#include "models/model.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/params.hpp"
#include "runtime/recorder.hpp"
#include "runtime/tensor_parallel.hpp"

namespace tessel::rt {

using Buf = std::shared_ptr<std::vector<float>>;
Buf make_buf(std::size_t n);
std::int64_t buf_bytes(const Buf& b);

// dW += x^T dy ([in,out] weights), or dW += dy^T x when `transposed` (weights stored [out,in]: the tied
// LM head); db += column sums of dy when db is set.
struct WeightGradJob {
  Buf x, dy;
  int rows = 0, in = 0, out = 0;
  float* dw = nullptr;
  float* db = nullptr;
  bool transposed = false;
  std::int64_t bytes() const { return buf_bytes(x) + buf_bytes(dy); }
};
void run_weight_grad(const WeightGradJob& j);

struct Weight {
  float* w = nullptr;  // nullptr when the model has no such parameter (no bias, RMSNorm has no .b)
  float* g = nullptr;
};

// A mixture-of-experts MLP (runtime/moe_layer.cpp): the router, the shared expert (tensor-parallel like the
// dense MLP; w1.w null when the model has none) and this expert-parallel rank's routed experts, local
// expert i being expert first + i.
struct ExpertWeights {
  Weight w1, wg, w2;
};
struct MoeWeights {
  Weight router, sw1, swg, sw2;
  std::vector<ExpertWeights> local;
  int first = 0;
  // Auxiliary-loss-free balancing (DeepSeek-V3 Sec. 2.1.2): bias.w (E values, null without it) is added to the
  // scores to choose experts only; `load` sums the tokens routed to each expert over the step's micro-batches
  // (each backward adds its micro-batch's), for update_selection_bias.
  Weight bias;
  std::shared_ptr<std::vector<float>> load;
};

struct LayerWeights {
  Weight ln1w, ln1b, wq, wk, wv, bq, bk, bv, wo, bo, ln2w, ln2b, w1, b1, wg, bg, w2, b2;
  bool is_moe = false;  // the MLP is `moe` instead of w1/wg/w2
  MoeWeights moe;
};
// experts: the store of this rank's routed experts (nullptr for a dense model); ep, ep_rank: the split.
LayerWeights layer_weights(ParamStore& store, int layer, ParamStore* experts = nullptr, int ep = 1, int ep_rank = 0);

// The expert-parallel group as a MoE layer sees it: the ranks that exchange tokens (all-to-all over
// send/recv, timed into the trace as ep_alltoall on the tp stream, where the simulator draws them).
struct ExpertParallel {
  Comm* comm = nullptr;  // nullptr when size == 1
  int size = 1;
  int rank = 0;
  Recorder* rec = nullptr;
  // Expert tensor parallelism: each local expert's FFN split etp ways (w1/wg columns, w2 rows); the etp ranks
  // gather their received tokens before the experts and reduce-scatter the outputs after (moe_layer.hpp).
  Comm* etp_comm = nullptr;  // nullptr when etp_size == 1
  int etp_size = 1;
  int etp_rank = 0;
};

struct LayerShape {
  int batch = 1, seq = 1;   // micro-batch size and sequence length: T = batch * seq tokens
  int tokens = 1;           // T
  int local_tokens = 1;     // T / tp under sequence parallelism, else T
  int hidden = 1, heads = 1, kv_heads = 1, head_dim = 1, ffn = 1;  // heads/kv_heads/ffn: this rank's share
  bool swiglu = false, layernorm = true;
  float eps = 1e-5f;        // norm epsilon (PyTorch LayerNorm default)
  // Rotary models: cos/sin per position and frequency, shared by every layer of the stage; null for learned
  // positions. q and k are rotated right after their GEMMs (bias included, as GPT-NeoX and HF Llama do).
  std::shared_ptr<const kernels::cpu::RopeTable> rope;
  // Mixture of experts (0 experts: none): routed experts, top-k, one expert's width, this rank's share of the
  // shared expert's width; the router's score (softmax or sigmoid), group limit (groups, group_top_k; 1/1 off),
  // top-k renormalisation, scale and load-balancing loss weight; and the stage's loss scale, which the
  // load-balancing loss's gradient takes as the LM loss's does.
  int experts = 0, top_k = 0, expert_ffn = 0, shared_ffn = 0;
  bool sigmoid = false;
  int groups = 1, group_top_k = 1;
  bool normalize_top_k = true;
  float route_scale = 1.0f, aux_coef = 0.0f, loss_scale = 1.0f;
};
LayerShape layer_shape(const Model& m, int micro_batch, const TensorParallel& tp);

// Forward FLOPs of one micro-batch through `layers` such layers, plus the vocab-parallel head when `last`:
// 2 T per GEMM weight and 4 B H S^2 d for the attention core (the full square, the simulator's convention);
// moe_layers of the layers have a MoE MLP (routed experts at the balanced load).
// The CPU and CUDA stages both report it on their forward ops.
double stage_forward_flops(const LayerShape& s, int layers, bool last, std::int64_t vocab, int tp, int moe_layers = 0);

// Throws InputError for a position embedding this layer cannot compute (rotary needs an even head_dim).
void check_position_embedding(const Model& m);

// What the backward reads. Empty buffers were not kept: probs under selective recomputation. q and k are
// kept after the rotary rotation (what attention read), so selective recomputation needs no re-rotation.
struct MoeActs;
struct LayerActs {
  Buf x, mu1, rs1, y1, q, k, v, probs, attn, x2, mu2, rs2, y2, h1, g1, act;
  std::shared_ptr<MoeActs> moe;  // a MoE layer's router, dispatch and expert activations
  std::vector<const Buf*> bufs() const;
  std::int64_t bytes() const;
};

// x, out: [local_tokens, hidden]. save == nullptr keeps nothing (the inside of a fully recomputed block).
// Returns this rank's part of the layer's load-balancing loss (0 for a dense layer; summed over the tp ranks
// it is the micro-batch's, unscaled).
float layer_forward(const LayerShape& s, const LayerWeights& w, const TensorParallel& tp, const ExpertParallel& ep,
                    const float* x, float* out, LayerActs* save, bool keep_probs);

// dout, dx: [local_tokens, hidden]. Recomputes the attention probabilities when they were not kept.
void layer_backward(const LayerShape& s, const LayerWeights& w, const TensorParallel& tp, const ExpertParallel& ep,
                    const LayerActs& a, const float* dout, float* dx, std::vector<WeightGradJob>& jobs);

// The tensor-parallel edges of a column-/row-parallel pair (the dense MLP, attention, a MoE layer's shared
// expert): gather_tokens all-gathers this rank's tokens under SP (else copies the full activations);
// reduce_tokens sums the row-parallel partials over tp into this rank's tokens (a reduce-scatter under SP).
void gather_tokens(const LayerShape& s, const TensorParallel& tp, const float* local, float* full);
void reduce_tokens(const LayerShape& s, const TensorParallel& tp, std::vector<float>& partial, float* local);

// Norm dispatch shared with the stage's final norm.
void norm_forward(const LayerShape& s, const Weight& g, const Weight& b, const float* x, float* y, float* mu, float* rs,
                  int rows);
void norm_backward(const LayerShape& s, const Weight& g, const Weight& b, const float* dy, const float* x,
                   const float* mu, const float* rs, float* dx, int rows);

}  // namespace tessel::rt
