// The MoE presets through estimate, simulate and explore (GPT-OSS's windowed layers, DeepSeek-V3's latent
// attention, dense layers and MTP, tiny-moe's dense layer); what the runtimes do not build yet (latent
// attention in the runtimes, ZeRO-2 with experts on the CUDA runtime) refused with exit 2 and a message naming it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/tools/run_util.hpp"

using tessel::test::run_tessel;

namespace {
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("estimate, simulate and explore price every MoE preset, GPT-OSS's windowed layers as their own kind") {
  // GPT-OSS: every other layer attends through a 128-token window; explore searches it, estimate and simulate
  // list the two kinds of layer apart, the windowed one's attention a fraction of the full one's.
  const auto e = run_tessel({"explore", "--model", "gpt-oss-120b", "--gpus", "64", "--gbs", "512", "--json"});
  REQUIRE(e.code == 0);
  CHECK(!nlohmann::json::parse(e.out)["top"].empty());
  for (const char* verb : {"estimate", "simulate"}) {
    CAPTURE(verb);
    const auto g = run_tessel({verb, "--model", "gpt-oss-120b", "--tp", "1", "--pp", "1", "--dp", "8", "--ep", "8", "--gbs",
                               "64", "--ops", "--json"});
    REQUIRE(g.code == 0);
    const auto doc = nlohmann::json::parse(g.out);
    const auto flash = [&](const char* key) {
      for (const auto& o : doc[key])
        if (o["name"] == "flash_attn") return o["forward_s"].get<double>();
      return -1.0;
    };
    const double full = flash("layer_ops"), windowed = flash("window_layer_ops");
    CHECK(windowed > 0);
    CHECK(windowed < full / 4);  // 4096 positions against a 128 window (two 128-tiles per query block)
  }
  const auto o = run_tessel({"estimate", "--model", "gpt-oss-120b", "--tp", "1", "--pp", "1", "--dp", "8", "--ep", "8",
                             "--gbs", "64", "--ops"});
  CHECK(has(o.out, "one MoE layer with full attention (18 of them), one micro-batch"));
  CHECK(has(o.out, "one MoE layer with attention through a 128-token window (18 of them), one micro-batch"));
  // Priced: a model whose layers are all MoE layers (Mixtral 8x7B on 64 GPUs, ep 8), one whose first layer is
  // dense (tiny-moe on the CPU system, its dense layer's ops listed apart), and DeepSeek-V3 (latent attention,
  // three dense layers, an MTP module) searched on DeepSeek's 2,048 H800 with ep among the degrees.
  const auto d = run_tessel({"explore", "--model", "deepseek-v3", "--system", "h800", "--gpus", "2048", "--gbs", "15360",
                             "--seq", "4096", "--json"});
  REQUIRE(d.code == 0);
  const auto top = nlohmann::json::parse(d.out)["top"];
  REQUIRE(!top.empty());
  CHECK(top[0]["layout"]["ep"].get<int>() > 1);
  CHECK(top[0]["layout"]["pp"].get<int>() > 1);
  // DeepEP is tried only where the ep group leaves the 8-GPU node (inside it the two dispatchers cost alike);
  // restricted to NCCL's all-to-all, no row uses it.
  int deepep = 0;
  for (const auto& row : top) {
    const auto& lay = row["layout"];
    if (lay.value("moe_dispatcher", "alltoall") != "deepep") continue;
    ++deepep;
    CHECK((lay["ep"].get<int>() - 1) * lay.value("etp", lay["tp"].get<int>()) + 1 > 8);
  }
  CHECK(deepep > 0);
  // A DeepEP row is priced as DeepEP (its layer lowered apart from its NCCL twin's): explore's analytical step is
  // estimate's for the same layout.
  for (const auto& row : top)
    if (row["layout"].value("moe_dispatcher", "alltoall") == "deepep") {
      const auto est = run_tessel({"estimate", "--model", "deepseek-v3", "--system", "h800", "--gpus", "2048", "--gbs", "15360",
                                   "--seq", "4096", "--layout", row["describe"].get<std::string>(), "--json"});
      REQUIRE(est.code == 0);
      CHECK(nlohmann::json::parse(est.out)["step_s"].get<double>() ==
            doctest::Approx(row["analytical_step_s"].get<double>()).epsilon(1e-9));
      break;
    }
  // The all-to-all overlap only with ep > 1 on the schedules with F&B blocks: DualPipeV, or Megatron-Core's
  // combined 1F1B (interleaved with vpp > 1, 1f1b with pp 1).
  int overlapped = 0;
  for (const auto& row : top)
    if (row["layout"].value("moe_a2a_overlap", false)) {
      ++overlapped;
      const auto& lay = row["layout"];
      const std::string sc = lay["schedule"];
      const int pp = lay.value("pp", 1), vpp = lay.value("vpp", 1);
      CHECK((sc == "dualpipev" || (sc == "interleaved" && vpp > 1) || (sc == "1f1b" && pp == 1)));
      CHECK(lay["ep"].get<int>() > 1);
    }
  CHECK(overlapped > 0);
  const auto a = run_tessel({"explore", "--model", "deepseek-v3", "--system", "h800", "--gpus", "2048", "--gbs", "15360",
                             "--seq", "4096", "--moe-dispatcher", "alltoall", "--moe-a2a-overlap", "off", "--json"});
  REQUIRE(a.code == 0);
  const auto nccl = nlohmann::json::parse(a.out);
  REQUIRE(!nccl["top"].empty());
  for (const auto& row : nccl["top"]) {
    CHECK(!row["layout"].contains("moe_dispatcher"));
    CHECK(!row["layout"].contains("moe_a2a_overlap"));
  }
  const auto bad = run_tessel({"explore", "--model", "deepseek-v3", "--gpus", "2048", "--moe-dispatcher", "nvshmem"});
  CHECK(bad.code == 2);
  CHECK(has(bad.err, "--moe-dispatcher nvshmem: unknown dispatcher"));
  // A stack without DeepEP or the overlap refuses the flag that asks for them, rather than search nothing.
  const auto st = run_tessel({"explore", "--model", "deepseek-v3", "--gpus", "2048", "--stack", "megatron-core-2024",
                              "--moe-dispatcher", "deepep"});
  CHECK(st.code == 2);
  CHECK(has(st.err, "--moe-dispatcher deepep: stack megatron-core-2024 has no DeepEP dispatcher"));
  const auto so = run_tessel({"explore", "--model", "deepseek-v3", "--gpus", "2048", "--stack", "megatron-core-2024",
                              "--moe-a2a-overlap", "on"});
  CHECK(so.code == 2);
  CHECK(has(so.err, "--moe-a2a-overlap on: stack megatron-core-2024 does not overlap the expert all-to-alls"));
  const auto m = run_tessel({"estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "1", "--pp", "1", "--dp", "64",
                             "--ep", "8", "--gbs", "256", "--seq", "4096", "--json"});
  CHECK(m.code == 0);
  const auto t = run_tessel({"estimate", "--model", "tiny-moe", "--system", "cpu", "--precision", "fp32", "--tp", "1", "--pp",
                             "2", "--dp", "1", "--gbs", "8", "--schedule", "1f1b", "--ops"});
  CHECK(t.code == 0);
  CHECK(has(t.out, "one MoE layer (3 of them), one micro-batch"));
  CHECK(has(t.out, "one dense layer (1 of them), one micro-batch"));
  // simulate lists the same ops: the MoE layer's router, permute and expert GEMMs; the dense layer's MLP.
  const auto sj = run_tessel({"simulate", "--model", "tiny-moe", "--system", "cpu", "--precision", "fp32", "--tp", "1", "--pp",
                              "2", "--dp", "1", "--gbs", "8", "--schedule", "1f1b", "--ops", "--json"});
  REQUIRE(sj.code == 0);
  const auto doc = nlohmann::json::parse(sj.out);
  std::vector<std::string> moe_ops, dense_ops;
  for (const auto& o : doc["layer_ops"]) moe_ops.push_back(o["name"]);
  for (const auto& o : doc["dense_layer_ops"]) dense_ops.push_back(o["name"]);
  for (const char* name : {"router", "permute", "expert_up", "expert_down", "unpermute", "shared_up"})
    CHECK_MESSAGE(std::find(moe_ops.begin(), moe_ops.end(), name) != moe_ops.end(), name);
  CHECK(std::find(dense_ops.begin(), dense_ops.end(), "mlp_up") != dense_ops.end());
  CHECK(std::find(dense_ops.begin(), dense_ops.end(), "router") == dense_ops.end());
}

TEST_CASE("run trains tiny-moe on the CPU runtime and refuses what it does not build, naming it") {
  const auto r = run_tessel({"run", "--backend", "cpu", "--model", "tiny-moe", "--steps", "1", "--dp", "2", "--ep", "2",
                             "--gbs", "4", "--json"});
  REQUIRE(r.code == 0);
  const auto doc = nlohmann::json::parse(r.out);
  CHECK(doc["steps"][0]["aux_loss"].get<double>() > 0.0);
  // etp left at tp 2 (Megatron-Core's default): each expert split over 2 ranks, the same tokens, the same loss.
  const auto etp = run_tessel({"run", "--model", "tiny-moe", "--tp", "2", "--sp", "--dp", "2", "--ep", "2", "--gbs", "4",
                               "--steps", "1", "--json"});
  REQUIRE(etp.code == 0);
  const double split = nlohmann::json::parse(etp.out)["steps"][0]["loss"].get<double>();
  const double whole = doc["steps"][0]["loss"].get<double>();
  CHECK(std::abs(split - whole) <= 1e-5 * whole);
  const auto mla = run_tessel({"run", "--model", "deepseek-v3", "--steps", "1"});
  CHECK(mla.code == 2);
  CHECK(has(mla.err, "multi-head latent attention"));
  // The CUDA runtime shards experts with ZeRO-1 only so far; --zero 2 with a MoE model is refused, naming the flag,
  // before any device is looked for (this machine may have none), in a build with the CUDA runtime.
  const auto cuda = run_tessel({"run", "--backend", "cuda", "--model", "tiny-moe", "--tp", "2", "--sp", "--dp", "2", "--ep",
                                "2", "--zero", "2", "--gbs", "4", "--steps", "1"});
  CHECK(cuda.code == 2);
  if (!has(cuda.err, "this build has no CUDA runtime"))
    CHECK(has(cuda.err, "--zero 2 (ZeRO-1 shards the experts' states over edp): not yet with a mixture of experts on the "
                        "CUDA runtime (--backend cpu runs it)"));
}
