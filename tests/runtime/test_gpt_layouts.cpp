// The numerics matrix: every layout over tp {1,2} x pp {1,2,4} x dp {1,2}, every schedule generator, each
// recompute policy, sequence parallelism and ZeRO-1 must reproduce the single-rank run: the loss of each of
// 5 optimizer steps within 1e-5 relative and every parameter's gradient norm (step 1) within 1e-5 relative.
// Rotary positions get their own cases on a Llama-shaped micro model (last test case).
// Why those tolerances: each layout sums the same fp32 terms in another order (micro-batch accumulation,
// all-reduce over tp/dp, vocab-parallel softmax sums); one reordering moves a sum by ~1e-7 relative, and
// five Adam steps amplify differences in near-zero gradient elements only mildly at this scale.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <sstream>

#include "runtime/trainer.hpp"
#include "sim/stage_split.hpp"
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

// The rotary cases use a Llama-shaped micro model: rotary positions with GQA (4 query heads sharing 2 kv
// heads, so tp 2 gives each rank 2 query heads and 1 kv head), RMSNorm, SwiGLU, no biases, untied head.
Model micro_llama() {
  Model m = micro_gpt();
  m.name = "micro-llama";
  m.heads = 4;
  m.kv_heads = 2;
  m.head_dim = 4;
  m.activation = Activation::swiglu;
  m.norm = Norm::rmsnorm;
  m.position = PositionEmbedding::rotary;
  m.rope_theta = 100.0;  // small base: even the slowest pair (w_1 = 100^(-1/2)) turns 0.7 rad over 8 positions
  m.tied_embeddings = false;
  m.bias = false;
  m.dropout = false;
  return m;
}

const std::vector<rt::StepStats>& reference(const Model& m) {
  static std::map<std::string, std::vector<rt::StepStats>> refs;
  auto it = refs.find(m.name);
  if (it == refs.end())
    it = refs.emplace(m.name, rt::train_threads(m, layout(1, 1, 1, "1f1b", 1, kGlobalBatch), {}, kSteps).steps).first;
  return it->second;
}

void check_matches(const Layout& l, const Model& m = micro_gpt()) {
  CAPTURE(l.describe());
  CAPTURE(m.name);
  const auto got = rt::train_threads(m, l, {}, kSteps).steps;
  // The single-rank run of the same global batch (kGlobalBatch's is shared by the model's cases).
  static std::map<int, std::vector<rt::StepStats>> other_batch;
  if (l.global_batch != kGlobalBatch && !other_batch.count(l.global_batch))
    other_batch[l.global_batch] = rt::train_threads(m, layout(1, 1, 1, "1f1b", 1, l.global_batch), {}, kSteps).steps;
  const auto& ref = l.global_batch == kGlobalBatch ? reference(m) : other_batch.at(l.global_batch);
  REQUIRE(got.size() == ref.size());
  for (int k = 0; k < kSteps; ++k) {
    CAPTURE(k);
    CHECK(rel_err(got[k].loss, ref[k].loss) < kLossTol);
  }
  const auto specs = rt::gpt_param_specs(m);
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
        for (const auto& f : sched::families()) check_matches(layout(tp, pp, dp, f.name, vpp_for(f.name), kGlobalBatch));
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

TEST_CASE("rotary positions (GQA, Llama-shaped) match the single-rank run across tp, sp, pp and recomputation") {
  // tp 2 splits query and kv heads (each rank rotates its own heads); sp all-gathers tokens before q/k, so
  // the rotation still sees positions t % seq of whole sequences; zbv runs split I/W backward on pp 2 x vpp 2;
  // selective recomputes the probabilities from the saved post-rotation q/k, full re-runs the rotation.
  const Model m = micro_llama();
  check_matches(layout(2, 1, 1, "1f1b", 1, kGlobalBatch), m);
  Layout sp = layout(2, 1, 1, "1f1b", 1, kGlobalBatch);
  sp.sequence_parallel = true;
  check_matches(sp, m);
  check_matches(layout(1, 2, 1, "zbv", 2, kGlobalBatch), m);
  for (Recompute rc : {Recompute::selective, Recompute::full}) {
    Layout l = layout(2, 2, 1, "1f1b", 1, kGlobalBatch);
    l.recompute = rc;
    check_matches(l, m);
  }
}

TEST_CASE("uneven and balanced stage splits, and interleaved with m not a multiple of pp, match the single-rank run") {
  // 3 + 5 of the micro GPT's 8 layers at pp 2 (1F1B, and tp 2 x dp 2 around it): the first rank holds layers
  // 0-2 with the embedding, the second 3-7 with the head.
  Layout uneven = layout(1, 2, 1, "1f1b", 1, kGlobalBatch);
  uneven.stage_layers = {3, 5};
  check_matches(uneven);
  Layout wide = layout(2, 2, 2, "1f1b", 1, kGlobalBatch);
  wide.stage_layers = {5, 3};
  check_matches(wide);
  // The time-balanced split of interleaved at pp 2 x vpp 3 (8 layers over 6 virtual stages: two of them hold
  // one layer, the split is uneven whatever the costs), as the partitioner chooses it on the CPU system.
  Layout inter = layout(1, 2, 1, "interleaved", 3, kGlobalBatch);
  inter.stage_layers = balanced_split(micro_gpt(), inter, load_system("cpu"), Balance::time);
  REQUIRE(inter.stage_layers.size() == 6);
  CHECK(*std::min_element(inter.stage_layers.begin(), inter.stage_layers.end()) <
        *std::max_element(inter.stage_layers.begin(), inter.stage_layers.end()));
  check_matches(inter);
  // Interleaved under PyTorch's rule with m = 6 micro-batches on pp 4 (Megatron's rule needs a multiple of 4):
  // gbs 6 at dp 1, vpp 2 over the 8 layers (one each), against the single-rank run of batch 6.
  Layout torch_rule = layout(1, 4, 1, "interleaved", 2, 6);
  torch_rule.microbatch_rule = sched::MicrobatchRule::torch;
  check_matches(torch_rule);
  // m = 3 on pp 2 with vpp 3 and a balanced split: both at once.
  Layout both = layout(1, 2, 1, "interleaved", 3, 3);
  both.microbatch_rule = sched::MicrobatchRule::torch;
  both.stage_layers = inter.stage_layers;
  check_matches(both);
}
