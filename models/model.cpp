#include "models/model.hpp"

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string_view>
#include <utility>

#include "models/beyond_dense.hpp"
#include "util/suggest.hpp"

namespace tessel {

const std::vector<std::pair<std::string_view, std::string_view>>& tessel_model_presets();

namespace {
constexpr std::int64_t kMaxDim = 1 << 24;  // 16M: far above any real model, far below overflow
}

std::string to_string(Activation a) { return a == Activation::gelu ? "gelu" : "swiglu"; }
std::string to_string(Norm n) { return n == Norm::layernorm ? "layernorm" : "rmsnorm"; }
std::string to_string(PositionEmbedding p) {
  return p == PositionEmbedding::learned ? "learned" : p == PositionEmbedding::rotary ? "rotary" : "alibi";
}

void check_model_size(const Model& m, const std::string& where) {
  constexpr double kMaxParams = 1e15;
  // The same terms as params_per_layer() and friends, in double: no overflow, and exact enough to compare.
  const double h = m.hidden, f = m.ffn, q = static_cast<double>(m.heads) * m.head_dim,
               kv = static_cast<double>(m.kv_heads) * m.head_dim;
  const double per_layer = h * (q + 2 * kv) + q * h + 3 * h * f + 2 * f + q + 2 * kv +
                           (2.0 + 2.0 * std::max(m.layer_norms, 2)) * h + 4.0 * m.head_dim;
  // Beyond the dense transformer (0 for a dense model): every routed expert (gated, with biases), the shared
  // experts with their gate, the router; MLA's projections and norms; sinks; each MTP module's own layer.
  const double e = m.moe.experts, fe = m.moe.expert_ffn, fs = m.moe.shared_ffn;
  const double moe = m.moe.enabled() ? e * (3 * h * fe + 2 * fe + h) + 3 * h * fs + 2 * fs + 2 * h + e * (h + 1) : 0.0;
  const double qr = m.mla.q_lora_rank, kvr = m.mla.kv_lora_rank, heads = m.heads;
  const double dn = m.mla.qk_nope_head_dim, dr = m.mla.qk_rope_head_dim, dv = m.mla.v_head_dim;
  const double mla = m.mla.enabled() ? h * qr + 3 * qr + qr * heads * (dn + dr) + h * heads * (dn + dr) + h * (kvr + dr) +
                                           3 * kvr + 2 * dr + kvr * heads * (dn + dv) + heads * dv * h + h
                                     : 0.0;
  const double sinks = m.attention_sinks ? heads : 0.0;
  const double layer = per_layer + moe + mla + sinks;
  const double total = (static_cast<double>(m.layers) + m.mtp_layers) * layer + m.mtp_layers * (2 * h * h + 6 * h) +
                       (static_cast<double>(m.vocab) + std::max(m.seq_len, m.max_positions) + 2) * h * 2 + m.vocab;
  if (total > kMaxParams) {
    std::ostringstream os;
    os << where << ": the model has about " << total << " parameters (layers " << m.layers << ", hidden " << m.hidden
       << ", ffn " << m.ffn << ", vocab " << m.vocab;
  if (m.moe.enabled()) os << ", experts " << m.moe.experts << ", expert_ffn " << m.moe.expert_ffn;
  os << "), more than the limit " << kMaxParams;
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
  const std::string pos = o.choice("position", {"learned", "rotary", "alibi"});
  m.position = pos == "learned" ? PositionEmbedding::learned
               : pos == "rotary" ? PositionEmbedding::rotary
                                 : PositionEmbedding::alibi;
  if (auto rows = o.opt_integer("max_positions", 1, kMaxDim)) {
    if (m.position != PositionEmbedding::learned)
      o.fail("max_positions", "applies only to \"position\": \"learned\" (the rows of the position table)");
    m.max_positions = static_cast<int>(*rows);
    if (m.seq_len > m.max_positions)
      o.fail("max_positions", "seq_len " + std::to_string(m.seq_len) + " exceeds the " + std::to_string(m.max_positions) +
                                  " rows of the learned position table");
  }
  if (auto theta = o.opt_number("rope_theta", 1.0, 1e12)) {
    if (m.position != PositionEmbedding::rotary)
      o.fail("rope_theta", "applies only to \"position\": \"rotary\" (this model has learned positions)");
    m.rope_theta = *theta;
  }
  m.tied_embeddings = o.boolean("tied_embeddings");
  m.bias = o.boolean("bias");
  m.qkv_bias = o.opt_boolean("qkv_bias");
  m.out_bias = o.opt_boolean("out_bias");
  m.mlp_bias = o.opt_boolean("mlp_bias");
  m.head_bias = o.opt_boolean("head_bias").value_or(false);
  if (m.head_bias && m.tied_embeddings)
    o.fail("head_bias", "a tied LM head is the token embedding and has no bias (set tied_embeddings false)");
  m.layer_norms = static_cast<int>(o.opt_integer("layer_norms", 1, 4).value_or(2));
  m.embedding_norm = o.opt_boolean("embedding_norm").value_or(false);
  m.qk_norm = o.opt_boolean("qk_norm").value_or(false);
  m.qk_norm_whole = o.opt_boolean("qk_norm_whole").value_or(false);
  if (m.qk_norm_whole && !m.qk_norm) o.fail("qk_norm_whole", "applies only with \"qk_norm\": true");
  m.dropout = o.opt_boolean("dropout").value_or(true);
  detail::parse_beyond_dense(o, m);
  if (auto hd = o.opt_integer("head_dim", 1, kMaxDim)) {
    m.head_dim = static_cast<int>(*hd);
  } else if (m.mla.enabled()) {
    m.head_dim = m.mla.qk_head_dim();  // queries and keys: the non-rotary and the rotary part of each head
  } else {
    if (m.hidden % m.heads != 0)
      o.fail("heads", "hidden " + std::to_string(m.hidden) + " is not divisible by heads " + std::to_string(m.heads) +
                          " (give head_dim explicitly)");
    m.head_dim = m.hidden / m.heads;
  }
  if (m.heads % m.kv_heads != 0)
    o.fail("kv_heads", "heads " + std::to_string(m.heads) + " is not a multiple of kv_heads " + std::to_string(m.kv_heads));
  o.finish();
  check_beyond_dense(m, where);
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
  // The keys below are written only where they differ from their defaults, so the JSON of a model that has
  // none of them reads as before.
  if (m.max_positions > 0) j["max_positions"] = m.max_positions;
  j["activation"] = to_string(m.activation);
  j["norm"] = to_string(m.norm);
  j["position"] = to_string(m.position);
  if (m.position == PositionEmbedding::rotary) j["rope_theta"] = m.rope_theta;
  j["tied_embeddings"] = m.tied_embeddings;
  j["bias"] = m.bias;
  if (m.qkv_bias && *m.qkv_bias != m.bias) j["qkv_bias"] = *m.qkv_bias;
  if (m.out_bias && *m.out_bias != m.bias) j["out_bias"] = *m.out_bias;
  if (m.mlp_bias && *m.mlp_bias != m.bias) j["mlp_bias"] = *m.mlp_bias;
  if (m.head_bias) j["head_bias"] = true;
  if (m.layer_norms != 2) j["layer_norms"] = m.layer_norms;
  if (m.embedding_norm) j["embedding_norm"] = true;
  if (m.qk_norm) j["qk_norm"] = true;
  if (m.qk_norm_whole) j["qk_norm_whole"] = true;
  j["dropout"] = m.dropout;
  if (m.stated_params_b > 0) j["params_b"] = m.stated_params_b;
  detail::beyond_dense_to_json(m, j);
  return j;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : tessel_model_presets()) names.emplace_back(name);
  return names;
}

void check_learned_positions(const Model& m, const std::string& where, const std::string& key) {
  if (m.position != PositionEmbedding::learned || m.max_positions <= 0 || m.seq_len <= m.max_positions) return;
  throw InputError(where + ": " + key + ": value " + std::to_string(m.max_positions) +
                   " rows of the learned position table, but the sequence length is " + std::to_string(m.seq_len) +
                   "; a learned table has no position past its last row: pass --seq <= " +
                   std::to_string(m.max_positions));
}

namespace {
// A Megatron-LM argument file: the flags of a training script ("--num-layers 24 --hidden-size 1024 ..."),
// whitespace-separated, shell line continuations (a backslash ending a line) and "#" comments allowed. Its
// words; load_model takes a file for one when the first word starts with "--" (a JSON document starts with
// "{" or "[").
std::vector<std::string> megatron_tokens(const std::string& text) {
  std::vector<std::string> argv;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string w;
    while (words >> w)
      if (w != "\\") argv.push_back(w);
  }
  return argv;
}
}  // namespace

// A HuggingFace config.json is recognised by its keys: the layer count under any of its families' names
// (num_hidden_layers; n_layer in GPT-2, GPT-J, BLOOM, GPTBigCode), or model_type / architectures, which
// every config written by transformers carries and a Tessel model file never has.
bool is_hf_config(const Json& j) {
  return j.is_object() && (j.contains("num_hidden_layers") || j.contains("n_layer") || j.contains("model_type") ||
                           j.contains("architectures"));
}

std::optional<MegatronPipelineSplit> load_megatron_pipeline_split(const std::string& name_or_path) {
  for (const auto& [name, text] : tessel_model_presets())
    if (name == name_or_path) return std::nullopt;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(name_or_path, ec)) return std::nullopt;
  const std::vector<std::string> argv = megatron_tokens(read_text_file(name_or_path, "--model "));
  if (argv.empty() || argv.front().rfind("--", 0) != 0) return std::nullopt;
  return import_megatron_pipeline_split(argv, name_or_path);
}

Model load_model(const std::string& name_or_path, std::optional<std::int64_t> seq_len) {
  const auto with_seq = [&](Model m, const std::string& where) {
    if (seq_len) {
      m.seq_len = static_cast<int>(*seq_len);
      check_learned_positions(m, where, "max_positions");
      check_model_size(m, where);
    }
    return m;
  };
  for (const auto& [name, text] : tessel_model_presets()) {
    if (name == name_or_path) {
      std::string where = "model preset " + std::string(name);
      return with_seq(parse_model(parse_json_text(std::string(text), where), where), where);
    }
  }
  std::error_code ec;
  bool looks_like_path = name_or_path.find('/') != std::string::npos || name_or_path.find(".json") != std::string::npos ||
                         name_or_path.find(".txt") != std::string::npos || std::filesystem::exists(name_or_path, ec);
  if (!looks_like_path) {
    std::string list;
    for (const auto& n : model_preset_names()) list += (list.empty() ? "" : ", ") + n;
    throw InputError("--model " + name_or_path + ": no such preset (known: " + list + ") and no such file" +
                     did_you_mean(name_or_path, model_preset_names()));
  }
  const std::string text = read_text_file(name_or_path, "--model ");
  if (std::vector<std::string> argv = megatron_tokens(text); !argv.empty() && argv.front().rfind("--", 0) == 0) {
    if (seq_len) {
      argv.push_back("--seq-length");
      argv.push_back(std::to_string(*seq_len));
    }
    return import_megatron_args(argv, name_or_path);
  }
  Json j = parse_json_text(text, name_or_path);
  if (is_hf_config(j)) return import_hf_config(j, name_or_path, seq_len);
  return with_seq(parse_model(j, name_or_path), name_or_path);
}

}  // namespace tessel
