// Megatron-LM's mixture-of-experts, MLA and MTP flags (--model FILE with a launch script's arguments): the
// counts against the presets HF's classes confirmed, the layer-frequency forms, and the rules with the flags
// named.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "models/model.hpp"

using namespace tessel;

namespace {
std::vector<std::string> megatron(const std::string& line) {
  std::vector<std::string> argv;
  std::string w;
  for (char c : line + " ") {
    if (c == ' ') {
      if (!w.empty()) argv.push_back(w);
      w.clear();
    } else {
      w += c;
    }
  }
  return argv;
}

std::string megatron_error(const std::string& line) {
  try {
    import_megatron_args(megatron(line), "args.txt");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// The shape flags of Megatron-Bridge's DeepSeek-V3 pre-training recipe, as a launch script writes them.
const std::string kDeepSeekV3Args =
    "--num-layers 61 --hidden-size 7168 --num-attention-heads 128 --ffn-hidden-size 18432 --seq-length 4096 "
    "--max-position-embeddings 4096 --swiglu --normalization RMSNorm --position-embedding-type rope "
    "--untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 129280 "
    "--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 "
    "--v-head-dim 128 --num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 "
    "--moe-shared-expert-intermediate-size 2048 --moe-layer-freq ([0]*3+[1]*58) --moe-router-score-function sigmoid "
    "--moe-router-enable-expert-bias --moe-router-num-groups 8 --moe-router-group-topk 4 "
    "--moe-router-topk-scaling-factor 2.5 --moe-aux-loss-coeff 1e-4 --mtp-num-layers 1 "
    "--expert-model-parallel-size 64 --expert-tensor-parallel-size 1 --pipeline-model-parallel-size 16";
}  // namespace

TEST_CASE("Megatron-LM flags: DeepSeek-V3's recipe imports as the preset") {
  const Model m = import_megatron_args(megatron(kDeepSeekV3Args), "args.txt");
  const Model preset = load_model("deepseek-v3");
  // Megatron-Core builds the same tensors as HF's DeepseekV3 (MLA projections without biases, shared experts
  // as one MLP of 2048, the router's weight): every count agrees with the preset's.
  CHECK(m.total_params() == preset.total_params());
  CHECK(m.active_params() == preset.active_params());
  CHECK(m.mtp_params() == preset.mtp_params());
  CHECK(m.moe.dense_layers == std::vector<int>{0, 1, 2});
  CHECK(m.moe.router.score == RouterScore::sigmoid);
  CHECK(m.moe.router.selection_bias);
  CHECK(m.moe.router.bias_update_rate == 1e-3);  // Megatron's default
  CHECK(import_megatron_args(megatron(kDeepSeekV3Args + " --moe-router-bias-update-rate 0.002"), "args.txt")
            .moe.router.bias_update_rate == 0.002);
  // 0 freezes the bias (DeepSeek-V3's last 500B tokens); negative is refused, naming the flag.
  CHECK(import_megatron_args(megatron(kDeepSeekV3Args + " --moe-router-bias-update-rate 0"), "args.txt").moe.router.bias_update_rate == 0);
  CHECK_THROWS_WITH_AS(import_megatron_args(megatron(kDeepSeekV3Args + " --moe-router-bias-update-rate -0.1"), "args.txt"),
                       doctest::Contains("--moe-router-bias-update-rate"), InputError);
  // The expert bias needs sigmoid scores (Megatron-Core's rule), named with the flags the user wrote.
  std::string softmax_bias = kDeepSeekV3Args;
  softmax_bias.replace(softmax_bias.find("--moe-router-score-function sigmoid"), 35, "--moe-router-score-function softmax");
  CHECK_THROWS_WITH_AS(import_megatron_args(megatron(softmax_bias), "args.txt"),
                       doctest::Contains("--moe-router-enable-expert-bias: value true needs sigmoid scores (--moe-router-score-function is softmax)"),
                       InputError);
  CHECK(m.moe.router.normalize_top_k);  // sigmoid with top-k > 1
  CHECK(m.moe.router.scale == 2.5);
  CHECK(m.moe.router.aux_loss_coef == 1e-4);
  CHECK(m.head_dim == 192);
}

TEST_CASE("Megatron-LM flags: Mixtral, layer frequencies, the rules") {
  // NeMo's Mixtral 8x7B: experts of --ffn-hidden-size (no --moe-ffn-hidden-size), top-2 by default.
  const std::string mixtral = "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention "
                              "--num-query-groups 8 --ffn-hidden-size 14336 --seq-length 4096 --swiglu --normalization "
                              "RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights "
                              "--disable-bias-linear --vocab-size 32000 --num-experts 8";
  const Model x = import_megatron_args(megatron(mixtral), "args.txt");
  CHECK(x.total_params() == load_model("mixtral-8x7b").total_params());
  CHECK(x.moe.router.normalize_top_k);  // top-k of the logits, then softmax
  CHECK_FALSE(import_megatron_args(megatron(mixtral + " --moe-router-pre-softmax"), "a").moe.router.normalize_top_k);
  // An integer frequency N: layer i is a MoE layer when i % N == 0 (gpt_layer_specs.py).
  CHECK(import_megatron_args(megatron(mixtral + " --moe-layer-freq 2"), "a").moe.dense_layers.size() == 16);
  CHECK(import_megatron_args(megatron(mixtral + " --moe-layer-freq 2"), "a").is_moe_layer(0));
  CHECK(import_megatron_args(megatron(mixtral + " --moe-layer-freq '([1]*3+[0])*8'"), "a").moe.dense_layers.front() == 3);
  CHECK(megatron_error(mixtral + " --moe-layer-freq [1,0]*8") ==
        "args.txt: --moe-layer-freq [1,0]*8: has 16 entries for the 32 layers (--num-layers)");
  CHECK(megatron_error(mixtral + " --moe-layer-freq [1,2]*16") ==
        "args.txt: --moe-layer-freq [1,2]*16: entries are 1 (a MoE layer) or 0 (a dense one), not 2");
  CHECK(megatron_error(mixtral + " --moe-layer-freq [1]*32-1").find("unexpected text at character 7") != std::string::npos);
  CHECK(megatron_error(mixtral + " --moe-router-topk 9") == "args.txt: --moe-router-topk: value 9 exceeds the 8 experts (--num-experts)");
  CHECK(megatron_error(mixtral + " --moe-router-score-function sqrtsoftplus") ==
        "args.txt: --moe-router-score-function sqrtsoftplus: Tessel models softmax and sigmoid");
  std::string biased = mixtral;
  biased.replace(biased.find(" --disable-bias-linear"), 22, "");
  CHECK(megatron_error(biased + " --moe-shared-expert-intermediate-size 4096").find("Megatron's shared experts have no biases") !=
        std::string::npos);
  CHECK(megatron_error(mixtral + " --multi-latent-attention").find("--group-query-attention with --multi-latent-attention") !=
        std::string::npos);
  std::string no_rope = kDeepSeekV3Args;
  no_rope.replace(no_rope.find("--position-embedding-type rope "), 31, "");
  CHECK(megatron_error(no_rope) == "args.txt: --position-embedding-type learned_absolute (the default) with "
                                   "--multi-latent-attention: Tessel models MLA with rotary positions only (pass rope or yarn)");
}
