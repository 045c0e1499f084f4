// HuggingFace config.json -> Model. The file is a foreign format with many keys Tessel does not model
// (dropout, rope scaling, token ids); those are ignored, but every key Tessel needs must be present and valid,
// and a config describing what its family's class does not build (experts in a Llama config, latent
// attention outside DeepSeek) is rejected rather than imported as something else. The mixture-of-experts
// families' own fields are read in import_hf_moe.cpp.
//
// The MLP's shape comes from the architecture, not from hidden_act: HF transformers' LlamaMLP, MistralMLP,
// Qwen2MLP/Qwen3MLP, GemmaMLP/Gemma2MLP (down_proj(act(gate_proj(x)) * up_proj(x))) and Phi3MLP (gate_up_proj
// split in two) are gated whatever the activation, GemmaMLP with GELU (GeGLU); GPT-2, GPT-NeoX, GPT-J, OPT,
// BLOOM, Falcon, Phi-1/2, GPTBigCode and StarCoder2 have two projections around the activation; every
// mixture-of-experts family's experts and dense MLPs are gated. Tessel models the MLP by its shape:
// Activation::swiglu is the gated MLP (three GEMMs of h x ffn, two ffn-wide tensors kept), Activation::gelu
// the ungated one. A gated GELU imports as swiglu: parameters, FLOPs, bytes moved and activation memory are
// those of SwiGLU; only the pointwise function differs (the runtime computes SiLU).
#include <cmath>
#include <string_view>

#include "models/hf_json.hpp"

namespace tessel {

using namespace detail;

namespace {
// Architectures whose shape Tessel knows: model_type, the class name in "architectures", and what the
// family's HF modelling code and config class fix when config.json says nothing:
// - gated: the MLP (see the top of this file);
// - tied: the default of tie_word_embeddings in the config class (PretrainedConfig's true where the class sets
//   none);
// - rms: RMSNorm (LlamaRMSNorm and its copies) rather than nn.LayerNorm;
// - position: learned (GPT2Model.wpe, OPTLearnedPositionalEmbedding, GPTBigCodeModel.wpe), rotary (every
//   *RotaryEmbedding family; GPT-J, GPT-NeoX and Phi rotate a fraction of each head, rotary_dim /
//   rotary_pct / partial_rotary_factor, which changes neither a parameter nor a GEMM: Tessel counts the
//   pointwise rotation as if it covered the whole head) or alibi (BloomModel build_alibi_tensor).
struct Family {
  const char* model_type;
  const char* architecture;
  bool gated;
  bool tied;
  bool rms;
  PositionEmbedding position;
};
constexpr auto kLearned = PositionEmbedding::learned, kRotary = PositionEmbedding::rotary,
               kAlibi = PositionEmbedding::alibi;
constexpr Family kFamilies[] = {
    {"llama", "LlamaForCausalLM", true, false, true, kRotary},
    {"mistral", "MistralForCausalLM", true, false, true, kRotary},
    {"qwen2", "Qwen2ForCausalLM", true, false, true, kRotary},
    {"qwen3", "Qwen3ForCausalLM", true, false, true, kRotary},
    {"gemma", "GemmaForCausalLM", true, true, true, kRotary},
    {"gemma2", "Gemma2ForCausalLM", true, true, true, kRotary},
    {"phi3", "Phi3ForCausalLM", true, false, true, kRotary},
    {"gpt2", "GPT2LMHeadModel", false, true, false, kLearned},
    {"gpt_neox", "GPTNeoXForCausalLM", false, false, false, kRotary},
    {"gptj", "GPTJForCausalLM", false, false, false, kRotary},
    {"opt", "OPTForCausalLM", false, true, false, kLearned},
    {"bloom", "BloomForCausalLM", false, true, false, kAlibi},
    {"falcon", "FalconForCausalLM", false, true, false, kRotary},
    {"phi", "PhiForCausalLM", false, false, false, kRotary},
    {"gpt_bigcode", "GPTBigCodeForCausalLM", false, true, false, kLearned},
    {"starcoder2", "Starcoder2ForCausalLM", false, true, false, kRotary},
    {"mixtral", "MixtralForCausalLM", true, false, true, kRotary},
    {"qwen2_moe", "Qwen2MoeForCausalLM", true, false, true, kRotary},
    {"qwen3_moe", "Qwen3MoeForCausalLM", true, false, true, kRotary},
    {"deepseek_v2", "DeepseekV2ForCausalLM", true, false, true, kRotary},
    {"deepseek_v3", "DeepseekV3ForCausalLM", true, false, true, kRotary},
    {"gpt_oss", "GptOssForCausalLM", true, false, true, kRotary},
    {"olmoe", "OlmoeForCausalLM", true, false, true, kRotary},
};

// Keys that only mixture-of-experts configs carry (Mixtral: num_local_experts; DeepSeek-V2/V3:
// n_routed_experts, n_shared_experts; Qwen2-MoE, OLMoE: num_experts; all: num_experts_per_tok), and the
// low-rank projections of DeepSeek's multi-head latent attention.
constexpr const char* kMoeKeys[] = {"num_local_experts", "n_routed_experts", "n_shared_experts", "num_experts",
                                    "num_experts_per_tok", "moe_intermediate_size"};
constexpr const char* kMlaKeys[] = {"q_lora_rank", "kv_lora_rank"};
// Mixture-of-experts architectures whose classes Tessel has not followed.
constexpr const char* kOtherMoeTypes[] = {"dbrx", "jamba", "phimoe", "granitemoe", "jetmoe"};
constexpr const char* kMoeFamilies = "mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, gpt_oss, olmoe";

void reject_other_moe(const Json& j, const std::string& where) {
  if (const auto t = opt_string(j, where, "model_type"))
    for (const char* moe : kOtherMoeTypes)
      if (*t == moe)
        throw InputError(where + ": model_type: value \"" + *t + "\" is a mixture-of-experts architecture Tessel does "
                         "not import (it imports " + kMoeFamilies + ")");
}

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

bool is(const Family& f, std::string_view type) { return type == f.model_type; }

// Experts in a family whose HF class builds none (a Llama config with n_routed_experts), or latent attention
// outside DeepSeek's classes: the class would ignore the keys, so the file does not describe that class.
void reject_unmodelled(const Json& j, const std::string& where, const Family& f) {
  if (!is_hf_moe_family(f.model_type)) {
    for (const char* k : kMoeKeys) {
      if (!given(j, k)) continue;
      const Json& v = j.at(k);
      // A count of one expert (or none) is a dense MLP.
      if (v.is_number_integer() && v.get<std::int64_t>() <= 1 && std::string_view(k) != "moe_intermediate_size") continue;
      throw InputError(where + ": " + k + ": value " + json_brief(v) + " describes a mixture of experts, which the " +
                       f.model_type + " family does not have (mixture-of-experts families: " + kMoeFamilies + ")");
    }
  }
  if (is(f, "deepseek_v2") || is(f, "deepseek_v3")) return;
  for (const char* k : kMlaKeys)
    if (given(j, k))
      throw InputError(where + ": " + k + ": value " + json_brief(j.at(k)) + " describes multi-head latent attention, "
                       "which the " + f.model_type + " family does not have (it is DeepSeek's: deepseek_v2, deepseek_v3)");
}

// The MLP width. Gated families and GPT-NeoX, Phi, StarCoder2 read intermediate_size and have no fallback in
// their modelling code that a missing key could stand for: it is required. GPT-2, GPT-J and GPTBigCode read
// n_inner, "None will set it to 4 times n_embd" (GPT2Config, GPTJConfig, GPTBigCodeConfig docs); Falcon's
// ffn_hidden_size likewise (FalconConfig: 4 x hidden_size when None); BloomMLP is 4h whatever the config;
// OPT reads ffn_dim.
int ffn_of(const Json& j, const std::string& where, const Family& f, int hidden) {
  const auto four_h_unless = [&](const char* key) {
    return given(j, key) ? static_cast<int>(need_int(j, where, {key}, 1, 1 << 24)) : 4 * hidden;
  };
  if (is(f, "gpt2") || is(f, "gptj") || is(f, "gpt_bigcode")) return four_h_unless("n_inner");
  if (is(f, "falcon")) return four_h_unless("ffn_hidden_size");
  if (is(f, "bloom")) return 4 * hidden;
  const char* key = is(f, "opt") ? "ffn_dim" : "intermediate_size";
  if (!given(j, key))
    throw InputError(where + ": " + key + ": " + (j.contains(key) ? "value null" : "missing required key") + "; the " +
                     f.model_type + " MLP's width has no default to fall back on (4 x hidden_size would be a guess" +
                     (f.gated ? " and is wrong for gated MLPs: Llama-2-7B has 11008, not 16384" : "") + ")");
  return static_cast<int>(need_int(j, where, {key}, 1, 1 << 24));
}

// Key/value heads: num_key_value_heads (grouped-query attention) where the family has it. GPTBigCode with
// multi_query (GPTBigCodeConfig default true) has one key/value head; Falcon has one with multi_query (its
// default) unless new_decoder_architecture, which reads num_kv_heads (FalconAttention.__init__).
int kv_heads_of(const Json& j, const std::string& where, const Family& f, int heads) {
  if (is(f, "gpt_bigcode")) return opt_bool(j, where, "multi_query").value_or(true) ? 1 : heads;
  if (is(f, "falcon")) {
    const bool new_arch = opt_bool(j, where, "new_decoder_architecture").value_or(false);
    const bool multi_query = opt_bool(j, where, "multi_query").value_or(true);
    if (!new_arch && multi_query) return 1;
    return given(j, "num_kv_heads") ? static_cast<int>(need_int(j, where, {"num_kv_heads"}, 1, 1 << 16)) : heads;
  }
  return given(j, "num_key_value_heads") ? static_cast<int>(need_int(j, where, {"num_key_value_heads"}, 1, 1 << 16))
                                         : heads;
}

// Which linear layers have biases, as the families' modelling code builds them:
// - LlamaAttention: q/k/v/o_proj bias=attention_bias; LlamaMLP: gate/up/down bias=mlp_bias (both default
//   false). DeepseekV2: attention_bias on q_a/kv_a/o_proj, mlp_bias on the dense and shared MLPs.
// - Gemma, Gemma 2, Qwen3, Qwen3-MoE and OLMoE read attention_bias for q/k/v/o (default false); GPT-OSS too,
//   default true; DeepseekV3 for q_a/kv_a/o_proj. Their MLPs have none (GPT-OSS's experts: import_hf_moe.cpp).
// - Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False; Qwen2MLP none. Qwen2MoeAttention: q/k/v
//   bias=qkv_bias (default true).
// - Mistral, Mixtral and Phi-3: none.
// - GPT-J: q/k/v/out_proj none, fc_in/fc_out and lm_head with bias.
// - GPT-2, GPTBigCode, BLOOM: everywhere. GPT-NeoX: query_key_value/dense bias=attention_bias (default
//   true), the MLP always. OPT: enable_bias (default true). StarCoder2: use_bias (default true). Falcon: bias
//   (default false). Phi-1/2: everywhere, lm_head too.
void biases_of(const Json& j, const std::string& where, const Family& f, Model& m) {
  const auto set = [&](bool qkv, bool out, bool mlp) {
    m.bias = qkv && out && mlp;
    m.qkv_bias = qkv;
    m.out_bias = out;
    m.mlp_bias = mlp;
  };
  if (is(f, "llama") || is(f, "deepseek_v2")) {
    const bool attn = opt_bool(j, where, "attention_bias").value_or(false);
    set(attn, attn, opt_bool(j, where, "mlp_bias").value_or(false));
  } else if (is(f, "gemma") || is(f, "gemma2") || is(f, "qwen3") || is(f, "qwen3_moe") || is(f, "olmoe") ||
             is(f, "deepseek_v3")) {
    const bool attn = opt_bool(j, where, "attention_bias").value_or(false);
    set(attn, attn, false);
  } else if (is(f, "gpt_oss")) {
    const bool attn = opt_bool(j, where, "attention_bias").value_or(true);
    set(attn, attn, false);
  } else if (is(f, "qwen2")) {
    set(true, false, false);
  } else if (is(f, "qwen2_moe")) {
    set(opt_bool(j, where, "qkv_bias").value_or(true), false, false);
  } else if (is(f, "mistral") || is(f, "phi3") || is(f, "mixtral")) {
    set(false, false, false);
  } else if (is(f, "gptj")) {
    set(false, false, true);
    m.head_bias = true;
  } else if (is(f, "gpt_neox")) {
    const bool attn = opt_bool(j, where, "attention_bias").value_or(true);
    set(attn, attn, true);
  } else if (is(f, "opt")) {
    const bool b = opt_bool(j, where, "enable_bias").value_or(true);
    set(b, b, b);
  } else if (is(f, "starcoder2")) {
    const bool b = opt_bool(j, where, "use_bias").value_or(true);
    set(b, b, b);
  } else if (is(f, "falcon")) {
    const bool b = opt_bool(j, where, "bias").value_or(false);
    set(b, b, b);
  } else {
    set(true, true, true);  // GPT-2, GPTBigCode, BLOOM, Phi
    m.head_bias = is(f, "phi");
  }
  if (m.tied_embeddings) m.head_bias = false;  // a tied head is the embedding table: no bias of its own
}

// Norms per block and around it. Gemma2DecoderLayer: input, post_attention, pre_feedforward and
// post_feedforward norms (4). GPT-J and Phi: one ln_1 / input_layernorm feeds the parallel attention and
// MLP. FalconDecoderLayer: ln_attn and ln_mlp under new_decoder_architecture with num_ln_in_parallel_attn 2
// (FalconConfig sets 2 when it is None), else input_layernorm, plus post_attention_layernorm unless
// parallel_attn (default true). BLOOM: word_embeddings_layernorm after the token embedding. Qwen3 and
// Qwen3-MoE: q_norm and k_norm over head_dim; Phi with qk_layernorm: q_layernorm and k_layernorm; OLMoE:
// q_norm over the whole query projection, k_norm over the whole key projection.
void norms_of(const Json& j, const std::string& where, const Family& f, Model& m) {
  m.layer_norms = 2;
  if (is(f, "gemma2")) m.layer_norms = 4;
  if (is(f, "gptj") || is(f, "phi")) m.layer_norms = 1;
  if (is(f, "falcon")) {
    if (opt_bool(j, where, "new_decoder_architecture").value_or(false)) {
      m.layer_norms = given(j, "num_ln_in_parallel_attn")
                          ? static_cast<int>(need_int(j, where, {"num_ln_in_parallel_attn"}, 1, 2))
                          : 2;
    } else {
      m.layer_norms = opt_bool(j, where, "parallel_attn").value_or(true) ? 1 : 2;
    }
  }
  m.embedding_norm = is(f, "bloom");
  m.qk_norm = is(f, "qwen3") || is(f, "qwen3_moe") || is(f, "olmoe") ||
              (is(f, "phi") && opt_bool(j, where, "qk_layernorm").value_or(false));
  m.qk_norm_whole = is(f, "olmoe");
}

// The rotary base: rope_theta, GPT-NeoX's rotary_emb_base; the RoFormer/Llama 2 default 10000 otherwise
// (every family's config class default, GPT-J's fixed base).
double rope_theta_of(const Json& j, const std::string& where) {
  for (const char* key : {"rope_theta", "rotary_emb_base"}) {
    if (!given(j, key)) continue;
    const Json& t = j.at(key);
    if (!t.is_number() || !(t.get<double>() >= 1.0 && t.get<double>() <= 1e12))
      throw InputError(where + ": " + key + ": value " + json_brief(t) + " must be a number in [1, 1e12]");
    return t.get<double>();
  }
  return 10000.0;
}

// Sliding-window attention, kept per layer (Model::window_layers; the cost model prices a windowed layer as its
// own kind): Mistral, Mixtral, Phi-3 and StarCoder2 window every layer; Gemma 2 every other, from the first
// (Gemma2Config's layer_types); Qwen2, Qwen3 and Qwen2-MoE only with use_sliding_window, on the layers from
// max_window_layers on (Qwen2Config: default 28); Qwen3-MoE with use_sliding_window every layer (its attention
// reads sliding_window alone). A config's layer_types, where given, says which layers. The other families'
// classes have no window and ignore the key. GPT-OSS's windows: import_hf_moe.cpp.
void import_window(const Json& j, const std::string& where, const Family& f, Model& m) {
  if (!given(j, "sliding_window") || is(f, "gpt_oss")) return;
  const bool qwen = is(f, "qwen2") || is(f, "qwen3") || is(f, "qwen2_moe");
  const bool every = is(f, "mistral") || is(f, "mixtral") || is(f, "phi3") || is(f, "starcoder2") || is(f, "qwen3_moe");
  // The other families' classes have no window: the key, if a config carries it, changes nothing.
  if (!qwen && !every && !is(f, "gemma2")) return;
  if ((qwen || is(f, "qwen3_moe")) && !opt_bool(j, where, "use_sliding_window").value_or(false)) return;
  const auto window = static_cast<int>(need_int(j, where, {"sliding_window"}, 1, std::int64_t(1) << 24));
  std::vector<int> layers;
  if (is(f, "gemma2")) {
    layers = hf_window_layers(j, where, m.layers, [](int i) { return i % 2 == 0; });
  } else if (qwen) {
    const std::int64_t from = given(j, "max_window_layers") ? need_int(j, where, {"max_window_layers"}, 0, 1 << 20) : 28;
    layers = hf_window_layers(j, where, m.layers, [from](int i) { return i >= from; });
  } else {
    layers = hf_window_layers(j, where, m.layers, [](int) { return true; });
  }
  if (layers.empty()) return;
  m.sliding_window = window;
  m.window_layers = std::move(layers);
}
}  // namespace

Model import_hf_config(const Json& j, const std::string& where, std::optional<std::int64_t> seq_len) {
  if (!j.is_object()) throw InputError(where + ": a HuggingFace config must be a JSON object");
  reject_other_moe(j, where);
  Model m;
  m.name = opt_string(j, where, "_name_or_path").value_or(opt_string(j, where, "model_type").value_or("hf-model"));
  m.layers = static_cast<int>(need_int(j, where, {"num_hidden_layers", "n_layer"}, 1, 100000));
  // BloomConfig also takes n_embed for hidden_size.
  m.hidden = static_cast<int>(need_int(j, where, {"hidden_size", "n_embd", "n_embed"}, 1, 1 << 24));
  m.heads = static_cast<int>(need_int(j, where, {"num_attention_heads", "n_head"}, 1, 1 << 16));
  const Family& family = family_of(j, where);
  reject_unmodelled(j, where, family);
  m.kv_heads = kv_heads_of(j, where, family, m.heads);
  m.vocab = static_cast<int>(need_int(j, where, {"vocab_size"}, 1, 1 << 24));
  if (is(family, "opt") && given(j, "word_embed_proj_dim") &&
      need_int(j, where, {"word_embed_proj_dim"}, 1, 1 << 24) != m.hidden)
    throw InputError(where + ": word_embed_proj_dim: value " + json_brief(j.at("word_embed_proj_dim")) +
                     " differs from hidden_size " + std::to_string(m.hidden) +
                     ": OPT's project_in/project_out around the blocks are not modelled");

  // Positions and the sequence length. A learned table has max_position_embeddings (n_positions) rows and
  // the sequence may not exceed them. Rotary and ALiBi have no table: the key only states the longest
  // sequence trained, the default sequence length here; Falcon's config class defaults it to 2048 (FalconConfig;
  // tiiuae/falcon-7b's config.json omits it), and BLOOM, which has no such key, was trained at 2048
  // (BigScience, "BLOOM", arXiv:2211.05100, Sec. 3.3).
  m.position = family.position;
  if (is(family, "falcon") && opt_bool(j, where, "alibi").value_or(false)) m.position = PositionEmbedding::alibi;
  const bool has_positions = given(j, "max_position_embeddings") || given(j, "n_positions");
  const std::int64_t positions =
      has_positions ? need_int(j, where, {"max_position_embeddings", "n_positions"}, 1, 1 << 24) : 0;
  const char* positions_key = given(j, "max_position_embeddings") ? "max_position_embeddings" : "n_positions";
  std::string seq_from;
  if (seq_len) {
    m.seq_len = static_cast<int>(*seq_len);
    seq_from = "--seq";
  } else if (has_positions) {
    m.seq_len = static_cast<int>(positions);
    seq_from = positions_key;
  } else if (is(family, "falcon") || is(family, "bloom")) {
    m.seq_len = 2048;
    seq_from = std::string("the ") + family.model_type + " default";
  } else {
    throw InputError(where + ": missing required key max_position_embeddings or n_positions (the sequence length; " +
                     (m.position == PositionEmbedding::learned ? "the learned position table's rows)"
                                                               : "or pass --seq)"));
  }
  if (m.position == PositionEmbedding::learned) {
    if (!has_positions)
      throw InputError(where + ": missing required key max_position_embeddings or n_positions (the rows of the "
                       "learned position table)");
    // OPTLearnedPositionalEmbedding keeps 2 more rows than max_position_embeddings (its offset), unused.
    m.max_positions = static_cast<int>(positions);
    check_learned_positions(m, where, positions_key);
    if (is(family, "opt")) m.max_positions += 2;
  }
  if (m.position == PositionEmbedding::rotary) m.rope_theta = rope_theta_of(j, where);
  import_window(j, where, family, m);

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
  m.ffn = ffn_of(j, where, family, m.hidden);
  if (given(j, "rms_norm_eps") && !j.at("rms_norm_eps").is_number())
    throw InputError(where + ": rms_norm_eps: value " + json_brief(j.at("rms_norm_eps")) + " must be a number");
  m.norm = family.rms ? Norm::rmsnorm : Norm::layernorm;
  m.tied_embeddings = opt_bool(j, where, "tie_word_embeddings").value_or(family.tied);
  biases_of(j, where, family, m);
  norms_of(j, where, family, m);
  // HF configs state dropout probabilities; Llama-style configs train without dropout.
  m.dropout = !family.rms;
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    m.head_dim = static_cast<int>(need_int(j, where, {"head_dim"}, 1, 1 << 24));
  } else {
    if (m.hidden % m.heads != 0)
      throw InputError(where + ": hidden_size " + std::to_string(m.hidden) + " is not divisible by num_attention_heads " +
                       std::to_string(m.heads));
    m.head_dim = m.hidden / m.heads;
  }
  if (is_hf_moe_family(family.model_type)) import_hf_moe(j, where, family.model_type, m);
  if (m.heads % m.kv_heads != 0)
    throw InputError(where + ": num_key_value_heads " + std::to_string(m.kv_heads) + " does not divide num_attention_heads " +
                     std::to_string(m.heads));
  check_model_size(m, where);
  return m;
}

}  // namespace tessel
