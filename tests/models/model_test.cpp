// Model spec: parameter counts against the sources, strict parsing, importers.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "models/model.hpp"

using namespace tessel;

namespace {
constexpr double kTable1HalfDigit = 0.05 + 1e-6;  // Narayanan Table 1 prints billions with one decimal
constexpr double kStatedTol = 0.015;     // Llama parameter counts are stated rounded (6.74B, 70.6B)

Model parse(const std::string& text) { return parse_model(parse_json_text(text, "test.json"), "test.json"); }

std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

const char* kTinyJson = R"({"name":"t","layers":2,"hidden":8,"heads":2,"ffn":32,"vocab":16,"seq_len":4,
  "activation":"gelu","norm":"layernorm","position":"learned","tied_embeddings":true,"bias":true})";

// Presets whose sources state no parameter count (a recipe's label such as "8b" is not one: Nemotron-8B's
// shape holds 8.5B); the closed forms below count them instead.
bool count_unstated(const std::string& name) {
  return name == "gpt3-5b" || name == "gpt3-20b" || name == "nemotron-8b" || name == "nemotron-22b" ||
         name == "nemotron-340b";
}
}  // namespace

TEST_CASE("presets: parameter counts match the stated ones") {
  for (const auto& name : model_preset_names()) {
    CAPTURE(name);
    const Model m = load_model(name);
    if (count_unstated(name)) {
      CHECK(m.stated_params_b == 0);
      continue;
    }
    REQUIRE(m.stated_params_b > 0);
    const double ours = static_cast<double>(m.total_params()) / 1e9;
    // Narayanan et al. eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) gives Table 1's column.
    const bool megatron = name.rfind("megatron", 0) == 0 || name == "gpt3-175b" || name == "mt-nlg-530b";
    if (megatron) {
      // Table 1 prints one decimal: our count must round to the printed value.
      CHECK(std::fabs(ours - m.stated_params_b) <= kTable1HalfDigit);
    } else {
      CHECK(ours == doctest::Approx(m.stated_params_b).epsilon(kStatedTol));
    }
    if (megatron) {
      const double l = m.layers, h = m.hidden, V = m.vocab, s = m.seq_len;
      const double eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h)) / 1e9;
      CHECK(ours == doctest::Approx(eq2).epsilon(1e-4));  // differs only by the final norm, 2h
    }
  }
}

TEST_CASE("presets without a stated count: closed forms of their shapes") {
  // NeMo's GPT-3 recipes are Megatron GPTs: Narayanan et al. eq. 2 plus the final norm (2h).
  for (const char* name : {"gpt3-5b", "gpt3-20b"}) {
    CAPTURE(name);
    const Model m = load_model(name);
    const double l = m.layers, h = m.hidden, V = m.vocab, s = m.seq_len;
    CHECK(static_cast<double>(m.total_params()) ==
          doctest::Approx(12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h)) + 2 * h).epsilon(1e-9));
  }
  // Nemotron: no linear biases; per layer Q and O (h x h each), K and V (h x groups x head_dim each), the
  // squared-ReLU MLP (2 h ffn), two LayerNorms with weight and bias (4h); untied input and output embeddings
  // and the final LayerNorm.
  for (const char* name : {"nemotron-8b", "nemotron-22b", "nemotron-340b"}) {
    CAPTURE(name);
    const Model m = load_model(name);
    const double l = m.layers, h = m.hidden, V = m.vocab, f = m.ffn, kv = m.kv_heads * (m.hidden / m.heads);
    CHECK(static_cast<double>(m.total_params()) ==
          doctest::Approx(l * (2 * h * h + 2 * h * kv + 2 * h * f + 4 * h) + 2 * V * h + 2 * h).epsilon(1e-9));
  }
}

TEST_CASE("tiny preset: hand-counted parameters") {
  // Per layer: QKV 64*192 + 192, proj 64*64 + 64, MLP 64*256 + 256 + 256*64 + 64, two LayerNorms 4*64
  // = 12480 + 4160 + 16640 + 16448 + 256 = 49984; 8 layers = 399872; embeddings (256 + 32) * 64 = 18432;
  // final norm 128. Total 418432.
  const Model m = load_model("tiny");
  CHECK(m.params_per_layer() == 49984);
  CHECK(m.total_params() == 418432);
}

TEST_CASE("strict parsing names the key, the value and the rule") {
  CHECK(parse(kTinyJson).layers == 2);
  std::string unknown = std::string(kTinyJson).replace(1, 0, "\"extra\":1,");
  CHECK(error_of(unknown).find("extra: unknown key") != std::string::npos);
  std::string missing = R"({"name":"t","layers":2})";
  CHECK(error_of(missing).find("missing required key") != std::string::npos);
  std::string negative = std::string(kTinyJson);
  negative.replace(negative.find("\"layers\":2"), 10, "\"layers\":-3");
  CHECK(error_of(negative).find("layers: value -3 is out of range") != std::string::npos);
  std::string wrong_type = std::string(kTinyJson);
  wrong_type.replace(wrong_type.find("\"hidden\":8"), 10, "\"hidden\":\"8\"");
  CHECK(error_of(wrong_type).find("hidden: value \"8\" must be an integer") != std::string::npos);
  std::string absurd = std::string(kTinyJson);
  absurd.replace(absurd.find("\"hidden\":8"), 10, "\"hidden\":1e30");
  CHECK(error_of(absurd).find("hidden") != std::string::npos);
  std::string bad_heads = std::string(kTinyJson);
  bad_heads.replace(bad_heads.find("\"heads\":2"), 9, "\"heads\":3");
  CHECK(error_of(bad_heads).find("not divisible by heads 3") != std::string::npos);
  std::string bad_choice = std::string(kTinyJson);
  bad_choice.replace(bad_choice.find("\"gelu\""), 6, "\"relu6\"");
  CHECK(error_of(bad_choice).find("\"relu6\" is not one of: gelu, swiglu") != std::string::npos);
}

TEST_CASE("malformed JSON is reported as file:line:column") {
  std::string err;
  try {
    parse_json_text("{\n  \"a\": 1,\n  \"b\": ]\n}", "m.json");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err.rfind("m.json:3:", 0) == 0);
}

TEST_CASE("a key repeated in an object is rejected with the file and the key path") {
  // nlohmann keeps the last of repeated keys; strict input names the repeat instead of dropping a value.
  const auto parse_error = [](const std::string& text, const std::string& origin) {
    try {
      parse_json_text(text, origin);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string twice = std::string(kTinyJson).replace(1, 0, "\"layers\":64,");
  CHECK(error_of(twice) == "test.json: layers (value 2): duplicate key; each key may appear once in an object");
  // Nested objects and arrays name the path; the same key in sibling objects is not a repeat.
  CHECK(parse_error(R"([{"id":"a","m":{"l":1}},{"id":"b","m":{"l":1,"l":2}}])", "rows.json") ==
        "rows.json: [1].m.l (value 2): duplicate key; each key may appear once in an object");
  CHECK(parse_error(R"({"a":{"x":1},"b":{"x":1},"c":[{"x":1},{"x":2}]})", "ok.json").empty());
  CHECK(parse_error(R"({"a":[1,{"b":1}],"a":{}})", "o.json") ==
        "o.json: a: duplicate key; each key may appear once in an object");
  // A HuggingFace config.json loaded by path goes through the same reader.
  const auto path = (std::filesystem::temp_directory_path() / "tessel_model_test_dup_config.json").string();
  {
    std::ofstream f(path);
    f << R"({"hidden_act":"silu","hidden_size":4096,"intermediate_size":11008,"model_type":"llama",
      "num_attention_heads":32,"num_hidden_layers":32,"vocab_size":32000,"max_position_embeddings":4096,
      "rms_norm_eps":1e-05,"hidden_size":8192})";
  }
  std::string err;
  try {
    load_model(path);
  } catch (const InputError& e) {
    err = e.what();
  }
  std::filesystem::remove(path);
  CHECK(err == path + ": hidden_size (value 8192): duplicate key; each key may appear once in an object");
}

TEST_CASE("unknown preset lists the known ones") {
  std::string err;
  try {
    load_model("gpt5");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err.find("gpt3-175b") != std::string::npos);
  CHECK(err.find("tiny") != std::string::npos);
}

TEST_CASE("HuggingFace config.json import (Llama-2 7B and GPT-2)") {
  // Keys as in meta-llama/Llama-2-7b-hf config.json.
  const char* llama = R"({"architectures":["LlamaForCausalLM"],"hidden_act":"silu","hidden_size":4096,
    "intermediate_size":11008,"max_position_embeddings":4096,"model_type":"llama","num_attention_heads":32,
    "num_hidden_layers":32,"num_key_value_heads":32,"rms_norm_eps":1e-05,"tie_word_embeddings":false,
    "vocab_size":32000,"rope_theta":10000.0})";
  const Model m = import_hf_config(parse_json_text(llama, "config.json"), "config.json");
  CHECK(m.activation == Activation::swiglu);
  CHECK(m.norm == Norm::rmsnorm);
  CHECK_FALSE(m.tied_embeddings);
  // 6.74B stated by Touvron et al.
  CHECK(static_cast<double>(m.total_params()) / 1e9 == doctest::Approx(6.74).epsilon(kStatedTol));
  const char* gpt2 = R"({"model_type":"gpt2","n_layer":12,"n_embd":768,"n_head":12,"n_positions":1024,
    "vocab_size":50257,"n_inner":null,"activation_function":"gelu_new"})";
  const Model g = import_hf_config(parse_json_text(gpt2, "gpt2.json"), "gpt2.json");
  CHECK(g.ffn == 3072);
  // GPT-2 small: 124.4M parameters (HuggingFace model card).
  CHECK(static_cast<double>(g.total_params()) / 1e6 == doctest::Approx(124.4).epsilon(0.002));
  std::string err;
  try {
    import_hf_config(parse_json_text(R"({"hidden_size":4096})", "c.json"), "c.json");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err.find("num_hidden_layers") != std::string::npos);
}

TEST_CASE("HuggingFace import: the architecture decides a gated MLP; experts only in MoE families; wrong types are rejected") {
  const auto import_error = [](const std::string& text) {
    try {
      import_hf_config(parse_json_text(text, "config.json"), "config.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // google/gemma-7b config.json: GemmaMLP is down_proj(gelu(gate_proj(x)) * up_proj(x)) (GeGLU). Gemma Team
  // 2024, Table 2: 786M embedding + 7751M non-embedding parameters = 8.54B; per layer 4 x 3072 x 4096
  // (attention, head_dim 256 x 16 heads) + 3 x 3072 x 24576 (gated MLP). An ungated MLP would give 6.42B.
  // GemmaConfig ties the embeddings by default (the file has no tie_word_embeddings).
  const std::string gemma = R"({"architectures":["GemmaForCausalLM"],"attention_bias":false,"head_dim":256,
    "hidden_act":"gelu","hidden_activation":"gelu_pytorch_tanh","hidden_size":3072,"intermediate_size":24576,
    "max_position_embeddings":8192,"model_type":"gemma","num_attention_heads":16,"num_hidden_layers":28,
    "num_key_value_heads":16,"rms_norm_eps":1e-06,"rope_theta":10000.0,"vocab_size":256000})";
  const Model g = import_hf_config(parse_json_text(gemma, "config.json"), "config.json");
  CHECK(g.activation == Activation::swiglu);
  CHECK(g.tied_embeddings);
  CHECK(static_cast<double>(g.total_params()) / 1e9 == doctest::Approx(8.54).epsilon(kStatedTol));
  // Without model_type the architecture class decides; the gated shape whatever the activation.
  std::string by_class = gemma;
  by_class.replace(by_class.find("\"model_type\":\"gemma\","), 21, "");
  CHECK(import_hf_config(parse_json_text(by_class, "config.json"), "config.json").activation == Activation::swiglu);
  // GPT-NeoX: ungated whatever the activation name.
  const std::string neox = R"({"model_type":"gpt_neox","hidden_act":"gelu","hidden_size":64,"intermediate_size":256,
    "num_attention_heads":4,"num_hidden_layers":2,"vocab_size":100,"max_position_embeddings":16})";
  CHECK(import_hf_config(parse_json_text(neox, "config.json"), "config.json").activation == Activation::gelu);
  const std::string base = R"("hidden_size":64,"intermediate_size":256,"num_attention_heads":4,"num_hidden_layers":2,
    "vocab_size":100,"max_position_embeddings":16,"rms_norm_eps":1e-5)";
  CHECK(import_error("{\"model_type\":\"llama\"," + base + "}").empty());
  CHECK(import_error("{\"model_type\":\"foo\"," + base + "}").find("config.json: model_type: value \"foo\" is not an "
                                                                   "architecture whose MLP Tessel knows (llama,") == 0);
  CHECK(import_error("{" + base + "}").find("config.json: missing required key model_type or architectures") == 0);
  // Mixture-of-experts families import (tests/models/hf_moe_test.cpp has their exact counts). This one: 2 layers
  // of attention 4 x 64^2 = 16384, two RMSNorms 128, 8 gated experts of 3 x 64 x 256 = 49152 and a router of
  // 8 x 64 = 512: 410240 each; token table and untied head (MixtralConfig's default) 100 x 64 each, final norm
  // 64: 2 x 410240 + 2 x 6400 + 64 = 833344.
  const Model mixtral = import_hf_config(
      parse_json_text("{\"model_type\":\"mixtral\",\"num_local_experts\":8,\"num_experts_per_tok\":2," + base + "}", "config.json"),
      "config.json");
  CHECK(mixtral.moe.experts == 8);
  CHECK(mixtral.total_params() == 833344);
  // What sizes the experts is required, as intermediate_size is; a class default would be a guess.
  CHECK(import_error("{\"model_type\":\"mixtral\",\"num_local_experts\":8," + base + "}") ==
        "config.json: missing required key num_experts_per_tok");
  CHECK(import_error("{\"model_type\":\"deepseek_v3\"," + base + "}") == "config.json: missing required key n_routed_experts");
  // Experts or latent attention in a family whose class has none: named key, value, and the families that do.
  CHECK(import_error("{\"model_type\":\"llama\",\"n_routed_experts\":256," + base + "}") ==
        "config.json: n_routed_experts: value 256 describes a mixture of experts, which the llama family does not have "
        "(mixture-of-experts families: mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, gpt_oss, olmoe)");
  CHECK(import_error("{\"model_type\":\"llama\",\"num_experts\":1," + base + "}").empty());  // one expert: dense
  CHECK(import_error("{\"model_type\":\"llama\",\"kv_lora_rank\":512," + base + "}") ==
        "config.json: kv_lora_rank: value 512 describes multi-head latent attention, which the llama family does not "
        "have (it is DeepSeek's: deepseek_v2, deepseek_v3)");
  CHECK(import_error("{\"model_type\":\"mixtral\",\"q_lora_rank\":1536," + base + "}").find("q_lora_rank: value 1536") !=
        std::string::npos);
  // Mixture-of-experts architectures whose classes Tessel has not followed.
  CHECK(import_error("{\"model_type\":\"dbrx\"," + base + "}") ==
        "config.json: model_type: value \"dbrx\" is a mixture-of-experts architecture Tessel does not import (it "
        "imports mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, gpt_oss, olmoe)");
  // Types: key, value and the expected type.
  CHECK(import_error("{\"model_type\":\"llama\",\"hidden_act\":123," + base + "}") ==
        "config.json: hidden_act: value 123 must be a string");
  CHECK(import_error("{\"model_type\":\"llama\",\"tie_word_embeddings\":\"true\"," + base + "}") ==
        "config.json: tie_word_embeddings: value \"true\" must be true or false");
  CHECK(import_error("{\"model_type\":\"llama\",\"attention_bias\":1," + base + "}") ==
        "config.json: attention_bias: value 1 must be true or false");
  CHECK(import_error("{\"model_type\":7," + base + "}") == "config.json: model_type: value 7 must be a string");
  CHECK(import_error("{\"model_type\":\"llama\",\"hidden_act\":\"tanh\"," + base + "}") ==
        "config.json: hidden_act: value \"tanh\" is not supported (silu, swish, gelu*, relu)");
}

TEST_CASE("Megatron-LM command line import (GPT-3 175B example script)") {
  // Flags of examples/gpt3/train_gpt3_175b_distributed.sh (Megatron-LM).
  const std::vector<std::string> argv = {
      "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "16", "--num-layers", "96",
      "--hidden-size", "12288", "--num-attention-heads", "96", "--seq-length", "2048",
      "--max-position-embeddings", "2048", "--micro-batch-size", "1", "--global-batch-size", "1536",
      "--vocab-file", "gpt2-vocab.json", "--merge-file", "gpt2-merges.txt", "--bf16"};
  const Model m = import_megatron_args(argv, "cmdline");
  CHECK(m.layers == 96);
  CHECK(m.ffn == 4 * 12288);
  // 50257 padded to a multiple of 128 * tp = 1024: 51200.
  CHECK(m.vocab == 51200);
  CHECK(m.tied_embeddings);
  std::vector<std::string> swiglu = {"--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32",
                                     "--seq-length", "4096", "--swiglu", "--vocab-size", "32000",
                                     "--group-query-attention", "--num-query-groups", "8"};
  const Model s = import_megatron_args(swiglu, "cmdline");
  // Megatron's default SwiGLU ffn: int(4h * 2/3 / 64) * 64 = 10880 for h = 4096.
  CHECK(s.ffn == 10880);
  CHECK(s.kv_heads == 8);
  std::string err;
  try {
    import_megatron_args({"--num-layers", "x"}, "cmdline");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err.find("--num-layers x") != std::string::npos);
}

TEST_CASE("rope_theta: rotary models only, round-trips, Llama 3's base from the preset and from config.json") {
  // Default 10000 (RoFormer; Llama 2 config.json); Llama 3 Table 3 states a RoPE base of 500,000.
  std::string rotary = std::string(kTinyJson);
  rotary.replace(rotary.find("\"learned\""), 9, "\"rotary\"");
  CHECK(parse(rotary).rope_theta == 10000.0);
  std::string with_theta = rotary;
  with_theta.replace(1, 0, "\"rope_theta\":500000,");
  const Model r = parse(with_theta);
  CHECK(r.rope_theta == 500000.0);
  CHECK(parse_model(model_to_json(r), "round-trip").rope_theta == 500000.0);
  std::string learned = std::string(kTinyJson).replace(1, 0, "\"rope_theta\":500000,");
  CHECK(error_of(learned).find("rope_theta") != std::string::npos);
  CHECK(error_of(learned).find("learned positions") != std::string::npos);
  CHECK(load_model("llama3-8b").rope_theta == 500000.0);
  CHECK(load_model("llama2-7b").rope_theta == 10000.0);
  const char* cfg = R"({"hidden_act":"silu","hidden_size":4096,"intermediate_size":14336,"model_type":"llama",
    "num_attention_heads":32,"num_hidden_layers":32,"num_key_value_heads":8,"vocab_size":128256,
    "max_position_embeddings":8192,"tie_word_embeddings":false,"rope_theta":500000.0})";
  CHECK(import_hf_config(parse_json_text(cfg, "config.json"), "config.json").rope_theta == 500000.0);
}

TEST_CASE("a directory given as a JSON file is named as one") {
  // An ifstream opens a directory and reads nothing from it: "malformed JSON ... unexpected end of input".
  const auto dir = std::filesystem::temp_directory_path() / "tessel-models-test-dir.json";
  std::filesystem::create_directories(dir);
  const std::string expect = dir.string() + ": is a directory, not a file";
  CHECK_THROWS_WITH_AS(read_text_file(dir.string()), expect.c_str(), InputError);
  CHECK_THROWS_WITH_AS(parse_json_file(dir.string()), expect.c_str(), InputError);
  CHECK_THROWS_WITH_AS(load_model(dir.string()), ("--model " + expect).c_str(), InputError);
  CHECK_THROWS_WITH_AS(refuse_directory(dir.string(), "--data "), ("--data " + expect).c_str(), InputError);
  CHECK_NOTHROW(refuse_directory((dir / "absent.json").string()));  // a missing path is the reader's to report
  std::filesystem::remove(dir);
}
