// What a Model has beyond the dense transformer (mixture of experts, multi-head latent attention, MTP
// modules, sliding windows, attention sinks): its description, the rules between its fields, and its keys in
// Tessel's model file.
#include "models/beyond_dense.hpp"

#include <algorithm>
#include <sstream>

namespace tessel {

namespace {
constexpr std::int64_t kMaxDim = 1 << 24;   // as model.cpp: far above any real model, far below overflow
constexpr std::int64_t kMaxExperts = 1 << 16;  // DeepSeek-V3 has 256, Kimi K2 384: room for any published one
constexpr std::int64_t kMaxMtp = 64;        // DeepSeek-V3 has 1

std::string plural(long n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// A list of layer indices: integers in [0, layers), ascending without repeats.
std::vector<int> layer_list(JsonObject& o, const std::string& key, int layers) {
  const Json& v = o.raw(key);
  if (!v.is_array()) o.fail(key, "value " + json_brief(v) + " must be an array of layer indices");
  std::vector<int> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string k = key + "[" + std::to_string(i) + "]";
    const Json& e = v[i];
    if (!e.is_number_integer() || e.get<std::int64_t>() < 0 || e.get<std::int64_t>() >= layers)
      o.fail(k, "value " + json_brief(e) + " must be a layer index in [0, " + std::to_string(layers - 1) + "]");
    const int x = static_cast<int>(e.get<std::int64_t>());
    if (!out.empty() && x <= out.back())
      o.fail(k, "value " + std::to_string(x) + " must be above the index before it (" + std::to_string(out.back()) +
                    "): the list is ascending without repeats");
    out.push_back(x);
  }
  return out;
}

Json layer_json(const std::vector<int>& v) { return Json(v); }

RouterSpec parse_router(JsonObject r, int experts) {
  RouterSpec s;
  s.score = r.has("score") && r.choice("score", {"softmax", "sigmoid"}) == "sigmoid" ? RouterScore::sigmoid
                                                                                        : RouterScore::softmax;
  r.ignore("score");
  s.normalize_top_k = r.opt_boolean("normalize_top_k").value_or(true);
  s.scale = r.opt_number("scale", 1e-6, 1e6).value_or(1.0);
  s.groups = static_cast<int>(r.opt_integer("groups", 1, experts).value_or(1));
  s.group_top_k = static_cast<int>(r.opt_integer("group_top_k", 1, experts).value_or(1));
  s.selection_bias = r.opt_boolean("selection_bias").value_or(false);
  s.bias_update_rate = r.opt_number("bias_update_rate", 0.0, 1.0).value_or(1e-3);
  s.logit_bias = r.opt_boolean("logit_bias").value_or(false);
  s.aux_loss_coef = r.opt_number("aux_loss_coef", 0, 1e6).value_or(0);
  r.finish();
  return s;
}

MoeSpec parse_moe(JsonObject o, int layers) {
  MoeSpec s;
  s.experts = static_cast<int>(o.integer("experts", 1, kMaxExperts));
  s.top_k = static_cast<int>(o.integer("top_k", 1, kMaxExperts));
  s.expert_ffn = static_cast<int>(o.integer("expert_ffn", 1, kMaxDim));
  s.shared_experts = static_cast<int>(o.opt_integer("shared_experts", 0, kMaxExperts).value_or(0));
  s.shared_ffn = static_cast<int>(o.opt_integer("shared_ffn", 0, kMaxDim).value_or(0));
  s.shared_gate = o.opt_boolean("shared_gate").value_or(false);
  s.expert_bias = o.opt_boolean("expert_bias").value_or(false);
  if (o.has("dense_layers")) s.dense_layers = layer_list(o, "dense_layers", layers);
  o.ignore("dense_layers");
  if (o.has("router")) s.router = parse_router(o.object("router"), s.experts);
  o.ignore("router");
  o.finish();
  return s;
}

MlaSpec parse_mla(JsonObject o) {
  MlaSpec s;
  s.q_lora_rank = static_cast<int>(o.opt_integer("q_lora_rank", 0, kMaxDim).value_or(0));
  s.kv_lora_rank = static_cast<int>(o.integer("kv_lora_rank", 1, kMaxDim));
  s.qk_nope_head_dim = static_cast<int>(o.integer("qk_nope_head_dim", 1, kMaxDim));
  s.qk_rope_head_dim = static_cast<int>(o.integer("qk_rope_head_dim", 1, kMaxDim));
  s.v_head_dim = static_cast<int>(o.integer("v_head_dim", 1, kMaxDim));
  o.finish();
  return s;
}
}  // namespace

std::string to_string(RouterScore s) { return s == RouterScore::softmax ? "softmax" : "sigmoid"; }

std::string Model::beyond_dense() const {
  std::vector<std::string> parts;
  if (moe.enabled()) {
    std::string p = "mixture of experts (" + plural(moe.experts, "expert", "experts") + ", top-" + std::to_string(moe.top_k);
    if (moe.shared_ffn > 0) p += ", " + plural(std::max(moe.shared_experts, 1), "shared expert", "shared experts");
    if (!moe.dense_layers.empty()) p += ", " + plural(static_cast<long>(moe.dense_layers.size()), "dense layer", "dense layers");
    parts.push_back(p + ")");
  }
  if (mla.enabled()) parts.push_back("multi-head latent attention");
  if (mtp_layers > 0) parts.push_back(plural(mtp_layers, "multi-token prediction module", "multi-token prediction modules"));
  if (sliding_window > 0 && sliding_window < seq_len)  // a window as long as the sequence changes nothing
    parts.push_back("sliding-window attention (" + std::to_string(sliding_window) + " tokens) on " +
                    std::to_string(window_layers.size()) + " of " + std::to_string(layers) + " layers");
  if (attention_sinks) parts.push_back("attention sinks");
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

void check_beyond_dense(const Model& m, const std::string& where, const BeyondDenseKeys& k) {
  const auto fail = [&](const std::string& key, const std::string& value, const std::string& rule) {
    throw InputError(where + ": " + key + ": value " + value + " " + rule);
  };
  const auto s = [](long v) { return std::to_string(v); };
  if (m.moe.enabled()) {
    const MoeSpec& e = m.moe;
    if (e.top_k > e.experts) fail(k.top_k, s(e.top_k), "exceeds the " + s(e.experts) + " experts (" + k.experts + ")");
    if ((e.shared_experts > 0) != (e.shared_ffn > 0))
      fail(k.shared_ffn, s(e.shared_ffn), "and " + k.shared_experts + " " + s(e.shared_experts) +
                                              " disagree: shared experts have a width, and a width needs shared experts");
    if (e.shared_gate && e.shared_ffn == 0) fail(k.shared_gate, "true", "needs shared experts (" + k.shared_ffn + " > 0)");
    if (static_cast<int>(e.dense_layers.size()) >= m.layers)
      fail(k.dense_layers, s(static_cast<long>(e.dense_layers.size())) + " dense layers",
           "leaves none of the " + s(m.layers) + " layers a MoE layer: a model without one is dense (no experts)");
    const RouterSpec& r = e.router;
    if (e.experts % r.groups != 0) fail(k.groups, s(r.groups), "does not divide the " + s(e.experts) + " experts");
    if (r.group_top_k > r.groups) fail(k.group_top_k, s(r.group_top_k), "exceeds the " + s(r.groups) + " groups");
    // Megatron-Core scores a group by the sum of its top_k / group_top_k best experts: none when top_k is smaller.
    if (r.groups > 1 && e.top_k < r.group_top_k)
      fail(k.top_k, s(e.top_k), "is below the " + s(r.group_top_k) + " groups a token keeps (" + k.group_top_k +
                                    "): a group is scored by its best top_k / group_top_k experts");
    // Megatron-Core's TransformerConfig: the expert bias of auxiliary-loss-free routing supports sigmoid scores
    // only (a bias on softmax probabilities is no published router).
    if (r.selection_bias && r.score != RouterScore::sigmoid)
      fail(k.selection_bias, "true", "needs sigmoid scores (" + k.score + " is " + to_string(r.score) +
                                         "): auxiliary-loss-free balancing is defined for sigmoid routers");
    const long reachable = static_cast<long>(r.group_top_k) * (e.experts / r.groups);
    if (e.top_k > reachable)
      fail(k.top_k, s(e.top_k), "exceeds the " + s(reachable) + " experts of the " + s(r.group_top_k) +
                                    " groups a token may use (" + k.group_top_k + ")");
  }
  if (m.mla.enabled()) {
    if (m.head_dim != m.mla.qk_head_dim())
      fail(k.mla, "head_dim " + s(m.head_dim), "must be qk_nope_head_dim + qk_rope_head_dim = " + s(m.mla.qk_head_dim()));
    if (m.kv_heads != m.heads)
      fail(k.mla, "kv_heads " + s(m.kv_heads), "must equal heads " + s(m.heads) + ": MLA expands its latent to every head");
    if (m.position != PositionEmbedding::rotary)
      fail(k.mla, "position " + to_string(m.position), "must be rotary: MLA's keys carry a rotary part");
    if (m.qk_norm) fail(k.mla, "qk_norm true", "does not apply: MLA normalises its latents instead");
  }
  if ((m.sliding_window > 0) != !m.window_layers.empty())
    fail(k.sliding_window, s(m.sliding_window), "and " + k.window_layers + " (" + s(static_cast<long>(m.window_layers.size())) +
                                                    " layers) go together: a window and the layers that use it");
  for (int i : m.window_layers)
    if (i < 0 || i >= m.layers) fail(k.window_layers, s(i), "is not a layer index in [0, " + s(m.layers - 1) + "]");
  if (m.mtp_layers < 0 || m.mtp_layers > kMaxMtp)
    fail(k.mtp_layers, s(m.mtp_layers), "is out of range [0, " + s(kMaxMtp) + "]");
}

namespace detail {

void parse_beyond_dense(JsonObject& o, Model& m) {
  if (o.has("moe")) m.moe = parse_moe(o.object("moe"), m.layers);
  o.ignore("moe");
  if (o.has("mla")) m.mla = parse_mla(o.object("mla"));
  o.ignore("mla");
  m.mtp_layers = static_cast<int>(o.opt_integer("mtp_layers", 0, kMaxMtp).value_or(0));
  m.sliding_window = static_cast<int>(o.opt_integer("sliding_window", 1, kMaxDim).value_or(0));
  if (o.has("window_layers")) m.window_layers = layer_list(o, "window_layers", m.layers);
  o.ignore("window_layers");
  m.attention_sinks = o.opt_boolean("attention_sinks").value_or(false);
  if (auto a = o.opt_number("active_params_b", 0, 1e6)) {
    if (!m.moe.enabled()) o.fail("active_params_b", "applies only to a mixture of experts (a dense model uses all its parameters)");
    m.stated_active_params_b = *a;
  }
}

void beyond_dense_to_json(const Model& m, Json& j) {
  if (m.moe.enabled()) {
    const RouterSpec& r = m.moe.router;
    j["moe"] = {{"experts", m.moe.experts},
                {"top_k", m.moe.top_k},
                {"expert_ffn", m.moe.expert_ffn},
                {"shared_experts", m.moe.shared_experts},
                {"shared_ffn", m.moe.shared_ffn},
                {"shared_gate", m.moe.shared_gate},
                {"expert_bias", m.moe.expert_bias},
                {"dense_layers", layer_json(m.moe.dense_layers)},
                {"router",
                 {{"score", to_string(r.score)},
                  {"normalize_top_k", r.normalize_top_k},
                  {"scale", r.scale},
                  {"groups", r.groups},
                  {"group_top_k", r.group_top_k},
                  {"selection_bias", r.selection_bias},
                  {"bias_update_rate", r.bias_update_rate},
                  {"logit_bias", r.logit_bias},
                  {"aux_loss_coef", r.aux_loss_coef}}}};
  }
  if (m.mla.enabled()) {
    j["mla"] = {{"kv_lora_rank", m.mla.kv_lora_rank},
                {"qk_nope_head_dim", m.mla.qk_nope_head_dim},
                {"qk_rope_head_dim", m.mla.qk_rope_head_dim},
                {"v_head_dim", m.mla.v_head_dim}};
    if (m.mla.q_lora_rank > 0) j["mla"]["q_lora_rank"] = m.mla.q_lora_rank;
  }
  if (m.mtp_layers > 0) j["mtp_layers"] = m.mtp_layers;
  if (m.sliding_window > 0) {
    j["sliding_window"] = m.sliding_window;
    j["window_layers"] = layer_json(m.window_layers);
  }
  if (m.attention_sinks) j["attention_sinks"] = true;
  if (m.stated_active_params_b > 0) j["active_params_b"] = m.stated_active_params_b;
}

}  // namespace detail
}  // namespace tessel
