// HuggingFace config.json -> Model. The file is a foreign format with many keys Tessel does not model
// (dropout, rope scaling, token ids); those are ignored, but every key Tessel needs must be present and valid.
#include <cmath>

#include "models/model.hpp"

namespace tessel {

namespace {
std::int64_t need_int(const Json& j, const std::string& where, std::initializer_list<const char*> keys,
                      std::int64_t min, std::int64_t max) {
  for (const char* k : keys) {
    if (!j.contains(k) || j.at(k).is_null()) continue;
    const Json& v = j.at(k);
    if (!v.is_number_integer() || v.get<std::int64_t>() < min || v.get<std::int64_t>() > max)
      throw InputError(where + ": " + k + ": value " + json_brief(v) + " must be an integer in [" +
                       std::to_string(min) + ", " + std::to_string(max) + "]");
    return v.get<std::int64_t>();
  }
  std::string names;
  for (const char* k : keys) names += (names.empty() ? "" : " or ") + std::string(k);
  throw InputError(where + ": missing required key " + names);
}
}  // namespace

Model import_hf_config(const Json& j, const std::string& where) {
  if (!j.is_object()) throw InputError(where + ": a HuggingFace config must be a JSON object");
  Model m;
  m.name = j.contains("_name_or_path") && j["_name_or_path"].is_string() ? j["_name_or_path"].get<std::string>()
           : j.contains("model_type") && j["model_type"].is_string()   ? j["model_type"].get<std::string>()
                                                                       : std::string("hf-model");
  m.layers = static_cast<int>(need_int(j, where, {"num_hidden_layers", "n_layer"}, 1, 100000));
  m.hidden = static_cast<int>(need_int(j, where, {"hidden_size", "n_embd"}, 1, 1 << 24));
  m.heads = static_cast<int>(need_int(j, where, {"num_attention_heads", "n_head"}, 1, 1 << 16));
  m.kv_heads = m.heads;
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null())
    m.kv_heads = static_cast<int>(need_int(j, where, {"num_key_value_heads"}, 1, 1 << 16));
  m.vocab = static_cast<int>(need_int(j, where, {"vocab_size"}, 1, 1 << 24));
  m.seq_len = static_cast<int>(need_int(j, where, {"max_position_embeddings", "n_positions"}, 1, 1 << 24));
  std::string act = j.contains("hidden_act") && j["hidden_act"].is_string() ? j["hidden_act"].get<std::string>()
                    : j.contains("activation_function") && j["activation_function"].is_string()
                        ? j["activation_function"].get<std::string>()
                        : std::string("gelu");
  bool gated = act == "silu" || act == "swiglu" || act == "swish";
  if (!gated && act.rfind("gelu", 0) != 0 && act != "relu")
    throw InputError(where + ": hidden_act: value \"" + act + "\" is not supported (silu, gelu*)");
  m.activation = gated ? Activation::swiglu : Activation::gelu;
  if (j.contains("intermediate_size") || j.contains("n_inner")) {
    bool has_inner = (j.contains("intermediate_size") && !j["intermediate_size"].is_null()) ||
                     (j.contains("n_inner") && !j["n_inner"].is_null());
    m.ffn = has_inner ? static_cast<int>(need_int(j, where, {"intermediate_size", "n_inner"}, 1, 1 << 24)) : 4 * m.hidden;
  } else {
    m.ffn = 4 * m.hidden;  // GPT-2 configs leave n_inner null: 4h
  }
  bool rms = j.contains("rms_norm_eps");
  m.norm = rms ? Norm::rmsnorm : Norm::layernorm;
  m.position = j.contains("rope_theta") || j.value("model_type", "") == "llama" || j.value("model_type", "") == "mistral"
                   ? PositionEmbedding::rotary
                   : PositionEmbedding::learned;
  // rope_theta: the rotary base (Llama 3 configs: 500000); absent means the RoFormer/Llama 2 default 10000.
  if (m.position == PositionEmbedding::rotary && j.contains("rope_theta") && !j["rope_theta"].is_null()) {
    const Json& t = j["rope_theta"];
    if (!t.is_number() || !(t.get<double>() >= 1.0 && t.get<double>() <= 1e12))
      throw InputError(where + ": rope_theta: value " + json_brief(t) + " must be a number in [1, 1e12]");
    m.rope_theta = t.get<double>();
  }
  m.tied_embeddings = j.contains("tie_word_embeddings") ? j["tie_word_embeddings"].is_boolean() &&
                                                              j["tie_word_embeddings"].get<bool>()
                                                        : !rms;  // GPT-2 ties, Llama does not
  m.bias = j.contains("attention_bias") ? j["attention_bias"].is_boolean() && j["attention_bias"].get<bool>() : !rms;
  // HF configs state dropout probabilities; Llama-style configs train without dropout.
  m.dropout = !rms;
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    m.head_dim = static_cast<int>(need_int(j, where, {"head_dim"}, 1, 1 << 24));
  } else {
    if (m.hidden % m.heads != 0)
      throw InputError(where + ": hidden_size " + std::to_string(m.hidden) + " is not divisible by num_attention_heads " +
                       std::to_string(m.heads));
    m.head_dim = m.hidden / m.heads;
  }
  if (m.heads % m.kv_heads != 0)
    throw InputError(where + ": num_key_value_heads " + std::to_string(m.kv_heads) + " does not divide num_attention_heads " +
                     std::to_string(m.heads));
  check_model_size(m, where);
  return m;
}

}  // namespace tessel
