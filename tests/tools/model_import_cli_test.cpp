// `--model FILE` from the command line for imported models: the exact parameter count in estimate's header
// and JSON, and the sequence checks (an attention window, a learned position table) as exit 2 with the rule.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "tests/tools/run_util.hpp"

using tessel::test::run_tessel;
using tessel::test::write_temp;

namespace {
// openai-community/gpt2 config.json (the keys that matter).
const char* kGpt2 = R"({"activation_function":"gelu_new","architectures":["GPT2LMHeadModel"],"model_type":"gpt2",
  "n_ctx":1024,"n_embd":768,"n_head":12,"n_layer":12,"n_positions":1024,"vocab_size":50257})";
// mistralai/Mistral-7B-v0.1 config.json.
const char* kMistral = R"({"architectures":["MistralForCausalLM"],"hidden_act":"silu","hidden_size":4096,
  "intermediate_size":14336,"max_position_embeddings":32768,"model_type":"mistral","num_attention_heads":32,
  "num_hidden_layers":32,"num_key_value_heads":8,"rms_norm_eps":1e-05,"rope_theta":10000.0,"sliding_window":4096,
  "tie_word_embeddings":false,"vocab_size":32000})";
const std::vector<std::string> kSmallLayout = {"--tp", "1", "--pp", "1", "--gpus", "8", "--gbs", "64"};

std::vector<std::string> args(std::vector<std::string> head, const std::vector<std::string>& tail = kSmallLayout) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}
}  // namespace

TEST_CASE("estimate prints the exact parameter count; --json has it for presets and imported models") {
  const std::string gpt2 = write_temp("gpt2_config.json", kGpt2);
  // GPT-2 small: 12 x (12h^2 + 13h) + (50257 + 1024) h + 2h at h 768 = 124,439,808 (GPT2LMHeadModel).
  const auto r = run_tessel(args({"estimate", "--model", gpt2}));
  REQUIRE(r.code == 0);
  CHECK(r.out.find(", 124,439,808 params (124.4 M), on 8 x") != std::string::npos);
  const auto j = run_tessel(args({"estimate", "--model", gpt2, "--json"}));
  REQUIRE(j.code == 0);
  CHECK(nlohmann::json::parse(j.out)["params"].get<long long>() == 124439808);
  // A preset: llama2-7b, 32 x (4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096) + 2 x 32000 x 4096 + 4096.
  const auto p = run_tessel(args({"estimate", "--model", "llama2-7b", "--json"}));
  REQUIRE(p.code == 0);
  CHECK(nlohmann::json::parse(p.out)["params"].get<long long>() == 6738415616LL);
}

TEST_CASE("--seq against the model: a window shorter than it is priced; past the learned table is exit 2") {
  // Mistral-7B at its 32768 positions: every layer attends through 4096, priced as such (--ops lists the kind).
  const std::string mistral = write_temp("mistral_config.json", kMistral);
  const auto windowed = run_tessel(args({"estimate", "--model", mistral, "--ops"}));
  CHECK(windowed.code == 0);
  CHECK(windowed.out.find("one transformer layer with attention through a 4096-token window") != std::string::npos);
  CHECK(run_tessel(args({"estimate", "--model", mistral, "--seq", "4096"})).code == 0);
  const std::string gpt2 = write_temp("gpt2_config.json", kGpt2);
  const auto longer = run_tessel(args({"explore", "--model", gpt2, "--seq", "2048"}, {"--gpus", "8", "--gbs", "64"}));
  CHECK(longer.code == 2);
  CHECK(longer.err.find(gpt2 + ": n_positions: value 1024 rows of the learned position table, but the sequence "
                                "length is 2048") != std::string::npos);
}

TEST_CASE("--model reads a Megatron-LM argument file") {
  const std::string file = write_temp("megatron_args.txt",
                                      "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 \\\n"
                                      "  --seq-length 2048 --max-position-embeddings 2048 --vocab-size 51200\n");
  const auto r = run_tessel(args({"estimate", "--model", file, "--json"}));
  REQUIRE(r.code == 0);
  const auto doc = nlohmann::json::parse(r.out);
  CHECK(doc["model"]["layers"] == 24);
  // 24 x (12h^2 + 13h) + (51200 + 2048) h + 2h at h 1024 = 356,837,376.
  CHECK(doc["params"].get<long long>() == 356837376);
}

TEST_CASE("--model: a Megatron argument file may start with comments and need not be named .txt") {
  // QA: a leading '#' comment line made the file read as JSON, and `--model args.sh` (no '/', no .json or
  // .txt in the name) was looked up as a preset only.
  const std::string body = "# GPT 350M, as in the launch script\n\n"
                           "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 \\\n"
                           "  --seq-length 2048 --max-position-embeddings 2048 --vocab-size 51200  # the padded vocab\n";
  const std::string file = write_temp("megatron_args.sh", body);
  const auto r = run_tessel(args({"estimate", "--model", file, "--json"}));
  REQUIRE(r.code == 0);
  CHECK(nlohmann::json::parse(r.out)["params"].get<long long>() == 356837376);
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(std::filesystem::path(file).parent_path());
  const auto bare = run_tessel(args({"estimate", "--model", std::filesystem::path(file).filename().string(), "--json"}));
  std::filesystem::current_path(cwd);
  REQUIRE(bare.code == 0);
  CHECK(nlohmann::json::parse(bare.out)["params"].get<long long>() == 356837376);
  // A name that is neither a preset nor a file says both.
  const auto none = run_tessel(args({"estimate", "--model", "no-such-model"}));
  CHECK(none.code == 2);
  CHECK(none.err.find("--model no-such-model: no such preset (known: ") != std::string::npos);
  CHECK(none.err.find(") and no such file") != std::string::npos);
}
