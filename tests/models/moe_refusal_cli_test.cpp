// Until the cost model and the runtimes model experts, latent attention, MTP modules and windows, their
// commands refuse such a model with exit 2 and a message naming it and what it has, rather than price or
// run it as a dense transformer. (These checks change when that support lands.)
#include <doctest/doctest.h>

#include "tests/tools/run_util.hpp"

using tessel::test::run_tessel;

namespace {
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
const std::string kTinyMoe = "model tiny-moe: mixture of experts (8 experts, top-2, 1 shared expert, 1 dense layer): ";
}  // namespace

TEST_CASE("estimate, simulate and explore refuse a MoE model: not yet priced") {
  const std::vector<std::string> cpu = {"--system", "cpu", "--precision", "fp32", "--tp", "1", "--pp", "1", "--dp", "1",
                                        "--gbs", "8"};
  for (const char* verb : {"estimate", "simulate"}) {
    CAPTURE(verb);
    std::vector<std::string> args = {verb, "--model", "tiny-moe"};
    args.insert(args.end(), cpu.begin(), cpu.end());
    const auto r = run_tessel(args);
    CHECK(r.code == 2);
    CHECK(has(r.err, kTinyMoe + "not yet priced by the cost model, which prices dense transformers only"));
  }
  // explore scores on worker threads; the refusal comes before them (an exception there would abort).
  const auto e = run_tessel({"explore", "--model", "mixtral-8x7b", "--gpus", "64", "--gbs", "256", "--json"});
  CHECK(e.code == 2);
  CHECK(has(e.err, "model mixtral-8x7b: mixture of experts (8 experts, top-2): not yet priced by the cost model"));
  CHECK(e.out.empty());
  const auto d = run_tessel({"estimate", "--model", "deepseek-v3", "--tp", "8", "--pp", "1", "--dp", "128"});
  CHECK(d.code == 2);
  CHECK(has(d.err, "multi-head latent attention, 1 multi-token prediction module: not yet priced"));
}

TEST_CASE("run refuses a MoE model before any rank starts: not yet executed") {
  const auto r = run_tessel({"run", "--backend", "cpu", "--model", "tiny-moe", "--steps", "1"});
  CHECK(r.code == 2);
  CHECK(has(r.err, "--" + kTinyMoe + "not yet executed by the runtime, which runs dense transformers only"));
}
