// Lowering of one transformer layer, the embedding and the LM head under a layout. FLOP counts follow
// Narayanan et al. SC'21 (per layer forward 24 b s h^2 + 4 b s^2 h for h-wide GPT); activation bytes follow
// Korthikanti et al. 2022 Table 2 (generalised to GQA, SwiGLU and ffn != 4h term by term, see
// layer_activation_bytes). Element-wise byte counts are read + write of each fused kernel in Megatron-LM.
#include "sim/workload.hpp"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "util/error.hpp"
#include "sim/cost/memory.hpp"

namespace tessel {

using cost::Collective;
using cost::GemmShape;

// Every group spans the job's GPUs in blocks (GroupPlacement::total), so one straddling an NVLink domain's
// boundary is priced as such.
cost::GroupPlacement tp_group(const Layout& l) { return {l.tp, 1, false, l.gpus()}; }
cost::GroupPlacement cp_group(const Layout& l) { return {l.cp, l.tp, false, l.gpus()}; }
cost::GroupPlacement dp_group(const Layout& l) { return {l.dp * l.cp, l.tp, false, l.gpus()}; }
// Megatron-Core's expert folding of a stage's tp x cp x dp GPUs: etp fastest, then ep, then edp.
cost::GroupPlacement etp_group(const Layout& l) { return {l.expert_tp(), 1, false, l.gpus()}; }
cost::GroupPlacement ep_group(const Layout& l) { return {l.ep, l.expert_tp(), false, l.gpus()}; }
cost::GroupPlacement edp_group(const Layout& l) { return {l.expert_dp(), l.expert_tp() * l.ep, false, l.gpus()}; }

// MLA's down-projections and latent norms, whole on every tp rank (add_mla_projections).
double mla_duplicated_params(const Model& m) {
  if (!m.mla.enabled()) return 0.0;
  const double h = m.hidden, qr = m.mla.q_lora_rank, kvr = m.mla.kv_lora_rank, dr = m.mla.qk_rope_head_dim;
  const double norm = m.norm == Norm::rmsnorm ? 1.0 : 2.0;
  return (qr > 0 ? h * qr + norm * qr : 0.0) + h * (kvr + dr) + norm * kvr;
}

// Qwen2-MoE's shared-expert gate ([h, 1]), whole on every tp rank as the router is; 0 for other models.
double shared_gate_params(const Model& m) {
  return m.moe.enabled() && m.moe.shared_ffn > 0 && m.moe.shared_gate ? static_cast<double>(m.hidden) : 0.0;
}

double layer_params_per_gpu(const Model& m, const Layout& l) {
  if (!m.moe.enabled() && !m.mla.enabled()) return static_cast<double>(m.params_per_layer()) / l.tp;
  // Attention (but MLA's duplicated down-projections), norms, a dense MLP or the shared experts split over tp;
  // the router is replicated on every tp rank (Megatron-Core); the routed experts are counted by
  // layer_expert_params_per_gpu.
  const double dup = mla_duplicated_params(m);
  const double gate = shared_gate_params(m);
  const double mlp = m.moe.enabled() ? static_cast<double>(m.shared_expert_params()) - gate : static_cast<double>(m.dense_mlp_params());
  return dup + (static_cast<double>(m.attention_params()) - dup + m.layer_norms * m.norm_params() + mlp) / l.tp +
         static_cast<double>(m.router_params()) + gate + layer_expert_params_per_gpu(m, l);
}

double layer_wide_params_per_gpu(const Model& m, const Layout& l) {
  // As layer_params_per_gpu counts them: the norms (Qwen3's q/k norms and attention sinks with the attention)
  // split over tp, the router and the gate whole. (MLA's two latent norms are counted with its projections.)
  const double attention_wide = static_cast<double>(m.qk_norm_params()) + (m.attention_sinks ? m.heads : 0);
  return (static_cast<double>(m.layer_norms) * static_cast<double>(m.norm_params()) + attention_wide) / l.tp +
         (m.moe.enabled() ? static_cast<double>(m.router_params()) + shared_gate_params(m) : 0.0);
}

double fp8_gemm_share(const Workload& w) {
  double others = 0, wide = 0;
  for (const StageWork& st : w.stages) {
    others += st.params - st.expert_params;
    wide += st.wide_params;
  }
  return others > 0 ? std::clamp(1.0 - wide / others, 0.0, 1.0) : 1.0;
}

double layer_expert_params_per_gpu(const Model& m, const Layout& l) {
  if (!m.moe.enabled()) return 0.0;
  return static_cast<double>(m.moe.experts / l.ep) * static_cast<double>(m.expert_params()) / l.expert_tp();
}

int uniform_window(const Model& m) {
  const bool all = m.sliding_window > 0 && static_cast<int>(m.window_layers.size()) == m.layers;
  return all && m.sliding_window < m.seq_len ? m.sliding_window : 0;
}

int layer_kind(const Model& m, int i) {
  const int w = m.window_of_layer(i);
  return (mixed_layers(m) && !m.is_moe_layer(i) ? 1 : 0) + (w > 0 && w < m.seq_len ? 2 : 0);
}

// Every layer of the same kind (most models): no dense layers among MoE ones and no window shorter than the
// sequence.
static bool one_layer_kind(const Model& m) { return !mixed_layers(m) && (m.sliding_window == 0 || m.sliding_window >= m.seq_len); }

std::array<int, kLayerKinds> layer_kinds_in(const Model& m, int first, int end) {
  std::array<int, kLayerKinds> n{};
  // Most models have one kind: count without a per-layer walk.
  if (one_layer_kind(m)) {
    n[0] = std::max(0, end - first);
    return n;
  }
  for (int i = first; i < end; ++i) ++n[static_cast<std::size_t>(layer_kind(m, i))];
  return n;
}

bool has_layer_kind(const Model& m, int k) { return layer_kinds_in(m, 0, m.layers)[static_cast<std::size_t>(k)] > 0; }

Model kind_model(const Model& m, int k) {
  Model x = k & 1 ? dense_part(m) : m;
  x.window_layers.clear();
  if (k & 2)
    for (int i = 0; i < x.layers; ++i) x.window_layers.push_back(i);
  else
    x.sliding_window = 0;
  return x;
}

const StageEdges* Workload::edges_of(int stage) const {
  if (stage == 0) return &first_edges;
  if (stage == static_cast<int>(stages.size()) - 1) return &last_edges;
  return nullptr;
}

namespace {

struct Dims {
  double b, s, h, t, heads, d, q_dim, kv_dim, f, cp;
  double qk_d, v_d;   // attention core head dims: QK^T's and AV's (both head_dim but under MLA)
  double tokens;      // b * s / cp: tokens of one micro-batch on this GPU
  double x;           // elements of one activation tensor [tokens, h]
  double xs;          // the same, sequence-sharded under SP
  double elt;         // bytes per element
};

Dims dims_of(const Model& m, const Layout& l) {
  Dims d{};
  d.b = l.micro_batch;
  d.cp = l.cp;
  d.s = m.seq_len;
  d.h = m.hidden;
  d.t = l.tp;
  d.heads = m.heads;
  d.d = m.head_dim;
  d.q_dim = static_cast<double>(m.heads) * m.head_dim;
  // With tp > kv_heads, Megatron replicates KV heads: each rank still computes at least one KV head.
  d.kv_dim = std::max(static_cast<double>(m.kv_heads) * m.head_dim / l.tp, static_cast<double>(m.head_dim)) * l.tp;
  d.f = m.ffn;
  d.qk_d = m.mla.enabled() ? m.mla.qk_head_dim() : m.head_dim;
  d.v_d = m.mla.enabled() ? m.mla.v_head_dim : m.head_dim;
  d.tokens = d.b * d.s / d.cp;
  d.x = d.tokens * d.h;
  d.xs = l.sequence_parallel ? d.x / d.t : d.x;
  // Activations between ops stay 16-bit under an fp8 recipe: Transformer Engine quantizes only a GEMM's
  // inputs (op.cpp prices those casts); norms, residuals, activations, TP / CP / pipeline transfers and the
  // MoE dispatch move bf16 (fp8 communication is an opt-in of later releases). The memory model
  // (cost/memory.cpp) counts them at 2 bytes too.
  d.elt = l.precision == Precision::fp8 ? 2.0 : bytes_per_element(l.precision);
  return d;
}

// A GEMM of the layer (or head): its forward shape and model FLOPs (backward: input and weight gradients,
// twice the forward).
WorkOp gemm_op(const char* name, Precision p, GemmShape g, bool has_weights = true) {
  // Only linear layers run in fp8 (Transformer Engine); attention's batched GEMMs stay in 16-bit.
  if (p == Precision::fp8 && !has_weights) p = Precision::bf16;
  WorkOp op;
  op.name = name;
  op.cls = OpClass::gemm;
  op.precision = p;
  op.gemm = g;
  op.has_weights = has_weights;
  op.flops_f = cost::gemm_flops(g);
  op.flops_b = 2 * op.flops_f;
  return op;
}

WorkOp elementwise_op(const char* name, double bytes_f, double bytes_b, int kernels = 1) {
  WorkOp op;
  op.name = name;
  op.cls = OpClass::elementwise;
  op.bytes_f = bytes_f;
  op.bytes_b = bytes_b;
  op.kernels = kernels;
  return op;
}

WorkOp collective_op(const char* name, Collective c, double bytes, const cost::GroupPlacement& g) {
  WorkOp op;
  op.name = name;
  op.cls = OpClass::collective;
  op.coll = c;
  op.group = g;
  op.comm_bytes = bytes;
  return op;
}

// Query-key pairs of a windowed causal attention over n queries, each seeing the last w positions (itself
// included): w(w+1)/2 + (n - w) w, or n(n+1)/2 when the window covers the sequence.
double window_pairs(double n, double w) {
  if (w >= n) return n * (n + 1) / 2;
  return w * (w + 1) / 2 + (n - w) * w;
}

// The same band as a tiled kernel computes it: the pairs of every tile x tile block the band touches (query
// block j reaches key blocks from the one holding position j*tile - w + 1 to its own diagonal block).
double window_tile_pairs(double n, double w, int tile) {
  const auto blocks = static_cast<long long>(std::ceil(n / tile));
  double touched = 0;
  for (long long j = 0; j < blocks; ++j) {
    const long long lo = std::max(0LL, (j * tile - static_cast<long long>(w) + 1) / tile);
    touched += static_cast<double>(j - lo + 1);
  }
  return touched * tile * tile;
}

// The element-wise kernels of a layer, per element of the tensor they pass over, fused or as PyTorch eager
// runs them op by op (Layout::unfused; docs/stacks.md "Fused kernels"): bytes read and written and launches,
// forward and backward. e: the activation dtype's bytes; the fp32 upcasts are 4.
struct EwWork {
  double bytes_f, bytes_b;
  int kernels_f, kernels_b;
};

// A norm. Fused (Apex's or Transformer Engine's kernels, PyTorch's native LayerNorm): read x, write y; backward
// read x and dy, write dx (the weight gradient's partial sums per block are left out). Unfused (an RMSNorm as
// PyTorch's composite and HF's LlamaRMSNorm write it: upcast to fp32, square, mean, add eps, rsqrt, scale,
// downcast, times the weight): forward e+4, 8, 4, 8, 4+e, 2e bytes (the [tokens, 1] eps and rsqrt ops launch,
// moving nothing per element); backward as autograd runs it: the weight product's two gradients and the
// weight's sum over tokens (6e), the downcast's (e+4), the scaling's two products and the rsqrt gradient's
// sum over the hidden dim (24), the [tokens, 1] ops' two launches, the mean's expanded division (4), the
// square's (self.pow(1), times 2, times the gradient: 28), the two gradients of the upcast summed (12) and
// the upcast's (4+e). An fp32 model's upcasts are no-ops. A LayerNorm is one kernel either way.
EwWork norm_work(const Model& m, const Layout& l, double e) {
  if (!l.unfused.norm || m.norm != Norm::rmsnorm) return {2 * e, 3 * e, 1, 1};
  const double up = e < 4 ? 1 : 0;
  return {up * (2 * e + 8) + 20 + 2 * e, 6 * e + up * (2 * e + 8) + 68, 6 + 2 * static_cast<int>(up),
          13 + 2 * static_cast<int>(up)};
}

// The MLP activation, per element of its output (tokens x ffn). Fused (Megatron's bias_gelu / bias_swiglu):
// GELU reads its input (the bias added in the same pass) and writes the output; backward reads dy and x,
// writes dx. SwiGLU reads gate and up, writes one; backward reads dy, gate and up, writes both gradients.
// Unfused: GELU with a bias adds it in a kernel of its own first (read, write); a GELU without one is a
// single kernel anyway; SwiGLU as silu(gate) * up from two projections (torchtitan's FeedForward, HF's
// LlamaMLP): silu (read, write), the product (read two, write one); backward the product's two gradients
// (read two, write one each) and silu's (read dy and gate, write). Megatron's unfused glu splits one
// [gate | up] projection, whose backward also concatenates the two gradients (not priced).
EwWork act_work(const Model& m, const Layout& l, double e, bool bias) {
  const bool swiglu = m.activation == Activation::swiglu;
  if (!l.unfused.act) return swiglu ? EwWork{3 * e, 5 * e, 1, 1} : EwWork{2 * e, 3 * e, 1, 1};
  if (swiglu) return {5 * e, 9 * e, 2, 3};
  return bias ? EwWork{4 * e, 3 * e, 2, 1} : EwWork{2 * e, 3 * e, 1, 1};
}

// Rotary embedding, per element rotated (q and k). Fused (Megatron-Core's --apply-rope-fusion, Transformer
// Engine's kernel, one per tensor): read, write, likewise backward. Unfused, through rotate_half (HF's
// apply_rotary_pos_emb, Megatron-Core's unfused path without its final concatenation): negate one half (read
// and write half), concatenate (read, write), times cos, rotated times sin (read, write each), the sum (read
// two, write one): 10e in 5 kernels a tensor; backward the two products' gradients (2e each), the negation's
// (e), each half's slice gradient as a zero-filled full tensor and a copy into it (2e each) and the three
// gradients summed (two adds, 3e each): 15e in 9 kernels. torchtitan's complex-number form (upcast, one
// complex product, downcast: 2e + 16 bytes in 3 kernels) moves the same 20 bytes at bf16.
EwWork rope_work(const Layout& l, double e) {
  if (!l.unfused.rope) return {2 * e, 2 * e, 1, 1};
  return {10 * e, 15 * e, 5, 9};
}

WorkOp ew_op(const char* name, const EwWork& w, double elements, int tensors = 1) {
  WorkOp op = elementwise_op(name, w.bytes_f * elements, w.bytes_b * elements, w.kernels_f * tensors);
  op.kernels_b = w.kernels_b * tensors;
  return op;
}

// Rotary position embedding on the queries and keys, after their projections and before the attention core
// (Megatron-Core's apply_rotary_pos_emb; rope_work above): each element read and written once forward, its
// gradient likewise backward when fused (the cos / sin table, s x head_dim, is left out). This rank's heads
// (kv replicated as the attention core counts them); under MLA only the rope dims rotate: qk_rope_head_dim of
// every query head, and the one rotary key the heads share.
void add_rope(const Model& m, const Layout& l, const Dims& d, std::vector<WorkOp>& ops) {
  if (m.position != PositionEmbedding::rotary) return;
  const double width = m.mla.enabled() ? (d.heads / d.t + 1.0) * m.mla.qk_rope_head_dim : (d.q_dim + d.kv_dim) / d.t;
  ops.push_back(ew_op("rope", rope_work(l, d.elt), d.tokens * width, 2));
}

// Attention core. Per head: scores s_q x s_k with s_q = s/cp (each CP rank holds its query chunk and sees
// all keys over the ring), then A V. The unfused path computes and masks the whole s_q x s_k matrix whatever
// the mask, so a windowed layer takes it as long as a full one.
void add_attention_core(const Model& m, const Layout& l, const Dims& d, std::vector<WorkOp>& ops) {
  const Precision p = l.precision;
  const double e = d.elt;
  const double sq = d.s / d.cp, sk = d.s;
  const double batch = d.b * (d.heads / d.t);  // micro-batch x this rank's heads
  const int w = uniform_window(m);
  // A windowed layer's query-key pairs on this CP rank: the band the model computes, and the 128 x 128 tiles a
  // flash kernel runs for it.
  const double band = w > 0 ? window_pairs(d.s, w) / d.cp : 0.0, tiles = w > 0 ? window_tile_pairs(d.s, w, 128) / d.cp : 0.0;
  // Model FLOPs of a windowed layer count the band whatever the kernel; the unfused GEMMs keep their shapes
  // (the time of the whole matrix) and carry what a flash kernel would execute (price_measured_core).
  const auto banded = [&](WorkOp& op, double head_dim) {
    if (w == 0) return;
    op.flops_f = 2.0 * batch * band * head_dim;
    op.flops_b = 2 * op.flops_f;
    op.exec_flops_f = 2.0 * batch * tiles * head_dim;
    op.exec_flops_b = 2.5 * op.exec_flops_f;
  };
  if (l.attention == AttentionImpl::unfused) {
    GemmShape sc{static_cast<std::int64_t>(sq), static_cast<std::int64_t>(sk), static_cast<std::int64_t>(d.qk_d),
                 static_cast<std::int64_t>(batch)};
    WorkOp scores = gemm_op("attn_scores", p, sc, false);
    scores.attention_core = true;
    banded(scores, d.qk_d);
    ops.push_back(scores);
    // Megatron's fused scale-mask-softmax (read + write the s^2 scores) then dropout (read, write, 1-byte mask).
    const double s2 = batch * sq * sk;
    const double drop = m.dropout ? 5.0 * s2 : 0.0;
    WorkOp sm = elementwise_op("softmax_dropout", 2 * e * s2 + drop, 3 * e * s2 + drop, m.dropout ? 2 : 1);
    sm.attention_core = true;
    ops.push_back(sm);
    WorkOp av = gemm_op("attn_v", p, {static_cast<std::int64_t>(sq), static_cast<std::int64_t>(d.v_d),
                                      static_cast<std::int64_t>(sk), static_cast<std::int64_t>(batch)}, false);
    av.attention_core = true;
    banded(av, d.v_d);
    ops.push_back(av);
    return;
  }
  // Flash attention: causal, so half of the s_q x s_k block is computed; backward recomputes the scores
  // (2.5x the forward matrix work: dV, dP, dQ, dK plus QK^T again; Dao 2022, FlashAttention-2 Sec. 3).
  WorkOp fa;
  fa.name = "flash_attn";
  fa.cls = OpClass::attention;
  // FP8 recipes keep the attention core in 16-bit (Transformer Engine's default; attention_time prices it so).
  fa.precision = p == Precision::fp8 ? Precision::bf16 : p;
  fa.attention_core = true;
  // The key length one kernel call sees, for the kernel's rate (GpuSpec::attention_curve): a context-parallel
  // rank runs its query chunk against one key chunk of s/cp per ring step (Megatron-Core's p2p context
  // parallelism); a window shortens every query's keys to w.
  fa.attn_seq = w > 0 ? std::min(static_cast<double>(w), d.s / d.cp) : d.s / d.cp;
  fa.attn_head_dim = d.qk_d;
  // Its tiles (attention_occupancy): a call runs this rank's query chunk (s / cp) for every head of the
  // micro-batch. Without context parallelism or a window they are the causal triangle; a window's band, and
  // the ring steps of context parallelism (whole blocks but for the one on the diagonal), cost alike a tile.
  fa.attn_batch_heads = batch;
  fa.attn_queries = sq;
  fa.attn_causal = w == 0 && d.cp == 1;
  const double per_pair = 2.0 * batch * (d.qk_d + d.v_d);  // QK^T and AV of one query-key pair, this rank's heads
  if (w > 0) {
    // A windowed layer (sliding_window shorter than the sequence): each query sees the last w positions, itself
    // included. Model FLOPs count those pairs, w(w+1)/2 + (s - w) w per head (Megatron-Bridge's GPT-OSS
    // FLOPs formula counts the same; there is no non-causal count to offer). The kernel works in tiles of
    // 128 queries x 128 keys (FlashAttention-2's block size) and computes every tile the band touches.
    fa.flops_f = per_pair * band;
    fa.flops_b = 2 * fa.flops_f;
    fa.exec_flops_f = per_pair * tiles;
    fa.exec_flops_b = 2.5 * fa.exec_flops_f;
  } else {
    const double full = per_pair * sq * sk;  // non-causal (4 b h s^2 d)
    fa.flops_f = full;
    fa.flops_b = 2 * full;
    fa.exec_flops_f = full / 2;
    fa.exec_flops_b = 2.5 * full / 2;
  }
  // Q, K, V read and the output written (MLA: Q and K of qk_d per head, V and the output of v_d).
  const double io = m.mla.enabled() ? e * d.tokens * d.heads * 2 * (d.qk_d + d.v_d) / d.t
                                    : e * d.tokens * (d.q_dim + 2 * d.kv_dim + d.q_dim) / d.t;
  fa.bytes_f = io;
  fa.bytes_b = 2 * io;
  ops.push_back(fa);
}

// Multi-head latent attention's projections as Megatron-Core's MLASelfAttention runs them under tensor
// parallelism (DeepSeek-V2 Sec. 2.1): the down-projections to the query and key-value latents (and the shared
// rotary key) have their weights whole on every tp rank; under sequence parallelism each rank runs them on its
// sequence shard and the small latents are all-gathered (instead of the hidden state), without it every rank
// runs them on the whole sequence (the same work tp times: model FLOPs counted once). Each latent is
// RMSNorm-ed, then the column-parallel up-projections give the heads' queries (nope + rope dims) and keys /
// values (nope + v dims). The rotary embedding is add_rope's.
// q_lora_rank 0: queries projected directly from the gathered hidden state.
void add_mla_projections(const Model& m, const Layout& l, const Dims& d, Precision p, std::vector<WorkOp>& ops) {
  const double e = d.elt, t = d.t;
  const bool sp = l.sequence_parallel;
  const auto M = static_cast<std::int64_t>(d.tokens), H = static_cast<std::int64_t>(d.h);
  const auto Mdown = static_cast<std::int64_t>(sp ? d.xs / d.h : d.tokens);
  const auto i64 = [](double x) { return static_cast<std::int64_t>(x); };
  const double qr = m.mla.q_lora_rank, kvr = m.mla.kv_lora_rank, dr = m.mla.qk_rope_head_dim, dn = m.mla.qk_nope_head_dim;
  const auto down = [&](WorkOp op) {
    if (!sp) {  // duplicated on every tp rank
      op.flops_f /= t;
      op.flops_b /= t;
    }
    return op;
  };
  if (qr > 0) ops.push_back(down(gemm_op("q_down", p, {Mdown, i64(qr), H})));
  ops.push_back(down(gemm_op("kv_down", p, {Mdown, i64(kvr + dr), H})));
  if (sp) {
    // The latents gathered (and the hidden state too when queries are projected from it directly).
    const double width = (qr > 0 ? qr : d.h) + kvr + dr;
    ops.push_back(collective_op("tp_allgather1", Collective::all_gather, e * d.tokens * width, tp_group(l)));
  }
  if (qr > 0) {
    ops.push_back(elementwise_op("q_norm", 2 * e * d.tokens * qr, 3 * e * d.tokens * qr));
    ops.push_back(gemm_op("q_up", p, {M, i64(d.heads * d.qk_d / t), i64(qr)}));
  } else {
    ops.push_back(gemm_op("q_proj", p, {M, i64(d.heads * d.qk_d / t), H}));
  }
  ops.push_back(elementwise_op("kv_norm", 2 * e * d.tokens * kvr, 3 * e * d.tokens * kvr));
  ops.push_back(gemm_op("kv_up", p, {M, i64(d.heads * (dn + d.v_d) / t), i64(kvr)}));
}

// A mixture-of-experts MLP as Megatron-Core runs it with the all-to-all token dispatcher (moe_layer.py,
// token_dispatcher.py), one micro-batch on one GPU. Tokens entering: T, the GPU's sequence shard (SP is
// required with tp > 1). The router's GEMM [T, E, h] and its softmax / top-k (fp32 over [T, E]); the permute
// that copies each token once per chosen expert; the dispatch all-to-all over the ep group (T k h elements
// out and, balanced, as many in); under etp > 1 an all-gather over the etp group; the local experts' GEMMs
// as a grouped GEMM (experts / ep of them, each on M_e = etp ep T k / E tokens when the routing is balanced,
// each 1/etp of the expert's width: the GEMM model prices the small M a fine-grained expert gets); then the
// reverse: reduce-scatter over etp, combine all-to-all, unpermute (the top-k weighted sum). Shared experts
// are a dense tensor-parallel MLP beside them (Megatron runs them after the routed ones unless told to
// overlap). Routing is balanced (the published benchmarks force it); imbalance is not modelled yet.
void add_moe_mlp(const Model& m, const Layout& l, const Dims& d, std::vector<WorkOp>& ops) {
  const Precision p = l.precision;
  const Precision router_p = p == Precision::fp8 ? Precision::bf16 : p;  // the router is a plain linear layer
  const double e = d.elt;
  const double T = d.xs / d.h;  // tokens on this GPU
  const double E = m.moe.experts, k = m.moe.top_k, etp = l.expert_tp(), ep = l.ep;
  const double local = E / ep;
  const double rows = etp * T * k;  // token copies this GPU's experts process (balanced)
  // The busiest EP rank's load over balanced (skew, or the padded capacity): the step waits for it.
  const double load = l.moe_load_factor();
  const double me = load * rows / local;  // per local expert on the busiest rank
  const double gate = m.activation == Activation::swiglu ? 2.0 : 1.0;
  const double fe = m.moe.expert_ffn / etp;
  const auto H = static_cast<std::int64_t>(d.h);
  WorkOp router = gemm_op("router", router_p, {static_cast<std::int64_t>(T), static_cast<std::int64_t>(E), H});
  ops.push_back(router);
  // Softmax (or sigmoid) and top-k over fp32 scores: read the logits, write the probabilities, read them for
  // the top-k and the balancing loss; backward reads probabilities and their gradient, writes the logits'.
  ops.push_back(elementwise_op("router_topk", 16 * T * E, 12 * T * E, 3));
  // Permute: read each token, write it once per chosen expert; backward gathers the copies' gradients.
  ops.push_back(elementwise_op("permute", e * T * d.h * (1 + k), e * T * d.h * (1 + k)));
  // The buffer each GPU sends in one all-to-all; the collective ends with the busiest receiver's share.
  const double moved = load * e * T * k * d.h;
  // DeepEP (Layout::deepep): the all-to-alls priced as its node-limited dispatch and combine.
  const cost::DeepEpRouting deepep =
      l.deepep ? cost::DeepEpRouting{m.moe.experts, m.moe.top_k, m.moe.router.groups, m.moe.router.group_top_k}
               : cost::DeepEpRouting{};
  const auto a2a = [&](const char* name) {
    WorkOp op = collective_op(name, Collective::all_to_all, moved, ep_group(l));
    op.deepep = deepep;
    return op;
  };
  if (ep > 1) ops.push_back(a2a("ep_dispatch"));
  if (etp > 1) ops.push_back(collective_op("etp_allgather", Collective::all_gather, etp * moved, etp_group(l)));
  const auto M = static_cast<std::int64_t>(std::ceil(me));
  const auto batch = static_cast<std::int64_t>(local);
  WorkOp up = gemm_op("expert_up", p, {M, static_cast<std::int64_t>(gate * fe), H, batch});
  up.flops_f = 2.0 * rows * gate * fe * d.h;  // the balanced token count, not the rounded-up per-expert M
  up.flops_b = 2 * up.flops_f;
  ops.push_back(up);
  ops.push_back(ew_op("expert_act", act_work(m, l, e, m.has_mlp_bias()), load * rows * fe));
  WorkOp down = gemm_op("expert_down", p, {M, H, static_cast<std::int64_t>(fe), batch});
  down.flops_f = 2.0 * rows * fe * d.h;
  down.flops_b = 2 * down.flops_f;
  ops.push_back(down);
  if (etp > 1) ops.push_back(collective_op("etp_reducescatter", Collective::reduce_scatter, etp * moved, etp_group(l)));
  if (ep > 1) ops.push_back(a2a("ep_combine"));
  // Unpermute: read the k expert outputs of each token and its k weights, write the weighted sum.
  ops.push_back(elementwise_op("unpermute", e * T * d.h * (k + 1) + 4 * T * k, e * T * d.h * (k + 1) + 4 * T * k));
  if (m.moe.shared_ffn > 0) {
    const bool sp = l.sequence_parallel;
    const cost::GroupPlacement tp = tp_group(l);
    const double fs = static_cast<double>(m.moe.shared_ffn) / d.t;
    const auto Mt = static_cast<std::int64_t>(d.tokens);
    if (sp) ops.push_back(collective_op("tp_allgather_shared", Collective::all_gather, e * d.x, tp));
    ops.push_back(gemm_op("shared_up", p, {Mt, static_cast<std::int64_t>(gate * fs), H}));
    ops.push_back(ew_op("shared_act", act_work(m, l, e, m.has_mlp_bias()), d.tokens * fs));
    ops.push_back(gemm_op("shared_down", p, {Mt, H, static_cast<std::int64_t>(fs)}));
    if (sp) ops.push_back(collective_op("tp_reducescatter_shared", Collective::reduce_scatter, e * d.x, tp));
    else if (d.t > 1) ops.push_back(collective_op("tp_allreduce_shared", Collective::all_reduce, e * d.x, tp));
    if (m.moe.shared_gate) {
      // Qwen2-MoE's gate (Megatron-Core's SharedExpertMLP with use_shared_expert_gate): sigmoid(x w), one
      // logit per token from a [h, 1] weight every tp rank holds, scales the shared experts' output. A GEMV
      // on the sequence shard, then read the output, write it scaled (backward: read it and its gradient too).
      ops.push_back(gemm_op("shared_gate", router_p, {static_cast<std::int64_t>(T), 1, H}));
      ops.push_back(elementwise_op("shared_gate_scale", 2 * e * d.xs, 3 * e * d.xs));
    }
  }
}

// The passes Tessel's own runtime makes over one layer's buffers beside its kernels (runtime/gpt_layer.cpp's
// layer_forward / layer_backward), carried by residual1 (the attention half) and residual2 (the MLP half) as
// the glue a profile calibrated on that runtime prices (op.cpp): each buffer it allocates is zero-filled once
// (q/k/v, the scores, the attention output, the MLP's hidden and activation, their gradients, the token
// tensors), bias adds read and write their output and bias gradients read it once, gather_tokens /
// reduce_tokens copy the token tensor without SP, and the residual adds read two and write one. Megatron
// fuses all this (bias into the GEMMs or the bias-dropout-add); the runtime's is mostly on tensor-parallel
// shards, so a TP layout's glue shrinks with its shards as the runtime's does. A MoE layer's MLP half keeps
// only its residual passes (the routed experts' buffers are their own ops').
struct RuntimeGlue {
  double attn_f, attn_b, mlp_f, mlp_b;  // bytes
};

RuntimeGlue runtime_glue(const Model& m, const Layout& l, const Dims& d, bool moe) {
  const double e = d.elt, xs = d.xs, x = d.x, copy = l.sequence_parallel ? 0 : 2;
  const double q = d.tokens * (d.q_dim + 2 * d.kv_dim) / d.t, a = d.tokens * d.heads * d.v_d / d.t;
  const double f = d.tokens * d.f / d.t, gate = m.activation == Activation::swiglu ? 2.0 : 1.0;
  const double scores = l.attention == AttentionImpl::unfused ? d.tokens * d.s * d.heads / d.t : 0;
  const double qb = m.has_qkv_bias() ? 1 : 0, ob = m.has_out_bias() ? 1 : 0, mb = m.has_mlp_bias() ? 1 : 0;
  RuntimeGlue g;
  g.attn_f = e * ((7 + copy) * xs + (2 + copy) * x + (1 + 2 * qb) * q + scores + a);
  g.attn_b = e * ((4 + ob + copy) * xs + (2 + copy) * x + (1 + qb) * q + a);
  if (moe) {
    g.mlp_f = e * 3 * xs;
    g.mlp_b = e * 5 * xs;
  } else {
    g.mlp_f = e * ((3 + copy) * xs + (1 + copy) * x + (gate + 1 + 2 * mb * gate) * f);
    g.mlp_b = e * ((5 + mb + copy) * xs + (2 + copy) * x + (gate + 1 + mb * gate) * f);
  }
  return g;
}

// A residual op carrying its share of the runtime's glue (above).
WorkOp residual_op(const char* name, double bytes_f, double bytes_b, double runtime_f, double runtime_b) {
  WorkOp op = elementwise_op(name, bytes_f, bytes_b);
  op.runtime_bytes_f = runtime_f;
  op.runtime_bytes_b = runtime_b;
  return op;
}

// The work of one transformer layer, in Megatron-LM's op order: its ops with shapes, FLOPs and bytes, and
// the CP ring's K and V chunk.
void layer_work(const Model& m, const Layout& l, LayerWork& lw) {
  const Dims d = dims_of(m, l);
  const Precision p = l.precision;
  const auto M = static_cast<std::int64_t>(d.tokens);
  const auto H = static_cast<std::int64_t>(d.h);
  const double f_local = d.f / d.t;
  const double gate = m.activation == Activation::swiglu ? 2.0 : 1.0;
  const double e = d.elt;
  const bool sp = l.sequence_parallel;
  const cost::GroupPlacement tp = tp_group(l);
  std::vector<WorkOp>& ops = lw.ops;
  lw.window = uniform_window(m);

  // Norm 1 (on the sequence shard under SP): read x, write y.
  const EwWork norm = norm_work(m, l, e);
  ops.push_back(ew_op("norm1", norm, d.xs));
  // MLA gathers its latents after the down-projections instead (add_mla_projections).
  if (sp && !m.mla.enabled()) ops.push_back(collective_op("tp_allgather1", Collective::all_gather, e * d.x, tp));
  if (m.mla.enabled()) {
    add_mla_projections(m, l, d, p, ops);
  } else {
    ops.push_back(gemm_op("qkv", p, {M, static_cast<std::int64_t>((d.q_dim + 2 * d.kv_dim) / d.t), H}));
  }
  add_rope(m, l, d, ops);
  add_attention_core(m, l, d, ops);
  // Ring attention: each of cp-1 steps passes a K and V chunk to the next CP rank while attending to the
  // current one, so the exchange hides behind the attention compute when that is longer.
  if (l.cp > 1)
    lw.cp_kv_bytes = m.mla.enabled() ? e * d.tokens * d.heads * (d.qk_d + d.v_d) / d.t : 2 * e * d.tokens * d.kv_dim / d.t;
  ops.push_back(gemm_op("proj", p, {M, H, static_cast<std::int64_t>(d.heads * d.v_d / d.t)}));
  if (sp) ops.push_back(collective_op("tp_reducescatter1", Collective::reduce_scatter, e * d.x, tp));
  else ops.push_back(collective_op("tp_allreduce1", Collective::all_reduce, e * d.x, tp));
  // Bias + dropout + residual add, fused: read two inputs, write one, a 1-byte mask.
  const double res_f = (3 * e + (m.dropout ? 1 : 0)) * d.xs, res_b = (2 * e + (m.dropout ? 1 : 0)) * d.xs;
  const RuntimeGlue glue = runtime_glue(m, l, d, m.moe.enabled());
  ops.push_back(residual_op("residual1", res_f, res_b, glue.attn_f, glue.attn_b));
  ops.push_back(ew_op("norm2", norm, d.xs));
  if (m.moe.enabled()) {
    add_moe_mlp(m, l, d, ops);
    ops.push_back(residual_op("residual2", res_f, res_b, glue.mlp_f, glue.mlp_b));
    lw.act_bytes = cost::layer_activation_bytes(m, l);
    Layout nore = l;
    nore.recompute = Recompute::none;
    lw.act_bytes_unfused_full = cost::layer_activation_bytes(m, nore);
    return;
  }
  if (sp) ops.push_back(collective_op("tp_allgather2", Collective::all_gather, e * d.x, tp));
  ops.push_back(gemm_op("mlp_up", p, {M, static_cast<std::int64_t>(gate * f_local), H}));
  ops.push_back(ew_op("act", act_work(m, l, e, m.has_mlp_bias()), d.tokens * f_local));
  ops.push_back(gemm_op("mlp_down", p, {M, H, static_cast<std::int64_t>(f_local)}));
  if (sp) ops.push_back(collective_op("tp_reducescatter2", Collective::reduce_scatter, e * d.x, tp));
  else ops.push_back(collective_op("tp_allreduce2", Collective::all_reduce, e * d.x, tp));
  ops.push_back(residual_op("residual2", res_f, res_b, glue.mlp_f, glue.mlp_b));
  lw.act_bytes = cost::layer_activation_bytes(m, l);
  Layout nore = l;
  nore.recompute = Recompute::none;
  lw.act_bytes_unfused_full = cost::layer_activation_bytes(m, nore);
}

// The time communication of `comm` seconds adds when `hidden` of it runs beside compute slowed by s
// (GpuSpec::overlap_slowdown): the part not hidden, plus the compute's slowdown hidden x s / (1 + s). The one
// charge for every overlap a layer's ops carry (TP overlap below, the CP ring in price_layer).
double exposed_after_overlap(double comm, double hidden, double s) { return comm - hidden + hidden * s / (1.0 + s); }

// The MoE layer's expert collectives (dispatch / combine all-to-alls, etp gather / scatter): not TP's.
bool is_expert_collective(const WorkOp& op) {
  const std::string_view n(op.name);
  return n.rfind("ep_", 0) == 0 || n.rfind("etp_", 0) == 0;
}

// TP communication overlap (Megatron --tp-comm-overlap; Transformer Engine's userbuffers, Wang et al.,
// "Overlap communication with dependent computation via decomposition", ASPLOS 2023): an all-gather feeds
// the GEMM after it and a reduce-scatter drains the GEMM before it; each is cut into tp chunks, one moving
// while the GEMM computes on another, so all but one chunk's transfer can hide: hidden = min(comm, gemm) x
// (tp - 1) / tp, forward against the GEMM's forward, backward against its input and weight gradients. While
// they overlap the GEMM runs slower (GpuSpec::overlap_slowdown s: it progresses at 1 / (1 + s) of its rate,
// the same charge as every other overlap in the model): hidden x s / (1 + s) is added back. The collective's
// t_f / t_i keep the rest, so stage times, the closed form and the event engine all see the same cost.
void overlap_tp_comm(const Layout& l, const System& sys, LayerWork& lw) {
  const double keep = (l.tp - 1.0) / l.tp, s = sys.gpu.overlap_slowdown;
  for (std::size_t k = 0; k < lw.ops.size(); ++k) {
    WorkOp& c = lw.ops[k];
    // Megatron's userbuffers overlap the linear layers' TP collectives, not the token dispatcher's.
    if (c.cls != OpClass::collective || is_expert_collective(c)) continue;
    const bool gather = c.coll == Collective::all_gather, scatter = c.coll == Collective::reduce_scatter;
    const std::size_t g = gather ? k + 1 : k - 1;
    if ((!gather && !scatter) || (scatter && k == 0) || g >= lw.ops.size() || lw.ops[g].cls != OpClass::gemm) continue;
    const WorkOp& gemm = lw.ops[g];
    c.hidden_f = std::min(c.t_f, gemm.t_f) * keep;
    c.hidden_i = std::min(c.t_i, gemm.t_i + gemm.t_w) * keep;
    c.t_f = exposed_after_overlap(c.t_f, c.hidden_f, s);
    c.t_i = exposed_after_overlap(c.t_i, c.hidden_i, s);
    lw.tp_hidden_f += c.hidden_f;
    lw.tp_hidden_b += c.hidden_i;
  }
}

// The layer's times on `sys`: each op priced by the cost model, the CP exchange against the attention it
// hides behind, the sums by kind, and the recompute the layout adds.
void price_layer(const Layout& l, const System& sys, LayerWork& lw) {
  for (auto& op : lw.ops) cost::price(op, sys, l);
  if (l.tp_comm_overlap) overlap_tp_comm(l, sys, lw);
  if (l.cp > 1) {
    const double step = cost::collective_time(sys, Collective::send_recv, lw.cp_kv_bytes, cp_group(l)).seconds;
    const double comm_f = (l.cp - 1.0) * step, comm_b = 2 * comm_f;
    double attn_f = 0, attn_b = 0;
    for (const auto& op : lw.ops)
      if (op.attention_core) {
        attn_f += op.t_f;
        attn_b += op.t_i;
      }
    lw.cp_comm_f = comm_f;
    lw.cp_comm_b = comm_b;
    // What hides slows the attention it runs beside (the send / receive kernels take SMs and memory
    // bandwidth), charged as every other overlap here.
    const double s = sys.gpu.overlap_slowdown;
    lw.t_cp_f = exposed_after_overlap(comm_f, std::min(comm_f, attn_f), s);
    lw.t_cp_b = exposed_after_overlap(comm_b, std::min(comm_b, attn_b), s);
  }
  for (const auto& op : lw.ops) {
    if (op.cls == OpClass::collective) {
      lw.t_tp_f += op.t_f;
      lw.t_tp_b += op.t_i;
      if (is_expert_collective(op)) {
        lw.t_ep_f += op.t_f;
        lw.t_ep_b += op.t_i;
      }
      continue;
    }
    lw.t_f += op.t_f;
    lw.t_i += op.t_i;
    lw.t_w += op.t_w;
    if (op.cls == OpClass::gemm || op.cls == OpClass::attention) lw.flops_model_f += op.flops_f;
    if (op.attention_core && (op.cls == OpClass::gemm || op.cls == OpClass::attention) && lw.window == 0)
      lw.flops_attention_f += op.flops_f;
  }
  // Recompute work per recomputed layer: the whole forward with its TP collectives (full), or the attention
  // core only (selective; Korthikanti et al. Sec. 4.2). Under flash attention too: Megatron-core checkpoints
  // the core attention for selective recompute (checkpoint_core_attention, recompute_modules "core_attn")
  // whatever kernel runs it, so the backward runs the flash forward again before the flash backward (which
  // recomputes its scores on its own besides).
  if (l.recompute == Recompute::full) {
    lw.t_recompute = lw.t_f + lw.t_tp_f + lw.t_cp_f;
    lw.flops_hw_extra = lw.flops_model_f;
  } else if (l.recompute == Recompute::selective) {
    for (const auto& op : lw.ops)
      if (op.attention_core) {
        lw.t_recompute += op.t_f;
        if (op.cls != OpClass::elementwise) lw.flops_hw_extra += op.flops_f;
      }
  }
}

// Current fp8 scaling quantizes a tensor with one scale from its own amax; one that sequence parallelism
// gathers over tp is quantized before the gather, so the tp ranks first all-reduce its amax (Transformer
// Engine's fp8_current_scaling docs, "Amax reduction": the input and the gradient in sequence parallelism). One
// small all-reduce (a 4-byte amax) before each of the layer's SP all-gathers forward, and as many backward for
// the output gradients gathered there. Delayed scaling reduces its amaxes once a micro-batch (stage_work);
// MXFP8's block scales are local.
void add_fp8_amax_reductions(const Layout& l, LayerWork& lw) {
  if (l.precision != Precision::fp8 || l.fp8_recipe != Fp8Recipe::current || !l.sequence_parallel || l.tp == 1) return;
  std::vector<WorkOp>& ops = lw.ops;
  for (std::size_t k = 0; k < ops.size(); ++k)
    if (ops[k].cls == OpClass::collective && ops[k].coll == Collective::all_gather && !is_expert_collective(ops[k])) {
      ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(k), collective_op("fp8_amax", Collective::all_reduce, 4.0, tp_group(l)));
      ++k;
    }
}

void lower_layer_into(const Model& m, const Layout& l, const System& sys, LayerWork& lw) {
  layer_work(m, l, lw);
  add_fp8_amax_reductions(l, lw);
  price_layer(l, sys, lw);
}

// Records an edge collective of the stage and returns its time.
double add_edge(StageEdges& e, const System& sys, const Layout& l, const char* name, Collective c, double bytes,
                double at, bool backward) {
  TESSEL_CHECK(e.count < StageEdges::kMax, "more than " << StageEdges::kMax << " edge collectives");
  const double t = cost::collective_time(sys, c, bytes, tp_group(l)).seconds;
  e.edges[e.count++] = {name, c, bytes, t, at, backward};
  return t;
}

// Embedding (first stage): gather rows, add positions, dropout; backward scatter-adds into the table.
// `recompute_s`: the part of st.i that recomputes the forward, run as its own op before the input gradient's.
void add_embedding(const Model& m, const Layout& l, const System& sys, StageWork& st, StageEdges& edges,
                   double recompute_s) {
  const Dims d = dims_of(m, l);
  const double bytes = d.elt * d.x * 3;
  const double lookup = cost::memory_time(sys.gpu, bytes, 2, CostKind::embedding, false);
  st.w += cost::memory_time(sys.gpu, bytes + 4 * d.x, 2, CostKind::embedding, true);
  double t = 0;
  if (l.tp > 1) {
    // Vocab-parallel embedding: partial rows all-reduced (reduce-scattered under SP) across TP, before the
    // first layer; under SP the backward all-gathers the output gradient for the table's update.
    const Collective c = l.sequence_parallel ? Collective::reduce_scatter : Collective::all_reduce;
    t = add_edge(edges, sys, l, "embedding", c, d.elt * d.x, lookup, false);
    st.tp_comm_f += t;
    if (l.sequence_parallel) {
      const double g =
          add_edge(edges, sys, l, "embedding grad", Collective::all_gather, d.elt * d.x, st.i - recompute_s, true);
      st.i += g;
      st.tp_comm_b += g;
    }
  }
  st.f += lookup + t;
  edges.layers_at_f = lookup + t;
}

// LM head (last stage): final norm, logits GEMM over the vocab shard, fp32 cross-entropy. Under fp8 the
// logits GEMM stays 16-bit: Megatron-Core's output layer is tensor_parallel.ColumnParallelLinear, not a
// Transformer Engine module, so fp8_autocast does not reach it (megatron/core/models/gpt/gpt_model.py), and
// DeepSeek-V3 keeps its output head in BF16 (arXiv:2412.19437 sec. 3.3.1), as its MTP heads.
void add_head(const Model& m, const Layout& l, const System& sys, StageWork& st, StageEdges& edges) {
  const Dims d = dims_of(m, l);
  const auto M = static_cast<std::int64_t>(d.tokens);
  WorkOp lg = gemm_op("logits", l.precision == Precision::fp8 ? Precision::bf16 : l.precision,
                      {M, static_cast<std::int64_t>(std::ceil(static_cast<double>(m.vocab) / l.tp)),
                       static_cast<std::int64_t>(d.h)});
  cost::price(lg, sys, l);
  const double v_local = std::ceil(static_cast<double>(m.vocab) / l.tp);
  const double logits = d.tokens * v_local;  // this rank's logits
  // A profile with measured kind rates (tessel calibrate on Tessel's runtime) prices the final norm and the
  // loss apart, at the bytes its bench charges the runtime's loss kernels (three fp32 passes forward, two
  // backward). Otherwise the loss the layout computes (Layout::cross_entropy), per logit and kernel:
  //  - megatron: Megatron-Core's vocab-parallel cross-entropy (tensor_parallel/cross_entropy.py), one kernel a
  //    pass over fp32 logits: forward the upcast of the 16-bit logits (read 2, write 4 bytes; none in fp32),
  //    the max (read 4), the in-place subtraction and exp (read and write 4 each), the sum (read 4) and the
  //    normalisation kept as the softmax for the backward (read and write 4); backward the scaling by the
  //    loss gradient (read and write 4) and the cast back to the GEMM's 16 bits (read 4, write 2);
  //  - megatron-fused (fusions/fused_cross_entropy.py): the upcast fused with the max, the subtraction with
  //    the exp; the sum and the normalisation as before; the same backward;
  //  - te (Transformer Engine's Triton kernels, pytorch/triton/cross_entropy.py): forward an online softmax
  //    reading the 16-bit logits once (per-token statistics only); backward one kernel reading them and
  //    writing the gradient in their place.
  // The per-token target updates and statistics are left out (one value per token, not per logit).
  const bool apart = sys.gpu.kind_rates();
  const double cast = d.elt < 4 ? d.elt + 4 : 0;
  // max_bytes: the forward's bytes up to its max, which tp all-reduces before the rest of the loss.
  double fwd_bytes = 0, bwd_bytes = 0, max_bytes = 0;
  int fwd_kernels = 0, bwd_kernels = 0;
  switch (l.cross_entropy) {
    case CrossEntropyImpl::megatron:
      max_bytes = cast + 4, fwd_bytes = cast + 32, fwd_kernels = cast > 0 ? 6 : 5;
      bwd_bytes = cast + 8, bwd_kernels = cast > 0 ? 2 : 1;
      break;
    case CrossEntropyImpl::megatron_fused:
      max_bytes = cast > 0 ? cast : 4, fwd_bytes = max_bytes + 20, fwd_kernels = 4;
      bwd_bytes = cast + 8, bwd_kernels = cast > 0 ? 2 : 1;
      break;
    case CrossEntropyImpl::te:
      max_bytes = fwd_bytes = d.elt, fwd_kernels = 2;
      bwd_bytes = 2 * d.elt, bwd_kernels = 1;
      break;
  }
  const EwWork norm = norm_work(m, l, d.elt);  // the final norm
  const double ce_f = apart ? cost::memory_time(sys.gpu, 12 * logits, 2, CostKind::cross_entropy, false) +
                                  cost::memory_time(sys.gpu, norm.bytes_f * d.xs, norm.kernels_f, CostKind::norm, false)
                            : cost::memory_time(sys.gpu, fwd_bytes * logits + norm.bytes_f * d.xs, fwd_kernels + norm.kernels_f);
  const double ce_i = apart ? cost::memory_time(sys.gpu, 8 * logits, 1, CostKind::cross_entropy, true) +
                                  cost::memory_time(sys.gpu, norm.bytes_b * d.xs, norm.kernels_b, CostKind::norm, true)
                            : cost::memory_time(sys.gpu, bwd_bytes * logits + norm.bytes_b * d.xs, bwd_kernels + norm.kernels_b);
  const double before_max = apart ? 1.0 / 3 : max_bytes / fwd_bytes;  // the forward's share up to the max
  st.w += lg.t_w;
  st.flops_model += 3 * lg.flops_f;
  st.flops_hw += 3 * lg.flops_f;
  if (l.tp == 1) {
    st.f += lg.t_f + ce_f;
    st.i += lg.t_i + ce_i;
    return;
  }
  // Vocab-parallel head (Megatron): under SP the hidden states are all-gathered before the logits GEMM; the
  // cross-entropy all-reduces each token's max, target logit and sum of exponentials (fp32, one value per
  // token each); the backward reduces the head's input gradient (reduce-scatters it under SP) before the
  // last layer's backward starts.
  const bool sp = l.sequence_parallel;
  double at = st.f, comm_f = 0;  // the head runs after the layers (and the embedding, when pp == 1)
  const auto edge_f = [&](const char* name, Collective c, double bytes) {
    const double t = add_edge(edges, sys, l, name, c, bytes, at, false);
    at += t;
    comm_f += t;
  };
  if (sp) edge_f("head gather", Collective::all_gather, d.elt * d.x);
  at += lg.t_f + ce_f * before_max;  // the logits, then the loss up to its max
  for (const char* name : {"cross-entropy max", "cross-entropy target", "cross-entropy sum-exp"})
    edge_f(name, Collective::all_reduce, 4 * d.tokens);
  st.f += lg.t_f + ce_f + comm_f;
  st.tp_comm_f += comm_f;
  // The backward starts with the head's: what the embedding recorded for its backward moves after it.
  const double g = add_edge(edges, sys, l, "head input grad", sp ? Collective::reduce_scatter : Collective::all_reduce,
                            d.elt * d.x, ce_i + lg.t_i, true);
  const double head_i = ce_i + lg.t_i + g;
  for (int k = 0; k + 1 < edges.count; ++k)
    if (edges.edges[k].backward) edges.edges[k].at += head_i;
  st.i += head_i;
  st.tp_comm_b += g;
  edges.layers_at_i = head_i;
}

StepSync step_sync(const Model& m, const Layout& l) {
  StepSync s;
  const cost::GroupPlacement dp = dp_group(l);
  if (dp.size > 1 && l.zero_stage < 3) {
    s.grad = {l.zero_stage == 0 ? Collective::all_reduce : Collective::reduce_scatter, dp, cost::grad_bytes(l)};
    s.grad_reductions = l.zero_stage == 2 ? l.num_microbatches() : 1;
    if (l.zero_stage >= 1) s.param_gather = {Collective::all_gather, dp, cost::weight_bytes(l.precision)};
  }
  // The routed experts' gradients are reduced among their edp replicas instead (Megatron-Core's expert data
  // parallel group), and the distributed optimizer shards their states over those.
  if (m.moe.enabled() && l.expert_dp() > 1 && l.zero_stage < 3) {
    s.expert_grad = {l.zero_stage == 0 ? Collective::all_reduce : Collective::reduce_scatter, edp_group(l),
                     cost::grad_bytes(l)};
    if (l.zero_stage >= 1) s.expert_param_gather = {Collective::all_gather, edp_group(l), cost::weight_bytes(l.precision)};
  }
  if (l.zero_stage == 3) {
    cost::GroupPlacement flat = dp;
    flat.flat = true;
    const double layer_params = static_cast<double>(m.params_per_layer()) / l.tp;
    const double wb = cost::weight_bytes(l.precision);
    // fp8 GEMM weights are gathered at their own bytes (fp8 with fp8 primary weights), the norms at 16 bits.
    double gathered = wb;
    if (l.precision == Precision::fp8 && layer_params > 0) {
      const double gemm = std::clamp(1.0 - layer_wide_params_per_gpu(m, l) / layer_params, 0.0, 1.0);
      gathered = (1 - gemm) * wb + gemm * cost::fp8_gemm_gather_bytes(l);
    }
    s.zero3_gather = {Collective::all_gather, flat, gathered * layer_params};
    s.zero3_scatter = {Collective::reduce_scatter, flat, wb * layer_params};
  }
  // Tied embeddings, or the MTP modules' copy of the token embedding, on another rank than the first stage's.
  if ((m.tied_embeddings || m.mtp_layers > 0) && l.num_stages() > 1 &&
      l.rank_of_stage(0) != l.rank_of_stage(l.num_stages() - 1)) {
    const double bytes = cost::grad_bytes(l) * m.vocab * m.hidden / l.tp;
    s.tied = {bytes / 2, (l.pp - 1) * l.tp * l.cp * l.dp, 2, l.gpus()};
  }
  if (l.sequence_parallel && l.tp > 1) s.sp_grad = {Collective::all_reduce, tp_group(l), cost::grad_bytes(l)};
  return s;
}

}  // namespace

LayerWork lower_layer(const Model& m, const Layout& l, const System& sys) {
  LayerWork lw;
  lower_layer_into(m, l, sys, lw);
  return lw;
}

KindWork lower_other_kinds(const Model& m, const Layout& l, const System& sys, const LayerWork& kind0,
                           std::array<LayerWork, kLayerKinds - 1>& others) {
  KindWork kinds{&kind0};
  for (int k = 1; k < kLayerKinds; ++k)
    if (has_layer_kind(m, k)) {
      LayerWork& other = others[static_cast<std::size_t>(k - 1)];
      lower_layer_into(kind_model(m, k), l, sys, other);
      kinds[static_cast<std::size_t>(k)] = &other;
    }
  return kinds;
}

Model dense_part(const Model& m) {
  Model d = m;
  d.moe = MoeSpec{};
  return d;
}

bool mixed_layers(const Model& m) { return m.moe.enabled() && !m.moe.dense_layers.empty(); }

namespace {
// A layer's parameters that tensor parallelism keeps whole on every tp rank: a MoE layer's norms (q/k norms
// included), router and shared-expert gate (Megatron-Core marks both weights sequence-parallel: their
// gradients are summed over tp); a dense layer's as the model counts them.
double replicated_layer_params(const Model& m) {
  const double gate = shared_gate_params(m);
  return m.moe.enabled() || m.mla.enabled()
             ? static_cast<double>(m.layer_norms * m.norm_params() + m.qk_norm_params() + m.router_params()) +
                   mla_duplicated_params(m) + gate
             : static_cast<double>(m.tp_replicated_params_per_layer());
}
}  // namespace

namespace {
// Multi-token prediction modules (DeepSeek-V3 Sec. 2.2; Megatron-Core's MultiTokenPredictionBlock, placed on
// the last pipeline stage): each looks up the next tokens' embeddings, RMSNorms them and the previous hidden
// state, projects their concatenation (2h -> h, column-parallel), runs one transformer layer of the model's
// last layer's kind and the shared output head with its own loss. Priced as that: the layer's work (`kind`),
// the projection GEMM, the norms and the lookup, and the head once more (its collectives not drawn).
void add_mtp(const Model& m, const Layout& l, const System& sys, const LayerWork& kind, StageWork& st) {
  const Dims d = dims_of(m, l);
  const double k = m.mtp_layers, e = d.elt;
  st.f += k * (kind.t_f + kind.t_tp_f + kind.t_cp_f);
  st.i += k * (kind.t_i + kind.t_tp_b + kind.t_cp_b);
  st.w += k * kind.t_w;
  st.tp_comm_f += k * kind.t_tp_f;
  st.tp_comm_b += k * kind.t_tp_b;
  st.ep_f += k * kind.t_ep_f;
  st.ep_b += k * kind.t_ep_b;
  st.flops_layers_f += k * kind.flops_model_f;
  st.flops_model += 3 * k * kind.flops_model_f;
  st.flops_hw += 3 * k * kind.flops_model_f;
  if (m.is_moe_layer(m.layers - 1)) st.moe_layers += static_cast<int>(k);
  WorkOp proj = gemm_op("mtp_proj", l.precision, {static_cast<std::int64_t>(d.tokens), static_cast<std::int64_t>(d.h / d.t),
                                                 static_cast<std::int64_t>(2 * d.h)});
  cost::price(proj, sys, l);
  // Embedding lookup (read + write), two norms and the concatenation, on the sequence shard.
  const double glue = (3.0 + 2 * 5.0 + 4.0) * e * d.xs;
  st.f += k * (proj.t_f + cost::memory_time(sys.gpu, glue, 4));
  st.i += k * (proj.t_i + cost::memory_time(sys.gpu, glue, 3));
  st.w += k * proj.t_w;
  st.flops_model += 3 * k * proj.flops_f;
  st.flops_hw += 3 * k * proj.flops_f;
  st.flops_layers_f += k * proj.flops_f;
  for (int i = 0; i < m.mtp_layers; ++i) {
    StageEdges scratch;
    add_head(m, l, sys, st, scratch);
  }
  const Model km = m.is_moe_layer(m.layers - 1) ? m : dense_part(m);
  st.params += k * (layer_params_per_gpu(km, l) + 2.0 * d.h * d.h / d.t + 3.0 * static_cast<double>(m.norm_params()));
  st.wide_params += k * (layer_wide_params_per_gpu(km, l) + 3.0 * static_cast<double>(m.norm_params()));
  st.expert_params += k * layer_expert_params_per_gpu(km, l);
  st.act_bytes += k * cost::stage_activation_bytes(km, l, 1, 0);
  st.act_extra_bytes += k * cost::stage_extra_activation_bytes(m, l, false, true);
  if (l.sequence_parallel && l.tp > 1) st.sp_grad_params += k * (replicated_layer_params(km) + 3.0 * static_cast<double>(m.norm_params()));
}
}  // namespace

StageWork stage_work(const Model& m, const Layout& l, const System& sys, const KindWork& kinds, int s, int layers,
                     StageEdges& first_edges, StageEdges& last_edges, int first_layer) {
  const int stages = l.num_stages();
  StageWork st;
  st.stage = s;
  st.layers = layers;
  if (l.recompute == Recompute::full) {
    st.recomputed_layers = l.recompute_layers > 0 && l.recompute_method == RecomputeMethod::block
                               ? std::min(st.layers, l.recompute_layers)
                               : st.layers;
  } else if (l.recompute == Recompute::selective) {
    st.recomputed_layers = st.layers;
  }
  // Each kind of layer (a MoE model's dense layers, windowed attention layers) counted with its own lowering.
  // The recomputed layers are the stage's first ones (Megatron's block method), so their kinds come from there.
  st.kind_layers = layer_kinds_in(m, first_layer, first_layer + layers);
  st.kind_recomputed = layer_kinds_in(m, first_layer, first_layer + st.recomputed_layers);
  for (int k = 0; k < kLayerKinds; ++k)
    TESSEL_CHECK(st.kind_layers[static_cast<std::size_t>(k)] == 0 || kinds[static_cast<std::size_t>(k)],
                 "stage " << s << " of " << m.name << " has layers of kind " << k << ": that kind's work is needed");
  // Sum over the kinds of per(kind's work) times a count per kind.
  const auto sum = [&](const std::array<int, kLayerKinds>& n, auto per) {
    double t = 0;
    for (std::size_t k = 0; k < kinds.size(); ++k)
      if (n[k] > 0) t += n[k] * per(*kinds[k]);
    return t;
  };
  const auto& n = st.kind_layers;
  const auto& r = st.kind_recomputed;
  st.moe_layers = m.moe.enabled() ? n[0] + n[2] : 0;
  st.recompute = sum(r, [](const LayerWork& x) { return x.t_recompute; });
  st.f = sum(n, [](const LayerWork& x) { return x.t_f + x.t_tp_f + x.t_cp_f; });
  st.i = sum(n, [](const LayerWork& x) { return x.t_i + x.t_tp_b + x.t_cp_b; }) + st.recompute;
  st.w = sum(n, [](const LayerWork& x) { return x.t_w; });
  st.tp_comm_f = sum(n, [](const LayerWork& x) { return x.t_tp_f; });
  st.tp_comm_b = sum(n, [](const LayerWork& x) { return x.t_tp_b; }) +
                 (l.recompute == Recompute::full ? sum(r, [](const LayerWork& x) { return x.t_tp_f; }) : 0);
  st.ep_f = sum(n, [](const LayerWork& x) { return x.t_ep_f; });
  st.ep_b = sum(n, [](const LayerWork& x) { return x.t_ep_b; }) +
            (l.recompute == Recompute::full ? sum(r, [](const LayerWork& x) { return x.t_ep_f; }) : 0);
  st.flops_layers_f = sum(n, [](const LayerWork& x) { return x.flops_model_f; });
  st.flops_model = 3 * st.flops_layers_f;
  st.flops_hw = st.flops_model + sum(r, [](const LayerWork& x) { return x.flops_hw_extra; });
  // Memory and parameters differ by the MLP only: a window changes no parameter, and no activation either
  // (flash attention keeps its output and log-sum-exp; the unfused path its whole masked score matrix).
  const int nd = n[1] + n[3], rd = r[1] + r[3], nf = layers - nd, rf = st.recomputed_layers - rd;
  const bool mixed = nd > 0;
  const Model dm = mixed ? dense_part(m) : m;
  st.act_bytes = cost::stage_activation_bytes(m, l, nf, rf) + (mixed ? cost::stage_activation_bytes(dm, l, nd, rd) : 0.0);
  st.params = nf * layer_params_per_gpu(m, l) + (mixed ? nd * layer_params_per_gpu(dm, l) : 0.0);
  st.expert_params = nf * layer_expert_params_per_gpu(m, l);
  st.wide_params = nf * layer_wide_params_per_gpu(m, l) + (mixed ? nd * layer_wide_params_per_gpu(dm, l) : 0.0);
  const double before_ends = st.params;
  const bool first = s == 0, last = s == stages - 1;
  if (l.sequence_parallel && l.tp > 1) {
    st.sp_grad_params = nf * replicated_layer_params(m) + (mixed ? nd * replicated_layer_params(dm) : 0.0) +
                        static_cast<double>(first ? m.tp_replicated_embedding_params() : 0) +
                        static_cast<double>(last ? m.tp_replicated_output_params() : 0);
  }
  if (first) {
    add_embedding(m, l, sys, st, first_edges, st.recompute);
    // The token table is split by vocabulary; learned positions are whole on every tp rank (Megatron).
    st.params += static_cast<double>(m.embedding_params() - m.tp_replicated_embedding_params()) / l.tp +
                 static_cast<double>(m.tp_replicated_embedding_params());
  }
  if (last) {
    add_head(m, l, sys, st, first ? first_edges : last_edges);
    st.params += static_cast<double>(m.output_params()) / l.tp;
    // A tied head on another rank keeps its own copy of the embedding (Megatron); untied: the head itself.
    // MTP modules read the token embedding too: the last stage keeps a copy of it (Megatron-Core).
    if ((m.tied_embeddings || m.mtp_layers > 0) && stages > 1) st.params += static_cast<double>(m.vocab) * m.hidden / l.tp;
  }
  // The embeddings and the head are not Transformer Engine's fp8 linear layers (the output layer runs in 16-bit:
  // add_head). The MTP modules (below) add their own.
  st.wide_params += st.params - before_ends;
  st.act_extra_bytes = cost::stage_extra_activation_bytes(m, l, first, last);
  if (last && m.mtp_layers > 0) {
    const LayerWork* kind = kinds[static_cast<std::size_t>(layer_kind(m, m.layers - 1))];
    TESSEL_CHECK(kind, "the MTP modules of " << m.name << " need the work of its last layer's kind");
    add_mtp(m, l, sys, *kind, st);
  }
  if (l.precision == Precision::fp8 && l.fp8_recipe == Fp8Recipe::delayed) {
    // Delayed scaling: when a micro-batch's forward leaves the stage's fp8 region (Megatron-Core wraps each
    // model chunk in one fp8_autocast) and when its backward finishes there, the amaxes of every fp8 GEMM of
    // the chunk are all-reduced in one buffer over the tensor-, context- and data-parallel ranks (Megatron's
    // amax reduction group; TE's fp8_delayed_scaling docs): 3 per GEMM forward (input, weight, output), 2
    // backward (the gradients), 4 bytes each. Small, so its latency is what it costs.
    const double gemms = sum(n, [](const LayerWork& x) {
      double c = 0;
      for (const WorkOp& op : x.ops) c += op.cls == OpClass::gemm && op.precision == Precision::fp8 ? 1.0 : 0.0;
      return c;
    });
    const cost::GroupPlacement amax_group{l.tp * l.cp * l.dp, 1, false, l.gpus()};
    if (gemms > 0 && amax_group.size > 1) {
      st.f += cost::collective_time(sys, Collective::all_reduce, 12.0 * gemms, amax_group).seconds;
      st.i += cost::collective_time(sys, Collective::all_reduce, 8.0 * gemms, amax_group).seconds;
    }
  }
  return st;
}

FbBlock fb_block(const StageWork& fwd, const StageWork& bwd, bool with_w, bool a2a_overlap) {
  FbBlock b;
  b.serial = fwd.f + bwd.i + (with_w ? bwd.w : 0.0);
  if (a2a_overlap) {
    // Crossed: the forward's all-to-alls under the backward's compute, the backward's under the forward's
    // (compute: a part less its TP and EP collectives, which tp_comm_* hold).
    const double fwd_compute = fwd.f - fwd.tp_comm_f, bwd_compute = bwd.i + (with_w ? bwd.w : 0.0) - bwd.tp_comm_b;
    b.hidden = std::min(fwd.ep_f, std::max(0.0, bwd_compute)) + std::min(bwd.ep_b, std::max(0.0, fwd_compute));
  }
  return b;
}

Workload lower(const Model& m, const Layout& l, const System& sys, const LayerWork* layer) {
  check_layout(l, m, 0);
  Workload w;
  w.model = m;
  w.layout = l;
  if (layer) {
    w.layer = *layer;
  } else {
    lower_layer_into(m, l, sys, w.layer);
  }
  const KindWork kinds = lower_other_kinds(m, l, sys, w.layer, w.other_kinds);
  const Dims d = dims_of(m, l);
  w.tokens_per_mb = d.b * d.s;
  // Adjacent pipeline stages exchange one activation [b, s/cp, h]; with SP (or Megatron's scatter/gather
  // optimisation) each TP rank sends its 1/t slice (Narayanan et al. Sec. 4.1).
  w.p2p.bytes = l.pp > 1 ? d.elt * d.x / d.t : 0.0;
  w.p2p.distance = l.tp * l.cp * l.dp;
  w.p2p.total = l.gpus();
  w.sync = step_sync(m, l);

  // A middle stage's work depends on its layers' count and kinds only; with one kind of layer (most models)
  // a middle stage of as many layers as the last one built is that one again (explore lowers pp x vpp stages,
  // up to 128, for every layout).
  const bool one_kind = one_layer_kind(m);
  const int S = l.num_stages();
  w.stages.reserve(static_cast<std::size_t>(S));
  for (int s = 0, first = 0, middle = -1; s < S; ++s) {
    const int n = l.layers_of_stage(s, m.layers);  // first: the running sum, not first_layer_of_stage's O(s) walk
    const bool edge = s == 0 || s == S - 1;
    if (one_kind && !edge && middle >= 0 && w.stages[static_cast<std::size_t>(middle)].layers == n) {
      w.stages.push_back(w.stages[static_cast<std::size_t>(middle)]);
      w.stages.back().stage = s;
    } else {
      w.stages.push_back(stage_work(m, l, sys, kinds, s, n, w.first_edges, w.last_edges, first));
      if (!edge) middle = s;
    }
    first += n;
  }
  // fp8 GEMM weights gather at their own bytes (cost::fp8_gemm_gather_bytes), the rest at the 16-bit weight's.
  if (l.precision == Precision::fp8) {
    const double share = fp8_gemm_share(w), wb = cost::weight_bytes(l.precision), gb = cost::fp8_gemm_gather_bytes(l);
    if (w.sync.param_gather.bytes_per_param > 0) w.sync.param_gather.bytes_per_param = (1 - share) * wb + share * gb;
    if (w.sync.expert_param_gather.bytes_per_param > 0) w.sync.expert_param_gather.bytes_per_param = gb;
  }
  return w;
}

}  // namespace tessel
