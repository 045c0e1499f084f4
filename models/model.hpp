// Model: the shape of the transformer being trained. Parsed once from JSON (strict keys); presets are
// embedded JSON files in models/presets/, each stating its parameter count and source.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/util/json_reader.hpp"

namespace tessel {

enum class Activation { gelu, swiglu };
enum class Norm { layernorm, rmsnorm };
enum class PositionEmbedding { learned, rotary };

struct Model {
  std::string name;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;          // == heads without GQA
  int head_dim = 0;          // hidden / heads unless given
  int ffn = 0;               // MLP inner size (per branch for SwiGLU)
  int vocab = 0;
  int seq_len = 0;
  Activation activation = Activation::gelu;
  Norm norm = Norm::layernorm;
  PositionEmbedding position = PositionEmbedding::learned;
  // Rotary base theta: inv_freq_j = theta^(-2j/head_dim) (Su et al. 2021 eq. 15). 10000 in RoFormer and
  // Llama 2, 500000 in Llama 3 (its config.json rope_theta). Used only when position == rotary.
  double rope_theta = 10000.0;
  bool tied_embeddings = true;
  bool bias = true;          // linear-layer biases (GPT: yes, Llama: no)
  bool dropout = true;       // dropout after attention and MLP (its masks count in activation memory)
  double stated_params_b = 0;  // the source's parameter count in billions (0 = not stated)

  // Parameter counts, exact for the architecture described here.
  std::int64_t params_per_layer() const;
  std::int64_t embedding_params() const;   // token (+ learned position) embedding
  std::int64_t output_params() const;      // LM head (0 when tied) + final norm
  std::int64_t total_params() const;

  // Of those, the ones tensor parallelism keeps whole on every tp rank (Megatron's layout): the norms, the
  // row-parallel biases (attention output, second MLP matrix), learned positions. Under sequence parallelism
  // each rank's gradient of them covers only its own tokens, so the step all-reduces them over tp.
  std::int64_t norm_params() const;                     // one norm: weight (+ bias for LayerNorm)
  std::int64_t tp_replicated_params_per_layer() const;  // two norms + two row-parallel biases
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

// Strict parse of a model object; `where` names the file for messages.
Model parse_model(const Json& j, const std::string& where);
Json model_to_json(const Model& m);

// A preset name ("gpt3-175b") or a path to a JSON file. InputError lists the presets when neither.
Model load_model(const std::string& name_or_path);
std::vector<std::string> model_preset_names();

// Importers. HuggingFace config.json (Llama/GPT-2/Mistral-style keys) and a Megatron-LM command line.
Model import_hf_config(const Json& j, const std::string& where);
Model import_megatron_args(const std::vector<std::string>& argv, const std::string& where);

}  // namespace tessel
