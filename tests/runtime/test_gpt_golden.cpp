// Tessel's single-rank CPU run of the `tiny` preset against PyTorch (tools/torch_golden.py wrote
// tests/golden/tiny_gpt/golden.json from the same seeded init and data): the loss of each of 5 AdamW steps
// within 1e-5 relative, and each parameter's step-1 gradient norm within 1e-5 relative. The same for the
// rotary variant (tests/golden/tiny_gpt/tiny_rotary.json -> golden_rotary.json), whose PyTorch side
// implements RoPE on its own (rotate_half on [B, heads, S, d] tensors).
// Tolerances: both sides compute in fp32 with different summation orders (BLAS blocking, fused softmax),
// ~1e-6 relative per op; the loss is a mean over 128 tokens of O(1) terms, the gradients of small
// parameters (biases, positions) are sums of many cancelling terms, hence the looser gradient bound.
#include <doctest/doctest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "runtime/trainer.hpp"
#include "tests/runtime/runtime_test_util.hpp"
#include "tests/test_paths.hpp"

using namespace tessel;

namespace {
constexpr double kLossRelTol = 1e-5;
constexpr double kGradNormRelTol = 1e-5;
// The key bias gets an exactly-zero gradient in exact arithmetic (softmax is invariant to adding q.b_k to
// every score of a query); both sides leave ~1e-11 of rounding noise there, so norms below this floor are
// compared as "both zero".
constexpr double kZeroGrad = 1e-8;
}  // namespace

namespace {

void check_golden(const Model& m, const std::string& golden) {
  std::ifstream in(test::source_root() + "/tests/golden/tiny_gpt/" + golden);
  REQUIRE(in.good());
  const auto g = nlohmann::json::parse(in);
  REQUIRE(g.at("model").get<std::string>() == m.name);
  Layout l = test::layout(1, 1, 1, "1f1b", 1, g.at("global_batch").get<int>());
  rt::TrainOptions opt;
  opt.seed = g.at("seed").get<std::uint64_t>();
  const int steps = g.at("steps").get<int>();
  const auto r = rt::train_threads(m, l, opt, steps);
  for (int k = 0; k < steps; ++k) {
    const double want = g.at("losses").at(k).get<double>();
    CAPTURE(k);
    MESSAGE("step " << k << " tessel " << r.steps[k].loss << " torch " << want);
    CHECK(test::rel_err(r.steps[k].loss, want) < kLossRelTol);
  }
  const auto specs = rt::gpt_param_specs(m);
  REQUIRE(g.at("grad_norms_step1").size() == specs.size());
  double worst = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CAPTURE(specs[i].name);
    const double want = g.at("grad_norms_step1").at(specs[i].name).get<double>();
    const double got = r.steps[0].param_grad_norms[i];
    if (want < kZeroGrad) {
      CHECK(got < kZeroGrad);
      continue;
    }
    const double e = test::rel_err(got, want);
    worst = std::max(worst, e);
    CHECK(e < kGradNormRelTol);
  }
  MESSAGE(golden << ": worst per-parameter gradient-norm relative error " << worst);
}

}  // namespace

TEST_CASE("tiny GPT on one CPU rank matches the PyTorch golden run") { check_golden(load_model("tiny"), "golden.json"); }

TEST_CASE("tiny GPT with rotary positions on one CPU rank matches the PyTorch golden run") {
  const Model m = load_model(test::source_root() + "/tests/golden/tiny_gpt/tiny_rotary.json");
  REQUIRE(m.position == PositionEmbedding::rotary);
  check_golden(m, "golden_rotary.json");
}
