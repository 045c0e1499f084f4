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

struct Model {
  std::string name;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;          // == heads without GQA
  int head_dim = 0;          // hidden / heads unless given
  int ffn = 0;               // MLP inner size (per branch for SwiGLU)
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
  bool dropout = true;       // dropout after attention and MLP (its masks count in activation memory)
  double stated_params_b = 0;  // the source's parameter count in billions (0 = not stated)

  int position_rows() const { return max_positions > 0 ? max_positions : seq_len; }
  bool has_qkv_bias() const { return qkv_bias.value_or(bias); }
  bool has_out_bias() const { return out_bias.value_or(bias); }
  bool has_mlp_bias() const { return mlp_bias.value_or(bias); }

  // Parameter counts, exact for the architecture described here.
  std::int64_t params_per_layer() const;
  std::int64_t embedding_params() const;   // token (+ learned position) embedding
  std::int64_t output_params() const;      // LM head (0 when tied) + final norm
  std::int64_t total_params() const;

  // Of those, the ones tensor parallelism keeps whole on every tp rank (Megatron's layout): the norms, the
  // row-parallel biases (attention output, second MLP matrix), learned positions. Under sequence parallelism
  // each rank's gradient of them covers only its own tokens, so the step all-reduces them over tp.
  std::int64_t norm_params() const;                     // one norm: weight (+ bias for LayerNorm)
  std::int64_t qk_norm_params() const;                  // the q and k norms of one layer (0 without qk_norm)
  std::int64_t tp_replicated_params_per_layer() const;  // the norms + the row-parallel biases
  std::int64_t tp_replicated_embedding_params() const;  // learned positions (the token table is split)
  std::int64_t tp_replicated_output_params() const;     // the final norm (the head is split)
};

std::string to_string(Activation a);
std::string to_string(Norm n);
std::string to_string(PositionEmbedding p);

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
