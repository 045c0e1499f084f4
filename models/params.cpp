// Parameter counts of a Model: per part, per layer, total, active (per token) and the MTP modules'. Every
// count is an exact integer; check_model_size (model.cpp) bounds a model to 10^15 parameters before anything
// counts it, so no int64 product here overflows.
#include <algorithm>

#include "models/model.hpp"

namespace tessel {

namespace {
using i64 = std::int64_t;

// A norm over `width` features: RMSNorm has a weight, LayerNorm a weight and a bias.
i64 norm_of(const Model& m, i64 width) { return m.norm == Norm::layernorm ? 2 * width : width; }

// An MLP of inner width w around `hidden`: two matrices, or three when gated (gate, up, down); biases on
// each output (gated: gate and up of w each, down of h; ungated: up of w, down of h).
i64 mlp_of(const Model& m, i64 w, bool bias) {
  const i64 h = m.hidden;
  const bool gated = m.activation == Activation::swiglu;
  i64 p = (gated ? 3 : 2) * h * w;
  if (bias) p += (gated ? 2 * w : w) + h;
  return p;
}

// Multi-head latent attention as DeepSeek-V2 (arXiv:2405.04434 eqs. 9-14) and HF's DeepseekV2Attention
// build it: q = W_qb norm(W_qa x) (or W_q x without a query bottleneck), the latent [c_kv, k_rope] = W_kva x,
// [k_nope, v] per head = W_kvb norm(c_kv), out = W_o v. The down-projections q_a and kv_a take the
// attention bias (HF attention_bias), the output projection the out bias; the up-projections have none.
i64 mla_attention(const Model& m) {
  const i64 h = m.hidden, H = m.heads, dn = m.mla.qk_nope_head_dim, dr = m.mla.qk_rope_head_dim;
  const i64 dv = m.mla.v_head_dim, qr = m.mla.q_lora_rank, kvr = m.mla.kv_lora_rank;
  const bool in_bias = m.has_qkv_bias();
  i64 q = qr > 0 ? h * qr + (in_bias ? qr : 0) + norm_of(m, qr) + qr * H * (dn + dr) : h * H * (dn + dr);
  i64 kv = h * (kvr + dr) + (in_bias ? kvr + dr : 0) + norm_of(m, kvr) + kvr * H * (dn + dv);
  i64 out = H * dv * h + (m.has_out_bias() ? h : 0);
  return q + kv + out;
}
}  // namespace

bool Model::is_moe_layer(int i) const {
  return moe.enabled() && !std::binary_search(moe.dense_layers.begin(), moe.dense_layers.end(), i);
}

int Model::moe_layer_count() const {
  return moe.enabled() ? layers - static_cast<int>(moe.dense_layers.size()) : 0;
}

int Model::window_of_layer(int i) const {
  return std::binary_search(window_layers.begin(), window_layers.end(), i) ? sliding_window : 0;
}

i64 Model::norm_params() const { return norm_of(*this, hidden); }

// Qwen3's q_norm and k_norm: one norm over head_dim each, shared by all heads (Qwen3Attention); OLMoE's
// cover the whole projections (OlmoeAttention: q_norm over hidden_size, k_norm over kv_heads x head_dim).
i64 Model::qk_norm_params() const {
  if (!qk_norm) return 0;
  if (qk_norm_whole) return norm_of(*this, i64(heads) * head_dim) + norm_of(*this, i64(kv_heads) * head_dim);
  return 2 * norm_of(*this, head_dim);
}

// Multi-head or grouped-query attention: Q (h x heads*head_dim), K and V (h x kv_heads*head_dim each), the
// output projection, their biases and the q/k norms; with MLA its own projections. Sinks: one per head.
// With kv_dim == h and biases this is 4h^2 + 4h, the attention of Narayanan et al. eq. 2.
i64 Model::attention_params() const {
  i64 a = 0;
  if (mla.enabled()) {
    a = mla_attention(*this);
  } else {
    const i64 h = hidden, q_dim = i64(heads) * head_dim, kv_dim = i64(kv_heads) * head_dim;
    a = h * (q_dim + 2 * kv_dim) + q_dim * h + qk_norm_params();
    if (has_qkv_bias()) a += q_dim + 2 * kv_dim;
    if (has_out_bias()) a += h;
  }
  return a + (attention_sinks ? heads : 0);
}

i64 Model::dense_mlp_params() const { return mlp_of(*this, ffn, has_mlp_bias()); }

i64 Model::expert_params() const { return moe.enabled() ? mlp_of(*this, moe.expert_ffn, moe.expert_bias) : 0; }

// HF DeepseekV2MLP (the shared experts) takes mlp_bias like the dense MLP; Megatron's SharedExpertMLP refuses
// biases; Qwen2-MoE's shared_expert_gate is a Linear(hidden, 1) without bias.
i64 Model::shared_expert_params() const {
  if (moe.shared_ffn == 0) return 0;
  return mlp_of(*this, moe.shared_ffn, has_mlp_bias()) + (moe.shared_gate ? hidden : 0);
}

i64 Model::router_params() const {
  if (!moe.enabled()) return 0;
  return i64(moe.experts) * hidden + (moe.router.logit_bias ? moe.experts : 0);
}

i64 Model::moe_mlp_params() const {
  return i64(moe.experts) * expert_params() + shared_expert_params() + router_params();
}

// Per layer: attention, the MLP, and the norms (two per block unless layer_norms says otherwise). With
// kv_dim == h, biases everywhere and two LayerNorms this is 12h^2 + 13h, the per-layer term of Narayanan et
// al. eq. 2.
i64 Model::params_per_layer() const {
  TESSEL_CHECK(!moe.enabled(), "model " << name << " is a mixture of experts: its layers differ (use layer_params(i))");
  return attention_params() + dense_mlp_params() + layer_norms * norm_params();
}

i64 Model::layer_params(int i) const {
  TESSEL_CHECK(i >= 0 && i < layers, "layer " << i << " of " << layers);
  return attention_params() + layer_norms * norm_params() + (is_moe_layer(i) ? moe_mlp_params() : dense_mlp_params());
}

i64 Model::active_layer_params(int i) const {
  const i64 all = layer_params(i);
  return is_moe_layer(i) ? all - i64(moe.experts - moe.top_k) * expert_params() : all;
}

i64 Model::tp_replicated_params_per_layer() const {
  TESSEL_CHECK(!moe.enabled() && !mla.enabled(), "model " << name << ": " << beyond_dense());
  return layer_norms * norm_params() + qk_norm_params() + (has_out_bias() ? i64(hidden) : 0) +
         (has_mlp_bias() ? i64(hidden) : 0);
}

i64 Model::tp_replicated_embedding_params() const {
  i64 r = position == PositionEmbedding::learned ? i64(position_rows()) * hidden : 0;
  return r + (embedding_norm ? norm_params() : 0);
}

i64 Model::tp_replicated_output_params() const { return norm_params(); }

i64 Model::embedding_params() const {
  i64 e = i64(vocab) * hidden;
  if (position == PositionEmbedding::learned) e += i64(position_rows()) * hidden;
  if (embedding_norm) e += norm_params();
  return e;
}

i64 Model::output_params() const {
  i64 head = tied_embeddings ? 0 : i64(vocab) * hidden + (head_bias ? vocab : 0);
  return norm_params() + head;
}

// Layers of one kind are alike, so the sum over layers is a count of each kind times its size.
i64 Model::total_params() const {
  const i64 edges = embedding_params() + output_params();
  if (!moe.enabled()) return layers * params_per_layer() + edges;
  const i64 common = attention_params() + layer_norms * norm_params();
  const i64 n_moe = moe_layer_count(), n_dense = layers - n_moe;
  return n_dense * (common + dense_mlp_params()) + n_moe * (common + moe_mlp_params()) + edges;
}

i64 Model::active_params() const {
  return total_params() - i64(moe_layer_count()) * (moe.experts - moe.top_k) * expert_params();
}

// DeepSeek-V3 Sec. 2.2 (eq. 21) and Megatron's MultiTokenPredictionLayer: enorm and hnorm, eh_proj (2h -> h,
// no bias), the transformer layer, and the norm before the shared output head (DeepSeek's checkpoint:
// shared_head.norm; Megatron: final_layernorm).
i64 Model::mtp_params() const {
  if (mtp_layers == 0) return 0;
  const i64 h = hidden;
  return mtp_layers * (3 * norm_params() + 2 * h * h + layer_params(layers - 1));
}

i64 Model::mtp_active_params() const {
  if (mtp_layers == 0) return 0;
  const i64 h = hidden;
  return mtp_layers * (3 * norm_params() + 2 * h * h + active_layer_params(layers - 1));
}

}  // namespace tessel
