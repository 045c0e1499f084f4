// Mixture of experts in the cost model (sim/workload.cpp add_moe_mlp, sim/layout.cpp's expert rules, the
// experts' memory and data parallelism): each expectation derived by hand from the layout, the model's
// parameter counts (models/, checked against HF transformers) or the rule, then asserted.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>

#include "sim/cost/memory.hpp"
#include "sim/engine/sim_trace.hpp"
#include "sim/engine/simulate.hpp"
#include "sim/estimate.hpp"
#include "sim/goodput.hpp"
#include "sim/layout_words.hpp"
#include "sim/schedule/generators.hpp"
#include "sim/step_costs.hpp"
#include "sim/workload.hpp"
#include "util/error.hpp"

using namespace tessel;

namespace {
constexpr double kExact = 1e-9;

Layout moe_layout(int tp, int dp, int ep, int etp = 0) {
  Layout l;
  l.tp = tp;
  l.pp = 1;
  l.dp = dp;
  l.ep = ep;
  l.etp = etp;
  l.micro_batch = 1;
  l.global_batch = 8 * dp;
  l.sequence_parallel = tp > 1;
  l.precision = Precision::bf16;
  return l;
}

std::map<std::string, WorkOp> ops_by_name(const LayerWork& lw) {
  std::map<std::string, WorkOp> by;
  for (const auto& op : lw.ops) by[op.name] = op;
  return by;
}

std::string rule_of(const Layout& l, const Model& m) {
  const auto p = layout_problem(l, m, 0);
  return p ? p->rule : "";
}
}  // namespace

TEST_CASE("MoE layout rules: ep divides the experts, experts fold over tp x cp x dp, a dense model has no ep") {
  const Model q = load_model("qwen3-30b-a3b");  // 128 experts, expert FFN 768
  CHECK(rule_of(moe_layout(1, 8, 8), q).empty());
  CHECK(rule_of(moe_layout(1, 8, 3), q) == "ep-divides-experts");
  CHECK(rule_of(moe_layout(1, 8, 16), q) == "expert-folding");     // 1 x 16 does not divide 1 x 1 x 8
  CHECK(rule_of(moe_layout(2, 8, 16, 1), q).empty());              // 1 x 16 divides 2 x 8
  CHECK(rule_of(moe_layout(2, 8, 16, 2), q) == "expert-folding");  // 2 x 16 does not
  Layout nosp = moe_layout(2, 4, 4, 1);
  nosp.sequence_parallel = false;
  CHECK(rule_of(nosp, q) == "moe-tp-needs-sp");
  Layout z3 = moe_layout(1, 8, 8);
  z3.zero_stage = 3;
  CHECK(rule_of(z3, q) == "moe-zero3");
  const Model dense = load_model("llama3-8b");
  CHECK(rule_of(moe_layout(1, 8, 2), dense) == "ep-needs-experts");
  // etp defaults to tp (Megatron-Core); edp = tp cp dp / (etp ep).
  const Layout l = moe_layout(2, 8, 4);
  CHECK(l.expert_tp() == 2);
  CHECK(l.expert_dp() == 2);
}

TEST_CASE("MoE layout words and JSON carry ep and etp") {
  const Layout l = parse_layout_words("tp2 pp1 dp8 ep8 etp1 mbs1 sp", 64, "test");
  CHECK(l.ep == 8);
  CHECK(l.etp == 1);
  CHECK(l.describe().find("ep8 etp1") != std::string::npos);
  const Layout back = parse_layout(layout_to_json(l), "layout.json");
  CHECK(back.ep == 8);
  CHECK(back.etp == 1);
  // etp as tp is not printed (it is the default).
  CHECK(parse_layout_words("tp2 pp1 dp8 ep4 mbs1 sp", 64, "test").describe().find("etp") == std::string::npos);
}

// Qwen3-30B-A3B (h 2048, 128 experts, top-8, expert FFN 768, SwiGLU), seq 4096, mbs 1, tp 1, dp 8, ep 8, bf16:
// T = 4096 tokens enter the MoE layer on a GPU; it holds 128 / 8 = 16 experts, each receiving (balanced)
// ep T k / E = 8 x 4096 x 8 / 128 = 2048 tokens; the dispatch all-to-all sends T k h bf16 values.
TEST_CASE("MoE lowering: router, permute, all-to-all and grouped expert GEMMs with their shapes") {
  const Model q = load_model("qwen3-30b-a3b");
  const System sys = load_system("dgx-h100");
  const LayerWork lw = lower_layer(q, moe_layout(1, 8, 8), sys);
  auto by = ops_by_name(lw);
  for (const char* name : {"router", "router_topk", "permute", "ep_dispatch", "expert_up", "expert_act", "expert_down",
                           "ep_combine", "unpermute"})
    CHECK_MESSAGE(by.count(name) == 1, name);
  CHECK(by.count("mlp_up") == 0);
  CHECK(by["router"].gemm.m == 4096);
  CHECK(by["router"].gemm.n == 128);
  CHECK(by["expert_up"].gemm.m == 2048);
  CHECK(by["expert_up"].gemm.n == 2 * 768);
  CHECK(by["expert_up"].gemm.k == 2048);
  CHECK(by["expert_up"].gemm.batch == 16);
  CHECK(by["expert_down"].gemm.k == 768);
  CHECK(by["ep_dispatch"].coll == cost::Collective::all_to_all);
  CHECK(by["ep_dispatch"].comm_bytes == doctest::Approx(2.0 * 4096 * 8 * 2048).epsilon(kExact));
  CHECK(by["ep_dispatch"].group.size == 8);
  // The all-to-alls are the layer's EP time (within its blocking collectives), forward and backward.
  CHECK(lw.t_ep_f == doctest::Approx(by["ep_dispatch"].t_f + by["ep_combine"].t_f).epsilon(kExact));
  CHECK(lw.t_ep_f > 0);
  CHECK(lw.t_tp_f >= lw.t_ep_f);
  // etp 2 on tp 2: each GPU holds the experts' half width on the gathered tokens of its etp group.
  const LayerWork lw2 = lower_layer(q, moe_layout(2, 4, 4, 2), sys);
  auto by2 = ops_by_name(lw2);
  CHECK(by2.count("etp_allgather") == 1);
  CHECK(by2["expert_up"].gemm.n == 768);  // 2 x 768 / etp 2
  CHECK(by2["expert_up"].gemm.batch == 32);
}

// Model FLOPs of a MoE layer per token, from the parameter counts: 2 x (attention's linear weights + the router
// + top_k routed experts) for the GEMMs, plus the attention core 4 s (heads x head_dim) counted full. The
// lowering's per-GPU forward FLOPs times tp x cp over the micro-batch's tokens must give exactly that.
TEST_CASE("MoE lowering: the layer's model FLOPs are the active parameters' (an independent count)") {
  for (const char* name : {"qwen3-30b-a3b", "mixtral-8x7b"}) {
    CAPTURE(name);
    Model m = load_model(name);
    m.seq_len = 4096;
    const System sys = load_system("dgx-h100");
    for (const Layout& l : {moe_layout(1, 8, 8), moe_layout(2, 4, 8, 1), moe_layout(2, 4, 2, 2)}) {
      CAPTURE(l.describe());
      if (layout_problem(l, m, 0)) continue;
      const LayerWork lw = lower_layer(m, l, sys);
      const double tokens = static_cast<double>(l.micro_batch) * m.seq_len;
      const double linear = static_cast<double>(m.attention_params() - m.qk_norm_params()) +
                            static_cast<double>(m.router_params()) + m.moe.top_k * static_cast<double>(m.expert_params());
      const double core = 4.0 * m.seq_len * m.heads * m.head_dim;
      CHECK(lw.flops_model_f * l.tp * l.cp / tokens == doctest::Approx(2.0 * linear + core).epsilon(1e-9));
    }
  }
}

// Qwen3-30B-A3B on tp 1, dp 8, ep 4, ZeRO-1: edp = 8 / 4 = 2. Per GPU and layer the experts are
// 32 x expert_params (bf16 weights, fp32 gradients, 12 optimizer bytes over edp 2); the rest (attention,
// norms, router) has its optimizer bytes over dp 8.
TEST_CASE("MoE memory: expert weights over ep, their optimizer states over edp") {
  const Model q = load_model("qwen3-30b-a3b");
  const System sys = load_system("dgx-h100");
  Layout l = moe_layout(1, 8, 4);
  l.zero_stage = 1;
  const Estimate e = estimate(q, l, sys, 8);
  const double experts_per_layer = 32.0 * static_cast<double>(q.expert_params());
  const double others_per_layer = static_cast<double>(q.attention_params() + q.layer_norms * q.norm_params() + q.router_params());
  const double L = q.layers;
  const double outside = static_cast<double>(q.embedding_params() + q.output_params());
  const double experts = L * experts_per_layer, others = L * others_per_layer + outside;
  REQUIRE(e.memory.size() == 1);
  CHECK(e.memory[0].weights_bytes == doctest::Approx(2.0 * (experts + others)).epsilon(1e-9));
  CHECK(e.memory[0].grads_bytes == doctest::Approx(4.0 * (experts + others)).epsilon(1e-9));
  CHECK(e.memory[0].optimizer_bytes == doctest::Approx(12.0 * experts / 2 + 12.0 * others / 8).epsilon(1e-9));
}

TEST_CASE("MoE estimate and simulate: the presets whose layers are all MoE are priced, EP reported apart") {
  const System sys = load_system("dgx-h100");
  for (const char* name : {"qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b", "mixtral-8x22b"}) {
    CAPTURE(name);
    Model m = load_model(name);
    m.seq_len = 4096;
    Layout l = moe_layout(1, 8, 8);
    l.pp = 4;
    l.global_batch = 64;
    l.schedule = sched::Kind::one_f_one_b;
    l.zero_stage = 1;
    if (m.layers % 4 != 0) l.stage_layers = {m.layers / 4 + 1, m.layers / 4 + 1, m.layers / 4, m.layers - 3 * (m.layers / 4) - 2};
    const Estimate e = estimate(m, l, sys, 32);
    CHECK(e.step_s > 0);
    CHECK(e.ep_comm_s > 0);
    CHECK(e.tp_comm_s >= 0);
  }
}

// A recovery checkpoint holds every parameter's fp32 value and two Adam moments once (12 bytes each) plus one
// small blob per rank, whatever the sharding: the routed experts are distinct on each ep rank (written by edp 0),
// the rest replicated over dp (written by dp 0). Qwen3-30B-A3B on 16 GPUs, pp 2, under ep 8 (edp 1) and ep 4
// (edp 2), ZeRO-1 and none.
TEST_CASE("MoE checkpoint bytes: every parameter once, whatever ep and ZeRO") {
  const Model q = load_model("qwen3-30b-a3b");
  const System sys = load_system("dgx-h100");
  for (int ep : {8, 4})
    for (int zero : {0, 1}) {
      CAPTURE(ep);
      CAPTURE(zero);
      Layout l = moe_layout(1, 8, ep);
      l.pp = 2;
      l.zero_stage = zero;
      l.schedule = sched::Kind::one_f_one_b;
      l.global_batch = 64;
      const Estimate e = estimate(q, l, sys, 16);
      const goodput::CheckpointBytes b = goodput::checkpoint_bytes(q, e, 8);
      const double blobs = 16 * 16384.0;
      CHECK(b.total_write == doctest::Approx(12.0 * static_cast<double>(q.total_params()) + blobs).epsilon(1e-9));
    }
}

// Routing imbalance: the busiest EP rank's load over balanced. Qwen3-30B-A3B, tp 1, dp 8, ep 8, seq 4096:
// balanced, each local expert gets 2048 tokens and each GPU sends 4096 x 8 x 2048 bf16 values per all-to-all;
// skew 1.5 makes that 3072 tokens and 1.5x the bytes on the busiest rank, a padded capacity factor 1.25 2560
// and 1.25x; the model FLOPs (the routed tokens' work) stay the balanced count.
TEST_CASE("MoE routing: skew and capacity factor scale the busiest rank's expert work and all-to-alls") {
  const Model q = load_model("qwen3-30b-a3b");
  const System sys = load_system("dgx-h100");
  const LayerWork base = lower_layer(q, moe_layout(1, 8, 8), sys);
  Layout skew = moe_layout(1, 8, 8);
  skew.moe_skew = 1.5;
  Layout cap = moe_layout(1, 8, 8);
  cap.moe_capacity = 1.25;
  auto b = ops_by_name(base), s = ops_by_name(lower_layer(q, skew, sys)), c = ops_by_name(lower_layer(q, cap, sys));
  CHECK(s["expert_up"].gemm.m == 3072);
  CHECK(c["expert_up"].gemm.m == 2560);
  CHECK(s["ep_dispatch"].comm_bytes == doctest::Approx(1.5 * b["ep_dispatch"].comm_bytes).epsilon(kExact));
  CHECK(c["ep_combine"].comm_bytes == doctest::Approx(1.25 * b["ep_combine"].comm_bytes).epsilon(kExact));
  CHECK(s["expert_up"].flops_f == doctest::Approx(b["expert_up"].flops_f).epsilon(kExact));
  CHECK(s["expert_up"].t_f > b["expert_up"].t_f);
  Layout both = skew;
  both.moe_capacity = 1.25;
  CHECK(rule_of(both, q) == "moe-routing");
  Layout dense = moe_layout(1, 8, 1);
  dense.moe_skew = 1.2;
  CHECK(rule_of(dense, load_model("llama3-8b")) == "routing-needs-experts");
  const Layout w = parse_layout_words("tp1 pp1 dp8 ep8 skew=1.5 mbs1", 64, "test");
  CHECK(w.moe_skew == 1.5);
  CHECK(w.describe().find("skew=1.5") != std::string::npos);
  CHECK(parse_layout(layout_to_json(w), "l.json").moe_skew == 1.5);
  CHECK_THROWS_WITH_AS(parse_layout_words("tp1 dp8 ep8 skew=0.5", 64, "test"),
                       doctest::Contains("skew=X needs the busiest EP rank's load over the mean"), InputError);
}

// With dp x cp 1 the layers' parameters have no data-parallel reduction, yet edp can exceed 1 (tp wider than
// etp x ep): Mixtral 8x7B on tp 4, etp 1, ep 2 gives edp 2, whose expert gradients the event engine must
// reduce as the closed form does: the two agree within the engine tests' 5%. NVLink slowed 100x so that the
// reduction (2.8 GB of fp32 expert gradients per GPU) is most of the step: leaving it out would miss by far more.
TEST_CASE("MoE: an expert reduction without a dp group is simulated as estimated") {
  Model m = load_model("mixtral-8x7b");
  m.seq_len = 4096;
  System sys = load_system("dgx-h100");
  sys.node.intra_bw_Bps /= 100;
  Layout l = moe_layout(4, 1, 2, 1);
  l.global_batch = 8;
  l.zero_stage = 0;
  REQUIRE(l.expert_dp() == 2);
  const Estimate e = estimate(m, l, sys, 4);
  CHECK(e.dp_comm_s > 0.3 * e.step_s);
  const double sim = engine::simulate(m, l, sys, {}).step_s;
  CHECK(sim == doctest::Approx(e.step_s).epsilon(0.05));
}

// A MoE model with dense layers (tiny-moe: layer 0 dense, 1-3 MoE): each stage counts each kind with its own
// lowering. On pp 2 (layers 0-1 | 2-3) stage 0 holds one dense and one MoE layer, stage 1 two MoE layers; the
// stages' layer FLOPs add up to one dense and three MoE layers'.
TEST_CASE("MoE with dense layers: each stage prices each kind of layer it holds") {
  const Model m = load_model("tiny-moe");
  const System sys = load_system("cpu");
  Layout l;
  l.pp = 2;
  l.global_batch = 8;
  l.precision = Precision::fp32;
  l.attention = AttentionImpl::unfused;
  const Workload w = lower(m, l, sys);
  const LayerWork moe = lower_layer(m, l, sys), dense = lower_layer(dense_part(m), l, sys);
  REQUIRE(w.stages.size() == 2);
  CHECK(w.stages[0].moe_layers == 1);
  CHECK(w.stages[1].moe_layers == 2);
  CHECK(dense.flops_model_f != moe.flops_model_f);
  CHECK(w.stages[0].flops_layers_f == doctest::Approx(dense.flops_model_f + moe.flops_model_f).epsilon(kExact));
  CHECK(w.stages[1].flops_layers_f == doctest::Approx(2 * moe.flops_model_f).epsilon(kExact));
  // Stage 0's weight-gradient work: its two layers' and the embedding table's update (no head there).
  CHECK(w.stages[0].w > dense.t_w + moe.t_w);
  // Parameters: the dense layer's MLP (ffn) in stage 0, the experts in both.
  const double dense_params = layer_params_per_gpu(dense_part(m), l), moe_params = layer_params_per_gpu(m, l);
  CHECK(w.stages[0].expert_params == doctest::Approx(layer_expert_params_per_gpu(m, l)).epsilon(kExact));
  CHECK(w.stages[0].params - static_cast<double>(m.embedding_params()) ==
        doctest::Approx(dense_params + moe_params).epsilon(1e-9));
  CHECK(&w.layer_of(0) == &w.kind(1));
  CHECK(&w.layer_of(1) == &w.layer);
}

// DeepSeek-V3's MoE layer under latent attention: its model FLOPs per token are 2 x (MLA's projection weights +
// the router + top-8 routed experts + the shared expert) + the attention core 2 s heads (qk_head_dim + v_head_dim),
// counted once although the down-projections run on every tp rank (tp 2 here).
TEST_CASE("MLA lowering: model FLOPs from the parameter counts, duplicated down-projections counted once") {
  Model m = load_model("deepseek-v3");
  m.seq_len = 4096;
  const System sys = load_system("h800");
  Layout l = moe_layout(2, 4, 8, 1);
  const LayerWork lw = lower_layer(m, l, sys);
  auto by = ops_by_name(lw);
  for (const char* name : {"q_down", "q_norm", "q_up", "kv_down", "kv_norm", "kv_up"}) CHECK_MESSAGE(by.count(name) == 1, name);
  CHECK(by.count("qkv") == 0);
  CHECK(by["q_down"].gemm.n == 1536);                 // duplicated: the whole latent on each tp rank
  CHECK(by["q_up"].gemm.n == 128 * 192 / 2);          // column-parallel over tp 2
  CHECK(by["kv_up"].gemm.n == 128 * (128 + 128) / 2);
  CHECK(by["proj"].gemm.k == 128 * 128 / 2);
  const double norms = m.mla.q_lora_rank + m.mla.kv_lora_rank;  // RMSNorm weights of the two latents
  const double linear = static_cast<double>(m.attention_params()) - norms + static_cast<double>(m.router_params()) +
                        m.moe.top_k * static_cast<double>(m.expert_params()) + static_cast<double>(m.shared_expert_params());
  const double core = 2.0 * m.seq_len * m.heads * (m.mla.qk_head_dim() + m.mla.v_head_dim);
  CHECK(lw.flops_model_f * l.tp * l.cp / m.seq_len == doctest::Approx(2.0 * linear + core).epsilon(1e-9));
}

// On one GPU per stage (tp 1, ep 1, pp 2) the stages' parameters are the model's, its MTP module's, and the copy
// of the token embedding the last stage keeps for the MTP module: each layer kind, the latent attention and the
// MTP module counted once, from the counts checked against HF transformers.
TEST_CASE("DeepSeek-V3 stages hold every parameter once, the MTP module and its embedding copy on the last") {
  Model m = load_model("deepseek-v3");
  m.seq_len = 4096;
  const System sys = load_system("h800");
  Layout l = moe_layout(1, 1, 1);
  l.pp = 2;
  l.global_batch = 8;
  l.stage_layers = {30, 31};
  l.schedule = sched::Kind::one_f_one_b;
  const Workload w = lower(m, l, sys);
  const double held = w.stages[0].params + w.stages[1].params;
  const double expected = static_cast<double>(m.total_params() + m.mtp_params()) + static_cast<double>(m.vocab) * m.hidden;
  CHECK(held == doctest::Approx(expected).epsilon(1e-9));
  CHECK(w.stages[0].moe_layers == 27);  // layers 0-29, of which 0-2 dense
  CHECK(w.stages[1].moe_layers == 32);  // layers 30-60 and the MTP module's
}

// GPT-OSS's windowed layers (every other one, 128 tokens): their flash attention's model FLOPs count the band's
// pairs and the kernel's work its 128 x 128 tiles, both counted here by enumerating the positions; each stage
// adds each kind of layer it holds; MFU's causal convention halves only the full layers' attention.
TEST_CASE("windowed attention: band pairs and tiles counted by enumeration, each layer kind priced as its own") {
  Model m = load_model("gpt-oss-120b");
  m.seq_len = 4096;
  const System sys = load_system("dgx-h100");
  Layout l = moe_layout(1, 8, 8);
  l.pp = 4;
  l.global_batch = 64;
  l.schedule = sched::Kind::one_f_one_b;
  REQUIRE(m.sliding_window == 128);
  // Pairs (query i, key j) with i - 128 < j <= i, and the 128 x 128 tiles holding at least one of them.
  const int s = m.seq_len, w = m.sliding_window, tile = 128;
  double pairs = 0, tiles = 0;
  for (int i = 0; i < s; ++i) pairs += std::min(i + 1, w);
  for (int qb = 0; qb < s / tile; ++qb)
    for (int kb = 0; kb <= qb; ++kb) {
      // key block kb holds a key some query of block qb sees: its last key >= the block's first query's
      // window start, and its first key <= the block's last query.
      const int first_query = qb * tile, last_key = kb * tile + tile - 1;
      tiles += last_key > first_query - w;
    }
  REQUIRE(tiles == 63);  // the diagonal tile of each of the 32 query blocks, the one before it for 31
  const double per_pair = 2.0 * l.micro_batch * m.heads * 2 * m.head_dim;  // QK^T and AV, fwd, all heads (tp 1)
  const auto flash = [](const LayerWork& lw) {
    for (const auto& op : lw.ops)
      if (op.name == std::string("flash_attn")) return op;
    FAIL("no flash_attn op");
    return WorkOp{};
  };
  const LayerWork full = lower_layer(m, l, sys), band = lower_layer(kind_model(m, 2), l, sys);
  CHECK(band.window == 128);
  CHECK(full.window == 0);
  CHECK(flash(band).flops_f == doctest::Approx(per_pair * pairs).epsilon(kExact));
  CHECK(flash(band).exec_flops_f == doctest::Approx(per_pair * tiles * tile * tile).epsilon(kExact));
  CHECK(flash(full).flops_f == doctest::Approx(per_pair * double(s) * s).epsilon(kExact));  // non-causal count
  CHECK(band.flops_attention_f == 0);  // nothing for the causal convention to halve
  CHECK(full.flops_attention_f == doctest::Approx(flash(full).flops_f).epsilon(kExact));
  // Everything but the attention core is the same work.
  CHECK(full.flops_model_f - band.flops_model_f == doctest::Approx(flash(full).flops_f - flash(band).flops_f).epsilon(kExact));
  // Stages: 36 layers over pp 4, 9 each; layers 0, 2, 4, ... windowed (GptOssConfig's layer_types).
  const Workload wk = lower(m, l, sys);
  REQUIRE(wk.stages.size() == 4);
  CHECK(wk.stages[0].kind_layers[2] == 5);  // layers 0-8: 0, 2, 4, 6, 8
  CHECK(wk.stages[0].kind_layers[0] == 4);
  CHECK(wk.stages[1].kind_layers[2] == 4);  // layers 9-17: 10, 12, 14, 16
  CHECK(wk.stages[1].flops_layers_f == doctest::Approx(5 * full.flops_model_f + 4 * band.flops_model_f).epsilon(kExact));
  CHECK(&wk.layer_of(0) == &wk.kind(2));
  CHECK(&wk.layer_of(1) == &wk.layer);
  CHECK(wk.kind(2).t_f < wk.layer.t_f);
  // The unfused path computes the whole masked matrix (its GEMMs keep their shapes) but the model FLOPs are
  // the band's whatever the kernel, so MFU compares across --attention.
  Layout unf = l;
  unf.attention = AttentionImpl::unfused;
  const LayerWork band_unfused = lower_layer(kind_model(m, 2), unf, sys);
  auto ub = ops_by_name(band_unfused);
  CHECK(ub["attn_scores"].flops_f + ub["attn_v"].flops_f == doctest::Approx(flash(band).flops_f).epsilon(kExact));
  CHECK(ub["attn_scores"].gemm.n == s);  // every key, masked
  CHECK(band_unfused.flops_attention_f == 0);
  // A profile that measured the attention core as one kernel prices a windowed layer's flash op, and its unfused
  // GEMMs, at the tiles the kernel runs.
  System measured = sys;
  measured.gpu.attention_flops.fwd = 400e12;
  measured.gpu.attention_flops.bwd = 300e12;
  const auto fm = flash(lower_layer(kind_model(m, 2), l, measured));
  CHECK(fm.t_f == doctest::Approx(cost::attention_core_time(measured.gpu, per_pair * tiles * tile * tile, false, 1)).epsilon(kExact));
  CHECK(fm.t_i == doctest::Approx(cost::attention_core_time(measured.gpu, 2.5 * per_pair * tiles * tile * tile, true, 1)).epsilon(kExact));
  auto um = ops_by_name(lower_layer(kind_model(m, 2), unf, measured));
  CHECK(um["attn_scores"].t_f + um["attn_v"].t_f ==
        doctest::Approx(cost::attention_core_time(measured.gpu, per_pair * tiles * tile * tile, false, 1)).epsilon(1e-9));
  // MFU under the causal convention: the full layers' attention halved, the windowed ones' kept.
  const Estimate e = estimate(m, l, sys);
  const double gpus = 8 * 4, mb = l.num_microbatches();
  const double halved = 3 * 18 * flash(full).flops_f / 2 * mb * l.dp;
  CHECK((e.model_tflops_per_gpu - e.model_tflops_per_gpu_causal) * 1e12 * e.step_s * gpus ==
        doctest::Approx(halved).epsilon(1e-9));
}

// DeepEP's shares of the dispatch buffer (sim/cost/comm.cpp deepep_shares) against an enumeration of every
// routing: a token's copies cross the network once per remote node holding one of its experts. Token on node 0.
TEST_CASE("DeepEP dispatch: network share by enumerating every routing, NVLink fan-out, priced below NCCL's across nodes") {
  // 8 experts on 4 nodes (2 a node), top-2 of all: every pair of experts equally likely.
  {
    double remote = 0, pairs = 0;
    for (int a = 0; a < 8; ++a)
      for (int b = a + 1; b < 8; ++b) {
        const int na = a / 2, nb = b / 2;
        remote += (na != 0) + (nb != 0 && nb != na);
        ++pairs;
      }
    const cost::A2aShares s = cost::deepep_shares({8, 2, 0, 0}, 2, 4);
    CHECK(s.network * 2 == doctest::Approx(remote / pairs).epsilon(kExact));
    CHECK(s.nvlink == doctest::Approx(0.5).epsilon(kExact));
  }
  // Group-limited: 4 groups of 2 experts, 2 groups a node on 2 nodes, each token in 2 groups (one expert from
  // each, top-2): every pair of groups equally likely.
  {
    double remote = 0, pairs = 0;
    for (int g = 0; g < 4; ++g)
      for (int h = g + 1; h < 4; ++h) {
        const int ng = g / 2, nh = h / 2;
        remote += (ng != 0) + (nh != 0 && nh != ng);
        ++pairs;
      }
    CHECK(cost::deepep_shares({8, 2, 4, 2}, 4, 2).network * 2 == doctest::Approx(remote / pairs).epsilon(kExact));
  }
  // DeepSeek-V3 on ep 64 over 8 H800 nodes: 8 groups (one a node), 4 per token: 4 nodes hit, 3.5 remote of 8
  // copies; NCCL's all-to-all sends 56 of every 64 to other nodes.
  const cost::A2aShares ds = cost::deepep_shares({256, 8, 8, 4}, 8, 8);
  CHECK(ds.network == doctest::Approx(3.5 / 8).epsilon(kExact));
  Model m = load_model("deepseek-v3");
  m.seq_len = 4096;
  const System sys = load_system("h800");
  const auto dispatch = [&](const std::string& words) {
    return ops_by_name(lower_layer(m, parse_layout_words(words, 15360, "test"), sys))["ep_dispatch"];
  };
  const WorkOp nccl = dispatch("tp1 pp16 dp128 ep64 mbs1 1f1b zero1"), deep = dispatch("tp1 pp16 dp128 ep64 mbs1 1f1b zero1 deepep");
  CHECK(deep.deepep.enabled());
  CHECK(!nccl.deepep.enabled());
  // Both network-bound here: the time's bandwidth term halves (3.5 / 8 against 7 / 8), the latencies stay.
  const double lat = sys.node.intra_latency_s + sys.net.latency_s;
  CHECK((deep.t_f - lat) / (nccl.t_f - lat) == doctest::Approx(0.5).epsilon(1e-6));
  // Inside one node the two dispatchers cost alike.
  CHECK(dispatch("tp1 pp16 dp128 ep8 mbs1 1f1b zero1 deepep").t_f == doctest::Approx(dispatch("tp1 pp16 dp128 ep8 mbs1 1f1b zero1").t_f).epsilon(kExact));
  // The layout's word, its JSON and its rule.
  const Layout l = parse_layout_words("tp1 pp16 dp128 ep64 mbs1 1f1b zero1 deepep", 15360, "test");
  CHECK(l.describe().find(" deepep") != std::string::npos);
  CHECK(layout_to_json(l)["moe_dispatcher"] == "deepep");
  CHECK(parse_layout(layout_to_json(l), "test").deepep);
  CHECK(rule_of(parse_layout_words("tp1 pp16 dp128 ep1 mbs1 1f1b zero1 deepep", 15360, "test"), m) == "deepep-needs-ep");
  CHECK(rule_of(l, load_model("llama3-70b")) == "ep-needs-experts");  // the dense model's first broken rule
  CHECK(rule_of(parse_layout_words("tp1 pp16 dp128 mbs1 1f1b zero1 deepep", 15360, "test"), load_model("llama3-70b")) ==
        "deepep-needs-ep");
}

// Groups straddling NVLink domains (cost::node_split): Megatron's order puts each group kind in blocks of
// size x stride consecutive ranks tiling the job; nodes take ranks in order. Checked against every group of
// the job enumerated member by member, on nodes that divide the blocks, that the blocks divide, and neither.
TEST_CASE("groups straddling NVLink domains: node split by enumerating every group, all-to-all priced by its slowest member") {
  int cases = 0, straddling = 0;
  for (int n : {2, 3, 4, 6, 8, 16, 32, 64})
    for (int s : {1, 2, 3, 4, 8})
      for (int D : {1, 4, 8, 18, 72})
        for (int copies : {1, 2, 3, 4, 9}) {
          const long long total = static_cast<long long>(n) * s * copies;
          int fewest = n, most = 0, nodes = 0;
          for (long long a = 0; a < total; a += static_cast<long long>(n) * s)
            for (int t = 0; t < s; ++t) {
              std::map<long long, int> per_node;
              for (int i = 0; i < n; ++i) ++per_node[(a + t + static_cast<long long>(i) * s) / D];
              for (const auto& [node, k] : per_node) {
                fewest = std::min(fewest, k);
                most = std::max(most, k);
              }
              nodes = std::max(nodes, static_cast<int>(per_node.size()));
            }
          CAPTURE(n);
          CAPTURE(s);
          CAPTURE(D);
          CAPTURE(copies);
          const cost::NodeSplit got = cost::node_split({n, s, false, total}, D);
          CHECK(got.fewest == fewest);
          CHECK(got.most == most);
          CHECK(got.nodes == nodes);
          ++cases;
          straddling += fewest < most;
        }
  CHECK(straddling > 100);  // the enumeration covers uneven splits, not only aligned ones
  CHECK(cases == 1000);

  // DeepSeek-V3 on 256 GB200 as Megatron-Bridge ran it (tp1 pp4 ep64): each stage's 64 ranks are one ep group.
  // Ranks filling racks of 72 in order, stage 0 is inside rack 0 (64 members) and stage 1 has 8 on rack 0 and 56
  // on rack 1: those 8 send 56/64 of their buffer over the network. With 64 GPUs a rack (Slurm's --segment 16)
  // every group is inside one.
  const System gb = load_system("gb200");
  const cost::GroupPlacement ep64{64, 1, false, 256};
  const cost::NodeSplit split = cost::node_split(ep64, gb.node.gpus_per_node);
  CHECK(split.fewest == 8);
  CHECK(split.most == 64);
  CHECK(split.nodes == 2);
  const double bytes = 1 << 28;
  const double net = gb.net.nic_bw_Bps * gb.net.efficiency, nvl = gb.node.intra_bw_Bps * gb.node.intra_efficiency;
  const cost::CommTime dense = cost::collective_time(gb, cost::Collective::all_to_all, bytes, ep64);
  CHECK(dense.inter_node);
  CHECK(dense.seconds == doctest::Approx(gb.node.intra_latency_s + gb.net.latency_s +
                                         std::max(63.0 / 64 * bytes / nvl, 56.0 / 64 * bytes / net))
                             .epsilon(kExact));
  System segment = gb;
  segment.node.gpus_per_node = 64;
  const cost::CommTime inside = cost::collective_time(segment, cost::Collective::all_to_all, bytes, ep64);
  CHECK_FALSE(inside.inter_node);
  CHECK(dense.seconds > 10 * inside.seconds);
  // A lone group (total 0) from a node boundary keeps the aligned pricing.
  CHECK_FALSE(cost::collective_time(gb, cost::Collective::all_to_all, bytes, {64, 1}).inter_node);
  // On 8-GPU nodes power-of-two groups never straddle: an 8-wide ep group over 64 GPUs stays inside a node.
  CHECK(cost::node_split({8, 1, false, 64}, 8).inside_one_node(8));
  // Hierarchical collectives: a data-parallel all-reduce over a straddling group is paced by its node with the
  // fewest members (each of its NICs carries buffer / fewest).
  const cost::CommTime ar = cost::collective_time(gb, cost::Collective::all_reduce, bytes, ep64);
  // (the NVLink phase over the 64 of stage 0's rack). Latency: NCCL's tree steps, 2 ceil(log2 n) for an
  // all-reduce (12 over 64 members, 2 over 2 racks).
  const double bw_part = cost::bus_factor(cost::Collective::all_reduce, 64) * bytes / nvl +
                         cost::bus_factor(cost::Collective::all_reduce, 2) * (bytes / 8) / net;
  CHECK(ar.seconds == doctest::Approx(12 * gb.node.intra_latency_s + 2 * gb.net.latency_s + bw_part).epsilon(kExact));
}

// DualPipe's all-to-all overlap (Layout::a2a_overlap): in each F&B block the forward's and the backward's expert
// all-to-alls run under the other part's compute (workload.hpp fb_block). The closed form counts the blocks
// per rank by formula; here they are counted in the generated DualPipeV schedule and their hidden seconds
// summed, which must be what the estimate no longer reports as exposed on the busiest rank (rank 0 here, with
// the embedding and the head); the event engine, which plays every block, agrees with the closed form.
TEST_CASE("all-to-all overlap: F&B blocks counted in the DualPipeV schedule, closed form and event engine agree") {
  Model m = load_model("qwen3-30b-a3b");
  m.seq_len = 4096;
  const System sys = load_system("dgx-h100");
  const Layout off = parse_layout_words("tp1 pp4 dp8 ep8 vpp2 mbs1 dualpipev zero1", 256, "test");
  const Layout on = parse_layout_words("tp1 pp4 dp8 ep8 vpp2 mbs1 dualpipev zero1 a2a-overlap", 256, "test");
  REQUIRE(on.a2a_overlap);
  const Workload w = lower(m, on, sys);
  const sched::Schedule s = sched::generate(sched::Kind::dualpipev, schedule_params(on));
  std::vector<double> hidden(static_cast<std::size_t>(on.pp), 0.0);
  int blocks = 0;
  for (int r = 0; r < on.pp; ++r)
    for (const auto& a : s.ranks[static_cast<std::size_t>(r)]) {
      if (a.type != sched::ActionType::OVERLAP_F_B) continue;
      ++blocks;
      const FbBlock b = fb_block(w.stages[static_cast<std::size_t>(a.sub[0].stage)], w.stages[static_cast<std::size_t>(a.sub[1].stage)],
                                 a.sub[1].type != sched::ActionType::I, true);
      CHECK(b.hidden > 0);
      hidden[static_cast<std::size_t>(r)] += b.hidden;
    }
  CHECK(blocks > 0);
  // The closed form's per-rank hidden seconds, every rank (the last one's first round is a plain F0, B1).
  const std::vector<double> closed = a2a_hidden(step_costs(m, on, sys), on.num_microbatches());
  REQUIRE(closed.size() == hidden.size());
  for (std::size_t r = 0; r < hidden.size(); ++r) {
    CAPTURE(r);
    CHECK(closed[r] == doctest::Approx(hidden[r]).epsilon(1e-9));
  }
  const Estimate e0 = estimate(m, off, sys), e1 = estimate(m, on, sys);
  CHECK(e0.ep_exposed_s - e1.ep_exposed_s == doctest::Approx(hidden[0]).epsilon(1e-9));
  CHECK(e0.busy_s - e1.busy_s == doctest::Approx(hidden[0]).epsilon(1e-9));
  CHECK(e0.compute_s == doctest::Approx(e1.compute_s).epsilon(1e-9));  // hidden all-to-alls are not compute
  CHECK(e1.step_s < e0.step_s);
  // Crossed: each part's all-to-alls hide under the other part's compute only (TP collectives are not compute).
  {
    StageWork f = w.stages[1], b = w.stages[6];
    f.f = 10, f.tp_comm_f = 4, f.ep_f = 3;  // 6 of compute, 3 of all-to-all
    b.i = 5, b.w = 0, b.tp_comm_b = 1, b.ep_b = 1;  // 4 of compute, 1 of all-to-all
    CHECK(fb_block(f, b, true, true).hidden == doctest::Approx(3 + 1).epsilon(kExact));
    b.ep_b = 0.5, b.i = 1.5, b.tp_comm_b = 0.5;  // 1 of compute: the forward's 3 of all-to-all hide only 1
    CHECK(fb_block(f, b, true, true).hidden == doctest::Approx(1 + 0.5).epsilon(kExact));
  }
  // Without the overlap a block is its two parts one after the other (the event engine as before).
  const FbBlock plain = fb_block(w.stages[0], w.stages[7], true, false);
  CHECK(plain.hidden == 0);
  CHECK(plain.serial == doctest::Approx(w.stages[0].f + w.stages[7].i + w.stages[7].w).epsilon(kExact));
  for (const Layout& l : {off, on}) {
    CAPTURE(l.describe());
    const double des = engine::simulate(m, l, sys, {}).step_s, closed = estimate(m, l, sys).step_s;
    CHECK(des == doctest::Approx(closed).epsilon(0.05));
  }
  // The rule: the overlap pairs a forward with another micro-batch's backward in DualPipeV's blocks.
  CHECK(rule_of(parse_layout_words("tp1 pp4 dp8 ep8 mbs1 1f1b zero1 a2a-overlap", 256, "test"), m) == "a2a-overlap");
  CHECK(rule_of(parse_layout_words("tp1 pp4 dp8 ep1 vpp2 mbs1 dualpipev zero1 a2a-overlap", 256, "test"), m) == "a2a-overlap");
  CHECK(rule_of(on, m).empty());
  CHECK(parse_layout(layout_to_json(on), "test").a2a_overlap);
  CHECK(on.describe().find(" a2a-overlap") != std::string::npos);
}

// Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm; combined_1f1b.py): interleaved with
// vpp > 1, or without pipelining, each steady-state forward runs with the backward after it as one F&B block.
// Read through its blocks, the generated order is the plain one warmed up by one forward more (Megatron-Core's
// rule, so that no block pairs a micro-batch's forward with its own backward); the validator proves it
// deadlock-free, and its activation peak, one chunk above the plain one's, is the memory model's. The closed form's block counts (gen::combined_block_counts, no schedule built) are the
// generated schedule's, the estimate drops the busiest rank's hidden seconds, and the event engine agrees.
TEST_CASE("all-to-all overlap: Megatron-Core's combined 1F1B, interleaved and without pipelining") {
  struct Case {
    sched::Kind kind;
    int pp, v, m;
    sched::MicrobatchRule rule;
  };
  for (const Case c : {Case{sched::Kind::interleaved, 4, 2, 8, sched::MicrobatchRule::megatron},
                       Case{sched::Kind::interleaved, 4, 2, 12, sched::MicrobatchRule::megatron},
                       Case{sched::Kind::interleaved, 2, 3, 6, sched::MicrobatchRule::megatron},
                       Case{sched::Kind::interleaved, 4, 4, 16, sched::MicrobatchRule::megatron},
                       Case{sched::Kind::interleaved, 4, 2, 8, sched::MicrobatchRule::torch},
                       Case{sched::Kind::one_f_one_b, 1, 1, 8, sched::MicrobatchRule::megatron}}) {
    CAPTURE(c.pp);
    CAPTURE(c.v);
    CAPTURE(c.m);
    sched::GenParams p;
    p.pp = c.pp;
    p.vpp = c.v;
    p.microbatches = c.m;
    p.rule = c.rule;
    const sched::Schedule plain = sched::generate(c.kind, p);
    p.combined = true;
    const sched::Schedule comb = sched::generate(c.kind, p);
    const sched::ValidationReport vp = sched::validate(plain), vc = sched::validate(comb);
    REQUIRE(vc.ok());
    const auto counts = sched::gen::combined_block_counts(c.kind, p);
    int blocks = 0;
    for (int r = 0; r < c.pp; ++r) {
      std::vector<int> seen(static_cast<std::size_t>(c.v * c.v), 0);
      // Read through its blocks: the same forwards in the same order, the same backwards in the same order,
      // one forward more before the first backward.
      std::vector<std::string> fs, bs, want_f, want_b;
      int lead = -1, want_lead = -1;
      const auto read = [](const sched::Action& a, std::vector<std::string>& f, std::vector<std::string>& b, int& lead) {
        if (a.type == sched::ActionType::F) f.push_back(a.token());
        if (a.type == sched::ActionType::B) {
          if (lead < 0) lead = static_cast<int>(f.size());
          b.push_back(a.token());
        }
      };
      for (const auto& a : comb.ranks[static_cast<std::size_t>(r)]) {
        if (a.type != sched::ActionType::OVERLAP_F_B) {
          read(a, fs, bs, lead);
          continue;
        }
        REQUIRE(a.sub.size() == 2);
        CHECK(a.sub[0].mb != a.sub[1].mb);  // never a micro-batch's forward with its own backward
        ++seen[static_cast<std::size_t>((a.sub[0].stage / c.pp) * c.v + a.sub[1].stage / c.pp)];
        ++blocks;
        for (const auto& x : a.sub) read(x, fs, bs, lead);
      }
      for (const auto& a : plain.ranks[static_cast<std::size_t>(r)]) read(a, want_f, want_b, want_lead);
      CHECK(seen == counts[static_cast<std::size_t>(r)]);
      CHECK(fs == want_f);
      CHECK(bs == want_b);
      CHECK(lead == std::min(want_lead + 1, c.m * c.v));
      CHECK(vc.peak_inflight[static_cast<std::size_t>(r)] == std::min(vp.peak_inflight[static_cast<std::size_t>(r)] + 1, c.m * c.v));
      // The memory model's in-flight chunks follow the generated schedule's.
      Layout l = parse_layout_words("tp1 pp" + std::to_string(c.pp) + " dp1 mbs1 " +
                                        (c.kind == sched::Kind::one_f_one_b ? std::string("1f1b")
                                                                            : "vpp" + std::to_string(c.v) + " interleaved"),
                                    c.m, "test");
      l.microbatch_rule = c.rule;
      l.a2a_overlap = true;
      CHECK(cost::inflight_chunks(l, r) == vc.peak_inflight[static_cast<std::size_t>(r)]);
    }
    CHECK(blocks > 0);
    if (c.pp == 1) CHECK(blocks == c.m - 1);
  }
  // Plain 1F1B over pp > 1 is not combined (Megatron asks for a virtual pipeline): refused by the generator
  // and by the layout's rule.
  sched::GenParams bad;
  bad.pp = 4;
  bad.microbatches = 8;
  bad.combined = true;
  CHECK_THROWS_WITH_AS(sched::generate(sched::Kind::one_f_one_b, bad), doctest::Contains("vpp > 1"), InputError);

  Model m = load_model("qwen3-30b-a3b");
  m.seq_len = 4096;
  const System sys = load_system("dgx-h100");
  for (const std::string words : {"tp1 pp4 dp8 ep8 vpp2 mbs1 interleaved zero1", "tp1 pp1 dp32 ep8 mbs1 1f1b zero1"}) {
    CAPTURE(words);
    const Layout off = parse_layout_words(words, 256, "test"), on = parse_layout_words(words + " a2a-overlap", 256, "test");
    REQUIRE(rule_of(on, m).empty());
    const std::vector<double> hidden = a2a_hidden(step_costs(m, on, sys), on.num_microbatches());
    const Estimate e0 = estimate(m, off, sys), e1 = estimate(m, on, sys);
    // The busiest rank after what each hides (it may change: the ranks hide different seconds).
    const StepCosts sc = step_costs(m, on, sys);
    const double mb = on.num_microbatches();
    double busiest = -1;
    for (std::size_t r = 0; r < hidden.size(); ++r) {
      CHECK(hidden[r] > 0);
      busiest = std::max(busiest, mb * (sc.ranks.f[r] + sc.ranks.i[r] + sc.ranks.w[r]) - hidden[r]);
    }
    CHECK(e1.busy_s == doctest::Approx(busiest).epsilon(1e-9));
    CHECK(e1.ep_exposed_s < e0.ep_exposed_s);
    CHECK(e0.compute_s == doctest::Approx(e1.compute_s).epsilon(1e-9));
    CHECK(e1.step_s < e0.step_s);
    for (const Layout& l : {off, on}) {
      CAPTURE(l.describe());
      const auto des = engine::simulate(m, l, sys, {});
      const Estimate closed = estimate(m, l, sys);
      CHECK(des.step_s == doctest::Approx(closed.step_s).epsilon(0.05));
      CHECK(des.peak_bytes == doctest::Approx(closed.peak_memory_bytes).epsilon(0.02));
      for (const auto& rk : des.ranks) {  // every pipeline rank's, the last one's logits included
        CAPTURE(rk.pp);
        CHECK(rk.peak_bytes == doctest::Approx(closed.memory[static_cast<std::size_t>(rk.pp)].total()).epsilon(0.02));
      }
    }
    CHECK(e1.peak_memory_bytes > e0.peak_memory_bytes);  // one more chunk alive: the memory the overlap costs
    if (on.pp == 1) CHECK(e1.memory[0].activations_bytes == doctest::Approx(2 * e0.memory[0].activations_bytes).epsilon(1e-12));
  }
  CHECK(rule_of(parse_layout_words("tp1 pp4 dp8 ep8 mbs1 1f1b zero1 a2a-overlap", 256, "test"), m) == "a2a-overlap");
  CHECK(rule_of(parse_layout_words("tp1 pp1 dp32 ep8 mbs1 1f1b zero1 a2a-overlap", 256, "test"), m).empty());
  CHECK(rule_of(parse_layout_words("tp1 pp4 dp8 ep8 vpp2 mbs1 interleaved zero1 full a2a-overlap", 256, "test"), m) ==
        "a2a-overlap");  // Megatron-Core asserts no full recompute with it
}

// The event engine's expert all-to-alls (sim/engine/job_pipeline.cpp): each dispatch and combine of a MoE
// forward or input-gradient op is a flow shared by its ep group's positions, on their NVLink links when the
// group sits in one node and their NICs otherwise, between the op's compute pieces. Expected counts from the
// model (8 MoE layers, a dispatch and a combine each) and the layout; durations from the flows' own work.
TEST_CASE("expert all-to-alls are flows of the ep group: per layer or coalesced, contended by gradient reductions") {
  Model m = load_model("mixtral-8x7b");
  m.layers = 8;
  m.seq_len = 1024;
  const System sys = load_system("dgx-h100");
  const auto a2a_tasks = [](const engine::SimReport& r) {
    std::vector<std::uint32_t> out;
    for (std::uint32_t t = 0; t < r.job.graph.size(); ++t)
      if (r.job.info[t].op == engine::OpKind::ep_alltoall) out.push_back(t);
    return out;
  };
  // pp 1, gradients reduced after the backward: no other flow runs beside an all-to-all.
  Layout solo = parse_layout_words("tp1 pp1 dp4 ep4 mbs1 1f1b", 16, "test");
  solo.overlap_grad_reduce = false;
  const int M = solo.num_microbatches();
  REQUIRE(M == 4);
  const engine::SimReport per_layer = engine::simulate(m, solo, sys, {});
  REQUIRE(per_layer.job.ep_flows);
  CHECK_FALSE(per_layer.job.ep_coalesced);
  const auto cuts_f = engine::a2a_cuts(per_layer.costs, solo, 0, true), cuts_i = engine::a2a_cuts(per_layer.costs, solo, 0, false);
  CHECK(cuts_f.size() == 2 * 8);
  CHECK(cuts_i.size() == 2 * 8);
  for (std::size_t k = 1; k < cuts_f.size(); ++k) CHECK(cuts_f[k].at > cuts_f[k - 1].at);  // compute between them
  const auto flows = a2a_tasks(per_layer);
  CHECK(flows.size() == static_cast<std::size_t>(M) * (16 + 16));  // one ep group (4 positions): shared flows
  const engine::Cluster cl(solo, sys, engine::Fidelity::cluster);
  for (auto t : flows) {
    const auto& members = per_layer.job.groups[static_cast<std::size_t>(per_layer.job.info[t].group)];
    CHECK(members.size() == 4);
    for (auto link : per_layer.job.graph.links_of(t)) CHECK(link < 4u);  // NVLink: the group is in one node
    CHECK(per_layer.run.end[t] - per_layer.run.start[t] == doctest::Approx(per_layer.job.graph.work[t]).epsilon(1e-12));
  }
  // Coalesced (a budget of no pieces): one flow per op at its end, the same seconds; with nothing to contend
  // with, the same step and the same peak memory.
  engine::SimOptions few;
  few.ep_piece_budget = 0;
  const engine::SimReport coalesced = engine::simulate(m, solo, sys, few);
  CHECK(coalesced.job.ep_coalesced);
  CHECK(a2a_tasks(coalesced).size() == static_cast<std::size_t>(M) * 2);
  CHECK(coalesced.step_s == doctest::Approx(per_layer.step_s).epsilon(1e-9));
  CHECK(coalesced.peak_bytes == doctest::Approx(per_layer.peak_bytes).epsilon(1e-12));
  // The all-to-alls are communication the compute stream waits for: exposed, not busy (with the gradient
  // reductions after the backward, the rest of what rank 0 waits for).
  double a2a_s = 0, dp_s = 0;
  for (auto t : flows) a2a_s += per_layer.run.end[t] - per_layer.run.start[t];
  for (std::uint32_t t = 0; t < per_layer.job.graph.size(); ++t)
    if (per_layer.job.info[t].stream == trace::Stream::dp) dp_s += per_layer.run.end[t] - per_layer.run.start[t];
  CHECK(a2a_s > 0);
  CHECK(per_layer.ranks[0].exposed_comm_s == doctest::Approx(a2a_s + dp_s).epsilon(1e-9));
  // The trace: one forward and one backward event per micro-batch (an op is one event, as the runtime
  // records it), each all-to-all inside its op's span, named and placed by layer.
  const trace::Trace tr = engine::to_trace(per_layer, sys);
  std::map<std::string, int> ops;
  std::vector<const trace::OpEvent*> spans;
  for (const auto& e : tr.events)
    if (e.rank == 0) {
      ++ops[e.op];
      if (e.op == "forward" || e.op == "backward") spans.push_back(&e);
    }
  CHECK(ops["forward"] == M);
  CHECK(ops["backward"] == M);
  CHECK(ops["ep_alltoall"] == M * 32);
  for (const auto& e : tr.events) {
    if (e.rank != 0 || e.op != "ep_alltoall") continue;
    CHECK(e.layer_end == e.layer_begin + 1);
    CHECK((e.name.rfind("ep_dispatch L", 0) == 0 || e.name.rfind("ep_combine L", 0) == 0));
    const bool inside = std::any_of(spans.begin(), spans.end(), [&](const trace::OpEvent* s) {
      return s->mb == e.mb && e.start_us >= s->start_us - 1e-6 && e.start_us + e.dur_us <= s->start_us + s->dur_us + 1e-6;
    });
    CHECK(inside);
  }
  // Gradient buckets reduced during the backward (Megatron's overlap_grad_reduce) share the NVLink links with
  // the backward's all-to-alls: some take longer than alone, none shorter.
  Layout busy = solo;
  busy.overlap_grad_reduce = true;
  const engine::SimReport pr = engine::simulate(m, busy, sys, {});
  int slowed = 0;
  for (auto t : a2a_tasks(pr)) {
    const double d = pr.run.end[t] - pr.run.start[t], w = pr.job.graph.work[t];
    CHECK(d >= w * (1 - 1e-12));
    slowed += d > w * (1 + 1e-6);
  }
  CHECK(slowed > 0);
  // ep 16 on nodes of 8: the group's flows use its positions' NICs.
  Model m16 = m;
  m16.moe.experts = 16;
  const Layout wide = parse_layout_words("tp1 pp1 dp16 ep16 mbs1 1f1b", 16, "test");
  const engine::SimReport wr = engine::simulate(m16, wide, sys, {});
  const auto wflows = a2a_tasks(wr);
  REQUIRE_FALSE(wflows.empty());
  for (auto t : wflows)
    for (auto link : wr.job.graph.links_of(t)) CHECK((link >= 16u && link < 32u));
}

// Full recompute replays the forward of the recomputed layers, their all-to-alls included: those are flows too
// (cut out of the recompute op's compute), drawn inside the recompute's event; Megatron's block method with
// recompute_layers 3 replays the first 3 layers only. Selective recompute replays the attention core, no
// all-to-all.
TEST_CASE("a full recompute's expert all-to-alls are flows of the ep group, as the forward's") {
  Model m = load_model("mixtral-8x7b");
  m.layers = 8;
  m.seq_len = 1024;
  const System sys = load_system("dgx-h100");
  const auto count_a2a = [](const engine::SimReport& r) {
    std::size_t n = 0;
    for (std::uint32_t t = 0; t < r.job.graph.size(); ++t) n += r.job.info[t].op == engine::OpKind::ep_alltoall;
    return n;
  };
  Layout l = parse_layout_words("tp1 pp1 dp4 ep4 mbs1 1f1b", 16, "test");
  l.overlap_grad_reduce = false;
  l.recompute = Recompute::full;
  const int M = l.num_microbatches();
  const engine::SimReport r = engine::simulate(m, l, sys, {});
  REQUIRE(r.job.ep_flows);
  const auto cuts_r = engine::a2a_cuts(r.costs, l, 0, true, r.costs.work.stages[0].recomputed_layers);
  CHECK(cuts_r.size() == 2 * 8);
  // The recompute's cuts are the forward's, less the edge work before the first layer (the embedding).
  const auto cuts_f = engine::a2a_cuts(r.costs, l, 0, true);
  const double lead = r.costs.work.edges_of(0)->layers_at_f;
  REQUIRE(cuts_f.size() == cuts_r.size());
  for (std::size_t k = 0; k < cuts_r.size(); ++k) {
    CHECK(cuts_r[k].at == doctest::Approx(cuts_f[k].at - lead).epsilon(1e-9));
    CHECK(cuts_r[k].seconds == cuts_f[k].seconds);
  }
  CHECK(count_a2a(r) == static_cast<std::size_t>(M) * (16 + 16 + 16));  // forward, input gradient, recompute
  // Each recompute's compute pieces add up to the recompute less its all-to-alls.
  double a2a_r = 0;
  for (const auto& c : cuts_r) a2a_r += c.seconds;
  std::map<int, double> recompute_work;  // per micro-batch, position 0
  for (std::uint32_t t = 0; t < r.job.graph.size(); ++t)
    if (r.job.info[t].pos == 0 && r.job.info[t].op == engine::OpKind::recompute) recompute_work[r.job.info[t].mb] += r.job.graph.work[t];
  REQUIRE(recompute_work.size() == static_cast<std::size_t>(M));
  for (const auto& [mb, w] : recompute_work)
    CHECK(w == doctest::Approx(r.costs.work.stages[0].recompute - a2a_r).epsilon(1e-9));
  // The trace: one recompute event per micro-batch, its all-to-alls inside it.
  const trace::Trace tr = engine::to_trace(r, sys);
  std::vector<const trace::OpEvent*> rec;
  for (const auto& e : tr.events)
    if (e.rank == 0 && e.op == "recompute") rec.push_back(&e);
  CHECK(rec.size() == static_cast<std::size_t>(M));
  int inside = 0;
  for (const auto& e : tr.events) {
    if (e.rank != 0 || e.op != "ep_alltoall") continue;
    inside += std::any_of(rec.begin(), rec.end(), [&](const trace::OpEvent* s) {
      return s->mb == e.mb && e.start_us >= s->start_us - 1e-6 && e.start_us + e.dur_us <= s->start_us + s->dur_us + 1e-6;
    });
  }
  CHECK(inside == M * 16);
  // Block method, 3 layers recomputed: 3 layers' all-to-alls per recompute.
  Layout block = l;
  block.recompute_method = RecomputeMethod::block;
  block.recompute_layers = 3;
  const engine::SimReport rb = engine::simulate(m, block, sys, {});
  CHECK(count_a2a(rb) == static_cast<std::size_t>(M) * (16 + 16 + 6));
  // Selective: none.
  Layout sel = l;
  sel.recompute = Recompute::selective;
  CHECK(count_a2a(engine::simulate(m, sel, sys, {})) == static_cast<std::size_t>(M) * (16 + 16));
}
