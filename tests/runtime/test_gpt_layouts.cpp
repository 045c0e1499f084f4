// The numerics matrix: every layout over tp {1,2} x pp {1,2,4} x dp {1,2}, every schedule generator, each
// recompute policy, sequence parallelism and ZeRO-1 must reproduce the single-rank run: the loss of each of
// 5 optimizer steps within 1e-5 relative and every parameter's gradient norm (step 1) within 1e-5 relative.
// Why those tolerances: each layout sums the same fp32 terms in another order (micro-batch accumulation,
// all-reduce over tp/dp, vocab-parallel softmax sums); one reordering moves a sum by ~1e-7 relative, and
// five Adam steps amplify differences in near-zero gradient elements only mildly at this scale.
#include <doctest/doctest.h>

#include <map>
#include <sstream>

#include "runtime/trainer.hpp"
#include "sim/schedule/schedule.hpp"
#include "tests/runtime/runtime_test_util.hpp"

using namespace tessel;
using namespace tessel::test;

namespace {

constexpr int kSteps = 5;
constexpr int kGlobalBatch = 16;    // dualpipev on pp 4 needs m >= 2 pp = 8 micro-batches per dp replica
constexpr double kLossTol = 1e-5;
constexpr double kGradNormTol = 1e-5;
constexpr double kTinyGrad = 1e-7;  // below this a parameter's gradient norm is compared absolutely

const std::vector<rt::StepStats>& reference() {
  static const auto ref = rt::train_threads(micro_gpt(), layout(1, 1, 1, "1f1b", 1, kGlobalBatch), {}, kSteps).steps;
  return ref;
}

void check_matches(const Layout& l) {
  CAPTURE(l.describe());
  const auto got = rt::train_threads(micro_gpt(), l, {}, kSteps).steps;
  const auto& ref = reference();
  REQUIRE(got.size() == ref.size());
  for (int k = 0; k < kSteps; ++k) {
    CAPTURE(k);
    CHECK(rel_err(got[k].loss, ref[k].loss) < kLossTol);
  }
  const auto specs = rt::gpt_param_specs(micro_gpt());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CAPTURE(specs[i].name);
    const double a = got[0].param_grad_norms[i], b = ref[0].param_grad_norms[i];
    if (b < kTinyGrad) CHECK(a < kTinyGrad);
    else CHECK(rel_err(a, b) < kGradNormTol);
  }
}

int vpp_for(const std::string& gen) {
  return gen == "interleaved" || gen == "looped-bfs" || gen == "zbv" || gen == "dualpipev" ? 2 : 1;
}

}  // namespace

TEST_CASE("every tp x pp x dp layout with every schedule generator matches the single-rank run") {
  for (int tp : {1, 2})
    for (int dp : {1, 2})
      for (int pp : {1, 2, 4}) {
        if (pp == 1) {
          check_matches(layout(tp, 1, dp, "1f1b", 1, kGlobalBatch));
          continue;
        }
        for (const auto& gen : sched::generator_names()) check_matches(layout(tp, pp, dp, gen, vpp_for(gen), kGlobalBatch));
      }
}

TEST_CASE("recompute policies match the single-rank run on pipelined, tensor-parallel layouts") {
  for (const std::string gen : {"1f1b", "zbv", "zb1p"})
    for (Recompute rc : {Recompute::selective, Recompute::full}) {
      Layout l = layout(2, 2, 1, gen, vpp_for(gen), kGlobalBatch);
      l.recompute = rc;
      check_matches(l);
      if (rc == Recompute::full) {
        l.recompute_method = RecomputeMethod::block;
        l.recompute_layers = 1;
        check_matches(l);
        l.recompute_method = RecomputeMethod::uniform;
        l.recompute_layers = 2;
        check_matches(l);
      }
    }
}

TEST_CASE("sequence parallelism and the distributed optimizer match the single-rank run") {
  for (int zero : {0, 1, 2, 3})
    for (bool sp : {false, true}) {
      Layout l = layout(2, 2, 2, "interleaved", 2, kGlobalBatch);
      l.sequence_parallel = sp;
      l.zero_stage = zero;
      check_matches(l);
    }
}
