// `tessel estimate` and `tessel validate` from the command line: output, JSON, and bad input (exit 2 with a
// one-line message naming the flag or file, the value and the rule; never a crash or a NaN).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "tests/test_paths.hpp"
#include "tests/tools/run_util.hpp"

using tessel::test::run_tessel;
using tessel::test::write_temp;

TEST_CASE("estimate: default run prints the table; --json is one JSON document") {
  auto r = run_tessel({"estimate"});
  REQUIRE(r.code == 0);
  CHECK(r.out.find("step time") != std::string::npos);
  CHECK(r.out.find("peak") != std::string::npos);
  CHECK(r.out.find(" nan") == std::string::npos);
  CHECK(r.out.find(" inf") == std::string::npos);
  auto j = run_tessel({"estimate", "--json"});
  REQUIRE(j.code == 0);
  const auto doc = nlohmann::json::parse(j.out);
  CHECK(doc["gpus"] == 1024);
  CHECK(doc["step_s"].get<double>() > 0);
  CHECK(doc["memory_per_pipeline_rank"].size() == 8);
}

// Every step time says how sure it is: the system's error band (the mean step error validate measures on its
// hardware class), or that nothing validated covers the hardware.
TEST_CASE("estimate: the step time carries its system's error band") {
  auto a = run_tessel({"estimate", "--json"});
  REQUIRE(a.code == 0);
  const auto j = nlohmann::json::parse(a.out);
  REQUIRE(j["error_band"].is_object());
  CHECK(j["error_band"]["class"] == "A100");
  const double step = j["step_s"].get<double>(), pct = j["error_band"]["step_pct"].get<double>();
  CHECK(pct > 0);
  CHECK(j["error_band"]["step_high_s"].get<double>() == doctest::Approx(step * (1 + pct / 100)));
  CHECK(j["error_band"]["step_low_s"].get<double>() == doctest::Approx(step / (1 + pct / 100)));
  auto text = run_tessel({"estimate"});
  CHECK(text.out.find("% (mean step error of ") != std::string::npos);
  auto b = run_tessel({"estimate", "--json", "--system", "gb200", "--model", "llama3-8b", "--tp", "1", "--pp", "1",
                       "--dp", "8", "--gbs", "64", "--schedule", "1f1b"});
  REQUIRE(b.code == 0);
  CHECK(nlohmann::json::parse(b.out)["error_band"].is_null());
  auto bt = run_tessel({"estimate", "--system", "gb200", "--model", "llama3-8b", "--tp", "1", "--pp", "1", "--dp", "8",
                        "--gbs", "64", "--schedule", "1f1b"});
  CHECK(bt.out.find("accuracy unknown (no validated rows on this hardware)") != std::string::npos);
}

// A mixture-of-experts model's step carries the band of the MoE rows of its hardware class (published-moe.json),
// not the dense rows' (published.json); where no MoE rows were validated, none, whatever the dense band.
TEST_CASE("estimate and explore: a MoE model's step carries the MoE band of its hardware class") {
  const std::vector<std::string> moe = {"--model", "mixtral-8x7b", "--tp", "1", "--pp", "1", "--ep", "8", "--dp", "8",
                                        "--gbs", "64", "--seq", "4096", "--schedule", "1f1b"};
  const auto with = [&](std::vector<std::string> head) {
    head.insert(head.end(), moe.begin(), moe.end());
    return head;
  };
  for (const std::string sys : {"dgx-h100", "gb200"}) {
    CAPTURE(sys);
    auto j = run_tessel(with({"estimate", "--json", "--system", sys}));
    REQUIRE(j.code == 0);
    const auto doc = nlohmann::json::parse(j.out);
    REQUIRE(doc["error_band"].is_object());
    CHECK(doc["error_band"]["class"] == (sys == "gb200" ? "Blackwell" : "Hopper"));
    CHECK(doc["error_band"]["rows_of"] == "MoE rows of published-moe.json");
    auto t = run_tessel(with({"estimate", "--system", sys}));
    CHECK(t.out.find(sys == "gb200" ? "(mean step error of 7 Blackwell MoE rows of published-moe.json)"
                                    : "(mean step error of 11 Hopper MoE rows of published-moe.json)") != std::string::npos);
  }
  // The dense band of the A100 class does not stand for a MoE model.
  auto a = run_tessel(with({"estimate", "--json", "--system", "dgx-a100"}));
  REQUIRE(a.code == 0);
  CHECK(nlohmann::json::parse(a.out)["error_band"].is_null());
  auto at = run_tessel(with({"estimate", "--system", "dgx-a100"}));
  CHECK(at.out.find("accuracy unknown (no validated mixture-of-experts rows on this hardware)") != std::string::npos);
  // explore: the header and every JSON row.
  auto e = run_tessel({"explore", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--gpus", "64", "--gbs", "256",
                       "--seq", "4096", "--top", "2"});
  REQUIRE(e.code == 0);
  CHECK(e.out.find("step times +-") != std::string::npos);
  CHECK(e.out.find("Hopper MoE rows of published-moe.json") != std::string::npos);
  auto ej = run_tessel({"explore", "--json", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--gpus", "64", "--gbs",
                        "256", "--seq", "4096", "--top", "2"});
  REQUIRE(ej.code == 0);
  const auto doc = nlohmann::json::parse(ej.out);
  REQUIRE(doc["top"].size() == 2);
  CHECK(doc["error_band"]["rows_of"] == "MoE rows of published-moe.json");
  for (const auto& row : doc["top"])
    CHECK(row["step_error_band_pct"].get<double>() == doctest::Approx(doc["error_band"]["step_pct"].get<double>()));
}

TEST_CASE("estimate: bad input exits 2 with the rule") {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const std::string bad_json = write_temp("bad_model.json", "{\"name\": \"x\",\n \"layers\": }\n");
  const std::string layout = write_temp("layout.json", R"({"tp":8,"micro_batch":1,"global_batch":8})");
  const Case cases[] = {
      {{"estimate", "--tp", "5", "--dp", "16"}, "tp 5 does not divide heads 96"},
      {{"estimate", "--tp", "abc"}, "--tp: 'abc' is not an integer"},
      {{"estimate", "--gpus", "1e30"}, "--gpus: '1e30' is not an integer"},
      {{"estimate", "--gpus", "1000000000"}, "--gpus: 1000000000 is out of range"},
      {{"estimate", "--mbs", "0"}, "--mbs: 0 is out of range"},
      {{"estimate", "--model", "gpt5"}, "no such preset"},
      {{"estimate", "--model", bad_json}, bad_json + ":2:"},
      {{"estimate", "--system", "tpu-v9"}, "--system tpu-v9: no such preset"},
      {{"estimate", "--schedule", "zigzag"}, "--schedule zigzag: unknown schedule"},
      {{"estimate", "--layout", "tp8 pp2 dp1 warp9"}, "--layout: word 'warp9' is not a layout term"},
      {{"estimate", "--frobnicate"}, "unknown flag --frobnicate"},
      {{"estimate", "--moments", "fp16"}, "--moments: value \"fp16\" is not one of fp32, bf16"},
      {{"estimate", "--master-weights", "half"}, "--master-weights: value \"half\" is not one of fp32, remainder, none"},
      {{"estimate", "--precision", "fp32", "--main-grads", "bf16"}, "with precision fp32: fp32 training keeps"},
      {{"run", "--backend", "cpu", "--model", "tiny", "--layout", "tp1 pp1 dp1 moments=bf16", "--steps", "1"},
       "the runtime keeps fp32 gradients, moments and master weights"},
      {{"estimate", "--gpus", "1000"}, "--gpus 1000 is not divisible by tp*pp*cp = 64"},
      {{"estimate", "--schedule", "zbv", "--vpp", "3"}, "zbv needs exactly 2 stages per rank"},
      {{"estimate", "--precision", "fp8"}, "precision fp8 is not supported by A100"},
      {{"estimate", "--system", "dgx-h100", "--precision", "fp8", "--fp8-recipe", "tensorwise"},
       "--fp8-recipe: value \"tensorwise\" is not one of delayed, current, mxfp8"},
      {{"estimate", "--system", "dgx-h100", "--fp8-recipe", "current"}, "but the precision is bf16; add --precision fp8"},
      {{"estimate", "--system", "dgx-h100", "--precision", "fp8", "--fp8-recipe", "mxfp8"},
       "fp8 recipe mxfp8 runs on Blackwell's block-scaled tensor cores only; H100-SXM5-80GB is not one"},
      {{"explore", "--system", "dgx-h100", "--precision", "fp8", "--fp8-recipe", "mxfp8"},
       "--fp8-recipe mxfp8: Blackwell's block-scaled tensor cores only"},
      {{"estimate", "--unfused", "norm,softmax"},
       "--unfused: value \"norm,softmax\": \"softmax\" is not one of norm, act, rope (a comma-separated list of them, or none)"},
      {{"estimate", "--flash-kernel", "fa3"}, "--flash-kernel: value \"fa3\" is not one of cudnn, fa2"},
      {{"estimate", "--attention", "unfused", "--flash-kernel", "fa2"},
       "--flash-kernel fa2: a flash attention kernel, but the attention is unfused"},
      {{"explore", "--attention", "unfused", "--flash-kernel", "fa2"},
       "--flash-kernel fa2: a flash attention kernel, but the attention is unfused"},
      {{"explore", "--unfused", "gelu"}, "--unfused: value \"gelu\": \"gelu\" is not one of norm, act, rope"},
      // Megatron's rules for the full-recompute details; uniform blocks of several layers are not priced.
      {{"estimate", "--recompute", "selective", "--recompute-method", "block"}, "--recompute-method: applies to --recompute full only"},
      {{"estimate", "--recompute", "full", "--recompute-method", "block", "--recompute-layers", "0"}, "--recompute-layers: 0 is out of range [1,"},
      {{"estimate", "--recompute", "full", "--recompute-layers", "6"}, "with --recompute-method uniform: the cost model prices"},
      {{"run", "--backend", "cpu", "--model", "tiny", "--recompute", "none", "--recompute-layers", "2"}, "--recompute-layers: applies to --recompute full only"},
      {{"run", "--backend", "cpu", "--model", "tiny", "--pp", "2", "--schedule", "1f1b", "--gbs", "1073741824"}, "stage-micro-batches: over the limit"},
      {{"simulate", "--model", "llama2-7b", "--tp", "1", "--pp", "1", "--dp", "1", "--gpus", "1", "--gbs", "1073741824", "--seq", "16"},
       "over the limit"},
      // GPT-3 175B at fp32 on the CPU runtime: ~6 TiB (16 bytes per parameter plus activations), beyond any
      // machine running this suite; refused up front, not by bad_alloc after allocating.
      {{"run", "--backend", "cpu", "--model", "gpt3-175b", "--tp", "8", "--pp", "8", "--steps", "1"},
       "GiB available; use a smaller model"},
  };
  for (const auto& c : cases) {
    auto r = run_tessel(c.args);
    CAPTURE(c.args.back());
    CAPTURE(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find(c.expect) != std::string::npos);
    CHECK(r.err.find('\n') == r.err.size() - 1);  // one line
  }
}

TEST_CASE("validate: rows file errors and a small file end to end") {
  const std::string not_array = write_temp("rows.json", "{}");
  auto r = run_tessel({"validate", not_array});
  CHECK(r.code == 2);
  CHECK(r.err.find("expected a JSON array of rows") != std::string::npos);
  auto missing = run_tessel({"validate", "/nonexistent/rows.json"});
  CHECK(missing.code == 2);
  CHECK(missing.err.find("/nonexistent/rows.json: cannot open file") != std::string::npos);
  const std::string rows = write_temp("rows2.json", R"([{"id":"r1","model":{"layers":48,"hidden":6144,"heads":64,
    "vocab":51200,"seq_len":2048},"hardware":{"gpu":"NVIDIA A100 80GB","gpu_count":8},
    "layout":{"tp":8,"pp":1,"dp":1,"micro_batch":4,"global_batch":4,"schedule":"none","recompute":"full",
    "sequence_parallel":false,"zero_stage":0,"precision":"fp16_or_bf16"},"measured":{"iteration_time_s":1.42}}])");
  auto ok = run_tessel({"validate", rows, "--json"});
  REQUIRE(ok.code == 0);
  const auto doc = nlohmann::json::parse(ok.out);
  REQUIRE(doc["rows"].size() == 1);
  CHECK(doc["rows"][0]["metric"] == "iteration_time_s");
  CHECK(doc["mape_pct"].contains("iteration_time_s"));
}

// zb-greedy is a generator the cost model has no closed form for: the run's memory check bounds it by
// GPipe's memory instead of failing an internal check (exit 1, before).
TEST_CASE("run: a generated schedule without a closed form runs") {
  auto r = run_tessel({"run", "--backend", "cpu", "--model", "tiny", "--pp", "2", "--schedule", "zb-greedy", "--gbs", "8",
                       "--steps", "1"});
  CAPTURE(r.err);
  CHECK(r.code == 0);
  CHECK(r.out.find("step    1  loss") != std::string::npos);
}

// --steps counts from step 0 (Megatron's --train-iters): resuming a checkpoint at step 2 with --steps 2
// would train nothing, and says so; --steps 3 trains the one step left.
TEST_CASE("run: --resume at or past --steps is refused, naming both") {
  const std::string dir = write_temp("ck_resume_dir", "").append(".d");
  auto save = run_tessel({"run", "--backend", "cpu", "--model", "tiny", "--steps", "2", "--save-every", "2",
                          "--checkpoint-dir", dir});
  REQUIRE(save.code == 0);
  auto none = run_tessel({"run", "--backend", "cpu", "--model", "tiny", "--steps", "2", "--resume", dir});
  CAPTURE(none.err);
  CHECK(none.code == 2);
  CHECK(none.err.find("--steps 2: the checkpoint " + dir + " is at step 2 already") != std::string::npos);
  auto one = run_tessel({"run", "--backend", "cpu", "--model", "tiny", "--steps", "3", "--resume", dir});
  CHECK(one.code == 0);
  CHECK(one.out.find("step    3  loss") != std::string::npos);
  CHECK(one.out.find("step    2  loss") == std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("numbers beyond int64 or double are out of range, with the range; garbage is not a number") {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  // strtoll / strtod report ERANGE for these; they read as "is not an integer" / "not a finite number".
  const std::vector<Case> cases = {
      {{"run", "--seed", "18446744073709551615"}, "--seed: 18446744073709551615 is out of range [0, 9223372036854775807]"},
      {{"estimate", "--tp", "-99999999999999999999"}, "--tp: -99999999999999999999 is out of range [1, 1048576]"},
      {{"estimate", "--tp", "0"}, "--tp: 0 is out of range [1, 1048576]"},
      {{"run", "--lr", "1e-400"},
       "--lr: 1e-400 underflows (its magnitude is below 2.2e-308, the smallest normal double); the range is [0, 10]"},
      {{"run", "--lr", "1e400"}, "--lr: 1e400 overflows a double (over 1.8e308); the range is [0, 10]"},
      {{"run", "--lr", "fast"}, "--lr: 'fast' is not a finite number"},
      {{"run", "--lr", "nan"}, "--lr: 'nan' is not a finite number"},
      {{"estimate", "--tp", "8x"}, "--tp: '8x' is not an integer"},
  };
  for (const auto& c : cases) {
    const auto r = run_tessel(c.args);
    INFO(c.expect);
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find(c.expect) != std::string::npos);
  }
}

// zb1p's rounds rule is a layout rule (sim/schedule/rules.hpp): estimate priced tp2 pp14 dp8 zb1p with
// m = 1536 / 8 = 192 (70.54 s) while simulate refused it; both refuse it now, naming the rule.
TEST_CASE("estimate and simulate refuse a layout the schedule generator refuses, naming the rule") {
  const std::string layout = write_temp("zb1p_224.json", R"({"tp":2,"pp":14,"dp":8,"micro_batch":1,"global_batch":1536,
    "schedule":"zb1p","recompute":"selective","sequence_parallel":true,"stage_layers":[6,7,7,7,7,7,7,7,7,7,7,7,7,6]})");
  for (const char* verb : {"estimate", "simulate"}) {
    auto r = run_tessel({verb, "--gpus", "224", "--layout", layout});
    CAPTURE(verb);
    CAPTURE(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find("zb1p needs micro-batches m divisible by its number of rounds max(1, m // pp) = 13, got m = 192 "
                     "with pp 14") != std::string::npos);
  }
  // zbv's vpp rule, not the layer split it would cause (4 layers... tiny's 8 over 2*3 stages).
  auto run = run_tessel({"run", "--backend", "cpu", "--model", "tiny", "--tp", "1", "--pp", "2", "--gbs", "4",
                         "--schedule", "zbv", "--vpp", "3", "--steps", "1"});
  CAPTURE(run.err);
  CHECK(run.code == 2);
  CHECK(run.err.find("zbv needs exactly 2 stages per rank") != std::string::npos);
  // dualpipev's minimum reads as a requirement with what was got.
  auto dual = run_tessel({"estimate", "--model", "tiny", "--system", "cpu", "--tp", "1", "--pp", "2", "--dp", "1",
                          "--gbs", "2", "--schedule", "dualpipev"});
  CHECK(dual.code == 2);
  CHECK(dual.err.find("dualpipev needs micro-batches m >= 2*pp = 4, got m = 2") != std::string::npos);
}

// The default --gpus (1024) above the cpu preset's 64-GPU limit gave dp 1024 and a message blaming a
// micro_batch*dp nobody gave; the default is capped at the system's max_gpus and the message says where dp came from.
TEST_CASE("simulate: the default GPU count stays within the system; a derived dp is explained") {
  auto r = run_tessel({"simulate", "--model", "tiny", "--system", "cpu", "--tp", "1", "--pp", "1", "--gbs", "1"});
  CAPTURE(r.err);
  CHECK(r.code == 2);
  CHECK(r.err.find("--gbs 1 is not divisible by micro_batch*dp = 1*64, where dp 64 = the default --gpus 64 "
                   "(cpu's max_gpus) / (tp*pp*cp = 1)") != std::string::npos);
  auto ok = run_tessel({"simulate", "--model", "tiny", "--system", "cpu", "--tp", "1", "--pp", "1", "--gbs", "64", "--precision", "fp32"});
  CAPTURE(ok.err);
  CHECK(ok.code == 0);
}

// --layout takes a file or explore's words, and the layout flags override its fields (a flag that was
// refused next to --layout): the file's tp 8 becomes tp 2, so the layout needs tp*pp*dp*cp = 2*1*1*1 GPUs.
TEST_CASE("estimate --layout: the flags override the layout's fields") {
  const std::string layout = write_temp("layout_override.json", R"({"tp":8,"micro_batch":1,"global_batch":8})");
  auto r = run_tessel({"estimate", "--layout", layout, "--tp", "2"});
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("on 2 x A100") != std::string::npos);
  CHECK(r.out.find("layout: tp2 pp1 dp1 mbs1, global batch 8") != std::string::npos);
  // Words, with --gbs: 16 / (mbs 1 * dp 2) = 8 micro-batches per pipeline.
  auto w = run_tessel({"estimate", "--layout", "tp8 pp4 dp2 vpp2 mbs1 interleaved", "--gbs", "16"});
  CAPTURE(w.err);
  REQUIRE(w.code == 0);
  CHECK(w.out.find("layout: tp8 pp4 dp2 vpp2 mbs1 interleaved, global batch 16, 8 micro-batches per pipeline") != std::string::npos);
  CHECK(w.out.find("precision: fp8") == std::string::npos);  // bf16: no fp8 recipe to state
  auto f8 = run_tessel({"estimate", "--system", "dgx-h100", "--model", "llama2-7b", "--tp", "2", "--pp", "1", "--gpus", "16",
                        "--gbs", "64", "--precision", "fp8", "--fp8-recipe", "current"});
  REQUIRE(f8.code == 0);
  CHECK(f8.out.find("precision: fp8, current scaling") != std::string::npos);
  auto s8 = run_tessel({"simulate", "--system", "dgx-h100", "--model", "llama2-7b", "--tp", "2", "--pp", "1", "--gpus", "16",
                        "--gbs", "64", "--precision", "fp8", "--fp8-recipe", "current"});
  REQUIRE(s8.code == 0);
  CHECK(s8.out.find("fp8 with current scaling") != std::string::npos);
  // Unfused kernels: stated, and slower; torchtitan's eager model code runs them so unless --unfused none.
  const std::vector<std::string> l7 = {"estimate", "--system", "dgx-h100", "--model", "llama2-7b", "--tp", "2", "--pp", "1",
                                       "--gpus", "16", "--gbs", "64", "--json"};
  const auto step_of = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = l7;
    a.insert(a.end(), extra.begin(), extra.end());
    auto r = run_tessel(a);
    CAPTURE(r.err);
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    return std::pair{j.at("step_s").get<double>(), j.at("layout").value("unfused", nlohmann::json::array())};
  };
  const auto [fused, fused_list] = step_of({});
  const auto [eager, eager_list] = step_of({"--unfused", "norm,act,rope"});
  CHECK(eager > fused);
  CHECK(fused_list.empty());
  CHECK(eager_list == nlohmann::json::array({"norm", "act", "rope"}));
  const auto tt = step_of({"--stack", "torchtitan-2025", "--recompute", "none", "--zero", "0"});
  const auto tt_compiled = step_of({"--stack", "torchtitan-2025", "--recompute", "none", "--zero", "0", "--unfused", "none"});
  CHECK(tt.second == nlohmann::json::array({"norm", "act", "rope"}));
  CHECK(tt_compiled.second.empty());
  CHECK(tt.first > tt_compiled.first);
  auto said = run_tessel({"estimate", "--system", "dgx-h100", "--model", "llama2-7b", "--tp", "2", "--pp", "1", "--gpus", "16",
                          "--gbs", "64", "--unfused", "rope"});
  REQUIRE(said.code == 0);
  CHECK(said.out.find("unfused kernels: rope, one op a kernel as PyTorch eager runs them") != std::string::npos);
  // The attention kernel's shape where the GPU's rate depends on it: llama2-7b's 4096 keys a call, head dim 128,
  // on the H100's curve (529 / 539 forward at 8k, 518 / 539 at 4k; backward 499 / 516); a CP rank's chunk of
  // it under --cp 2; nothing on the A100, which has no curve, while the tiles fill its SMs (16 heads x 33 / 216).
  CHECK(said.out.find("attention kernel: 4096 keys a call, head dim 128: 0.96 / 0.97 (forward / backward)") != std::string::npos);
  said = run_tessel({"estimate", "--system", "dgx-h100", "--model", "llama2-7b", "--tp", "2", "--pp", "1", "--cp", "2",
                     "--gpus", "16", "--gbs", "64"});
  REQUIRE(said.code == 0);
  // Under CP a rank's ring steps are unmasked tiles of equal cost: 16 heads x 16 blocks = 256 in two waves of
  // 132 (0.97 busy); the curve's backward was measured unmasked at the same share, its forward causal and full.
  CHECK(said.out.find("attention kernel: 2048 keys a call, head dim 128, 256 tiles of 128 queries on 132 SMs: 0.87 / 0.90 "
                      "(forward / backward) of the GPU's long-sequence attention rate (key length and head dim 0.90 / "
                      "0.90, efficiency.attention_curve; SMs kept busy 0.97 / 1.00, docs/simulator.md)") != std::string::npos);
  said = run_tessel({"estimate", "--system", "dgx-h100", "--model", "llama2-7b", "--tp", "2", "--pp", "1", "--cp", "2",
                     "--gpus", "16", "--gbs", "64", "--json"});
  REQUIRE(said.code == 0);
  const auto ak = nlohmann::json::parse(said.out)["attention_kernel"];
  CHECK(ak["keys"] == 2048);
  CHECK(ak["head_dim"] == 128);
  CHECK(ak["rate_share_fwd"].get<double>() == doctest::Approx(484.0 / 539 * 256 / 264));
  CHECK(ak["rate_share_bwd"].get<double>() == doctest::Approx(465.0 / 516));
  said = run_tessel({"estimate", "--system", "dgx-a100", "--model", "llama2-7b", "--tp", "2", "--pp", "1", "--gpus", "16",
                     "--gbs", "64"});
  REQUIRE(said.code == 0);
  CHECK(said.out.find("attention kernel:") == std::string::npos);
  said = run_tessel({"estimate", "--system", "dgx-a100", "--model", "llama2-7b", "--tp", "2", "--pp", "1", "--gpus", "16",
                     "--gbs", "64", "--json"});
  REQUIRE(said.code == 0);
  CHECK(nlohmann::json::parse(said.out)["attention_kernel"].is_null());
  // Tiles too few for the SMs: Llama 3 8B at tp 8 holds 4 of its 32 heads a rank, one 2,048-token sequence a
  // micro-batch, 64 tiles of 128 queries for 132 SMs; the causal triangle's longest row (16 blocks) sets the
  // time, 4 x 17 / 264 of the SMs kept busy forward, that over the measured shape's 0.97 backward.
  said = run_tessel({"estimate", "--system", "dgx-h100", "--model", "llama3-8b", "--tp", "8", "--pp", "1", "--gpus", "8",
                     "--gbs", "8", "--seq", "2048"});
  REQUIRE(said.code == 0);
  CHECK(said.out.find("attention kernel: 2048 keys a call, head dim 128, 64 tiles of 128 queries on 132 SMs: 0.23 / 0.24 "
                      "(forward / backward) of the GPU's long-sequence attention rate (key length and head dim 0.90 / "
                      "0.90, efficiency.attention_curve; SMs kept busy 0.26 / 0.27, docs/simulator.md)") != std::string::npos);
  said = run_tessel({"estimate", "--system", "dgx-h100", "--model", "llama3-8b", "--tp", "8", "--pp", "1", "--gpus", "8",
                     "--gbs", "8", "--seq", "2048", "--json"});
  REQUIRE(said.code == 0);
  const auto tiles = nlohmann::json::parse(said.out)["attention_kernel"];
  CHECK(tiles["tiles"] == 64);
  CHECK(tiles["sms"] == 132);
  CHECK(tiles["causal"] == true);
  CHECK(tiles["wave_share_fwd"].get<double>() == doctest::Approx(68.0 / 264));
  CHECK(tiles["wave_share_bwd"].get<double>() == doctest::Approx(68.0 / 256));
  CHECK(tiles["rate_share_fwd"].get<double>() == doctest::Approx(484.0 / 539 * 68 / 264));
  // The A100 has no curve; the same layout there is priced at the tiles' share of its one rate (108 SMs).
  said = run_tessel({"estimate", "--system", "dgx-a100", "--model", "llama3-8b", "--tp", "8", "--pp", "1", "--gpus", "8",
                     "--gbs", "8", "--seq", "2048", "--json"});
  REQUIRE(said.code == 0);
  const auto a100 = nlohmann::json::parse(said.out)["attention_kernel"];
  CHECK(a100["curve_share_fwd"] == 1.0);
  CHECK(a100["rate_share_fwd"].get<double>() == doctest::Approx(68.0 / 216));
}

// A schedule file decides the schedule's stages per rank unless --schedule / --vpp say otherwise (a --vpp
// given keeps its value; the file still names the schedule): the default
// layout's interleaved with 3 chunks per rank made a 1F1B file fail on "8 layers over 12 stages".
TEST_CASE("simulate --schedule-file: the file's shape, not the default schedule's vpp") {
  const auto dir = std::filesystem::temp_directory_path() / ("sched_file_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string csv = (dir / "s1f1b.csv").string();
  REQUIRE(run_tessel({"schedule", "gen", "1f1b", "--pp", "4", "--mb", "8", "-o", csv}).code == 0);
  const std::vector<std::string> sim = {"simulate", "--model", "tiny", "--system", "cpu", "--precision", "fp32", "--tp", "1", "--pp", "4",
                                        "--dp", "1", "--gbs", "8", "--schedule-file", csv};
  auto r = run_tessel(sim);
  CAPTURE(r.err);
  CHECK(r.code == 0);
  CHECK(r.out.find("tp1 pp4 dp1 mbs1 1f1b") != std::string::npos);
  std::filesystem::remove(dir / "s1f1b.meta.json");  // no sidecar: the shape is inferred from the file
  auto bare = run_tessel(sim);
  CAPTURE(bare.err);
  CHECK(bare.code == 0);
  std::vector<std::string> v3 = sim;
  v3.insert(v3.end(), {"--vpp", "3"});  // given: the user's vpp stands, and its layer split is the error
  CHECK(run_tessel(v3).code == 2);
  // A V-shaped file under a given --vpp 3: the file still names the schedule (zbv), whose rule names the
  // mismatch (it was the default interleaved's placement against the file's).
  const std::string zbv = (dir / "v.csv").string();
  REQUIRE(run_tessel({"schedule", "gen", "zbv", "--pp", "4", "--mb", "8", "-o", zbv}).code == 0);
  auto vz = run_tessel({"simulate", "--model", "gpt3-175b", "--tp", "8", "--pp", "4", "--dp", "1", "--gbs", "8",
                        "--schedule-file", zbv, "--vpp", "3"});
  CAPTURE(vz.err);
  CHECK(vz.code == 2);
  CHECK(vz.err.find("zbv needs exactly 2 stages per rank") != std::string::npos);
  std::filesystem::remove_all(dir);
}

// PyTorch's ScheduleInterleaved1F1B order for p 4, m 6, v 2 (a golden written by PyTorch, no sidecar):
// Megatron's rule refuses m 6 with pp 4, PyTorch's takes it, and the file is that rule's order, so the
// layout names it interleaved under PyTorch's rule (it was played as looped-bfs, or refused with a sidecar).
TEST_CASE("simulate --schedule-file: PyTorch's interleaved order with m not a multiple of pp") {
  const std::string csv = tessel::test::source_root() + "/tests/golden/schedules/torch/ScheduleInterleaved1F1B_p4_m6_v2.csv";
  const std::vector<std::string> sim = {"simulate", "--model", "tiny", "--system", "cpu", "--precision", "fp32", "--tp", "1",
                                        "--pp", "4", "--dp", "1", "--gbs", "6", "--schedule-file", csv};
  auto r = run_tessel(sim);
  CAPTURE(r.err);
  CHECK(r.code == 0);
  CHECK(r.out.find("tp1 pp4 dp1 vpp2 mbs1 interleaved mb-rule=torch") != std::string::npos);
  CHECK(r.out.find("note:") == std::string::npos);  // named after the generator that makes its order
  std::vector<std::string> megatron = sim;
  megatron.insert(megatron.end(), {"--schedule", "interleaved", "--vpp", "2", "--mb-rule", "megatron"});
  auto refused = run_tessel(megatron);
  CHECK(refused.code == 2);
  CHECK(refused.err.find("PyTorch's rule (mb-rule=torch) takes it") != std::string::npos);
}

TEST_CASE("one error prefix, and a suggestion for a near miss of a flag, verb, preset or schedule") {
  // main adds "tessel VERB: error: " once; a message never repeats it (it read
  // "tessel explore: error: tessel explore: unknown flag --sytem").
  const auto flag = run_tessel({"explore", "--sytem", "dgx-a100"});
  CHECK(flag.code == 2);
  CHECK(flag.err.find("tessel explore: error: unknown flag --sytem; did you mean '--system'?") == 0);
  CHECK(flag.err.find("tessel explore: error: tessel explore") == std::string::npos);
  const auto verb = run_tessel({"estimte"});
  CHECK(verb.code == 2);
  CHECK(verb.err.find("unknown verb 'estimte'; did you mean 'estimate'?") != std::string::npos);
  CHECK(run_tessel({"estimate", "--model", "gpt3-175"}).err.find("did you mean 'gpt3-175b'?") != std::string::npos);
  CHECK(run_tessel({"estimate", "--system", "dgx-a10"}).err.find("did you mean 'dgx-a100'?") != std::string::npos);
  const auto sched = run_tessel({"estimate", "--schedule", "interleavd"});
  CHECK(sched.err.find("choose one of gpipe, 1f1b, interleaved") != std::string::npos);
  CHECK(sched.err.find("did you mean 'interleaved'?") != std::string::npos);
}

// The split flags in simulate: tiny's 8 layers as 3 + 5 at pp 2. The trace names each rank's stages with
// the layers they hold (rank 0: layers 0-2; rank 1: 3-7), which the SVG timeline shows as the lane's title.
TEST_CASE("simulate --stage-layers: the engine plays the split, and the timeline names each stage's layers") {
  const std::string svg = write_temp("split.svg", "");
  auto r = run_tessel({"simulate", "--model", "tiny", "--system", "cpu", "--precision", "fp32", "--tp", "1", "--pp", "2",
                       "--dp", "1", "--gbs", "4", "--schedule", "1f1b", "--stage-layers", "3,5", "--svg", svg});
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  // The cpu system defaults to what the CPU runtime executes: no recompute, so no recompute word.
  CHECK(r.out.find("tp1 pp2 dp1 mbs1 1f1b layers=3,5,") != std::string::npos);
  std::ifstream in(svg);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("rank 0 (stage 0; layers 0-2)") != std::string::npos);
  CHECK(text.find("rank 1 (stage 1; layers 3-7)") != std::string::npos);
  // The even split is not written as layers= but still names the layers: 4 + 4.
  auto even = run_tessel({"simulate", "--model", "tiny", "--system", "cpu", "--precision", "fp32", "--tp", "1", "--pp", "2",
                          "--dp", "1", "--gbs", "4", "--schedule", "1f1b", "--stage-layers", "4,4", "--svg", svg});
  REQUIRE(even.code == 0);
  CHECK(even.out.find("layers=") == std::string::npos);
  std::ifstream in2(svg);
  const std::string text2((std::istreambuf_iterator<char>(in2)), std::istreambuf_iterator<char>());
  CHECK(text2.find("rank 1 (stage 1; layers 4-7)") != std::string::npos);
}

// A Megatron-LM argument file given as --model brings its split flags: 24 layers, pp 4 (flags), and
// --decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 5: the 16 left over 2 ranks, 8 each:
// 3,8,8,5. An explicit --stage-layers overrides the file; the account-for flags count the embedding and the
// loss as layers: 24 + 2 = 26 over pp 2, 13 a rank, the first and the last one fewer: 12,12.
TEST_CASE("estimate --model <Megatron-LM argument file>: its pipeline split flags decide the split") {
  const std::string shape = "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
                            "--max-position-embeddings 2048 --vocab-size 51200 ";
  const std::string args = write_temp("meg_split.txt", shape + "--decoder-first-pipeline-num-layers 3 "
                                                               "--decoder-last-pipeline-num-layers 5\n");
  const std::vector<std::string> est = {"estimate", "--model", args, "--tp", "1", "--pp", "4", "--dp", "1", "--gbs", "8",
                                        "--schedule", "1f1b"};
  auto r = run_tessel(est);
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("layers=3,8x2,5") != std::string::npos);
  std::vector<std::string> explicit_split = est;
  explicit_split.insert(explicit_split.end(), {"--stage-layers", "6x4"});
  auto e = run_tessel(explicit_split);
  REQUIRE(e.code == 0);
  CHECK(e.out.find("layers=") == std::string::npos);  // 6,6,6,6 is the even split
  const std::string acc = write_temp("meg_acc.txt", shape + "--account-for-embedding-in-pipeline-split "
                                                            "--account-for-loss-in-pipeline-split\n");
  auto a = run_tessel({"estimate", "--model", acc, "--tp", "1", "--pp", "2", "--dp", "1", "--gbs", "8", "--schedule", "1f1b"});
  CAPTURE(a.err);
  REQUIRE(a.code == 0);
  CHECK(a.out.find("layers=12x2") == std::string::npos);  // 12,12 is the even split: no layers= word
  CHECK(a.out.find("tp1 pp2 dp1 mbs1 1f1b selective,") != std::string::npos);
  // Megatron's rule: 24 + 2 = 26 does not divide over pp 4, named with the file and the flag.
  auto bad = run_tessel({"estimate", "--model", acc, "--tp", "1", "--pp", "4", "--dp", "1", "--gbs", "8", "--schedule", "1f1b"});
  CHECK(bad.code == 2);
  CHECK(bad.err.find(acc + ": --account-for-embedding-in-pipeline-split") != std::string::npos);
  CHECK(bad.err.find("do not divide over pp 4") != std::string::npos);
}

// --stack: its defaults on the layout, what it lacks refused with exit 2 and the stack named; explore with a
// stack enumerates only what it runs (checked on every row of its JSON).
TEST_CASE("estimate and explore --stack: defaults, refusals, and a search within the stack") {
  auto e = run_tessel({"estimate", "--stack", "megatron-lm-2021", "--json"});
  REQUIRE(e.code == 0);
  const auto doc = nlohmann::json::parse(e.out);
  CHECK(doc["layout"]["attention"] == "unfused");
  CHECK(doc["layout"]["overlap_grad_reduce"] == false);
  CHECK(doc["layout"]["sequence_parallel"] == false);
  CHECK(doc["layout"]["recompute"] == "none");
  auto bad = run_tessel({"estimate", "--stack", "megatron-lm-2021", "--schedule", "zbv"});
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--stack megatron-lm-2021: schedule zbv is not one of its schedules (1f1b, interleaved)") != std::string::npos);
  auto sp = run_tessel({"estimate", "--stack", "megatron-lm-2021", "--sp"});
  CHECK(sp.code == 2);
  CHECK(sp.err.find("it has no sequence parallelism") != std::string::npos);
  auto x = run_tessel({"explore", "--stack", "megatron-lm-2021", "--json", "--top", "20", "--no-simulate"});
  REQUIRE(x.code == 0);
  const auto xd = nlohmann::json::parse(x.out);
  CHECK(xd["stack"] == "megatron-lm-2021");
  REQUIRE(xd["top"].size() == 20);
  for (const auto& row : xd["top"]) {
    const auto& l = row["layout"];
    CAPTURE(l.dump());
    CHECK(l["sequence_parallel"] == false);
    CHECK(l["recompute"] != "selective");
    CHECK(l["zero_stage"] == 0);
    CHECK(l["attention"] == "unfused");
    CHECK(l["overlap_grad_reduce"] == false);
    CHECK((l["schedule"] == "1f1b" || l["schedule"] == "interleaved"));
  }
  // The loss implementation: a flag on estimate and explore, in the layout's JSON when not Megatron's default.
  auto ce = run_tessel({"estimate", "--stack", "megatron-core-2024", "--cross-entropy", "te", "--json"});
  REQUIRE(ce.code == 0);
  CHECK(nlohmann::json::parse(ce.out)["layout"]["cross_entropy"] == "te");
  CHECK_FALSE(doc["layout"].contains("cross_entropy"));
  auto cebad = run_tessel({"estimate", "--cross-entropy", "liger"});
  CHECK(cebad.code == 2);
  CHECK(cebad.err.find("--cross-entropy: value \"liger\" is not one of megatron, megatron-fused, te") != std::string::npos);
  auto xce = run_tessel({"explore", "--cross-entropy", "megatron-fused", "--json", "--top", "3", "--no-simulate"});
  REQUIRE(xce.code == 0);
  const auto xcd = nlohmann::json::parse(xce.out);
  REQUIRE(xcd["top"].size() == 3);
  for (const auto& row : xcd["top"]) CHECK(row["layout"]["cross_entropy"] == "megatron-fused");
  auto xbad = run_tessel({"explore", "--stack", "deepspeed", "--tp-comm-overlap"});
  CHECK(xbad.code == 2);
  CHECK(xbad.err.find("--tp-comm-overlap: stack deepspeed does not overlap TP communication") != std::string::npos);
}

// The allocator's fragmentation on the command line: a stack's (0.10 for megatron-core-2024) in estimate's
// JSON memory terms and its layout, --fragmentation over it, in the layout JSON, out of range refused naming
// the flag (estimate and explore); simulate's peak grows with it.
TEST_CASE("estimate, simulate and explore: the allocator's fragmentation") {
  const std::vector<std::string> base = {"--model", "gpt3-175b", "--tp", "8", "--pp", "8", "--gpus", "256",
                                         "--gbs", "256", "--schedule", "1f1b", "--json"};
  const auto run = [&](const std::string& verb, std::vector<std::string> extra) {
    std::vector<std::string> a = {verb};
    a.insert(a.end(), base.begin(), base.end());
    a.insert(a.end(), extra.begin(), extra.end());
    auto r = run_tessel(a);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out);
  };
  const auto none = run("estimate", {});
  const auto stack = run("estimate", {"--stack", "megatron-core-2024", "--zero", "0", "--no-sp", "--recompute", "selective"});
  const auto flag = run("estimate", {"--fragmentation", "0.25"});
  CHECK_FALSE(none["layout"].contains("fragmentation"));
  CHECK(stack["layout"]["fragmentation"].get<double>() == 0.10);
  CHECK(flag["layout"]["fragmentation"].get<double>() == 0.25);
  for (std::size_t r = 0; r < none["memory_per_pipeline_rank"].size(); ++r) {
    CAPTURE(r);
    const auto &a = none["memory_per_pipeline_rank"][r], &b = flag["memory_per_pipeline_rank"][r];
    const double dyn = b["activations_GiB"].get<double>() + b["extras_GiB"].get<double>() +
                       b["zero3_gather_GiB"].get<double>() + b["recompute_transient_GiB"].get<double>();
    CHECK(a["fragmentation_GiB"].get<double>() == 0);
    CHECK(b["fragmentation_GiB"].get<double>() == doctest::Approx(0.25 * dyn).epsilon(1e-9));
    CHECK(b["total_GiB"].get<double>() == doctest::Approx(a["total_GiB"].get<double>() + 0.25 * dyn).epsilon(1e-9));
  }
  const auto over = run("estimate", {"--stack", "megatron-core-2024", "--fragmentation", "0", "--zero", "0", "--no-sp",
                                     "--recompute", "selective"});
  CHECK_FALSE(over["layout"].contains("fragmentation"));  // the flag over the stack's
  const auto s0 = run("simulate", {});
  const auto s1 = run("simulate", {"--fragmentation", "0.25"});
  CHECK(s1["peak_memory_GiB"].get<double>() > s0["peak_memory_GiB"].get<double>());
  auto text = run_tessel({"estimate", "--fragmentation", "0.25"});
  REQUIRE(text.code == 0);
  CHECK(text.out.find("(fragmentation: the allocator's 25.0% of activations, extras and transients)") != std::string::npos);
  auto bad = run_tessel({"estimate", "--fragmentation", "1.5"});
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--fragmentation") != std::string::npos);
  auto xbad = run_tessel({"explore", "--fragmentation", "-0.1"});
  CHECK(xbad.code == 2);
  CHECK(xbad.err.find("--fragmentation") != std::string::npos);
}

// --fp8-param-gather on the command line: the weights' term falls by 2 bytes a GEMM weight (Hopper), the layout
// JSON and words carry it and round-trip, the text says which weights a run keeps; the stack's default
// (megatron-bridge-2025) and --no-fp8-param-gather over it; refused without fp8 or without the distributed
// optimizer (estimate and explore), and in a layout file, naming the flag or key.
TEST_CASE("estimate and explore: fp8 primary weights") {
  const std::vector<std::string> base = {"estimate", "--model", "llama3-70b", "--system", "dgx-h100", "--gpus", "512",
                                         "--tp", "4", "--pp", "4", "--cp", "2", "--vpp", "5", "--gbs", "512",
                                         "--precision", "fp8", "--zero", "1", "--sp", "--json"};
  const auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    auto r = run_tessel(a);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out);
  };
  const auto cached = run({}), fp8w = run({"--fp8-param-gather"});
  CHECK_FALSE(cached["layout"].contains("fp8_param_gather"));
  CHECK(fp8w["layout"]["fp8_param_gather"] == true);
  for (std::size_t r = 0; r < 4; ++r) {
    CAPTURE(r);
    const double a = cached["memory_per_pipeline_rank"][r]["weights_GiB"].get<double>();
    const double b = fp8w["memory_per_pipeline_rank"][r]["weights_GiB"].get<double>();
    CHECK(a > 1.8 * b);  // 4 bytes a GEMM weight against 2, the embeddings and norms 2 in both
    CHECK(a < 2 * b);
  }
  const auto bridge = run({"--stack", "megatron-bridge-2025"});
  CHECK(bridge["layout"]["fp8_param_gather"] == true);
  const auto off = run({"--stack", "megatron-bridge-2025", "--no-fp8-param-gather"});
  CHECK_FALSE(off["layout"].contains("fp8_param_gather"));
  // The layout words carry it: "fp8-params", as describe() prints it.
  std::vector<std::string> words = {"estimate", "--model", "llama3-70b", "--system", "dgx-h100", "--layout",
                                    "tp4 pp4 dp16 cp2 vpp5 mbs1 interleaved sp zero1 fp8-params", "--gbs", "512",
                                    "--precision", "fp8", "--json"};
  auto w = run_tessel(words);
  REQUIRE(w.code == 0);
  CHECK(nlohmann::json::parse(w.out)["layout"]["fp8_param_gather"] == true);
  std::vector<std::string> text_args(base.begin(), base.end() - 1);
  text_args.push_back("--fp8-param-gather");
  auto text = run_tessel(text_args);
  REQUIRE(text.code == 0);
  CHECK(text.out.find("fp8 primary weights gathered in fp8 (--fp8-param-gather; docs/stacks.md)") != std::string::npos);
  // torchtitan's torchao casts say so, and take their own part of the JSON layout.
  std::vector<std::string> tt = {"estimate", "--model", "llama3-8b", "--system", "dgx-h100", "--gpus", "8", "--tp", "1",
                                 "--pp", "1", "--gbs", "64", "--precision", "fp8", "--stack", "torchtitan-2025",
                                 "--zero", "2"};
  auto ttext = run_tessel(tt);
  REQUIRE(ttext.code == 0);
  CHECK(ttext.out.find("16-bit weights cast to fp8 in every micro-batch's forward and backward (torchao)") !=
        std::string::npos);
  tt.push_back("--json");
  auto tjson = run_tessel(tt);
  REQUIRE(tjson.code == 0);
  CHECK(nlohmann::json::parse(tjson.out)["layout"]["fp8_weight_cast"] == "per_microbatch");
  // Each refusal exits 2 with the flag and what is missing in its message.
  const auto refused = [](const std::vector<std::string>& args, const std::string& says) {
    CAPTURE(says);
    auto r = run_tessel(args);
    CHECK(r.code == 2);
    CHECK(r.err.find(says) != std::string::npos);
  };
  const std::vector<std::string> h100 = {"--model", "llama3-70b", "--system", "dgx-h100"};
  const auto with = [&](const std::string& verb, std::vector<std::string> extra) {
    std::vector<std::string> a = {verb};
    a.insert(a.end(), h100.begin(), h100.end());
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  refused(with("estimate", {"--fp8-param-gather"}), "--fp8-param-gather: fp8 primary weights need --precision fp8");
  refused(with("estimate", {"--precision", "fp8", "--zero", "0", "--fp8-param-gather"}), "the distributed optimizer");
  refused(with("estimate", {"--precision", "fp8", "--fp8-param-gather", "--no-fp8-param-gather"}), "contradict");
  refused(with("explore", {"--fp8-param-gather"}), "--fp8-param-gather: fp8 primary weights need --precision fp8");
  refused(with("explore", {"--precision", "fp8", "--zero", "0", "--fp8-param-gather"}), "--zero gives 0 only");
  const std::string file = write_temp("fp8_params_zero0.json", R"({"tp":8,"pp":1,"dp":8,"micro_batch":1,"global_batch":64,"zero_stage":0,"precision":"fp8","fp8_param_gather":true})");
  refused(with("estimate", {"--layout", file}), "fp8_param_gather: true needs the distributed optimizer (zero_stage >= 1)");
}

// --recipe: what a release ran for the model (sim/recipes/): its stack and its terms as defaults, a flag over
// them; estimate's prediction is validate's for the published row of the same layout (NeMo 24.07's Llama 3 70B
// row: tp 4, pp 4, cp 2, vpp 5 on 64 H100, the recipe's TP overlap and fused loss); explore fixes the terms on
// every row; an unknown release or model, a contradicting --stack and a whole --layout are refused.
TEST_CASE("estimate and explore --recipe: a release's terms as defaults, flags over them, refusals") {
  const std::vector<std::string> row = {"estimate", "--model", "llama3-70b", "--system", "dgx-h100", "--gpus", "64",
                                        "--tp", "4", "--pp", "4", "--cp", "2", "--vpp", "5", "--mbs", "1", "--gbs", "128",
                                        "--precision", "fp8", "--recipe", "nemo-24.07", "--json"};
  auto e = run_tessel(row);
  REQUIRE(e.code == 0);
  const auto j = nlohmann::json::parse(e.out);
  const auto& l = j["layout"];
  CHECK(l["recompute"] == "none");
  CHECK(l["sequence_parallel"] == true);
  CHECK(l["tp_comm_overlap"] == true);
  CHECK(l["cross_entropy"] == "megatron-fused");
  CHECK(l["master_weights"] == "remainder");
  CHECK(l["zero_stage"] == 1);  // the release's stack, megatron-core-2024
  // validate's prediction of nemo2407_LLAMA3-70B_64gpu (docs/validation.md): 1,678.8 tokens/s a GPU; the row
  // states vocab 128,000 where the preset has Llama 3's 128,256.
  CHECK(j["tokens_per_s"].get<double>() / 64 == doctest::Approx(1678.8).epsilon(0.002));
  std::vector<std::string> flagged = row;
  flagged.insert(flagged.end(), {"--recompute", "selective", "--cross-entropy", "megatron"});
  auto f = run_tessel(flagged);
  REQUIRE(f.code == 0);
  const auto fj = nlohmann::json::parse(f.out);
  CHECK(fj["layout"]["recompute"] == "selective");
  CHECK_FALSE(fj["layout"].contains("cross_entropy"));  // Megatron's default again
  CHECK(fj["layout"]["tp_comm_overlap"] == true);
  CHECK(fj["step_s"].get<double>() > j["step_s"].get<double>());

  auto x = run_tessel({"explore", "--model", "nemotron-340b", "--system", "dgx-h100", "--gpus", "128", "--gbs", "32",
                       "--precision", "fp8", "--recipe", "nemo-24.07", "--json", "--top", "5", "--no-simulate"});
  REQUIRE(x.code == 0);
  const auto xd = nlohmann::json::parse(x.out);
  CHECK(xd["recipe"] == "nemo-24.07");
  CHECK(xd["stack"] == "megatron-core-2024");
  REQUIRE(xd["top"].size() == 5);
  for (const auto& r : xd["top"]) {
    const auto& rl = r["layout"];
    CAPTURE(rl.dump());
    CHECK(rl["recompute"] == "selective");
    CHECK(rl["main_grads"] == "bf16");
    CHECK(rl["moments"] == "bf16");
    CHECK(rl["master_weights"] == "none");
    CHECK(rl["overlap_p2p"] == false);
  }

  auto unknown = run_tessel({"estimate", "--model", "llama3-70b", "--recipe", "nemo-2407"});
  CHECK(unknown.code == 2);
  CHECK(unknown.err.find("--recipe nemo-2407: no such release (known: dgxc-24.11, nemo-24.07); did you mean 'nemo-24.07'?") != std::string::npos);
  auto model = run_tessel({"estimate", "--model", "tiny", "--recipe", "nemo-24.07"});
  CHECK(model.code == 2);
  CHECK(model.err.find("--recipe nemo-24.07: no recipe for model tiny in that release (it has: GPT3-175B,") != std::string::npos);
  auto stack = run_tessel({"explore", "--model", "llama3-70b", "--recipe", "nemo-24.07", "--stack", "deepspeed"});
  CHECK(stack.code == 2);
  CHECK(stack.err.find("--stack deepspeed with --recipe nemo-24.07: that release runs stack megatron-core-2024") != std::string::npos);
  auto whole = run_tessel({"estimate", "--model", "llama3-70b", "--recipe", "nemo-24.07", "--layout", "tp8 pp8"});
  CHECK(whole.code == 2);
  CHECK(whole.err.find("--recipe nemo-24.07 with --layout: a layout given whole says what it runs") != std::string::npos);
}

// NVIDIA's reference recipes for H100 (github.com/NVIDIA/dgxc-benchmarking, tag v24.11.1; each README's step
// time at its smallest GPU count, NeMo 24.09 / 24.11) predicted under the same tag's configs (--recipe
// dgxc-24.11), held to the issue's per-source bound: a mean |step error| of at most 15% (12.0% today, all but
// one optimistic), none beyond 25% (GPT-3 175B bf16, -22.3%, the largest). docs/validation.md shows the table.
TEST_CASE("--recipe dgxc-24.11: NVIDIA's published H100 step times within the per-source bound") {
  struct Ref {
    std::string model;
    int gpus;
    std::vector<std::string> layout;
    double bf16_s, fp8_s;
  };
  const std::vector<Ref> refs = {
      {"llama3-8b", 8, {"--tp", "1", "--pp", "1", "--cp", "2", "--gbs", "128", "--schedule", "1f1b"}, 12.91, 9.67},
      {"llama3-70b", 64, {"--tp", "4", "--pp", "4", "--cp", "2", "--vpp", "5", "--gbs", "128", "--schedule", "interleaved"}, 14.72, 11.01},
      {"gpt3-175b", 128, {"--tp", "4", "--pp", "8", "--vpp", "12", "--gbs", "256", "--schedule", "interleaved"}, 8.91, 5.92},
      {"nemotron-340b", 128, {"--tp", "8", "--pp", "8", "--vpp", "12", "--gbs", "32", "--schedule", "interleaved"}, 4.61, 3.16},
  };
  double sum = 0;
  int n = 0;
  for (const Ref& r : refs)
    for (const auto& run : {std::pair<std::string, double>{"bf16", r.bf16_s}, {"fp8", r.fp8_s}}) {
      const std::string prec = run.first;  // not a structured binding: CAPTURE's lambda takes it (clang 14)
      const double measured = run.second;
      std::vector<std::string> args = {"estimate", "--json", "--model", r.model, "--system", "dgx-h100", "--gpus",
                                       std::to_string(r.gpus), "--mbs", "1", "--zero", "1", "--precision", prec,
                                       "--recipe", "dgxc-24.11"};
      args.insert(args.end(), r.layout.begin(), r.layout.end());
      auto e = run_tessel(args);
      CAPTURE(r.model);
      CAPTURE(prec);
      REQUIRE(e.code == 0);
      const double err = 100.0 * (nlohmann::json::parse(e.out)["step_s"].get<double>() / measured - 1.0);
      MESSAGE(r.model << " " << prec << ": " << err << "%");
      CHECK(std::fabs(err) <= 25.0);
      sum += std::fabs(err);
      ++n;
    }
  MESSAGE("mean |step error| " << sum / n << "% over " << n);
  CHECK(n == 8);
  CHECK(sum / n <= 15.0);
}

// --ops: one layer's ops with their work and price. Llama 2 7B (h 4096, 32 heads, SwiGLU ffn 11008), seq 4096,
// mbs 1, tp 2: qkv is M = b s = 4096 tokens by N = 3 x 4096 / 2 = 6144 by K = 4096; mlp_up N = 2 x 11008 / 2
// = 11008; mlp_down K = 11008 / 2 = 5504. Each op's forward + backward is its share of the layer's total.
TEST_CASE("estimate --ops: a layer's ops with shapes, dtypes and shares") {
  const std::vector<std::string> base = {"estimate", "--model", "llama2-7b", "--system", "dgx-h100", "--tp", "2", "--pp", "1",
                                         "--dp", "4", "--gbs", "32", "--seq", "4096", "--schedule", "1f1b", "--precision", "fp8", "--ops"};
  auto text = run_tessel(base);
  REQUIRE(text.code == 0);
  CHECK(text.out.find("one transformer layer, one micro-batch, one GPU (--ops)") != std::string::npos);
  CHECK(text.out.find("4096x6144x4096") != std::string::npos);
  auto args = base;
  args.push_back("--json");
  auto r = run_tessel(args);
  REQUIRE(r.code == 0);
  const auto ops = nlohmann::json::parse(r.out)["layer_ops"];
  REQUIRE(ops.is_array());
  std::map<std::string, nlohmann::json> by;
  for (const auto& o : ops) by[o["name"].get<std::string>()] = o;
  REQUIRE(by.count("qkv") == 1);
  CHECK(by["qkv"]["gemm_mnk_batch"] == nlohmann::json::array({4096, 6144, 4096, 1}));
  CHECK(by["mlp_up"]["gemm_mnk_batch"] == nlohmann::json::array({4096, 11008, 4096, 1}));
  CHECK(by["mlp_down"]["gemm_mnk_batch"] == nlohmann::json::array({4096, 4096, 5504, 1}));
  // Linear layers run in fp8; the attention core stays 16-bit under an fp8 recipe.
  CHECK(by["qkv"]["dtype"] == "fp8");
  CHECK(by["flash_attn"]["dtype"] == "bf16");
  // A GEMM's model FLOPs: 2 M N K forward, twice that backward.
  CHECK(by["qkv"]["flops_forward"].get<double>() == doctest::Approx(2.0 * 4096 * 6144 * 4096));
  CHECK(by["qkv"]["flops_backward"].get<double>() == doctest::Approx(4.0 * 4096 * 6144 * 4096));
  for (const auto& o : ops) {
    CHECK(o["forward_s"].get<double>() >= 0);
    CHECK(o["input_grad_s"].get<double>() >= 0);
  }
  CHECK(by["qkv"]["weight_grad_s"].get<double>() > 0);
  CHECK(by["flash_attn"]["weight_grad_s"].get<double>() == 0);
}
