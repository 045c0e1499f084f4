// Gradients element by element, and ZeRO's residency, across layouts.
//
// The numerics matrix (test_gpt_layouts.cpp) compares each parameter's gradient norm; here every element of
// every parameter's fully reduced gradient (before clipping) is reassembled by logical name from the shards
// the ranks hold (tensor-parallel rows/columns, ZeRO chunks) and compared with the single-rank run's. Each
// element must also be seen exactly once in the world: that is the rule the clip norm relies on.
// Tolerance: |a - b| <= 1e-5 * max|b| over the tensor at the first step. Layouts sum the same fp32 terms in
// another order (~1e-7 relative to the summands); a misplaced shard or a missing reduction is off by
// O(max|b|). After optimizer steps the parameters themselves differ by such roundings, which AdamW's
// m / sqrt(v) normalisation enlarges for elements with tiny second moments: 1e-4 there (measured worst
// 1.6e-5 at step 3). The attention key bias has an exactly-zero gradient in exact arithmetic (softmax is
// invariant to adding q.b_k to every score); tensors whose reference is below 1e-7 everywhere are compared
// absolutely, as test_gpt_golden.cpp does.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <filesystem>

#include "runtime/comm/thread_comm.hpp"
#include "runtime/trainer.hpp"
#include "runtime/trainer_checkpoint.hpp"
#include "sim/cost/memory.hpp"
#include "tests/runtime/runtime_test_util.hpp"

using namespace tessel;
using namespace tessel::test;

namespace {

constexpr int kGlobalBatch = 16;
constexpr double kElemTol = 1e-5;       // of the tensor's largest |gradient|, first step
constexpr double kElemTolLater = 1e-4;  // after optimizer steps
constexpr double kTinyGrad = 1e-7;

struct FullGrad {
  std::vector<float> value;
  std::vector<int> seen;  // how many ranks reported each element
};
using Grads = std::map<std::string, FullGrad>;

// Full gradients of step `step` (0-based) of a run of `steps` steps.
Grads gradients(const Model& m, const Layout& l, int step, int steps) {
  Grads out;
  std::mutex mu;
  rt::TrainOptions opt;
  opt.optimizer.observe_grads = [&](int k, const rt::Param& p, std::size_t begin, std::size_t end, const float* g) {
    if (k != step) return;
    std::lock_guard<std::mutex> lock(mu);
    FullGrad& f = out[p.spec.name];
    const std::size_t n = static_cast<std::size_t>(p.spec.rows * p.spec.cols);
    f.value.resize(n, 0.0f);
    f.seen.resize(n, 0);
    for (std::size_t i = begin; i < end; ++i) {
      const std::size_t r = static_cast<std::size_t>(p.row0) + i / static_cast<std::size_t>(p.cols);
      const std::size_t c = static_cast<std::size_t>(p.col0) + i % static_cast<std::size_t>(p.cols);
      const std::size_t at = r * static_cast<std::size_t>(p.spec.cols) + c;
      f.value[at] = g[i - begin];
      ++f.seen[at];
    }
  };
  rt::train_threads(m, l, opt, steps);
  return out;
}

void check_elementwise(const Layout& l, const Model& m = micro_gpt(), int step = 0) {
  CAPTURE(l.describe());
  static std::map<std::pair<std::string, int>, Grads> refs;
  auto key = std::make_pair(m.name, step);
  if (!refs.count(key)) refs[key] = gradients(m, layout(1, 1, 1, "1f1b", 1, kGlobalBatch), step, step + 1);
  const Grads& ref = refs.at(key);
  const Grads got = gradients(m, l, step, step + 1);
  REQUIRE(got.size() == ref.size());
  for (const auto& kv : ref) {  // no structured binding: clang 14 cannot capture one in CAPTURE
    const std::string& name = kv.first;
    const FullGrad& r = kv.second;
    CAPTURE(name);
    REQUIRE(got.count(name) == 1);
    const FullGrad& g = got.at(name);
    REQUIRE(g.value.size() == r.value.size());
    float scale = 0;
    for (float x : r.value) scale = std::max(scale, std::abs(x));
    const bool tiny = scale < kTinyGrad;
    const double tol = tiny ? kTinyGrad : (step == 0 ? kElemTol : kElemTolLater) * scale;
    std::size_t bad = 0, unseen = 0, twice = 0;
    double worst = 0;
    for (std::size_t i = 0; i < r.value.size(); ++i) {
      unseen += g.seen[i] == 0;
      twice += g.seen[i] > 1;
      const double err = std::abs(static_cast<double>(g.value[i]) - r.value[i]);
      worst = std::max(worst, err);
      bad += tiny ? std::abs(g.value[i]) >= kTinyGrad : err > tol;
    }
    CAPTURE(worst);
    CAPTURE(scale);
    CHECK(unseen == 0);
    CHECK(twice == 0);
    CHECK(bad == 0);
  }
}


}  // namespace

TEST_CASE("every gradient element matches the single-rank run across tp, pp, dp, schedules and ZeRO stages") {
  // ZeRO 0-3 with and without sequence parallelism on tp 2 x pp 2 (interleaved, 2 chunks) x dp 2: tied
  // embeddings on two ranks, vocab rows split over tp, replicated norms summed over tp, chunks over dp.
  for (int zero : {0, 1, 2, 3})
    for (bool sp : {false, true}) {
      Layout l = layout(2, 2, 2, "interleaved", 2, kGlobalBatch);
      l.zero_stage = zero;
      l.sequence_parallel = sp;
      check_elementwise(l);
    }
  // Split I/W backward with V placement (the first and last stage on one rank) under ZeRO-2 and ZeRO-3: the
  // weight gradients complete in W, after other micro-batches' work.
  for (int zero : {2, 3}) {
    Layout l = layout(1, 2, 2, "zbv", 2, kGlobalBatch);
    l.zero_stage = zero;
    check_elementwise(l);
  }
  check_elementwise(layout(2, 4, 1, "zb1p", 1, kGlobalBatch));
  check_elementwise(layout(1, 4, 2, "dualpipev", 2, kGlobalBatch));
}

TEST_CASE("gradients after three optimizer steps still match element by element (ZeRO-3, full recompute)") {
  // By step 3 the parameters have moved through the sharded AdamW update and ZeRO-3's gathers: a stale or
  // mis-gathered shard shows up in the gradients computed from them.
  Layout l = layout(2, 2, 2, "1f1b", 1, kGlobalBatch);
  l.zero_stage = 3;
  l.recompute = Recompute::full;
  check_elementwise(l, micro_gpt(), 2);
}

TEST_CASE("ZeRO residency: what a rank keeps between steps, against the cost model, and its transient peak") {
  // Expected, per rank with n parameters (fp32 runtime, cost::state_bytes_per_param for fp32: 4 + 4 + 8
  // bytes per parameter; ZeRO-1 divides the 8 optimizer bytes by dp, ZeRO-2 the gradients' 4 too, ZeRO-3
  // the weights' 4 too). Shards are padded per parameter group to a multiple of dp, so the runtime holds
  // at most (groups * (dp - 1)) elements more than n / dp: well under 1% here.
  // Peak (pp 2, 1f1b, one stage per rank): ZeRO 0/1 hold everything persistently (peak = persistent).
  // ZeRO-2 adds the stage's full gradient while a backward runs (+4n). ZeRO-3 adds that and the gathered
  // rest of the parameters (+4n + 4(n - n/dp)).
  const Model m = micro_gpt();
  const int dp = 4;
  std::vector<std::int64_t> n_of_rank;
  for (int zero : {0, 1, 2, 3}) {
    CAPTURE(zero);
    Layout l = layout(1, 2, dp, "1f1b", 1, kGlobalBatch);
    l.zero_stage = zero;
    const auto res = rt::train_threads(m, l, {}, 2);
    const cost::StateBytes sb = cost::state_bytes_per_param(l);
    for (std::size_t r = 0; r < res.state_memory.size(); ++r) {
      CAPTURE(r);
      const rt::StateMemory& s = res.state_memory[r];
      if (zero == 0) {
        n_of_rank.push_back(s.weights / 4);
        CHECK(s.grads == s.weights);
        CHECK(s.optimizer == 2 * s.weights);
        CHECK(s.peak == s.persistent());
        continue;
      }
      const double n = static_cast<double>(n_of_rank.at(r));
      CHECK(std::abs(s.weights - sb.weights * n) <= 0.01 * sb.weights * n);
      CHECK(std::abs(s.grads - sb.grads * n) <= 0.01 * sb.grads * n);
      CHECK(std::abs(s.optimizer - sb.optimizer * n) <= 0.01 * sb.optimizer * n);
      const double extra = static_cast<double>(s.peak - s.persistent());
      const double want = zero == 1 ? 0.0 : zero == 2 ? 4.0 * n : 4.0 * n + 4.0 * (n - n / dp);
      CHECK(std::abs(extra - want) <= 0.01 * 4.0 * n);
    }
  }
}

TEST_CASE("a ZeRO-3 checkpoint resumes bit-identically under ZeRO-3 and within 1e-5 under ZeRO-0 and ZeRO-2") {
  // The checkpoint stores full tensors by logical name: ZeRO-3 gathers its parameter shards and Adam moment
  // shards to write them, and a ZeRO-k run keeps its own shards of them on load. Same layout: steps 3-4
  // after the resume equal an uninterrupted run's bit for bit. Other ZeRO stages and dp: fp32 order only.
  Layout z3 = layout(2, 2, 2, "1f1b", 1, kGlobalBatch);
  z3.zero_stage = 3;
  const auto whole = run_losses(z3, 4, "", "");
  const auto dir = (std::filesystem::temp_directory_path() / ("tessel_zero3_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  run_losses(z3, 2, "", dir);
  const auto same = run_losses(z3, 2, dir, "");
  REQUIRE(same.size() == 2u);
  CHECK(same[0] == whole[2]);
  CHECK(same[1] == whole[3]);
  Layout z0 = layout(1, 2, 1, "1f1b", 1, kGlobalBatch);
  const auto plain = run_losses(z0, 2, dir, "");
  Layout z2 = layout(1, 1, 4, "1f1b", 1, kGlobalBatch);
  z2.zero_stage = 2;
  const auto other = run_losses(z2, 2, dir, "");
  for (int k = 0; k < 2; ++k) {
    CHECK(rel_err(plain[k], whole[2 + k]) < 1e-5);
    CHECK(rel_err(other[k], whole[2 + k]) < 1e-5);
  }
  std::filesystem::remove_all(dir);
}
