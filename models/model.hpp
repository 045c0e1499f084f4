// Model: the shape of the transformer being trained. Parsed once from JSON (strict keys); presets are
// embedded JSON files in models/presets/, each stating its parameter count and source.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/json_reader.hpp"

namespace tessel {

enum class Activation { gelu, swiglu };
enum class Norm { layernorm, rmsnorm };
// learned: a table of max_positions rows added to the token embeddings (GPT-2, OPT, GPTBigCode); rotary:
// RoPE inside attention (Llama, GPT-NeoX, GPT-J, Falcon); alibi: a fixed linear bias on the attention scores
// (Press et al. 2022; BLOOM, Falcon with "alibi": true). rotary and alibi have no parameters, and their
// FLOPs are pointwise (Tessel's GEMM and attention FLOPs do not change with them).
enum class PositionEmbedding { learned, rotary, alibi };

// How a router turns each token's expert logits into the weights of the experts it picks: a softmax over
// all experts (Mixtral, Qwen-MoE, OLMoE, GPT-OSS, DeepSeek-V2) or an independent sigmoid per expert
// (DeepSeek-V3, arXiv:2412.19437 eq. 15).
enum class RouterScore { softmax, sigmoid };

// The router of a mixture-of-experts layer. Its one weight matrix (experts x hidden) is counted in
// Model::router_params(); the fields below change what it computes, not its size, except logit_bias.
struct RouterSpec {
  RouterScore score = RouterScore::softmax;
  // The k chosen weights are divided by their sum (HF norm_topk_prob). Mixtral renormalises always;
  // GPT-OSS's softmax over the k chosen logits and Megatron's default top-k-then-softmax are the same.
  bool normalize_top_k = true;
  double scale = 1.0;            // multiplies the routed experts' weights (routed_scaling_factor; V3: 2.5)
  // Group-limited routing (DeepSeek-V2 Sec. 2.1.3, V3 Sec. 2.1.2): the experts form `groups` equal groups,
  // each token first keeps the `group_top_k` best groups, then picks its top_k experts inside them. 1/1: off.
  int groups = 1;
  int group_top_k = 1;
  // Auxiliary-loss-free balancing (DeepSeek-V3 Sec. 2.1.2): a per-expert bias added to the scores only to
  // choose experts, moved by a fixed step after each batch. No gradient trains it, so it is not counted as a
  // parameter (HF keeps it as a buffer, e_score_correction_bias; the CPU runtime keeps it beside its
  // parameters as a non-trainable tensor so that checkpoints carry it). Needs sigmoid scores.
  bool selection_bias = false;
  // The selection bias's step after each batch: b_e += rate * sign(mean load - load_e) (Megatron-Core's
  // --moe-router-bias-update-rate, default 1e-3, DeepSeek-V3's gamma 0.001 for most of its run).
  double bias_update_rate = 1e-3;
  bool logit_bias = false;       // a learned bias on the router's logits (GPT-OSS): `experts` more parameters
  double aux_loss_coef = 0;      // weight of the load-balancing loss in training (HF router_aux_loss_coef)
};

// Mixture of experts (Shazeer et al. 2017; Fedus et al. 2021): a MoE layer replaces the dense MLP by
// `experts` routed MLPs of width expert_ffn, of which each token uses top_k, plus shared MLPs every token
// passes through (DeepSeekMoE, arXiv:2401.06066). Routed and shared MLPs have the model's activation (gated
// or not) and its mlp bias rule; routed experts have biases only with expert_bias.
struct MoeSpec {
  int experts = 0;               // routed experts of each MoE layer; 0: no mixture of experts
  int top_k = 0;                 // routed experts each token uses
  int expert_ffn = 0;            // one routed expert's MLP width (HF moe_intermediate_size)
  int shared_experts = 0;        // the source's count of shared experts (informative; counts use shared_ffn)
  // The shared experts' total width: DeepSeek, Qwen2-MoE and Megatron all run them as one MLP this wide
  // (Megatron's --moe-shared-expert-intermediate-size; DeepSeek: n_shared_experts x moe_intermediate_size).
  int shared_ffn = 0;
  bool shared_gate = false;      // Qwen2-MoE: sigmoid(x . g) scales the shared output; g has `hidden` weights
  bool expert_bias = false;      // the routed experts' linear layers have biases (GPT-OSS)
  // Ascending indices of the layers whose MLP is the dense one of Model::ffn (DeepSeek's first
  // first_k_dense_replace layers; Qwen's mlp_only_layers and decoder_sparse_step; Megatron's
  // --moe-layer-freq); every other layer is a MoE layer.
  std::vector<int> dense_layers;
  RouterSpec router;

  bool enabled() const { return experts > 0; }
};

// Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 Sec. 2.1): queries through a low-rank
// bottleneck (q_lora_rank; 0: projected directly, as DeepSeek-V2-Lite), keys and values through a shared
// latent of kv_lora_rank, expanded per head to a non-rotary part (qk_nope_head_dim) and values (v_head_dim);
// one rotary key part of qk_rope_head_dim is shared by all heads. Each bottleneck has an RMSNorm.
struct MlaSpec {
  int q_lora_rank = 0;
  int kv_lora_rank = 0;          // 0: the model has no MLA
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;

  bool enabled() const { return kv_lora_rank > 0; }
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

struct Model {
  std::string name;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;          // == heads without GQA
  int head_dim = 0;          // hidden / heads unless given
  int ffn = 0;               // MLP inner size (per branch for SwiGLU); in a MoE model its dense layers' MLP
  int vocab = 0;
  int seq_len = 0;           // the training sequence length
  // Learned positions: the rows of the position table, the longest sequence the model can take (GPT-2's
  // n_positions). 0: the table follows seq_len (Tessel model files without the key, Megatron's
  // --max-position-embeddings == --seq-length). Use position_rows().
  int max_positions = 0;
  Activation activation = Activation::gelu;
  Norm norm = Norm::layernorm;
  PositionEmbedding position = PositionEmbedding::learned;
  // Rotary base theta: inv_freq_j = theta^(-2j/head_dim) (Su et al. 2021 eq. 15). 10000 in RoFormer and
  // Llama 2, 500000 in Llama 3 (its config.json rope_theta). Used only when position == rotary.
  double rope_theta = 10000.0;
  bool tied_embeddings = true;
  bool bias = true;          // linear-layer biases of a block (GPT: yes, Llama: no); the three below refine it
  // Per group, where a family differs from `bias` (unset: as `bias`): q/k/v projections (Qwen2: yes while
  // o_proj and the MLP have none), the attention output projection, the MLP's matrices (GPT-J: MLP only).
  std::optional<bool> qkv_bias, out_bias, mlp_bias;
  bool head_bias = false;    // the untied LM head has a bias (GPT-J, Phi-1/2)
  int layer_norms = 2;       // norms per block: 2 (pre-LN), 1 (GPT-J, Phi, Falcon-7B: one norm feeds the
                             // parallel attention and MLP), 4 (Gemma 2: pre and post norms around each)
  bool embedding_norm = false;  // a norm right after the token embedding (BLOOM's word_embeddings_layernorm)
  bool qk_norm = false;      // RMSNorm over head_dim on queries and keys (Qwen3's q_norm, k_norm)
  // With qk_norm: one norm over the whole query projection (heads x head_dim) and one over the keys
  // (kv_heads x head_dim) instead of one over head_dim shared by the heads (OLMoE's q_norm, k_norm).
  bool qk_norm_whole = false;
  bool dropout = true;       // dropout after attention and MLP (its masks count in activation memory)
  double stated_params_b = 0;  // the source's parameter count in billions (0 = not stated)
  double stated_active_params_b = 0;  // the source's active (per-token) count in billions (0 = not stated)

  // Beyond the dense transformer. The cost model, simulator and runtimes do not price or run these yet:
  // beyond_dense() names what a model uses, and their entry points refuse such a model.
  MoeSpec moe;
  MlaSpec mla;               // with MLA, head_dim = mla.qk_head_dim() and kv_heads = heads
  // Multi-token prediction modules (DeepSeek-V3 Sec. 2.2; Megatron --mtp-num-layers): module k predicts
  // token i+k+1 from module k-1's hidden state and token i+k's embedding. Each has two RMSNorms (of that
  // hidden state and of the embedding), a projection of their concatenation (2h x h, no bias), one
  // transformer layer of the kind of the model's last layer, and a norm before the output head; the
  // embedding and the output head are the main model's. Not part of total_params(): see mtp_params().
  int mtp_layers = 0;
  // Sliding-window attention on some layers (GPT-OSS: every other layer, 128 tokens): a windowed layer's
  // query attends to the last sliding_window positions (itself included) instead of all earlier ones.
  int sliding_window = 0;
  std::vector<int> window_layers;  // ascending indices of the windowed layers
  // Attention sinks (GPT-OSS): one learned logit per head joins every softmax's denominator (no value).
  bool attention_sinks = false;

  int position_rows() const { return max_positions > 0 ? max_positions : seq_len; }
  bool has_qkv_bias() const { return qkv_bias.value_or(bias); }
  bool has_out_bias() const { return out_bias.value_or(bias); }
  bool has_mlp_bias() const { return mlp_bias.value_or(bias); }

  // Layer kinds. Layer i (0-based) of a model with moe.enabled() is a MoE layer unless moe.dense_layers
  // lists it; every layer of a model without MoE is dense.
  bool is_moe_layer(int i) const;
  int moe_layer_count() const;
  int window_of_layer(int i) const;        // tokens a layer's query sees: sliding_window or 0 (all earlier)
  // "" for a dense transformer; otherwise what the model has beyond it, in words ("mixture of experts (8
  // experts, top-2), ..."), for the messages of the parts that do not model it yet. A sliding window at least
  // as long as the sequence is not beyond: every query sees all earlier positions.
  std::string beyond_dense() const;

  // Parameter counts, exact for the architecture described here (tests/models/hf_moe_test.cpp checks them
  // against HF transformers' classes).
  // One layer of a model whose layers are all alike: a model without MoE. A MoE model's layers differ and
  // its experts are sharded differently from the rest (expert parallelism): TESSEL_CHECK fails, use
  // layer_params(i) and the parts below.
  std::int64_t params_per_layer() const;
  std::int64_t layer_params(int i) const;        // layer i: attention + its norms + dense or MoE MLP
  std::int64_t active_layer_params(int i) const; // of those, what one token uses (top_k routed experts)
  std::int64_t attention_params() const;  // one layer's attention: projections, biases, q/k or MLA norms, sinks
  std::int64_t dense_mlp_params() const;  // the dense MLP of width ffn, with its biases
  std::int64_t expert_params() const;     // one routed expert's MLP (0 without MoE)
  std::int64_t shared_expert_params() const;  // a MoE layer's shared experts together, with their gate
  std::int64_t router_params() const;     // a MoE layer's router: experts x hidden (+ logit bias)
  std::int64_t moe_mlp_params() const;    // a MoE layer's MLP: every routed expert, the shared ones, router
  std::int64_t embedding_params() const;   // token (+ learned position) embedding
  std::int64_t output_params() const;      // LM head (0 when tied) + final norm
  // The main model: embedding, layers, output; the MTP modules are not in it (as DeepSeek-V3 states 671B
  // and HF builds it), because they are a training objective that inference can drop.
  std::int64_t total_params() const;
  // What one token's forward pass uses: total_params() less, on each MoE layer, the experts - top_k routed
  // experts it does not reach. The embedding table and head count whole, as Mistral, Qwen and OLMoE state
  // theirs; DeepSeek and OpenAI state active counts without the input embedding (presets say which).
  std::int64_t active_params() const;
  // The MTP modules' own parameters (norms, projection, layer), embedding and head excluded (they are
  // shared); a training run holds total_params() + mtp_params(). mtp_active_params(): with top_k experts.
  std::int64_t mtp_params() const;
  std::int64_t mtp_active_params() const;

  // Of those, the ones tensor parallelism keeps whole on every tp rank (Megatron's layout): the norms, the
  // row-parallel biases (attention output, second MLP matrix), learned positions. Under sequence parallelism
  // each rank's gradient of them covers only its own tokens, so the step all-reduces them over tp.
  std::int64_t norm_params() const;                     // one norm: weight (+ bias for LayerNorm)
  std::int64_t qk_norm_params() const;                  // the q and k norms of one layer (0 without qk_norm)
  // The norms + the row-parallel biases; defined for the dense attention and MLP only (TESSEL_CHECK fails
  // with MoE or MLA, whose replication under tensor parallelism is the cost model's to define).
  std::int64_t tp_replicated_params_per_layer() const;
  std::int64_t tp_replicated_embedding_params() const;  // learned positions (the token table is split)
  std::int64_t tp_replicated_output_params() const;     // the final norm (the head is split)
};

std::string to_string(Activation a);
std::string to_string(Norm n);
std::string to_string(PositionEmbedding p);
std::string to_string(RouterScore s);

// The names of the keys that set the MoE, MLA and window fields, in the format being read (a Tessel model
// file by default; the importers pass their own: num_local_experts, --moe-router-topk, ...), so that a rule
// broken between two fields is reported with the keys the user wrote.
struct BeyondDenseKeys {
  std::string experts = "moe.experts", top_k = "moe.top_k", expert_ffn = "moe.expert_ffn";
  std::string shared_experts = "moe.shared_experts", shared_ffn = "moe.shared_ffn", shared_gate = "moe.shared_gate";
  std::string dense_layers = "moe.dense_layers", groups = "moe.router.groups", group_top_k = "moe.router.group_top_k";
  std::string score = "moe.router.score", selection_bias = "moe.router.selection_bias";
  std::string mla = "mla", mtp_layers = "mtp_layers", sliding_window = "sliding_window";
  std::string window_layers = "window_layers";
};
// The rules between those fields and the rest of the model (top_k <= experts, groups divide the experts,
// dense layers within the model and not all of it, MLA's head_dim and kv_heads, rotary positions for MLA,
// ...): InputError naming `where`, the key, its value and the rule.
void check_beyond_dense(const Model& m, const std::string& where, const BeyondDenseKeys& keys = {});

// Every dimension is bounded on its own, but parameter counts multiply them in int64: a model of more than
// 10^15 parameters (about 2500x Llama 3 405B, the largest dense preset) is rejected with an InputError naming
// `where` before anything counts it. The parsers and importers below call it.
void check_model_size(const Model& m, const std::string& where);

// InputError naming `where`, `key` (the file's name for the table's rows), the rows and the sequence length
// when a learned position table is shorter than the sequence.
void check_learned_positions(const Model& m, const std::string& where, const std::string& key);

// Strict parse of a model object; `where` names the file for messages.
Model parse_model(const Json& j, const std::string& where);
Json model_to_json(const Model& m);

// A preset name ("gpt3-175b") or a path to a JSON file (a Tessel model, a HuggingFace config.json, or a
// Megatron-LM argument file). `seq_len` (the --seq flag) overrides the model's sequence length; the result is
// checked against what the model can take (a learned position table's rows, an attention window): an
// InputError names the file, the key, the value and the sequence length otherwise.
Model load_model(const std::string& name_or_path, std::optional<std::int64_t> seq_len = std::nullopt);
std::vector<std::string> model_preset_names();
// Whether load_model reads `j` as a HuggingFace config.json (by its keys) rather than a Tessel model object.
bool is_hf_config(const Json& j);

// Importers. HuggingFace config.json (Llama/GPT-2/Mistral-style keys) and a Megatron-LM command line.
// `seq_len`: as load_model's; without it the config's max_position_embeddings (or its family's default).
Model import_hf_config(const Json& j, const std::string& where, std::optional<std::int64_t> seq_len = std::nullopt);
Model import_megatron_args(const std::vector<std::string>& argv, const std::string& where);

// Megatron-LM's flags for an uneven pipeline split (megatron/training/arguments.py; their rules are
// megatron/core/transformer/transformer_block.py get_num_layers_to_build, which sim/stage_split.cpp follows).
struct MegatronPipelineSplit {
  std::optional<int> first_stage_layers;  // --decoder-first-pipeline-num-layers
  std::optional<int> last_stage_layers;   // --decoder-last-pipeline-num-layers
  bool account_for_embedding = false;     // --account-for-embedding-in-pipeline-split
  bool account_for_loss = false;          // --account-for-loss-in-pipeline-split
  bool any() const { return first_stage_layers || last_stage_layers || account_for_embedding || account_for_loss; }
};
MegatronPipelineSplit import_megatron_pipeline_split(const std::vector<std::string>& argv, const std::string& where);
// The flags of `name_or_path` when it is a Megatron-LM argument file (as load_model reads one), else none.
std::optional<MegatronPipelineSplit> load_megatron_pipeline_split(const std::string& name_or_path);

}  // namespace tessel
