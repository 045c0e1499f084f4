// Mixture-of-experts configs imported by Tessel against the counts HF transformers' own classes give them.
//
// tests/models/hf_configs/<name>.json are the models' config.json files; golden.json is what
// tools/hf_param_counts.py read from AutoModelForCausalLM built from each on the meta device (transformers
// 5.24, torch 2.15): the whole model, the embedding, the head, the final norm and every layer with its
// attention and MLP, and for MoE layers the routed experts together, the router and the shared experts. HF
// is the independent implementation here; every count must agree exactly.
#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "models/model.hpp"
#include "tests/test_paths.hpp"

using namespace tessel;

namespace {
const std::string kDir = test::source_root() + "/tests/models/hf_configs/";

const Json& golden() {
  static const Json g = parse_json_file(kDir + "golden.json");
  return g;
}

std::int64_t n(const Json& j, const char* key) { return j.at(key).get<std::int64_t>(); }

// Every count golden.json has for one model against Tessel's.
void check_counts(const Model& m, const Json& g) {
  CHECK(m.total_params() == n(g, "total"));
  CHECK(m.active_params() == n(g, "active"));
  CHECK(m.embedding_params() == n(g, "embedding"));
  CHECK(m.output_params() == n(g, "head") + n(g, "final_norm"));
  const Json& layers = g.at("layers");
  REQUIRE(static_cast<int>(layers.size()) == m.layers);
  for (int i = 0; i < m.layers; ++i) {
    CAPTURE(i);
    const Json& l = layers[static_cast<std::size_t>(i)];
    CHECK(m.layer_params(i) == n(l, "params"));
    CHECK(m.attention_params() == n(l, "attention"));
    REQUIRE(m.is_moe_layer(i) == l.at("moe").get<bool>());
    if (m.is_moe_layer(i)) {
      CHECK(m.moe_mlp_params() == n(l, "mlp"));
      CHECK(m.moe.experts == n(l, "num_experts"));
      CHECK(m.moe.experts * m.expert_params() == n(l, "experts"));
      CHECK(m.router_params() == n(l, "router"));
      CHECK(m.shared_expert_params() == n(l, "shared"));
    } else {
      CHECK(m.dense_mlp_params() == n(l, "mlp"));
    }
  }
}
}  // namespace

TEST_CASE("HF MoE configs: Tessel's counts equal transformers' exactly, per layer and part") {
  const Json& models = golden().at("models");
  int imported = 0;
  for (const auto& [key, g] : models.items()) {
    const std::string name = key;  // a structured binding cannot be captured (clang)
    if (name.rfind("preset:", 0) == 0) continue;
    CAPTURE(name);
    // Through load_model, as --model FILE reads it.
    const Model m = load_model(kDir + name + ".json");
    check_counts(m, g);
    ++imported;
  }
  // Mixtral 8x7B and 8x22B, Qwen1.5-MoE-A2.7B, Qwen3-30B-A3B and -235B-A22B, DeepSeek-V2, -V2-Lite and -V3,
  // GPT-OSS 120B and 20B, OLMoE.
  CHECK(imported == 11);
}

TEST_CASE("HF MoE configs: what each family's keys become") {
  // Mixtral-8x7B by hand, as the golden has it: attention 2 x 4096^2 + 2 x 4096 x 1024 = 41,943,040; experts
  // 8 x 3 x 4096 x 14336 = 1,409,286,144; router 8 x 4096; norms 2 x 4096: 1,451,270,144 per layer; 32 layers,
  // embedding and head 32000 x 4096 each, final norm: 46,702,792,704 (Mistral AI: 46.7B).
  const Model mixtral = load_model(kDir + "mixtral-8x7b.json");
  CHECK(mixtral.layer_params(0) == 1451270144LL);
  CHECK(mixtral.total_params() == 46702792704LL);
  CHECK(mixtral.moe.router.normalize_top_k);
  CHECK(mixtral.moe.router.aux_loss_coef == 0.02);
  // DeepSeek-V3: three leading dense layers, sigmoid scores with the correction bias, 8 groups of which 4.
  const Model v3 = load_model(kDir + "deepseek-v3.json");
  CHECK(v3.moe.dense_layers == std::vector<int>{0, 1, 2});
  CHECK(v3.moe.router.score == RouterScore::sigmoid);
  CHECK(v3.moe.router.selection_bias);
  CHECK(v3.moe.router.groups == 8);
  CHECK(v3.moe.router.group_top_k == 4);
  CHECK(v3.moe.router.scale == 2.5);
  CHECK(v3.mla.q_lora_rank == 1536);
  CHECK(v3.head_dim == 192);
  CHECK(v3.mtp_layers == 1);
  CHECK(v3.seq_len == 163840);  // max_position_embeddings, as for every family
  // DeepSeek-V2: softmax with group-limited greedy routing; V2-Lite: no query bottleneck, no groups.
  const Model v2 = load_model(kDir + "deepseek-v2.json");
  CHECK(v2.moe.router.score == RouterScore::softmax);
  CHECK(v2.moe.router.groups == 8);
  CHECK(v2.moe.router.group_top_k == 3);
  CHECK_FALSE(v2.moe.router.selection_bias);
  CHECK_FALSE(v2.moe.router.normalize_top_k);
  CHECK(v2.moe.shared_ffn == 2 * 1536);
  const Model lite = load_model(kDir + "deepseek-v2-lite.json");
  CHECK(lite.mla.q_lora_rank == 0);
  CHECK(lite.moe.router.groups == 1);
  CHECK(lite.mtp_layers == 0);
  // Qwen1.5-MoE: one gated shared expert of 5632, top-4 weights not renormalised.
  const Model qwen2 = load_model(kDir + "qwen1.5-moe-a2.7b.json");
  CHECK(qwen2.moe.shared_gate);
  CHECK(qwen2.moe.shared_ffn == 5632);
  CHECK_FALSE(qwen2.moe.router.normalize_top_k);
  CHECK(qwen2.has_qkv_bias());
  CHECK_FALSE(qwen2.has_out_bias());
  // GPT-OSS: windows of 128 on the 18 even layers, sinks, biased experts and router.
  const Model oss = load_model(kDir + "gpt-oss-120b.json");
  CHECK(oss.sliding_window == 128);
  CHECK(oss.window_layers.size() == 18);
  CHECK(oss.window_of_layer(0) == 128);
  CHECK(oss.window_of_layer(1) == 0);
  CHECK(oss.attention_sinks);
  CHECK(oss.moe.expert_bias);
  CHECK(oss.moe.router.logit_bias);
  // OLMoE: q/k norms over the whole projections.
  const Model olmoe = load_model(kDir + "olmoe-1b-7b-0924.json");
  CHECK(olmoe.qk_norm);
  CHECK(olmoe.qk_norm_whole);
}

TEST_CASE("the tiny-moe preset against HF's Glm4MoeForCausalLM of its shape") {
  // Hand count first: attention 4 x 64^2 = 16384, two RMSNorms 128; layer 0 dense 3 x 64 x 256 = 49152
  // (65664 in all); layers 1-3: 8 experts of 3 x 64 x 64 = 12288, one shared of 12288, router 8 x 64 = 512
  // (127616 in all); tied embedding 256 x 64 = 16384, final norm 64: 65664 + 3 x 127616 + 16384 + 64 =
  // 464960. Active: 3 layers x 6 unused experts x 12288 = 221184 fewer: 243776.
  const Model m = load_model("tiny-moe");
  CHECK(m.total_params() == 464960);
  CHECK(m.active_params() == 243776);
  check_counts(m, golden().at("models").at("preset:tiny-moe"));
  // Expert parallelism of 1, 2, 4 over the experts; tensor parallelism of 2 and 4 over every width.
  for (int ep : {1, 2, 4}) CHECK(m.moe.experts % ep == 0);
  for (int tp : {2, 4}) CHECK((m.heads % tp == 0 && m.moe.expert_ffn % tp == 0 && m.moe.shared_ffn % tp == 0 && m.ffn % tp == 0));
}

TEST_CASE("DeepSeek-V3's MTP module: outside the 671B, inside the checkpoint's 685B") {
  const Model m = load_model("deepseek-v3");
  const std::int64_t h = m.hidden;
  // DeepSeek-V3 Sec. 2.2: the module's own weights are its two input norms and the norm before the shared
  // head (3h), the 2h x h projection and one MoE layer (layer 60's shape: golden layers[60].params).
  const std::int64_t moe_layer = n(golden().at("models").at("deepseek-v3").at("layers")[60], "params");
  CHECK(moe_layer == 11507286016LL);
  CHECK(m.mtp_params() == moe_layer + 3 * h + 2 * h * h);
  CHECK(m.mtp_params() == 11610067968LL);
  // Of its 256 experts a token uses 8: 248 x 3 x 7168 x 2048 fewer.
  CHECK(m.mtp_active_params() == m.mtp_params() - 248LL * 3 * 7168 * 2048);
  // The model card: "685B, which includes 671B of the Main Model weights and 14B of the MTP Module weights".
  // The checkpoint's MTP layer stores its own copies of the embedding and head (0.93B each): 671.03B +
  // 11.61B + 1.85B = 684.49B. The card counts FP8 checkpoint tensors, whose per-block scales (one fp32 per
  // 128 x 128 block, about 0.04B) are not parameters: within 0.1%.
  const double checkpoint = static_cast<double>(m.total_params() + m.mtp_params() + m.embedding_params() +
                                                m.output_params() - m.norm_params());
  CHECK(checkpoint / 1e9 == doctest::Approx(685.0).epsilon(0.001));
  CHECK(m.total_params() == n(golden().at("models").at("deepseek-v3"), "total"));  // 671,026,404,352: MTP apart
}

TEST_CASE("MLA counts: DeepSeek-V2's attention by the paper's shapes") {
  // One MLA layer of DeepSeek-V2 (arXiv:2405.04434 Sec. 3.1.2: d 5120, 128 heads, d_c' 1536, d_c 512, d_h 128,
  // d_h^R 64): W_DQ 5120 x 1536 + its norm 1536 + W_UQ 1536 x 128 x 192; W_DKV (with the shared rotary
  // key) 5120 x 576 + norm 512 + W_UKV 512 x 128 x 256; W_O 128 x 128 x 5120:
  // 7864320 + 1536 + 37748736 + 2949120 + 512 + 16777216 + 83886080 = 149227520 (golden: layers[0].attention).
  const Model v2 = load_model(kDir + "deepseek-v2.json");
  CHECK(v2.attention_params() == 149227520);
  CHECK(v2.beyond_dense() == "mixture of experts (160 experts, top-6, 2 shared experts, 1 dense layer), multi-head latent attention");
}
