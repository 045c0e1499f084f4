#include "models/model.hpp"

#include <algorithm>
#include <string_view>
#include <utility>

namespace tessel {

const std::vector<std::pair<std::string_view, std::string_view>>& tessel_model_presets();

namespace {
constexpr std::int64_t kMaxDim = 1 << 24;  // 16M: far above any real model, far below overflow
}

std::string to_string(Activation a) { return a == Activation::gelu ? "gelu" : "swiglu"; }
std::string to_string(Norm n) { return n == Norm::layernorm ? "layernorm" : "rmsnorm"; }
std::string to_string(PositionEmbedding p) { return p == PositionEmbedding::learned ? "learned" : "rotary"; }

// Per layer: attention (Q: h*h, K and V: h*kv_dim each, output projection: h*h) plus the MLP
// (two matrices for GELU, three for SwiGLU), biases when the model has them, and two norms
// (LayerNorm: weight + bias, RMSNorm: weight only). With kv_dim == h this is 12h^2 + 13h, the per-layer
// term of Narayanan et al. eq. 2.
std::int64_t Model::params_per_layer() const {
  const std::int64_t h = hidden, f = ffn;
  const std::int64_t q_dim = static_cast<std::int64_t>(heads) * head_dim;
  const std::int64_t kv_dim = static_cast<std::int64_t>(kv_heads) * head_dim;
  std::int64_t attn = h * (q_dim + 2 * kv_dim) + q_dim * h;
  std::int64_t mlp = activation == Activation::swiglu ? 3 * h * f : 2 * h * f;
  if (bias) {
    attn += q_dim + 2 * kv_dim + h;
    mlp += (activation == Activation::swiglu ? 2 * f : f) + h;
  }
  return attn + mlp + 2 * norm_params();
}

std::int64_t Model::norm_params() const { return norm == Norm::layernorm ? 2 * std::int64_t(hidden) : hidden; }

std::int64_t Model::tp_replicated_params_per_layer() const {
  return 2 * norm_params() + (bias ? 2 * std::int64_t(hidden) : 0);
}

std::int64_t Model::tp_replicated_embedding_params() const {
  return position == PositionEmbedding::learned ? std::int64_t(seq_len) * hidden : 0;
}

std::int64_t Model::tp_replicated_output_params() const { return norm_params(); }

std::int64_t Model::embedding_params() const {
  std::int64_t e = static_cast<std::int64_t>(vocab) * hidden;
  if (position == PositionEmbedding::learned) e += static_cast<std::int64_t>(seq_len) * hidden;
  return e;
}

std::int64_t Model::output_params() const {
  std::int64_t head = tied_embeddings ? 0 : static_cast<std::int64_t>(vocab) * hidden;
  return norm_params() + head;
}

std::int64_t Model::total_params() const {
  return layers * params_per_layer() + embedding_params() + output_params();
}

void check_model_size(const Model& m, const std::string& where) {
  constexpr double kMaxParams = 1e15;
  // The same terms as params_per_layer() and friends, in double: no overflow, and exact enough to compare.
  const double h = m.hidden, f = m.ffn, q = static_cast<double>(m.heads) * m.head_dim,
               kv = static_cast<double>(m.kv_heads) * m.head_dim;
  const double per_layer = h * (q + 2 * kv) + q * h + 3 * h * f + 2 * f + q + 2 * kv + 6 * h;
  const double total = m.layers * per_layer + (static_cast<double>(m.vocab) + m.seq_len) * h * 2;
  if (total > kMaxParams) {
    std::ostringstream os;
    os << where << ": the model has about " << total << " parameters (layers " << m.layers << ", hidden " << m.hidden
       << ", ffn " << m.ffn << ", vocab " << m.vocab << "), more than the limit " << kMaxParams;
    throw InputError(os.str());
  }
}

Model parse_model(const Json& j, const std::string& where) {
  JsonObject o(j, where);
  Model m;
  m.name = o.string("name");
  o.ignore("source");
  m.stated_params_b = o.opt_number("params_b", 0, 1e6).value_or(0);
  m.layers = static_cast<int>(o.integer("layers", 1, 100000));
  m.hidden = static_cast<int>(o.integer("hidden", 1, kMaxDim));
  m.heads = static_cast<int>(o.integer("heads", 1, 1 << 16));
  m.kv_heads = static_cast<int>(o.opt_integer("kv_heads", 1, 1 << 16).value_or(m.heads));
  m.ffn = static_cast<int>(o.integer("ffn", 1, kMaxDim));
  m.vocab = static_cast<int>(o.integer("vocab", 1, kMaxDim));
  m.seq_len = static_cast<int>(o.integer("seq_len", 1, kMaxDim));
  m.activation = o.choice("activation", {"gelu", "swiglu"}) == "gelu" ? Activation::gelu : Activation::swiglu;
  m.norm = o.choice("norm", {"layernorm", "rmsnorm"}) == "layernorm" ? Norm::layernorm : Norm::rmsnorm;
  m.position = o.choice("position", {"learned", "rotary"}) == "learned" ? PositionEmbedding::learned
                                                                         : PositionEmbedding::rotary;
  if (auto theta = o.opt_number("rope_theta", 1.0, 1e12)) {
    if (m.position != PositionEmbedding::rotary)
      o.fail("rope_theta", "applies only to \"position\": \"rotary\" (this model has learned positions)");
    m.rope_theta = *theta;
  }
  m.tied_embeddings = o.boolean("tied_embeddings");
  m.bias = o.boolean("bias");
  m.dropout = o.opt_boolean("dropout").value_or(true);
  if (auto hd = o.opt_integer("head_dim", 1, kMaxDim)) {
    m.head_dim = static_cast<int>(*hd);
  } else {
    if (m.hidden % m.heads != 0)
      o.fail("heads", "hidden " + std::to_string(m.hidden) + " is not divisible by heads " + std::to_string(m.heads) +
                          " (give head_dim explicitly)");
    m.head_dim = m.hidden / m.heads;
  }
  if (m.heads % m.kv_heads != 0)
    o.fail("kv_heads", "heads " + std::to_string(m.heads) + " is not a multiple of kv_heads " + std::to_string(m.kv_heads));
  o.finish();
  check_model_size(m, where);
  return m;
}

Json model_to_json(const Model& m) {
  Json j;
  j["name"] = m.name;
  j["layers"] = m.layers;
  j["hidden"] = m.hidden;
  j["heads"] = m.heads;
  j["kv_heads"] = m.kv_heads;
  j["head_dim"] = m.head_dim;
  j["ffn"] = m.ffn;
  j["vocab"] = m.vocab;
  j["seq_len"] = m.seq_len;
  j["activation"] = to_string(m.activation);
  j["norm"] = to_string(m.norm);
  j["position"] = to_string(m.position);
  if (m.position == PositionEmbedding::rotary) j["rope_theta"] = m.rope_theta;
  j["tied_embeddings"] = m.tied_embeddings;
  j["bias"] = m.bias;
  j["dropout"] = m.dropout;
  if (m.stated_params_b > 0) j["params_b"] = m.stated_params_b;
  return j;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : tessel_model_presets()) names.emplace_back(name);
  return names;
}

Model load_model(const std::string& name_or_path) {
  for (const auto& [name, text] : tessel_model_presets()) {
    if (name == name_or_path) {
      std::string where = "model preset " + std::string(name);
      return parse_model(parse_json_text(std::string(text), where), where);
    }
  }
  bool looks_like_path = name_or_path.find('/') != std::string::npos || name_or_path.find(".json") != std::string::npos;
  if (!looks_like_path) {
    std::string list;
    for (const auto& n : model_preset_names()) list += (list.empty() ? "" : ", ") + n;
    throw InputError("--model " + name_or_path + ": no such preset (known: " + list + ") and not a .json path");
  }
  Json j = parse_json_file(name_or_path, "--model ");
  // A HuggingFace config.json is recognised by its keys and imported.
  if (j.is_object() && j.contains("num_hidden_layers")) return import_hf_config(j, name_or_path);
  return parse_model(j, name_or_path);
}

}  // namespace tessel
