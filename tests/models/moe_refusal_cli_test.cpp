// Until the cost model and the runtimes model latent attention, MTP modules, windows and mixed dense / MoE
// layers (and the runtimes experts at all), their commands refuse such a model with exit 2 and a message
// naming what it has, rather than price or run it as something else. (These checks change when support lands.)
#include <doctest/doctest.h>

#include "tests/tools/run_util.hpp"

using tessel::test::run_tessel;

namespace {
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
const std::string kTinyMoe = "model tiny-moe: mixture of experts (8 experts, top-2, 1 shared expert, 1 dense layer): ";
}  // namespace

TEST_CASE("estimate, simulate and explore refuse what the cost model does not price yet, naming it") {
  const std::vector<std::string> cpu = {"--system", "cpu", "--precision", "fp32", "--tp", "1", "--pp", "1", "--dp", "1",
                                        "--gbs", "8"};
  // tiny-moe mixes one dense layer with MoE layers: the cost model lowers one layer for all of them.
  for (const char* verb : {"estimate", "simulate"}) {
    CAPTURE(verb);
    std::vector<std::string> args = {verb, "--model", "tiny-moe"};
    args.insert(args.end(), cpu.begin(), cpu.end());
    const auto r = run_tessel(args);
    CHECK(r.code == 2);
    CHECK(has(r.err, "model tiny-moe: 1 dense layer among 3 MoE layers: not yet priced by the cost model, which prices "
                     "dense transformers and mixture-of-experts models whose layers are all MoE layers"));
  }
  // explore scores on worker threads; the refusal comes before them (an exception there would abort).
  const auto e = run_tessel({"explore", "--model", "deepseek-v3", "--gpus", "2048", "--gbs", "15360", "--json"});
  CHECK(e.code == 2);
  CHECK(has(e.err, "model deepseek-v3: multi-head latent attention, 1 multi-token prediction module, 3 dense layers among 58 "
                   "MoE layers: not yet priced"));
  CHECK(e.out.empty());
  // A model whose layers are all MoE layers is priced: Mixtral 8x7B on 64 GPUs, ep 8.
  const auto m = run_tessel({"estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "1", "--pp", "1", "--dp", "64",
                             "--ep", "8", "--gbs", "256", "--seq", "4096", "--json"});
  CHECK(m.code == 0);
}

TEST_CASE("run refuses a MoE model before any rank starts: not yet executed") {
  const auto r = run_tessel({"run", "--backend", "cpu", "--model", "tiny-moe", "--steps", "1"});
  CHECK(r.code == 2);
  CHECK(has(r.err, "--" + kTinyMoe + "not yet executed by the runtime, which runs dense transformers only"));
}
