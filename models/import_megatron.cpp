// Megatron-LM command line -> Model. Flag names follow megatron/training/arguments.py and the dataclass-
// generated flags of transformer_config.py (snake_case -> --kebab-case). Flags that do not describe the
// model's shape (learning rate, data paths, layout: --tensor-model-parallel-size, and for experts
// --expert-model-parallel-size, --expert-tensor-parallel-size) are skipped by import_megatron_args; the
// pipeline split's four are read by import_megatron_pipeline_split.
#include <cctype>
#include <map>
#include <sstream>

#include "models/model.hpp"

namespace tessel {

namespace {
struct Flags {
  std::map<std::string, std::string> values;
  std::map<std::string, bool> switches;
};

// Megatron flags are either "--name value" or a store_true "--name"; we decide by the next token.
Flags split_flags(const std::vector<std::string>& argv) {
  Flags f;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0) continue;
    auto eq = a.find('=');
    if (eq != std::string::npos) {
      f.values[a.substr(0, eq)] = a.substr(eq + 1);
    } else if (i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) {
      f.values[a] = argv[++i];
    } else {
      f.switches[a] = true;
    }
  }
  return f;
}

int int_flag(const Flags& f, const std::string& where, const std::string& name, int min, int max) {
  auto it = f.values.find(name);
  if (it == f.values.end()) throw InputError(where + ": missing " + name);
  try {
    std::size_t pos = 0;
    long v = std::stol(it->second, &pos);
    if (pos != it->second.size() || v < min || v > max) throw std::out_of_range("");
    return static_cast<int>(v);
  } catch (const std::exception&) {
    throw InputError(where + ": " + name + " " + it->second + " must be an integer in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "]");
  }
}
double double_flag(const Flags& f, const std::string& where, const std::string& name, double min, double max) {
  const std::string& v = f.values.at(name);
  try {
    std::size_t pos = 0;
    const double x = std::stod(v, &pos);
    if (pos != v.size() || !(x >= min && x <= max)) throw std::out_of_range("");
    return x;
  } catch (const std::exception&) {
    std::ostringstream os;
    os << where << ": " << name << " " << v << " must be a number in [" << min << ", " << max << "]";
    throw InputError(os.str());
  }
}

// --moe-layer-freq (arguments.py moe_freq_type; gpt_layer_specs.py): an integer N makes layer i a MoE layer
// when i % N == 0; a Python list expression ("([0]*3+[1]*58)", "[1,0,1,0]") gives each layer's 1 (MoE) or 0
// (dense) and must have one entry per layer. The expression is read here (lists, + and * by an integer,
// parentheses), not evaluated as Python. Returns the dense layers.
class FreqPattern {
 public:
  FreqPattern(std::string text, std::string where) : s_(std::move(text)), where_(std::move(where)) {
    if (s_.size() >= 2 && (s_.front() == '"' || s_.front() == '\'') && s_.back() == s_.front()) s_ = s_.substr(1, s_.size() - 2);
  }
  std::vector<int> dense_layers(int layers) {
    std::vector<int> pattern;
    if (s_.find('[') == std::string::npos) {
      const int n = number();
      if (n < 1) fail("an integer >= 1 or a list of 0 and 1");
      for (int i = 0; i < layers; ++i) pattern.push_back(i % n == 0 ? 1 : 0);
    } else {
      pattern = expr();
    }
    if (i_ != s_.size()) fail("unexpected text at character " + std::to_string(i_ + 1));
    if (static_cast<int>(pattern.size()) != layers)
      fail("has " + std::to_string(pattern.size()) + " entries for the " + std::to_string(layers) + " layers (--num-layers)");
    std::vector<int> dense;
    for (int i = 0; i < layers; ++i)
      if (pattern[i] == 0) dense.push_back(i);
    return dense;
  }

 private:
  [[noreturn]] void fail(const std::string& rule) const {
    throw InputError(where_ + ": --moe-layer-freq " + s_ + ": " + rule);
  }
  bool eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  int number() {
    std::size_t start = i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (start == i_ || i_ - start > 6) fail("expected an integer of at most 6 digits at character " + std::to_string(start + 1));
    return std::stoi(s_.substr(start, i_ - start));
  }
  std::vector<int> expr() {  // term ('+' term)*
    std::vector<int> out = term();
    while (eat('+')) {
      std::vector<int> t = term();
      out.insert(out.end(), t.begin(), t.end());
    }
    return out;
  }
  std::vector<int> term() {  // atom ('*' integer)*
    std::vector<int> a = atom();
    while (eat('*')) {
      const int times = number();
      if (a.size() * static_cast<std::size_t>(times) > 100000) fail("repeats past 100000 layers");
      std::vector<int> r;
      for (int k = 0; k < times; ++k) r.insert(r.end(), a.begin(), a.end());
      a = std::move(r);
    }
    return a;
  }
  std::vector<int> atom() {  // '[' 0|1 (',' 0|1)* ']' | '(' expr ')'
    if (eat('(')) {
      std::vector<int> e = expr();
      if (!eat(')')) fail("expected ')' at character " + std::to_string(i_ + 1));
      return e;
    }
    if (!eat('[')) fail("expected '[' or '(' at character " + std::to_string(i_ + 1) + " (write the list without spaces)");
    std::vector<int> out;
    do {
      const int v = number();
      if (v > 1) fail("entries are 1 (a MoE layer) or 0 (a dense one), not " + std::to_string(v));
      out.push_back(v);
    } while (eat(','));
    if (!eat(']')) fail("expected ']' at character " + std::to_string(i_ + 1));
    return out;
  }

  std::string s_, where_;
  std::size_t i_ = 0;
};

// Megatron-Core's mixture of experts (transformer_config.py, moe/router.py, moe/shared_experts.py): experts
// of --moe-ffn-hidden-size (default --ffn-hidden-size), the router's score function (softmax: top-k of the
// logits then softmax, renormalised, unless --moe-router-pre-softmax; sigmoid: renormalised when top-k > 1,
// moe_utils.topk_routing_with_score_function), its logit bias and the experts' biases with the linear
// layers' (add_bias_linear), shared experts as one MLP, which refuses biases (SharedExpertMLP).
void read_moe(const Flags& f, const std::string& where, Model& m) {
  MoeSpec& e = m.moe;
  e.experts = int_flag(f, where, "--num-experts", 1, 1 << 16);
  e.top_k = f.values.count("--moe-router-topk") ? int_flag(f, where, "--moe-router-topk", 1, 1 << 16) : 2;
  e.expert_ffn = f.values.count("--moe-ffn-hidden-size") ? int_flag(f, where, "--moe-ffn-hidden-size", 1, 1 << 24) : m.ffn;
  if (f.values.count("--moe-shared-expert-intermediate-size")) {
    e.shared_ffn = int_flag(f, where, "--moe-shared-expert-intermediate-size", 1, 1 << 24);
    e.shared_experts = 1;
    e.shared_gate = f.switches.count("--moe-shared-expert-gate") > 0;
    if (m.bias)
      throw InputError(where + ": --moe-shared-expert-intermediate-size with linear biases (no --disable-bias-linear): "
                       "Megatron's shared experts have no biases (shared_experts.py asserts add_bias_linear is false)");
  }
  if (f.values.count("--moe-layer-freq")) e.dense_layers = FreqPattern(f.values.at("--moe-layer-freq"), where).dense_layers(m.layers);
  e.expert_bias = m.bias;
  RouterSpec& r = e.router;
  r.logit_bias = m.bias;
  const auto score = f.values.find("--moe-router-score-function");
  if (score != f.values.end() && score->second != "softmax" && score->second != "sigmoid")
    throw InputError(where + ": --moe-router-score-function " + score->second + ": Tessel models softmax and sigmoid");
  r.score = score != f.values.end() && score->second == "sigmoid" ? RouterScore::sigmoid : RouterScore::softmax;
  r.normalize_top_k = r.score == RouterScore::softmax ? !f.switches.count("--moe-router-pre-softmax") : e.top_k > 1;
  if (f.values.count("--moe-router-num-groups")) r.groups = int_flag(f, where, "--moe-router-num-groups", 1, 1 << 16);
  if (f.values.count("--moe-router-group-topk")) r.group_top_k = int_flag(f, where, "--moe-router-group-topk", 1, 1 << 16);
  if (f.values.count("--moe-router-topk-scaling-factor"))
    r.scale = double_flag(f, where, "--moe-router-topk-scaling-factor", 1e-6, 1e6);
  r.selection_bias = f.switches.count("--moe-router-enable-expert-bias") > 0;
  if (f.values.count("--moe-router-bias-update-rate"))
    r.bias_update_rate = double_flag(f, where, "--moe-router-bias-update-rate", 0.0, 1.0);
  if (f.values.count("--moe-aux-loss-coeff")) r.aux_loss_coef = double_flag(f, where, "--moe-aux-loss-coeff", 0, 1e6);
  if (static_cast<int>(e.dense_layers.size()) == m.layers) e = MoeSpec{};  // a pattern of zeros: no MoE layer
}

// Multi-head latent attention (arguments.py _add_mla_args, multi_latent_attention.py): --q-lora-rank
// (default none: a direct query projection), --kv-lora-rank (default 32), --qk-head-dim (128),
// --qk-pos-emb-head-dim (64), --v-head-dim (128). Its projections have no bias, its output projection the
// linear layers' bias. MLA rotates its own rotary part: Megatron's learned absolute table (the default
// --position-embedding-type) would come on top, which Tessel does not model.
void read_mla(const Flags& f, const std::string& where, Model& m) {
  const auto opt = [&](const char* name, int dflt) {
    return f.values.count(name) ? int_flag(f, where, name, 1, 1 << 24) : dflt;
  };
  m.mla.q_lora_rank = opt("--q-lora-rank", 0);
  m.mla.kv_lora_rank = opt("--kv-lora-rank", 32);
  m.mla.qk_nope_head_dim = opt("--qk-head-dim", 128);
  m.mla.qk_rope_head_dim = opt("--qk-pos-emb-head-dim", 64);
  m.mla.v_head_dim = opt("--v-head-dim", 128);
  if (f.switches.count("--group-query-attention"))
    throw InputError(where + ": --group-query-attention with --multi-latent-attention: Megatron makes them exclusive "
                     "(arguments.py): MLA expands its latent to every head");
  m.head_dim = m.mla.qk_head_dim();
  m.kv_heads = m.heads;
  m.qkv_bias = false;
  const auto pos = f.values.find("--position-embedding-type");
  if (pos == f.values.end() || (pos->second != "rope" && pos->second != "yarn" && pos->second != "none"))
    throw InputError(where + ": --position-embedding-type " + (pos == f.values.end() ? "learned_absolute (the default)" : pos->second) +
                     " with --multi-latent-attention: Tessel models MLA with rotary positions only (pass rope or yarn)");
  m.position = PositionEmbedding::rotary;
}

BeyondDenseKeys megatron_keys() {
  BeyondDenseKeys k;
  k.experts = "--num-experts";
  k.top_k = "--moe-router-topk";
  k.expert_ffn = "--moe-ffn-hidden-size";
  k.shared_experts = k.shared_ffn = "--moe-shared-expert-intermediate-size";
  k.shared_gate = "--moe-shared-expert-gate";
  k.dense_layers = "--moe-layer-freq";
  k.groups = "--moe-router-num-groups";
  k.group_top_k = "--moe-router-group-topk";
  k.score = "--moe-router-score-function";
  k.selection_bias = "--moe-router-enable-expert-bias";
  k.mla = "--multi-latent-attention";
  k.mtp_layers = "--mtp-num-layers";
  return k;
}
}  // namespace

MegatronPipelineSplit import_megatron_pipeline_split(const std::vector<std::string>& argv, const std::string& where) {
  const Flags f = split_flags(argv);
  MegatronPipelineSplit out;
  const auto count = [&](const char* name) -> std::optional<int> {
    if (!f.values.count(name)) return std::nullopt;
    return int_flag(f, where, name, 0, 100000);
  };
  out.first_stage_layers = count("--decoder-first-pipeline-num-layers");
  out.last_stage_layers = count("--decoder-last-pipeline-num-layers");
  // store_true switches in arguments.py.
  out.account_for_embedding = f.switches.count("--account-for-embedding-in-pipeline-split") > 0;
  out.account_for_loss = f.switches.count("--account-for-loss-in-pipeline-split") > 0;
  return out;
}

Model import_megatron_args(const std::vector<std::string>& argv, const std::string& where) {
  Flags f = split_flags(argv);
  Model m;
  m.name = "megatron-import";
  m.layers = int_flag(f, where, "--num-layers", 1, 100000);
  m.hidden = int_flag(f, where, "--hidden-size", 1, 1 << 24);
  m.heads = int_flag(f, where, "--num-attention-heads", 1, 1 << 16);
  // --num-query-groups only takes effect with --group-query-attention (arguments.py).
  m.kv_heads = f.switches.count("--group-query-attention") && f.values.count("--num-query-groups")
                   ? int_flag(f, where, "--num-query-groups", 1, 1 << 16)
                   : m.heads;
  m.seq_len = int_flag(f, where, "--seq-length", 1, 1 << 24);
  bool swiglu = f.switches.count("--swiglu") > 0;
  m.activation = swiglu ? Activation::swiglu : Activation::gelu;
  if (f.values.count("--ffn-hidden-size")) {
    m.ffn = int_flag(f, where, "--ffn-hidden-size", 1, 1 << 24);
  } else {
    // Megatron's default: 4h, or int(4h * 2/3 / 64) * 64 with SwiGLU (transformer_config.py).
    m.ffn = swiglu ? (4 * m.hidden * 2 / 3 / 64) * 64 : 4 * m.hidden;
  }
  if (f.values.count("--kv-channels")) {
    m.head_dim = int_flag(f, where, "--kv-channels", 1, 1 << 24);
  } else {
    if (m.hidden % m.heads != 0)
      throw InputError(where + ": --hidden-size " + std::to_string(m.hidden) + " is not divisible by --num-attention-heads " +
                       std::to_string(m.heads));
    m.head_dim = m.hidden / m.heads;
  }
  auto norm = f.values.find("--normalization");
  m.norm = norm != f.values.end() && norm->second == "RMSNorm" ? Norm::rmsnorm : Norm::layernorm;
  auto pos = f.values.find("--position-embedding-type");
  m.position = pos != f.values.end() && pos->second == "rope" ? PositionEmbedding::rotary : PositionEmbedding::learned;
  // Learned absolute positions (Megatron's default): a table of --max-position-embeddings rows, which
  // arguments.py requires to be at least --seq-length; without the flag the table follows the sequence.
  if (m.position == PositionEmbedding::learned && f.values.count("--max-position-embeddings")) {
    m.max_positions = int_flag(f, where, "--max-position-embeddings", 1, 1 << 24);
    check_learned_positions(m, where, "--max-position-embeddings");
  }
  m.tied_embeddings = !f.switches.count("--untie-embeddings-and-output-weights");
  m.bias = !f.switches.count("--disable-bias-linear");
  if (f.values.count("--vocab-size")) {
    m.vocab = int_flag(f, where, "--vocab-size", 1, 1 << 24);
  } else if (f.values.count("--vocab-file") && f.values.at("--vocab-file").find("gpt2") != std::string::npos) {
    // GPT-2 BPE: 50257 tokens, padded to a multiple of --make-vocab-size-divisible-by (default 128) x TP.
    int tp = f.values.count("--tensor-model-parallel-size") ? int_flag(f, where, "--tensor-model-parallel-size", 1, 1 << 16) : 1;
    int div = f.values.count("--make-vocab-size-divisible-by") ? int_flag(f, where, "--make-vocab-size-divisible-by", 1, 1 << 16) : 128;
    // In 64 bits: div and tp may each be up to 2^16, their product 2^32.
    const std::int64_t mult = static_cast<std::int64_t>(div) * tp;
    const std::int64_t padded = (50257 + mult - 1) / mult * mult;
    if (padded > (1 << 24))
      throw InputError(where + ": padded vocabulary " + std::to_string(padded) + " (50257 rounded up to a multiple of " +
                       "--make-vocab-size-divisible-by x --tensor-model-parallel-size = " + std::to_string(mult) +
                       ") exceeds 2^24");
    m.vocab = static_cast<int>(padded);
  } else {
    throw InputError(where + ": the vocabulary size is unknown: give --vocab-size (Megatron reads it from the tokenizer)");
  }
  if (f.values.count("--num-experts")) read_moe(f, where, m);
  if (f.switches.count("--multi-latent-attention")) read_mla(f, where, m);
  if (f.values.count("--mtp-num-layers")) m.mtp_layers = int_flag(f, where, "--mtp-num-layers", 0, 64);
  check_beyond_dense(m, where, megatron_keys());
  if (m.heads % m.kv_heads != 0)
    throw InputError(where + ": --num-query-groups " + std::to_string(m.kv_heads) + " does not divide --num-attention-heads " +
                     std::to_string(m.heads));
  check_model_size(m, where);
  return m;
}

}  // namespace tessel
