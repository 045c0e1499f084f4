// HuggingFace config.json -> Model. The file is a foreign format with many keys Tessel does not model
// (dropout, rope scaling, token ids); those are ignored, but every key Tessel needs must be present and valid,
// and a config describing what Tessel does not model (mixture of experts, multi-head latent attention) is
// rejected rather than imported as a dense transformer.
//
// The MLP's shape comes from the architecture, not from hidden_act: HF transformers' LlamaMLP, MistralMLP,
// Qwen2MLP/Qwen3MLP, GemmaMLP/Gemma2MLP (down_proj(act(gate_proj(x)) * up_proj(x))) and Phi3MLP (gate_up_proj
// split in two) are gated whatever the activation, GemmaMLP with GELU (GeGLU); GPT-2, GPT-NeoX, GPT-J, OPT,
// BLOOM, Falcon, Phi-1/2, GPTBigCode and StarCoder2 have two projections around the activation. Tessel models
// the MLP by its shape: Activation::swiglu is the gated MLP (three GEMMs of h x ffn, two ffn-wide tensors
// kept), Activation::gelu the ungated one. A gated GELU imports as swiglu: parameters, FLOPs, bytes moved and
// activation memory are those of SwiGLU; only the pointwise function differs (the runtime computes SiLU).
#include <cmath>
#include <string_view>

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

bool given(const Json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }

// The value of an optional key of the expected JSON type; InputError naming key, value and type otherwise.
std::optional<std::string> opt_string(const Json& j, const std::string& where, const char* key) {
  if (!given(j, key)) return std::nullopt;
  if (!j.at(key).is_string())
    throw InputError(where + ": " + key + ": value " + json_brief(j.at(key)) + " must be a string");
  return j.at(key).get<std::string>();
}

std::optional<bool> opt_bool(const Json& j, const std::string& where, const char* key) {
  if (!given(j, key)) return std::nullopt;
  if (!j.at(key).is_boolean())
    throw InputError(where + ": " + key + ": value " + json_brief(j.at(key)) + " must be true or false");
  return j.at(key).get<bool>();
}

// Keys that only mixture-of-experts configs carry (Mixtral: num_local_experts; DeepSeek-V2/V3:
// n_routed_experts, n_shared_experts; Qwen2-MoE, OLMoE: num_experts; all: num_experts_per_tok), and the
// low-rank projections of DeepSeek's multi-head latent attention.
constexpr const char* kMoeKeys[] = {"num_local_experts", "n_routed_experts", "n_shared_experts", "num_experts",
                                    "num_experts_per_tok", "moe_intermediate_size"};
constexpr const char* kMlaKeys[] = {"q_lora_rank", "kv_lora_rank"};
constexpr const char* kMoeTypes[] = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "olmoe",
                                     "dbrx", "jamba", "phimoe", "granitemoe", "jetmoe"};

void reject_unmodelled(const Json& j, const std::string& where) {
  for (const char* k : kMoeKeys) {
    if (!given(j, k)) continue;
    const Json& v = j.at(k);
    // A count of one expert (or none) is a dense MLP.
    if (v.is_number_integer() && v.get<std::int64_t>() <= 1 && std::string_view(k) != "moe_intermediate_size") continue;
    throw InputError(where + ": " + k + ": value " + json_brief(v) +
                     " describes a mixture of experts; Tessel models dense transformers only");
  }
  for (const char* k : kMlaKeys)
    if (given(j, k))
      throw InputError(where + ": " + k + ": value " + json_brief(j.at(k)) +
                       " describes multi-head latent attention; Tessel models multi-head and grouped-query attention only");
  if (const auto t = opt_string(j, where, "model_type"))
    for (const char* moe : kMoeTypes)
      if (*t == moe)
        throw InputError(where + ": model_type: value \"" + *t +
                         "\" is a mixture-of-experts architecture; Tessel models dense transformers only");
}

// Architectures whose MLP shape Tessel knows (see the top of this file): model_type, the class name in
// "architectures", and the default of tie_word_embeddings in the family's HF config class (PretrainedConfig's
// true where the class sets none), used when config.json omits the key.
struct Family {
  const char* model_type;
  const char* architecture;
  bool gated;
  bool tied;
};
constexpr Family kFamilies[] = {
    {"llama", "LlamaForCausalLM", true, false},       {"mistral", "MistralForCausalLM", true, false},
    {"qwen2", "Qwen2ForCausalLM", true, false},       {"qwen3", "Qwen3ForCausalLM", true, false},
    {"gemma", "GemmaForCausalLM", true, true},        {"gemma2", "Gemma2ForCausalLM", true, true},
    {"phi3", "Phi3ForCausalLM", true, false},         {"gpt2", "GPT2LMHeadModel", false, true},
    {"gpt_neox", "GPTNeoXForCausalLM", false, false}, {"gptj", "GPTJForCausalLM", false, false},
    {"opt", "OPTForCausalLM", false, true},           {"bloom", "BloomForCausalLM", false, true},
    {"falcon", "FalconForCausalLM", false, true},     {"phi", "PhiForCausalLM", false, false},
    {"gpt_bigcode", "GPTBigCodeForCausalLM", false, true}, {"starcoder2", "Starcoder2ForCausalLM", false, true},
};

// The family of the config: model_type when given, else the first of "architectures".
const Family& family_of(const Json& j, const std::string& where) {
  std::string known;
  for (const auto& f : kFamilies) known += (known.empty() ? "" : ", ") + std::string(f.model_type);
  if (const auto t = opt_string(j, where, "model_type")) {
    for (const auto& f : kFamilies)
      if (*t == f.model_type) return f;
    throw InputError(where + ": model_type: value \"" + *t + "\" is not an architecture whose MLP Tessel knows (" +
                     known + ")");
  }
  if (given(j, "architectures")) {
    const Json& a = j.at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string())
      throw InputError(where + ": architectures: value " + json_brief(a) + " must be a non-empty array of strings");
    const std::string arch = a[0].get<std::string>();
    for (const auto& f : kFamilies)
      if (arch == f.architecture) return f;
    throw InputError(where + ": architectures: value \"" + arch +
                     "\" is not an architecture whose MLP Tessel knows (model_type " + known + ")");
  }
  throw InputError(where + ": missing required key model_type or architectures (needed to tell a gated MLP from "
                   "an ungated one; known: " + known + ")");
}
}  // namespace

Model import_hf_config(const Json& j, const std::string& where) {
  if (!j.is_object()) throw InputError(where + ": a HuggingFace config must be a JSON object");
  reject_unmodelled(j, where);
  Model m;
  m.name = opt_string(j, where, "_name_or_path").value_or(opt_string(j, where, "model_type").value_or("hf-model"));
  m.layers = static_cast<int>(need_int(j, where, {"num_hidden_layers", "n_layer"}, 1, 100000));
  m.hidden = static_cast<int>(need_int(j, where, {"hidden_size", "n_embd"}, 1, 1 << 24));
  m.heads = static_cast<int>(need_int(j, where, {"num_attention_heads", "n_head"}, 1, 1 << 16));
  m.kv_heads = m.heads;
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null())
    m.kv_heads = static_cast<int>(need_int(j, where, {"num_key_value_heads"}, 1, 1 << 16));
  m.vocab = static_cast<int>(need_int(j, where, {"vocab_size"}, 1, 1 << 24));
  m.seq_len = static_cast<int>(need_int(j, where, {"max_position_embeddings", "n_positions"}, 1, 1 << 24));
  const Family& family = family_of(j, where);
  // hidden_act (Llama, GPT-NeoX...), activation_function (GPT-2, GPT-J); Gemma's MLP reads hidden_activation.
  std::optional<std::string> act_key = opt_string(j, where, "hidden_act");
  const char* act_name = "hidden_act";
  if (!act_key) {
    act_key = opt_string(j, where, "activation_function");
    act_name = "activation_function";
  }
  if (const auto a = opt_string(j, where, "hidden_activation")) {
    act_key = a;
    act_name = "hidden_activation";
  }
  const std::string act = act_key.value_or(family.gated ? "silu" : "gelu");
  const bool known_act = act == "silu" || act == "swish" || act == "swiglu" || act.rfind("gelu", 0) == 0 || act == "relu";
  if (!known_act)
    throw InputError(where + ": " + act_name + ": value \"" + act + "\" is not supported (silu, swish, gelu*, relu)");
  m.activation = family.gated ? Activation::swiglu : Activation::gelu;
  if (j.contains("intermediate_size") || j.contains("n_inner")) {
    bool has_inner = (j.contains("intermediate_size") && !j["intermediate_size"].is_null()) ||
                     (j.contains("n_inner") && !j["n_inner"].is_null());
    m.ffn = has_inner ? static_cast<int>(need_int(j, where, {"intermediate_size", "n_inner"}, 1, 1 << 24)) : 4 * m.hidden;
  } else {
    m.ffn = 4 * m.hidden;  // GPT-2 configs leave n_inner null: 4h
  }
  if (given(j, "rms_norm_eps") && !j.at("rms_norm_eps").is_number())
    throw InputError(where + ": rms_norm_eps: value " + json_brief(j.at("rms_norm_eps")) + " must be a number");
  bool rms = j.contains("rms_norm_eps");
  m.norm = rms ? Norm::rmsnorm : Norm::layernorm;
  const std::string_view type = family.model_type;
  m.position = j.contains("rope_theta") || type == "llama" || type == "mistral"
                   ? PositionEmbedding::rotary
                   : PositionEmbedding::learned;
  // rope_theta: the rotary base (Llama 3 configs: 500000); absent means the RoFormer/Llama 2 default 10000.
  if (m.position == PositionEmbedding::rotary && j.contains("rope_theta") && !j["rope_theta"].is_null()) {
    const Json& t = j["rope_theta"];
    if (!t.is_number() || !(t.get<double>() >= 1.0 && t.get<double>() <= 1e12))
      throw InputError(where + ": rope_theta: value " + json_brief(t) + " must be a number in [1, 1e12]");
    m.rope_theta = t.get<double>();
  }
  m.tied_embeddings = opt_bool(j, where, "tie_word_embeddings").value_or(family.tied);
  m.bias = opt_bool(j, where, "attention_bias").value_or(!rms);
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
