// HuggingFace config.json of the mixture-of-experts families -> the MoE, MLA, MTP and window fields of a
// Model, as transformers' modelling classes (transformers/models/<family>/modeling_<family>.py, read at
// transformers 5.24) build them. import_hf_config has read the dense fields (hidden, heads, the dense MLP's
// intermediate_size, biases, norms) before.
//
// Keys that size the model (expert counts and widths, top-k, the dense layers of DeepSeek, MLA's ranks and
// head dims) are required, as intermediate_size is: a config class's default is its reference model's value,
// a guess for any other. Routing flags default as the config class does (norm_topk_prob, decoder_sparse_step,
// mlp_only_layers, scoring, scaling).
#include <algorithm>

#include "models/hf_json.hpp"

namespace tessel::detail {

namespace {
constexpr std::int64_t kMaxDim = 1 << 24, kMaxExperts = 1 << 16;

int int_of(const Json& j, const std::string& where, const char* key, std::int64_t min, std::int64_t max) {
  return static_cast<int>(need_int(j, where, {key}, min, max));
}

bool is_deepseek(std::string_view t) { return t == "deepseek_v2" || t == "deepseek_v3"; }
bool is_qwen(std::string_view t) { return t == "qwen2_moe" || t == "qwen3_moe"; }

// The keys of the routed experts: count, top-k, width. Mixtral's and GPT-OSS's experts are intermediate_size
// wide (MixtralExperts, GptOssExperts), OLMoE's too (OlmoeExperts); Qwen and DeepSeek have a dense
// intermediate_size and moe_intermediate_size for experts.
struct ExpertKeys {
  const char* experts;
  const char* ffn;
};
ExpertKeys expert_keys(std::string_view t) {
  if (t == "mixtral" || t == "gpt_oss") return {"num_local_experts", "intermediate_size"};
  if (t == "olmoe") return {"num_experts", "intermediate_size"};
  if (is_qwen(t)) return {"num_experts", "moe_intermediate_size"};
  return {"n_routed_experts", "moe_intermediate_size"};
}

// Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: layer i is sparse unless mlp_only_layers lists it or
// (i + 1) % decoder_sparse_step != 0.
std::vector<int> qwen_dense_layers(const Json& j, const std::string& where, int layers) {
  const int step = given(j, "decoder_sparse_step") ? int_of(j, where, "decoder_sparse_step", 1, 100000) : 1;
  std::vector<bool> dense(layers, false);
  if (given(j, "mlp_only_layers")) {
    const Json& v = j.at("mlp_only_layers");
    if (!v.is_array()) throw InputError(where + ": mlp_only_layers: value " + json_brief(v) + " must be an array of layer indices");
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer() || v[i].get<std::int64_t>() < 0 || v[i].get<std::int64_t>() >= layers)
        throw InputError(where + ": mlp_only_layers[" + std::to_string(i) + "]: value " + json_brief(v[i]) +
                         " must be a layer index in [0, " + std::to_string(layers - 1) + "]");
      dense[static_cast<std::size_t>(v[i].get<std::int64_t>())] = true;
    }
  }
  std::vector<int> out;
  for (int i = 0; i < layers; ++i)
    if (dense[i] || (i + 1) % step != 0) out.push_back(i);
  return out;
}

// DeepseekV2DecoderLayer / V3: layer i is a MoE layer from first_k_dense_replace on. DeepSeek's own modelling
// code (modeling_deepseek.py in their checkpoints) also requires i % moe_layer_freq == 0, which transformers
// drops; every published config has moe_layer_freq 1, where the two agree.
std::vector<int> deepseek_dense_layers(const Json& j, const std::string& where, int layers) {
  const int first = int_of(j, where, "first_k_dense_replace", 0, layers);
  const int freq = given(j, "moe_layer_freq") ? int_of(j, where, "moe_layer_freq", 1, 100000) : 1;
  std::vector<int> out;
  for (int i = 0; i < layers; ++i)
    if (i < first || i % freq != 0) out.push_back(i);
  return out;
}

// DeepseekV2TopkRouter: softmax, then the top-k of all experts (topk_method "greedy") or of the topk_group
// best of n_group groups ("group_limited_greedy"); DeepseekV3TopkRouter: sigmoid, the groups, and the
// e_score_correction_bias ("noaux_tc"). Both scale by routed_scaling_factor; V3 and DeepSeek's V2 code
// renormalise with norm_topk_prob.
void deepseek_router(const Json& j, const std::string& where, bool v3, RouterSpec& r) {
  const std::string score = opt_string(j, where, "scoring_func").value_or(v3 ? "sigmoid" : "softmax");
  if (score != "softmax" && score != "sigmoid")
    throw InputError(where + ": scoring_func: value \"" + score + "\" is not one of: softmax, sigmoid");
  r.score = score == "sigmoid" ? RouterScore::sigmoid : RouterScore::softmax;
  const std::string method = opt_string(j, where, "topk_method").value_or(v3 ? "noaux_tc" : "greedy");
  if (method != "greedy" && method != "group_limited_greedy" && method != "noaux_tc")
    throw InputError(where + ": topk_method: value \"" + method + "\" is not one of: greedy, group_limited_greedy, noaux_tc");
  if (method != "greedy") {
    r.groups = int_of(j, where, "n_group", 1, kMaxExperts);
    r.group_top_k = int_of(j, where, "topk_group", 1, kMaxExperts);
  }
  r.selection_bias = method == "noaux_tc";
  r.scale = opt_double(j, where, "routed_scaling_factor", 1e-6, 1e6).value_or(v3 ? 2.5 : 1.0);
  r.normalize_top_k = opt_bool(j, where, "norm_topk_prob").value_or(v3);
  r.aux_loss_coef = opt_double(j, where, "aux_loss_alpha", 0, 1e6).value_or(0);
}

// DeepseekV2Attention / V3: q_lora_rank (null: a direct q_proj), kv_lora_rank, the per-head dims. Queries and
// keys are qk_nope_head_dim + qk_rope_head_dim wide and the latent is expanded to every head.
void deepseek_mla(const Json& j, const std::string& where, Model& m) {
  if (!j.contains("q_lora_rank"))
    throw InputError(where + ": missing required key q_lora_rank (null for queries projected without a bottleneck)");
  m.mla.q_lora_rank = given(j, "q_lora_rank") ? int_of(j, where, "q_lora_rank", 1, kMaxDim) : 0;
  m.mla.kv_lora_rank = int_of(j, where, "kv_lora_rank", 1, kMaxDim);
  m.mla.qk_nope_head_dim = int_of(j, where, "qk_nope_head_dim", 1, kMaxDim);
  m.mla.qk_rope_head_dim = int_of(j, where, "qk_rope_head_dim", 1, kMaxDim);
  m.mla.v_head_dim = int_of(j, where, "v_head_dim", 1, kMaxDim);
  m.head_dim = m.mla.qk_head_dim();
  m.kv_heads = m.heads;
}

// GptOssAttention: a window of sliding_window positions on the layers layer_types calls
// "sliding_attention" (GptOssConfig: every even layer when the key is absent), and one sink per head.
void gpt_oss_attention(const Json& j, const std::string& where, Model& m) {
  m.attention_sinks = true;
  if (!given(j, "sliding_window")) return;
  m.sliding_window = int_of(j, where, "sliding_window", 1, kMaxDim);
  m.window_layers = hf_window_layers(j, where, m.layers, [](int i) { return i % 2 == 0; });
  if (m.window_layers.empty()) m.sliding_window = 0;
}

BeyondDenseKeys keys_of(std::string_view t, const ExpertKeys& ek) {
  BeyondDenseKeys k;
  k.experts = ek.experts;
  k.top_k = "num_experts_per_tok";
  k.expert_ffn = ek.ffn;
  k.shared_experts = is_deepseek(t) ? "n_shared_experts" : "shared_expert_intermediate_size";
  k.shared_ffn = k.shared_experts;
  k.shared_gate = "shared_expert_gate";
  k.dense_layers = is_deepseek(t) ? "first_k_dense_replace" : "mlp_only_layers and decoder_sparse_step";
  k.groups = "n_group";
  k.group_top_k = "topk_group";
  k.score = "scoring_func";
  k.selection_bias = "topk_method noaux_tc";
  k.mla = "kv_lora_rank";
  k.mtp_layers = "num_nextn_predict_layers";
  k.sliding_window = "sliding_window";
  k.window_layers = "layer_types";
  return k;
}
}  // namespace

bool is_hf_moe_family(std::string_view t) {
  return t == "mixtral" || t == "gpt_oss" || t == "olmoe" || is_qwen(t) || is_deepseek(t);
}

void import_hf_moe(const Json& j, const std::string& where, std::string_view t, Model& m) {
  const ExpertKeys ek = expert_keys(t);
  MoeSpec& e = m.moe;
  // Qwen's decoder layers build experts only when num_experts > 0: a config with none is a dense model.
  e.experts = int_of(j, where, ek.experts, is_qwen(t) ? 0 : 1, kMaxExperts);
  e.top_k = int_of(j, where, "num_experts_per_tok", 1, kMaxExperts);
  e.expert_ffn = int_of(j, where, ek.ffn, 1, kMaxDim);
  if (is_qwen(t)) e.dense_layers = qwen_dense_layers(j, where, m.layers);
  if (is_deepseek(t)) e.dense_layers = deepseek_dense_layers(j, where, m.layers);
  if (e.experts == 0 || static_cast<int>(e.dense_layers.size()) == m.layers) e = MoeSpec{};  // no sparse layer
  if (t == "qwen2_moe" && e.enabled()) {
    // Qwen2MoeSparseMoeBlock: one shared_expert of shared_expert_intermediate_size and its sigmoid gate.
    e.shared_ffn = int_of(j, where, "shared_expert_intermediate_size", 1, kMaxDim);
    e.shared_experts = 1;
    e.shared_gate = true;
  }
  if (is_deepseek(t) && e.enabled()) {
    // DeepseekV2Moe / V3: shared_experts is one MLP of moe_intermediate_size x n_shared_experts.
    e.shared_experts = int_of(j, where, "n_shared_experts", 0, kMaxExperts);
    e.shared_ffn = static_cast<int>(std::min<std::int64_t>(std::int64_t(e.shared_experts) * e.expert_ffn, kMaxDim + 1));
    if (e.shared_ffn > kMaxDim)
      throw InputError(where + ": n_shared_experts: value " + std::to_string(e.shared_experts) + " x " + ek.ffn + " " +
                       std::to_string(e.expert_ffn) + " exceeds the width limit " + std::to_string(kMaxDim));
  }
  // Mixtral's router renormalises its top-k always, GPT-OSS's softmax over the k chosen logits is the same;
  // Qwen and OLMoE do with norm_topk_prob (default false).
  RouterSpec& r = e.router;
  if (is_qwen(t) || t == "olmoe") r.normalize_top_k = opt_bool(j, where, "norm_topk_prob").value_or(false);
  if (t != "deepseek_v2" && t != "deepseek_v3") r.aux_loss_coef = opt_double(j, where, "router_aux_loss_coef", 0, 1e6).value_or(0);
  if (is_deepseek(t)) deepseek_router(j, where, t == "deepseek_v3", r);
  if (t == "gpt_oss") {
    e.expert_bias = true;   // GptOssExperts: gate_up_proj_bias, down_proj_bias
    r.logit_bias = true;    // GptOssTopKRouter: bias
    gpt_oss_attention(j, where, m);
  }
  if (is_deepseek(t)) deepseek_mla(j, where, m);
  // The checkpoint's MTP modules: transformers builds none (and skips their weights), DeepSeek-V3's config
  // states one. A config without the key has none.
  if (t == "deepseek_v3" && given(j, "num_nextn_predict_layers"))
    m.mtp_layers = int_of(j, where, "num_nextn_predict_layers", 0, 64);
  check_beyond_dense(m, where, keys_of(t, ek));
}

}  // namespace tessel::detail
