// Layout rules and System parsing.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "sim/layout.hpp"
#include "sim/system.hpp"

using namespace tessel;

namespace {
std::string infeasible(const Layout& l, const Model& m, int gpus) {
  try {
    check_layout(l, m, gpus);
  } catch (const InfeasibleLayout& e) {
    return e.what();
  }
  return "";
}

Layout base() {
  Layout l;
  l.tp = 8;
  l.pp = 8;
  l.dp = 16;
  l.vpp = 3;
  l.schedule = sched::Kind::interleaved;
  l.micro_batch = 1;
  l.global_batch = 1536;
  return l;
}
}  // namespace

TEST_CASE("layout rules name the rule and the values") {
  const Model m = load_model("gpt3-175b");
  CHECK(infeasible(base(), m, 1024).empty());
  Layout l = base();
  l.tp = 5;
  CHECK(infeasible(l, m, 5 * 8 * 16).find("tp 5 does not divide heads 96") != std::string::npos);
  l = base();
  CHECK(infeasible(l, m, 1000).find("is not the GPU count 1000") != std::string::npos);
  l = base();
  l.global_batch = 1000;
  CHECK(infeasible(l, m, 1024).find("global batch 1000 is not divisible by micro_batch*dp = 16") != std::string::npos);
  l = base();
  l.vpp = 5;  // 96 layers over 40 stages
  CHECK(infeasible(l, m, 1024).find("do not split evenly over pp*vpp = 40") != std::string::npos);
  l = base();
  l.vpp = 1;
  CHECK(infeasible(l, m, 1024).find("interleaved needs vpp > 1") != std::string::npos);
  l = base();
  l.global_batch = 16 * 12;  // m = 12, not a multiple of pp 8
  CHECK(infeasible(l, m, 1024).find("multiple of pp 8") != std::string::npos);
  l = base();
  l.schedule = sched::Kind::zbv;
  CHECK(infeasible(l, m, 1024).find("exactly 2 stages per rank") != std::string::npos);
  l.vpp = 2;
  CHECK(infeasible(l, m, 1024).empty());
  l.schedule = sched::Kind::dualpipev;
  l.global_batch = 16 * 8;  // m = 8 < 2p = 16
  CHECK(infeasible(l, m, 1024).find("dualpipev needs micro-batches m >= 2*pp = 16, got m = 8") != std::string::npos);
  l = base();
  l.stage_layers = {13, 12, 12, 12, 12, 12, 12, 12};
  l.vpp = 1;
  l.schedule = sched::Kind::one_f_one_b;
  CHECK(infeasible(l, m, 1024).find("stage_layers sum to 97") != std::string::npos);
  l.stage_layers = {11, 12, 13, 12, 12, 12, 12, 12};
  CHECK(infeasible(l, m, 1024).empty());
  CHECK(l.first_layer_of_stage(3, m.layers) == 36);
  l = base();
  l.sequence_parallel = true;
  l.tp = 1;
  l.dp = 128;
  CHECK(infeasible(l, m, 1024).find("sequence parallel needs tp > 1") != std::string::npos);
}

TEST_CASE("layout JSON is strict") {
  std::string err;
  try {
    parse_layout(parse_json_text(R"({"tp":2,"micro_batch":1,"global_batch":8,"pipeline":4})", "l.json"), "l.json");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err == "l.json: pipeline: unknown key");
  err.clear();
  try {
    parse_layout(parse_json_text(R"({"tp":0,"micro_batch":1,"global_batch":8})", "l.json"), "l.json");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err.find("tp: value 0 is out of range [1,") != std::string::npos);
  // Uniform blocks of several layers are not priced (the flags refuse them too).
  CHECK_THROWS_WITH_AS(parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"recompute":"full",
      "recompute_method":"uniform","recompute_layers":2})", "l.json"), "l.json"),
                       doctest::Contains("recompute_layers"), InputError);
  CHECK_NOTHROW(parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"recompute":"full",
      "recompute_method":"block","recompute_layers":2})", "l.json"), "l.json"));
  // An fp8 recipe reads back, and belongs to fp8 runs only.
  const Layout cs = parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"precision":"fp8","fp8_recipe":"current"})",
                                                 "l.json"), "l.json");
  CHECK(cs.fp8_recipe == Fp8Recipe::current);
  CHECK(layout_to_json(cs).at("fp8_recipe") == "current");
  CHECK(parse_layout(layout_to_json(cs), "roundtrip").fp8_recipe == Fp8Recipe::current);
  CHECK_FALSE(layout_to_json(Layout{}).contains("fp8_recipe"));
  CHECK_THROWS_WITH_AS(parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"fp8_recipe":"mxfp8"})", "l.json"), "l.json"),
                       "l.json: fp8_recipe: \"mxfp8\" is an fp8 recipe; precision is bf16, not fp8", InputError);
  CHECK_THROWS_WITH_AS(parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"precision":"fp8","fp8_recipe":"mx"})", "l.json"), "l.json"),
                       "l.json: fp8_recipe: value \"mx\" is not one of delayed, current, mxfp8", InputError);
  // How fp8 weights are cast reads back (written only when not Transformer Engine's cached cast), and belongs
  // to fp8 runs only.
  const Layout pm = parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"precision":"fp8","fp8_weight_cast":"per_microbatch"})",
                                                 "l.json"), "l.json");
  CHECK(pm.fp8_weight_cast == Fp8WeightCast::per_microbatch);
  CHECK(parse_layout(layout_to_json(pm), "roundtrip").fp8_weight_cast == Fp8WeightCast::per_microbatch);
  CHECK_FALSE(layout_to_json(cs).contains("fp8_weight_cast"));
  CHECK_THROWS_WITH_AS(parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"fp8_weight_cast":"cached"})", "l.json"), "l.json"),
                       "l.json: fp8_weight_cast: \"cached\" says how fp8 weights are cast; precision is bf16, not fp8", InputError);
  CHECK_THROWS_WITH_AS(parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"precision":"fp8","fp8_weight_cast":"each"})", "l.json"), "l.json"),
                       "l.json: fp8_weight_cast: value \"each\" is not one of cached, per_microbatch", InputError);
  // The unfused kernels read back as a list, absent when every kernel is fused; a word that is not a kernel
  // family, or a value that is not a list, is refused naming the key.
  const Layout uf = parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"unfused":["rope","norm"]})", "l.json"),
                                 "l.json");
  CHECK(uf.unfused == Unfused{true, false, true});
  CHECK(to_string(uf.unfused) == "norm,rope");
  CHECK(layout_to_json(uf).at("unfused") == Json::array({"norm", "rope"}));
  CHECK(parse_layout(layout_to_json(uf), "roundtrip").unfused == uf.unfused);
  CHECK_FALSE(layout_to_json(Layout{}).contains("unfused"));
  CHECK(parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"unfused":[]})", "l.json"), "l.json").unfused == Unfused{});
  CHECK_THROWS_WITH_AS(parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"unfused":["gelu"]})", "l.json"), "l.json"),
                       "l.json: unfused: value \"gelu\": \"gelu\" is not one of norm, act, rope (a comma-separated list of them, or none)",
                       InputError);
  CHECK_THROWS_WITH_AS(parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"unfused":"rope"})", "l.json"), "l.json"),
                       "l.json: unfused: must be an array of norm, act, rope (empty: every kernel fused)", InputError);
  // The flash kernel reads back, absent when it is the fused one, and belongs to flash attention only.
  const Layout fa2 = parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"flash_kernel":"fa2"})", "l.json"), "l.json");
  CHECK(fa2.flash_kernel == FlashKernel::fa2);
  CHECK(layout_to_json(fa2).at("flash_kernel") == "fa2");
  CHECK(parse_layout(layout_to_json(fa2), "roundtrip").flash_kernel == FlashKernel::fa2);
  CHECK_FALSE(layout_to_json(Layout{}).contains("flash_kernel"));
  CHECK_THROWS_WITH_AS(parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"flash_kernel":"fa3"})", "l.json"), "l.json"),
                       "l.json: flash_kernel: value \"fa3\" is not one of cudnn, fa2", InputError);
  CHECK_THROWS_WITH_AS(parse_layout(parse_json_text(R"({"micro_batch":1,"global_batch":8,"attention":"unfused","flash_kernel":"fa2"})",
                                                    "l.json"), "l.json"),
                       "l.json: flash_kernel: \"fa2\" is a flash attention kernel; attention is unfused", InputError);
  CHECK(parse_unfused("act", "--unfused") == Unfused{false, true, false});
  CHECK(parse_unfused("none", "--unfused") == Unfused{});
  CHECK_THROWS_WITH_AS(parse_unfused("norm,,rope", "--unfused"),
                       "--unfused: value \"norm,,rope\": \"\" is not one of norm, act, rope (a comma-separated list of them, or none)",
                       InputError);
  const Layout l = parse_layout(
      parse_json_text(R"({"tp":2,"pp":4,"micro_batch":1,"global_batch":8,"schedule":"zbv","vpp":2})", "l.json"), "l.json");
  CHECK(l.rank_of_stage(0) == 0);
  CHECK(l.rank_of_stage(7) == 0);  // V placement: stage 2p-1-r on rank r
  CHECK(l.rank_of_stage(4) == 3);
  const Layout back = parse_layout(layout_to_json(l), "roundtrip");
  CHECK(back.describe() == l.describe());
}

TEST_CASE("system presets load and bad system files are rejected") {
  for (const auto& n : system_preset_names()) {
    CAPTURE(n);
    const System s = load_system(n);
    CHECK(std::max(s.gpu.peak(Precision::bf16), s.gpu.peak(Precision::fp32)) > 0);  // cpu: fp32 only
    CHECK(s.node.intra_bw_Bps > 0);
    // Round trip through JSON keeps every number.
    const System back = parse_system(system_to_json(s), "roundtrip");
    CHECK(back.gpu.memory_bw_Bps == doctest::Approx(s.gpu.memory_bw_Bps));
    CHECK(back.net.nic_bw_Bps == doctest::Approx(s.net.nic_bw_Bps));
    CHECK(back.gpu.gemm_fp32_out == doctest::Approx(s.gpu.gemm_fp32_out));
    CHECK(back.gpu.arch == s.gpu.arch);
  }
  // A band's rows_of (a closed loop's held-out layouts) reads back; absent, the published rows.
  {
    System cal = load_system("cpu");
    cal.error_band = ErrorBand{"held-out", 3.5, 16, "a closed loop", "layouts run on this host"};
    const System back = parse_system(system_to_json(cal), "roundtrip");
    REQUIRE(back.error_band.has_value());
    CHECK(back.error_band->rows_of == "layouts run on this host");
    CHECK(back.error_band->rows == 16);
    CHECK(load_system("dgx-h100").error_band->rows_of.empty());
  }
  const System a100 = load_system("dgx-a100");
  CHECK(a100.gpu.peak(Precision::bf16) == doctest::Approx(312e12));
  Json j = system_to_json(a100);
  j["node"]["intra_GBps"] = -1;
  std::string err;
  try {
    parse_system(j, "s.json");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err.find("s.json: node.intra_GBps: value -1 is out of range") != std::string::npos);
  j = system_to_json(a100);
  j["gpu"]["efficiency"].erase("gemm");
  err.clear();
  try {
    parse_system(j, "s.json");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err == "s.json: gpu.efficiency.gemm: missing required key");
  // An fp32 output is never faster than a 16-bit one.
  j = system_to_json(a100);
  j["gpu"]["efficiency"]["gemm_fp32_out"] = 0.9;
  err.clear();
  try {
    parse_system(j, "s.json");
  } catch (const InputError& e) {
    err = e.what();
  }
  // An attention curve: ascending lengths, a rate for each, the reference head dim in both directions.
  const Json h100 = system_to_json(load_system("dgx-h100"));
  const auto curve_error = [&](const std::function<void(Json&)>& edit) {
    Json c = h100;
    edit(c["gpu"]["efficiency"]["attention_curve"]);
    try {
      parse_system(c, "s.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(curve_error([](Json& c) { c["seq"][1] = 256; }) ==
        "s.json: gpu.efficiency.attention_curve.seq: must be strictly ascending");
  CHECK(curve_error([](Json& c) { c["fwd_TFLOPs"]["64"].erase(0); }) ==
        "s.json: gpu.efficiency.attention_curve.fwd_TFLOPs.64: must hold one rate per entry of \"seq\" (6), not 5");
  CHECK(curve_error([](Json& c) { c["bwd_TFLOPs"].erase("128"); }) ==
        "s.json: gpu.efficiency.attention_curve.bwd_TFLOPs: must list the reference head dim (128)");
  CHECK(curve_error([](Json& c) { c["fwd_TFLOPs"]["wide"] = c["fwd_TFLOPs"]["64"]; }) ==
        "s.json: gpu.efficiency.attention_curve.fwd_TFLOPs.wide: the key must be a head dim, an integer from 1 to 4096");
  CHECK(curve_error([](Json& c) { c["fwd_TFLOPs"]["64"][2] = 0; }).find(
            "s.json: gpu.efficiency.attention_curve.fwd_TFLOPs.64") == 0);
  CHECK(curve_error([](Json& c) { c["seq"][0] = 256; }) == "accepted");
  // The shape the rates were measured at, for the kernel's occupancy: optional, whole when given.
  CHECK(curve_error([](Json& c) { c["measured_at"]["tokens"] = 0; }) ==
        "s.json: gpu.efficiency.attention_curve.measured_at.tokens: value 0 is out of range [1, 1e+09]");
  CHECK(curve_error([](Json& c) { c["measured_at"].erase("bwd_causal"); }) ==
        "s.json: gpu.efficiency.attention_curve.measured_at.bwd_causal: missing required key");
  CHECK(curve_error([](Json& c) { c["measured_at"]["batch"] = 1; }).find(
            "s.json: gpu.efficiency.attention_curve.measured_at.batch: unknown key") == 0);
  CHECK(curve_error([](Json& c) { c.erase("measured_at"); }) == "accepted");
  // The presets name the one built-in curve; written out (system_to_json) it parses to the same numbers.
  CHECK(curve_error([](Json& c) { c = "cudnn-h100"; }) == "accepted");
  CHECK(curve_error([](Json& c) { c = "cudnn-h10"; }) ==
        "s.json: gpu.efficiency.attention_curve: \"cudnn-h10\" names no built-in curve (known: cudnn-h100); did you "
        "mean 'cudnn-h100'?");
  CHECK(curve_error([](Json& c) { c = 7; }).find("s.json: gpu.efficiency.attention_curve") == 0);
  const AttentionCurve& named = load_system("dgx-h100").gpu.attention_curve;
  const AttentionCurve inlined = parse_system(h100, "s.json").gpu.attention_curve;
  CHECK(h100["gpu"]["efficiency"]["attention_curve"].is_object());
  CHECK(named.seq == inlined.seq);
  CHECK(named.head_dim == inlined.head_dim);
  CHECK(named.rate == inlined.rate);
  CHECK(named.rate[0][1][2] == doctest::Approx(484e12));  // forward, head dim 128, 2k keys
  CHECK(named.tokens == inlined.tokens);
  CHECK(named.hidden == inlined.hidden);
  CHECK(named.causal == inlined.causal);
  CHECK(named.tokens == 16384);  // the FlashAttention-3 paper's benchmark: 16k tokens, hidden 2048
  CHECK(named.hidden == 2048);
  CHECK(named.causal == std::array<bool, 2>{true, false});  // causal forward, the backward plotted without a mask
  for (const std::string p : {"dgx-h200", "h200", "h800", "meta-h100"})
    CHECK(load_system(p).gpu.attention_curve.rate == named.rate);
}

// Blackwell: the published rows name "NVIDIA B200 (DGX-B200)" and "NVIDIA GB200 (DGX-GB200)"; GB200's name holds
// "B200", so the mapping must test it first. An NVL72 rack is one NVLink domain: 72 GPUs a node.
TEST_CASE("Blackwell presets: datasheet peaks, the NVL72 domain, and the GPU names of published rows") {
  CHECK(system_preset_for_gpu("NVIDIA B200 (DGX-B200)") == "dgx-b200");
  CHECK(system_preset_for_gpu("NVIDIA GB200 (DGX-GB200)") == "gb200");
  const System b200 = load_system("dgx-b200"), gb200 = load_system("gb200");
  CHECK(b200.gpu.peak(Precision::bf16) == doctest::Approx(2250e12));  // HGX B200 at 1,000 W, dense
  CHECK(gb200.gpu.peak(Precision::bf16) == doctest::Approx(2500e12)); // GB200 at 1,200 W, dense
  CHECK(gb200.gpu.peak(Precision::fp8) == doctest::Approx(2 * gb200.gpu.peak(Precision::bf16)));
  CHECK(b200.node.gpus_per_node == 8);
  CHECK(gb200.node.gpus_per_node == 72);
  // NVLink 5: 1.8 TB/s bidirectional per GPU, 900 GB/s each way, twice NVLink 4's 450.
  CHECK(gb200.node.intra_bw_Bps == doctest::Approx(2 * load_system("dgx-h100").node.intra_bw_Bps));
}

// The schedule generators' own rules are layout rules (sim/schedule/rules.hpp): a layout that passes
// check_layout is one simulate can build a schedule for. Before, tp2 pp14 dp8 zb1p with m = 1536/8 = 192
// passed (estimate priced it) and the zb1p generator refused it (rounds max(1, 192 // 14) = 13, 192 mod 13 = 10).
TEST_CASE("layout rules include the schedule generator's micro-batch rule, and vpp before the layer split") {
  const Model m = load_model("gpt3-175b");
  Layout l;
  l.tp = 2;
  l.pp = 14;  // gpt3-175b has 96 layers: 14 stages do not split them, so give an uneven split of 96
  l.dp = 8;
  l.schedule = sched::Kind::zb1p;
  l.micro_batch = 1;
  l.global_batch = 1536;
  l.stage_layers = {6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 6};
  const auto p = layout_problem(l, m, 224);
  REQUIRE(p);
  CHECK(p->rule == "schedule-microbatches");
  CHECK(p->message.find("max(1, m // pp) = 13, got m = 192 with pp 14") != std::string::npos);
  CHECK(p->message.find("global batch 1536 / (micro_batch 1 * dp 8)") != std::string::npos);
  l.global_batch = 8 * 196;  // m = 196 = 14 rounds of 14
  CHECK_FALSE(layout_problem(l, m, 224));
  l.schedule = sched::Kind::one_f_one_b;  // 1F1B takes any m
  l.global_batch = 1536;
  CHECK_FALSE(layout_problem(l, m, 224));
  // zbv with vpp 3 on 2 ranks: 6 stages do not split 96 layers either, but vpp is what to change (zbv's rule).
  Layout z;
  z.tp = 8;
  z.pp = 2;
  z.dp = 64;
  z.vpp = 3;
  z.schedule = sched::Kind::zbv;
  z.global_batch = 1536;
  const auto zp = layout_problem(z, m, 1024);
  REQUIRE(zp);
  CHECK(zp->rule == "schedule-vpp");
  CHECK(zp->message.find("zbv needs exactly 2 stages per rank") != std::string::npos);
}

TEST_CASE("layout_problems lists every broken rule once, the first being layout_problem's") {
  const Model m = load_model("llama3-70b");  // 80 layers, 64 heads
  Layout l;
  l.tp = 8;
  l.pp = 3;  // 80 layers over 3 stages: layer-split
  l.dp = 4;
  l.global_batch = 510;  // not divisible by mbs 1 * dp 4: batch-divisibility
  l.schedule = sched::Kind::one_f_one_b;
  const auto all = layout_problems(l, m, 96);
  REQUIRE(all.size() == 2);
  CHECK(all[0].rule == "batch-divisibility");
  CHECK(all[1].rule == "layer-split");
  CHECK(layout_problem(l, m, 96)->rule == "batch-divisibility");
  l.global_batch = 512;
  REQUIRE(layout_problems(l, m, 96).size() == 1);
  CHECK(layout_problems(l, m, 96)[0].rule == "layer-split");
  l.pp = 4;
  l.dp = 3;  // 80 layers over 4 stages split; 512 not divisible by 3
  const auto one = layout_problems(l, m, 96);
  REQUIRE(one.size() == 1);
  CHECK(one[0].rule == "batch-divisibility");
  l.global_batch = 513;  // divisible by 3: m = 171, 1F1B takes it
  CHECK(layout_problems(l, m, 96).empty());
}
