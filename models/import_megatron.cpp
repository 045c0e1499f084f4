// Megatron-LM command line -> Model. Flag names follow megatron/training/arguments.py and the dataclass-
// generated flags of transformer_config.py (snake_case -> --kebab-case). Flags that do not describe the
// model's shape (learning rate, data paths, layout) are skipped by import_megatron_args; the pipeline
// split's four are read by import_megatron_pipeline_split.
#include <map>

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
  if (m.heads % m.kv_heads != 0)
    throw InputError(where + ": --num-query-groups " + std::to_string(m.kv_heads) + " does not divide --num-attention-heads " +
                     std::to_string(m.heads));
  check_model_size(m, where);
  return m;
}

}  // namespace tessel
