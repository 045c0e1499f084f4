// HuggingFace config.json import across families: exact parameter counts from the families' HF modelling
// classes, the keys that change a count (kv heads, biases, norms, positions), and the configs that must be
// refused (a sequence past the attention window or the learned position table, a gated MLP without its width).
//
// Expected counts are derived in the comments from the modelling classes (transformers/models/<family>/
// modeling_<family>.py): per block the attention projections, the MLP, the biases and the norms, plus the
// token embedding, a learned position table, the final norm and an untied head.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "models/model.hpp"

using namespace tessel;

namespace {
Model hf(const std::string& text, std::optional<std::int64_t> seq = std::nullopt) {
  return import_hf_config(parse_json_text(text, "config.json"), "config.json", seq);
}

std::string hf_error(const std::string& text, std::optional<std::int64_t> seq = std::nullopt) {
  try {
    hf(text, seq);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Writes `text` to a file under the temp folder and loads it as --model does.
Model load_text(const std::string& name, const std::string& text, std::optional<std::int64_t> seq = std::nullopt) {
  const auto path = (std::filesystem::temp_directory_path() / ("tessel_hf_families_" + std::to_string(::getpid()) + "_" + name)).string();
  {
    std::ofstream f(path);
    f << text;
  }
  try {
    Model m = load_model(path, seq);
    std::filesystem::remove(path);
    return m;
  } catch (...) {
    std::filesystem::remove(path);
    throw;
  }
}

std::string load_error(const std::string& name, const std::string& text, std::optional<std::int64_t> seq = std::nullopt) {
  try {
    load_text(name, text, seq);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// openai-community/gpt2 config.json (the keys that matter).
const char* kGpt2 = R"({"activation_function":"gelu_new","architectures":["GPT2LMHeadModel"],"model_type":"gpt2",
  "n_ctx":1024,"n_embd":768,"n_head":12,"n_layer":12,"n_positions":1024,"vocab_size":50257})";
// tiiuae/falcon-7b config.json as on the Hub: no max_position_embeddings.
const char* kFalcon7b = R"({"alibi":false,"architectures":["FalconForCausalLM"],"bias":false,"hidden_size":4544,
  "model_type":"falcon","multi_query":true,"new_decoder_architecture":false,"num_attention_heads":71,
  "num_hidden_layers":32,"parallel_attn":true,"vocab_size":65024})";
// mistralai/Mistral-7B-v0.1 config.json.
const char* kMistral = R"({"architectures":["MistralForCausalLM"],"hidden_act":"silu","hidden_size":4096,
  "intermediate_size":14336,"max_position_embeddings":32768,"model_type":"mistral","num_attention_heads":32,
  "num_hidden_layers":32,"num_key_value_heads":8,"rms_norm_eps":1e-05,"rope_theta":10000.0,"sliding_window":4096,
  "tie_word_embeddings":false,"vocab_size":32000})";
// meta-llama/Llama-2-7b-hf config.json.
const char* kLlama2 = R"({"architectures":["LlamaForCausalLM"],"hidden_act":"silu","hidden_size":4096,
  "intermediate_size":11008,"max_position_embeddings":4096,"model_type":"llama","num_attention_heads":32,
  "num_hidden_layers":32,"num_key_value_heads":32,"rms_norm_eps":1e-05,"tie_word_embeddings":false,"vocab_size":32000})";
// Qwen/Qwen2-7B config.json.
const char* kQwen2 = R"({"architectures":["Qwen2ForCausalLM"],"hidden_act":"silu","hidden_size":3584,
  "intermediate_size":18944,"max_position_embeddings":131072,"max_window_layers":28,"model_type":"qwen2",
  "num_attention_heads":28,"num_hidden_layers":28,"num_key_value_heads":4,"rms_norm_eps":1e-06,
  "rope_theta":1000000.0,"sliding_window":131072,"tie_word_embeddings":false,"use_sliding_window":false,
  "vocab_size":152064})";

std::string with(std::string text, const std::string& key_value) { return text.replace(1, 0, key_value + ","); }
std::string without(std::string text, const std::string& key_value) {
  return text.replace(text.find(key_value), key_value.size(), "");
}
}  // namespace

TEST_CASE("GPT-2, GPTBigCode and BLOOM configs (n_layer, n_embd, n_head) are recognised as HuggingFace files") {
  // GPT2Model: per block c_attn h x 3h + 3h, c_proj h^2 + h, c_fc h x 4h + 4h, mlp c_proj 4h x h + h, ln_1
  // and ln_2 2h each = 12h^2 + 13h; wte V h, wpe n_positions h, ln_f 2h; the head is tied.
  // h 768, 12 layers: 12 x 7,087,872 + 50257 x 768 + 1024 x 768 + 1536 = 124,439,808.
  CHECK(load_text("gpt2.json", kGpt2).total_params() == 124439808);
  // gpt2-medium (24 x 1024, 16 heads): 24 x 12,596,224 + 50257 x 1024 + 1024 x 1024 + 2048 = 354,823,168;
  // gpt2-xl (48 x 1600, 25 heads): 48 x 30,740,800 + 50257 x 1600 + 1024 x 1600 + 3200 = 1,557,611,200.
  std::string medium = kGpt2;
  medium.replace(medium.find("\"n_embd\":768,\"n_head\":12,\"n_layer\":12"), 37, "\"n_embd\":1024,\"n_head\":16,\"n_layer\":24");
  CHECK(load_text("gpt2-medium.json", medium).total_params() == 354823168);
  std::string xl = kGpt2;
  xl.replace(xl.find("\"n_embd\":768,\"n_head\":12,\"n_layer\":12"), 37, "\"n_embd\":1600,\"n_head\":25,\"n_layer\":48");
  CHECK(load_text("gpt2-xl.json", xl).total_params() == 1557611200);
  // bigscience/bloom-560m: n_layer, n_head, hidden_size; no position key (ALiBi). BloomModel: the GPT-2 block
  // (12h^2 + 13h), word_embeddings V h, word_embeddings_layernorm 2h, ln_f 2h, tied head, no position table:
  // 24 x 12,596,224 + 250880 x 1024 + 2048 + 2048 = 559,214,592. Trained at 2048 tokens (BLOOM Sec. 3.3).
  const Model bloom = load_text("bloom.json", R"({"architectures":["BloomForCausalLM"],"model_type":"bloom",
    "n_head":16,"n_layer":24,"hidden_size":1024,"n_inner":null,"vocab_size":250880})");
  CHECK(bloom.position == PositionEmbedding::alibi);
  CHECK(bloom.seq_len == 2048);
  CHECK(bloom.total_params() == 559214592);
  // GPTBigCode: multi_query by default (GPTBigCodeConfig), so c_attn is h x (h + 2 head_dim) + bias:
  // h 64, 4 heads of 16: per block 64 x 96 + 96 + 64 x 64 + 64 + 64 x 256 + 256 + 256 x 64 + 64 + 4 x 64
  // = 6144 + 96 + 4096 + 64 + 16384 + 256 + 16384 + 64 + 256 = 43,744; 2 blocks 87,488; wte 100 x 64, wpe
  // 32 x 64, ln_f 128: 87,488 + 6400 + 2048 + 128 = 96,064.
  const Model bigcode = load_text("bigcode.json", R"({"model_type":"gpt_bigcode","n_embd":64,"n_head":4,
    "n_layer":2,"n_positions":32,"n_inner":null,"vocab_size":100})");
  CHECK(bigcode.kv_heads == 1);
  CHECK(bigcode.total_params() == 96064);
  // A Tessel model file is still read as one (it has none of those keys).
  CHECK(load_text("tessel.json", R"({"name":"t","layers":2,"hidden":8,"heads":2,"ffn":32,"vocab":16,"seq_len":4,
    "activation":"gelu","norm":"layernorm","position":"learned","tied_embeddings":true,"bias":true})").layers == 2);
}

TEST_CASE("Falcon: multi-query, no biases, rotary, the norms parallel_attn implies; no max_position_embeddings") {
  // FalconDecoderLayer without new_decoder_architecture and with parallel_attn: one input_layernorm; multi_query
  // gives one key/value head; "bias": false drops every linear bias. h 4544, 71 heads of 64:
  // query_key_value h x (h + 2 x 64) = 21,229,568; dense h^2 = 20,647,936; MLP 2 x h x 4h = 165,183,488;
  // LayerNorm 2h = 9,088; per block 207,070,080, 32 blocks 6,626,242,560; word_embeddings 65024 x 4544 =
  // 295,469,056 (tied head); ln_f 9,088. Total 6,921,720,704.
  const Model f = hf(kFalcon7b);
  CHECK(f.kv_heads == 1);
  CHECK(f.position == PositionEmbedding::rotary);
  CHECK(f.layer_norms == 1);
  CHECK(f.seq_len == 2048);  // FalconConfig's max_position_embeddings default
  CHECK(f.total_params() == 6921720704);
  CHECK(hf(kFalcon7b, 4096).seq_len == 4096);  // rotary: no table to bound --seq
  // Falcon-40B: new_decoder_architecture, 8 kv heads, ln_attn and ln_mlp. h 8192, 128 heads of 64:
  // query_key_value h x (h + 2 x 8 x 64) = 75,497,472; dense 67,108,864; MLP 536,870,912; 2 LayerNorms 32,768;
  // per block 679,510,016, 60 blocks 40,770,600,960; embedding 65024 x 8192 = 532,676,608; ln_f 16,384.
  // Total 41,303,293,952.
  const Model f40 = hf(R"({"alibi":false,"architectures":["FalconForCausalLM"],"bias":false,"hidden_size":8192,
    "model_type":"falcon","multi_query":true,"new_decoder_architecture":true,"num_attention_heads":128,
    "num_hidden_layers":60,"num_kv_heads":8,"parallel_attn":true,"vocab_size":65024,"max_position_embeddings":2048})");
  CHECK(f40.kv_heads == 8);
  CHECK(f40.layer_norms == 2);
  CHECK(f40.total_params() == 41303293952);
  // Without parallel_attn a second norm (post_attention_layernorm): + 2h per block.
  CHECK(hf(with(without(kFalcon7b, "\"parallel_attn\":true,"), "\"parallel_attn\":false")).total_params() - f.total_params() == 32 * 2 * 4544);
  // "bias": true puts biases on all four linears: q/k/v (4544 + 128), dense 4544, MLP 4 x 4544 + 4544.
  CHECK(hf(with(without(kFalcon7b, "\"bias\":false,"), "\"bias\":true")).total_params() - f.total_params() ==
        32 * (4672 + 4544 + 5 * 4544));
  // alibi: no rotary.
  CHECK(hf(with(without(kFalcon7b, "\"alibi\":false,"), "\"alibi\":true")).position == PositionEmbedding::alibi);
}

TEST_CASE("sliding_window: kept per layer as each family's class applies it; a window past the sequence changes nothing") {
  // Mistral: every layer attends through its window, whatever the sequence.
  const Model mistral = hf(kMistral);
  CHECK(mistral.seq_len == 32768);
  CHECK(mistral.sliding_window == 4096);
  CHECK(mistral.window_layers.size() == 32);
  CHECK(has(mistral.beyond_dense(), "sliding-window attention (4096 tokens) on 32 of 32 layers"));
  // At or under the window a windowed layer is a full one: nothing beyond a dense transformer. Mistral-7B:
  // 32 x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336 + 2 x 4096) + 2 x 32000 x 4096 + 4096 = 7,241,732,096.
  const Model short_seq = hf(kMistral, 4096);
  CHECK(short_seq.total_params() == 7241732096);
  CHECK(short_seq.beyond_dense().empty());
  std::string null_window = kMistral;
  null_window.replace(null_window.find("\"sliding_window\":4096"), 21, "\"sliding_window\":null");
  CHECK(hf(null_window).sliding_window == 0);
  // Qwen2 ships sliding_window with use_sliding_window false: full attention.
  CHECK(hf(kQwen2).sliding_window == 0);
  CHECK(hf(without(kQwen2, "\"use_sliding_window\":false,")).sliding_window == 0);  // its default is false too
  // With it, the layers from max_window_layers on (Qwen2Config's layer_types); Qwen2-7B's 28 of 28 are full.
  std::string qwen_windowed = kQwen2;
  qwen_windowed.replace(qwen_windowed.find("\"use_sliding_window\":false"), 26, "\"use_sliding_window\":true");
  qwen_windowed.replace(qwen_windowed.find("\"sliding_window\":131072"), 23, "\"sliding_window\":4096");
  CHECK(hf(qwen_windowed).sliding_window == 0);
  qwen_windowed.replace(qwen_windowed.find("\"max_window_layers\":28"), 22, "\"max_window_layers\":20");
  const Model qw = hf(qwen_windowed);
  CHECK(qw.sliding_window == 4096);
  CHECK(qw.window_layers == std::vector<int>{20, 21, 22, 23, 24, 25, 26, 27});
  // Gemma 2: every other layer from the first; a layer_types key overrides the family's default.
  const std::string gemma2 = R"({"architectures":["Gemma2ForCausalLM"],"head_dim":256,"hidden_activation":"gelu_pytorch_tanh",
    "hidden_size":2304,"intermediate_size":9216,"max_position_embeddings":8192,"model_type":"gemma2",
    "num_attention_heads":8,"num_hidden_layers":4,"num_key_value_heads":4,"rms_norm_eps":1e-06,
    "rope_theta":10000.0,"sliding_window":4096,"vocab_size":256000})";
  CHECK(hf(gemma2).window_layers == std::vector<int>{0, 2});
  const Model typed = hf(with(gemma2, R"("layer_types":["full_attention","sliding_attention","sliding_attention","full_attention"])"));
  CHECK(typed.window_layers == std::vector<int>{1, 2});
  CHECK(has(hf_error(with(gemma2, R"("layer_types":["full_attention","sliding"])")),
            "layer_types: value [\"full_attention\",\"sliding\"] must be an array of 4 strings"));
  CHECK(has(hf_error(with(gemma2, R"("layer_types":["full_attention","sliding","full_attention","full_attention"])")),
            "layer_types[1]: value \"sliding\" is not one of: sliding_attention, full_attention"));
  // A family whose class has no window ignores the key (LlamaAttention attends to every earlier position).
  CHECK(hf(with(kLlama2, "\"sliding_window\":1024")).sliding_window == 0);
  // Through load_model, --seq is applied: at the window the model is dense again.
  CHECK(load_text("mistral.json", kMistral, 4096).beyond_dense().empty());
}

TEST_CASE("positions follow the family, not the presence of rope_theta") {
  // EleutherAI/pythia-160m: GPT-NeoX is rotary (rotary_emb_base, rotary_pct 0.25; a partial rotation changes
  // no count). GPTNeoXLayer: query_key_value h x 3h + 3h, dense h^2 + h, dense_h_to_4h h f + f, dense_4h_to_h
  // f h + h, 2 LayerNorms 4h; embed_in and embed_out V h each (untied), final_layer_norm 2h. h 768, f 3072,
  // V 50304: 12 x 7,085,568 + 2 x 38,633,472 + 1536 = 162,322,944 (Biderman et al. 2023, Table 1's count).
  const Model pythia = hf(R"({"architectures":["GPTNeoXForCausalLM"],"hidden_act":"gelu","hidden_size":768,
    "intermediate_size":3072,"layer_norm_eps":1e-05,"max_position_embeddings":2048,"model_type":"gpt_neox",
    "num_attention_heads":12,"num_hidden_layers":12,"rotary_emb_base":10000,"rotary_pct":0.25,
    "tie_word_embeddings":false,"use_parallel_residual":true,"vocab_size":50304})");
  CHECK(pythia.position == PositionEmbedding::rotary);
  CHECK(pythia.total_params() == 162322944);
  // Qwen2 and Gemma without rope_theta: rotary with the config classes' default base 10000.
  const Model qwen = hf(without(kQwen2, "\"rope_theta\":1000000.0,"));
  CHECK(qwen.position == PositionEmbedding::rotary);
  CHECK(qwen.rope_theta == 10000.0);
  CHECK(hf(R"({"model_type":"gemma","head_dim":256,"hidden_size":2048,"intermediate_size":16384,
    "max_position_embeddings":8192,"num_attention_heads":8,"num_hidden_layers":18,"num_key_value_heads":1,
    "rms_norm_eps":1e-06,"vocab_size":256000})").position == PositionEmbedding::rotary);
  // GPT-J: rotary, one ln_1 per block, no attention biases, MLP and lm_head biases, untied. h 4096, f 16384,
  // 28 blocks: 4h^2 + 2 h f + f + h + 2h = 201,355,264 per block; wte V h, ln_f 2h, lm_head V h + V (V 50400):
  // 5,637,947,392 + 206,438,400 + 8,192 + 206,488,800 = 6,050,882,784.
  const Model gptj = hf(R"({"activation_function":"gelu_new","architectures":["GPTJForCausalLM"],"model_type":"gptj",
    "n_embd":4096,"n_head":16,"n_inner":null,"n_layer":28,"n_positions":2048,"rotary_dim":64,
    "tie_word_embeddings":false,"vocab_size":50400})");
  CHECK(gptj.position == PositionEmbedding::rotary);
  CHECK(gptj.total_params() == 6050882784);
}

TEST_CASE("a learned position table has the model's rows; --seq past them is refused") {
  // GPT-2's wpe has n_positions 1024 rows whatever the training sequence: at --seq 512 the count is unchanged.
  const Model short_seq = load_text("gpt2.json", kGpt2, 512);
  CHECK(short_seq.seq_len == 512);
  CHECK(short_seq.position_rows() == 1024);
  CHECK(short_seq.total_params() == 124439808);
  CHECK(load_error("gpt2.json", kGpt2, 2048).find(": n_positions: value 1024 rows of the learned position table, but "
                                                  "the sequence length is 2048; a learned table has no position past "
                                                  "its last row: pass --seq <= 1024") != std::string::npos);
  // The Tessel form keeps the rows (max_positions) and refuses a longer seq_len.
  const Model round = parse_model(model_to_json(short_seq), "round-trip");
  CHECK(round.position_rows() == 1024);
  CHECK(round.total_params() == 124439808);
  Json longer = model_to_json(short_seq);
  longer["seq_len"] = 2048;
  CHECK_THROWS_WITH_AS(parse_model(longer, "m.json"),
                       "m.json: max_positions: seq_len 2048 exceeds the 1024 rows of the learned position table",
                       InputError);
  // Presets without max_positions keep their table at seq_len (Narayanan eq. 2's s).
  const Model gpt3 = load_model("gpt3-175b", 4096);
  CHECK(gpt3.position_rows() == 4096);
  // Megatron: --max-position-embeddings sizes the table.
  const Model meg = import_megatron_args({"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                          "--seq-length", "128", "--max-position-embeddings", "512", "--vocab-size", "100"},
                                         "cmdline");
  CHECK(meg.position_rows() == 512);
  CHECK_THROWS_AS(import_megatron_args({"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                        "--seq-length", "1024", "--max-position-embeddings", "512", "--vocab-size", "100"},
                                       "cmdline"),
                  InputError);
}

TEST_CASE("a gated MLP without intermediate_size is refused, not given 4h") {
  CHECK(hf_error(without(kLlama2, "\"intermediate_size\":11008,")) ==
        "config.json: intermediate_size: missing required key; the llama MLP's width has no default to fall back on "
        "(4 x hidden_size would be a guess and is wrong for gated MLPs: Llama-2-7B has 11008, not 16384)");
  std::string null_inner = kLlama2;
  null_inner.replace(null_inner.find("11008"), 5, "null");
  CHECK(has(hf_error(null_inner), "config.json: intermediate_size: value null;"));
  // GPT-2's n_inner null is documented as 4h.
  CHECK(hf(kGpt2).ffn == 3072);
}

TEST_CASE("biases, norms and heads as the families' modelling classes build them") {
  // Qwen2Attention: q/k/v_proj with bias, o_proj and the MLP without. Qwen2-7B (h 3584, 28 heads, 4 kv heads
  // of 128): per block q 3584 + k 512 + v 512 = 4,608 bias values; 28 blocks 129,024. Total: 28 x (3584 x
  // (3584 + 1024) + 3584^2 + 3 x 3584 x 18944 + 2 x 3584 + 4608) + 2 x 152064 x 3584 + 3584 = 7,615,616,512.
  const Model qwen = hf(kQwen2);
  CHECK(qwen.has_qkv_bias());
  CHECK_FALSE(qwen.has_out_bias());
  CHECK_FALSE(qwen.has_mlp_bias());
  CHECK(qwen.total_params() == 7615616512);
  // Llama-2-7B: 6,738,415,616 with no biases. attention_bias adds q, k, v, o: 4 x 4096 per block; mlp_bias
  // adds gate, up (11008 each) and down (4096).
  const Model llama = hf(kLlama2);
  CHECK(llama.total_params() == 6738415616);
  CHECK(hf(with(kLlama2, "\"attention_bias\":true")).total_params() - llama.total_params() == 32 * 4 * 4096);
  CHECK(hf(with(kLlama2, "\"mlp_bias\":true")).total_params() - llama.total_params() == 32 * (2 * 11008 + 4096));
  // Gemma 2: four RMSNorms per block. gemma-2-2b (h 2304, 8 heads and 4 kv heads of 256, f 9216, V 256000,
  // tied): 26 x (2304 x (2048 + 2048) + 2048 x 2304 + 3 x 2304 x 9216 + 4 x 2304) + 256000 x 2304 + 2304
  // = 2,614,341,888 (the Gemma 2 report's 2.6B).
  CHECK(hf(R"({"architectures":["Gemma2ForCausalLM"],"head_dim":256,"hidden_activation":"gelu_pytorch_tanh",
    "hidden_size":2304,"intermediate_size":9216,"max_position_embeddings":8192,"model_type":"gemma2",
    "num_attention_heads":8,"num_hidden_layers":26,"num_key_value_heads":4,"rms_norm_eps":1e-06,
    "rope_theta":10000.0,"sliding_window":4096,"vocab_size":256000})", 4096).total_params() == 2614341888);
  // Qwen3: q_norm and k_norm over head_dim. Qwen3-8B (h 4096, 32 heads, 8 kv heads of 128, f 12288, V 151936,
  // untied): 36 x (4096 x 6144 + 4096^2 + 3 x 4096 x 12288 + 2 x 4096 + 2 x 128) + 2 x 151936 x 4096 + 4096
  // = 8,190,735,360.
  CHECK(hf(R"({"architectures":["Qwen3ForCausalLM"],"attention_bias":false,"head_dim":128,"hidden_act":"silu",
    "hidden_size":4096,"intermediate_size":12288,"max_position_embeddings":40960,"model_type":"qwen3",
    "num_attention_heads":32,"num_hidden_layers":36,"num_key_value_heads":8,"rms_norm_eps":1e-06,
    "rope_theta":1000000,"sliding_window":null,"tie_word_embeddings":false,"use_sliding_window":false,
    "vocab_size":151936})").total_params() == 8190735360);
  // Phi-2: one LayerNorm per block, biases everywhere, lm_head with bias. h 2560, f 10240, V 51200:
  // 32 x (4 x (2560^2 + 2560) + 2 x 2560 x 10240 + 10240 + 2560 + 5120) + 51200 x 2560 + 5120
  // + 51200 x 2560 + 51200 = 2,779,683,840.
  CHECK(hf(R"({"architectures":["PhiForCausalLM"],"hidden_act":"gelu_new","hidden_size":2560,
    "intermediate_size":10240,"layer_norm_eps":1e-05,"max_position_embeddings":2048,"model_type":"phi",
    "num_attention_heads":32,"num_hidden_layers":32,"num_key_value_heads":32,"partial_rotary_factor":0.4,
    "qk_layernorm":false,"rope_theta":10000.0,"tie_word_embeddings":false,"vocab_size":51200})").total_params() ==
        2779683840);
}

TEST_CASE("the Tessel model form round-trips the imported shape") {
  for (const std::string& text : {std::string(kFalcon7b), std::string(kQwen2), std::string(kGpt2)}) {
    const Model m = hf(text);
    const Model r = parse_model(model_to_json(m), "round-trip");
    CHECK(r.total_params() == m.total_params());
    CHECK(r.tp_replicated_params_per_layer() == m.tp_replicated_params_per_layer());
  }
  // A model without the new keys writes none of them (traces' otherData reads as before).
  const Json tiny = model_to_json(load_model("tiny"));
  for (const char* key : {"max_positions", "qkv_bias", "out_bias", "mlp_bias", "head_bias", "layer_norms",
                          "embedding_norm", "qk_norm"})
    CHECK_FALSE(tiny.contains(key));
}

TEST_CASE("a Megatron-LM argument file is read as a Megatron command line") {
  // The flags of Megatron-LM's examples/gpt3 script, as a file with a line continuation and a comment.
  const Model m = load_text("args.txt", "--num-layers 24 --hidden-size 1024 \\\n  --num-attention-heads 16 # 350M\n"
                                        "--seq-length 2048 --max-position-embeddings 2048 --vocab-size 51200\n");
  CHECK(m.layers == 24);
  CHECK(m.hidden == 1024);
  CHECK(m.seq_len == 2048);
  // 24 x (12h^2 + 13h) + (51200 + 2048) x 1024 + 2048 = 302,309,376 + 54,525,952 + 2,048 = 356,837,376.
  CHECK(m.total_params() == 356837376);
  CHECK(load_text("args.txt", "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
                              "--vocab-size 100", 32).seq_len == 32);
  CHECK(has(load_error("args.txt", "--num-layers 2 --hidden-size 64"), "args.txt: missing --num-attention-heads"));
}
