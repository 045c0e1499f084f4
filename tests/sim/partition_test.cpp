// The stage partitioner (sim/partition.hpp) against splits derived by hand and against an exhaustive search
// over every split of small models (an independent implementation: it enumerates all compositions).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "sim/partition.hpp"

using namespace tessel;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// L identical layers of `layer` seconds over S stages; the first stage adds `first`, the last `last`.
PartitionCosts uniform(int L, int S, double layer, double first, double last) {
  PartitionCosts c;
  c.layer_s.assign(static_cast<std::size_t>(L), layer);
  c.layer_bytes.assign(static_cast<std::size_t>(L), 0.0);
  c.act_bytes.assign(static_cast<std::size_t>(L), 0.0);
  c.stage_s.assign(static_cast<std::size_t>(S), 0.0);
  c.stage_s.front() += first;
  c.stage_s.back() += last;
  c.stage_bytes.assign(static_cast<std::size_t>(S), 0.0);
  c.act_scale.assign(static_cast<std::size_t>(S), 1.0);
  c.budget_bytes.assign(static_cast<std::size_t>(S), kInf);
  return c;
}

std::vector<int> runs(std::initializer_list<std::pair<int, int>> count_times) {
  std::vector<int> v;
  for (auto [n, k] : count_times) v.insert(v.end(), static_cast<std::size_t>(k), n);
  return v;
}

// Every split of the layers over the stages (middle stages at least one layer), by recursion.
void each_split(int L, int S, const std::function<void(const std::vector<int>&)>& f) {
  std::vector<int> cur;
  std::function<void(int, int)> go = [&](int s, int left) {
    if (s == S - 1) {
      if (S > 1 || left >= 0) {
        cur.push_back(left);
        f(cur);
        cur.pop_back();
      }
      return;
    }
    const int need_later = std::max(0, S - 2 - s);  // middle stages after this one
    for (int n = (s == 0 ? 0 : 1); n + need_later <= left; ++n) {
      cur.push_back(n);
      go(s + 1, left - n);
      cur.pop_back();
    }
  };
  go(0, L);
}

struct Brute {
  double slowest = kInf, squares = kInf;
  bool found = false;
};

// The exhaustive optimum: the smallest slowest stage within budgets, and the smallest sum of squared stage
// times among those (the partitioner's order).
Brute brute_force(const PartitionCosts& c) {
  Brute b;
  each_split(c.layers(), c.stages(), [&](const std::vector<int>& split) {
    double slowest = 0, squares = 0;
    int first = 0;
    for (int s = 0; s < c.stages(); ++s) {
      const int end = first + split[static_cast<std::size_t>(s)];
      if (c.bytes(s, first, end) > c.budget_bytes[static_cast<std::size_t>(s)]) return;
      const double t = c.time(s, first, end);
      slowest = std::max(slowest, t);
      squares += t * t;
      first = end;
    }
    b.found = true;
    if (slowest < b.slowest - 1e-12 || (std::abs(slowest - b.slowest) <= 1e-12 && squares < b.squares)) {
      b.slowest = slowest;
      b.squares = squares;
    }
  });
  return b;
}

double squares_of(const PartitionCosts& c, const std::vector<int>& split) {
  double sq = 0;
  for (int s = 0, first = 0; s < c.stages(); first += split[static_cast<std::size_t>(s)], ++s) {
    const double t = c.time(s, first, first + split[static_cast<std::size_t>(s)]);
    sq += t * t;
  }
  return sq;
}

}  // namespace

TEST_CASE("partition: Llama 3 405B's lighter first and last stages come out of the costs") {
  // 126 layers of 1.0 s, the embedding 0.05 s on the first stage, the head and loss 0.7 s on the last (its
  // 2.1 B-parameter logits GEMM is about 2/3 of a 3.2 B-parameter layer's GEMMs).
  // 128 virtual stages (pp 16 x vpp 8): a stage holding a layer costs at least 1.0, the first 1.05 and the last
  // 1.7 with one, so the slowest stage is 1.0 exactly when both ends hold none and the other 126 one each:
  // 0,1x126,0, Meta's split (Llama 3 Sec. 3.3.2).
  const auto meta = partition(uniform(126, 128, 1.0, 0.05, 0.7));
  REQUIRE(meta);
  CHECK(meta->layers == runs({{0, 1}, {1, 126}, {0, 1}}));
  CHECK(meta->slowest_s == doctest::Approx(1.0));
  // 32 stages (pp 16 x vpp 2): the slowest stage is at least 4 (126 / 32 > 3.9); with 4 the first holds at
  // most 3 (4.05 > 4), the last at most 3 (3.7), the 30 others 4: 3 + 120 + 3 = 126, the only split with 4.
  const auto v2 = partition(uniform(126, 32, 1.0, 0.05, 0.7));
  REQUIRE(v2);
  CHECK(v2->layers == runs({{3, 1}, {4, 30}, {3, 1}}));
  // 16 stages (pp 16): at least 126 / 16 = 7.875, so 8: first and last 7, the others 8: 7 + 112 + 7 = 126.
  CHECK(partition(uniform(126, 16, 1.0, 0.05, 0.7))->layers == runs({{7, 1}, {8, 14}, {7, 1}}));
}

TEST_CASE("partition: a heavy head moves layers off the last stage; even costs split evenly") {
  // Llama 3 8B at pp 4: 32 layers of 1.0, the head 2.4 layers' worth (128256 x 4096 logits against 218 M
  // parameters a layer). The last stage takes at most 6 (8.4) if the slowest is 9; the first at most 8
  // (9.05 > 9), the middle two 9: 8 + 9 + 9 + 6 = 32. With 8.4 or less the first three hold at most 8 each.
  const auto p = partition(uniform(32, 4, 1.0, 0.05, 2.4));
  REQUIRE(p);
  CHECK(p->layers == std::vector<int>{8, 9, 9, 6});
  CHECK(p->slowest_s == doctest::Approx(9.0));
  // No extras: 8 layers over 4 stages, 2 each.
  CHECK(partition(uniform(8, 4, 1.0, 0, 0))->layers == std::vector<int>{2, 2, 2, 2});
  // A tie between 3,2 and 2,3 (same slowest, same squares) goes to the later stage, which keeps fewer
  // micro-batches in flight under 1F1B.
  CHECK(partition(uniform(5, 2, 1.0, 0, 0))->layers == std::vector<int>{2, 3});
  // One stage holds everything; more middle stages than layers cannot be split.
  CHECK(partition(uniform(5, 1, 1.0, 0.1, 0.2))->layers == std::vector<int>{5});
  CHECK_FALSE(partition(uniform(2, 5, 1.0, 0, 0)));
  CHECK(partition(uniform(3, 5, 1.0, 0, 0))->layers == std::vector<int>{0, 1, 1, 1, 0});
}

TEST_CASE("partition: memory budgets bound each stage, and the memory objective balances bytes") {
  // 12 layers over 3 stages; 1 byte of state and 1 of activations per layer; the first stage keeps 3
  // micro-batches in flight (1F1B's p - r), the second 2, the last 1: a layer costs 4, 3, 2 bytes there.
  PartitionCosts c = uniform(12, 3, 1.0, 0, 0);
  c.layer_bytes.assign(12, 1.0);
  c.act_bytes.assign(12, 1.0);
  c.act_scale = {3, 2, 1};
  // No budget: 4,4,4 (time). A budget of 12 bytes a stage: at most 3 layers on the first (12), 4 on the second
  // (12), 6 on the last (12): 3 + 4 + 5 = 12 fits, slowest 5 with 3,4,5 and no other split has a smaller one.
  CHECK(partition(c)->layers == std::vector<int>{4, 4, 4});
  c.budget_bytes.assign(3, 12.0);
  const auto tight = partition(c);
  REQUIRE(tight);
  CHECK(tight->layers == std::vector<int>{3, 4, 5});
  CHECK(tight->largest_bytes == doctest::Approx(12.0));
  // Too tight: 2 + 3 + 5 = 10 < 12 layers fit under 10 bytes a stage.
  c.budget_bytes.assign(3, 10.0);
  CHECK_FALSE(partition(c));
  // The memory objective without budgets: the largest stage bytes 4 a, 3 b, 2 c with a + b + c = 12 is at
  // least 12 / (1/4 + 1/3 + 1/2) = 11.08, so 12 at the integer optimum: a <= 3, b <= 4, c <= 6, and among
  // 3 + 4 + 5 (slowest 5) and 3 + 3 + 6 or 2 + 4 + 6 (slowest 6) the fastest is 3,4,5.
  c.budget_bytes.assign(3, kInf);
  const auto mem = partition(c, Objective::memory);
  REQUIRE(mem);
  CHECK(mem->largest_bytes == doctest::Approx(12.0));
  CHECK(mem->layers == std::vector<int>{3, 4, 5});
}

TEST_CASE("partition: Megatron's block recompute makes a stage's first layers dearer") {
  // The first 2 layers of each stage recompute their forward (0.5 s more each): a stage of n layers costs
  // n + 0.5 min(n, 2). 10 layers over 2 stages: 5,5 costs 6 each; 4,6 costs 5 and 7. Even.
  PartitionCosts c = uniform(10, 2, 1.0, 0, 1.0);
  c.block_layers = 2;
  c.block_s = 0.5;
  // With the head (1.0) on the last stage: 6,4 costs 7 and 6; 5,5 costs 6 and 7; both 7, squares 85 either
  // way; the tie goes to the later stage: 5,5.
  const auto p = partition(c);
  REQUIRE(p);
  CHECK(p->slowest_s == doctest::Approx(7.0));
  CHECK(p->layers == std::vector<int>{5, 5});
  CHECK(c.time(0, 0, 1) == doctest::Approx(1.5));
  CHECK(c.time(0, 0, 5) == doctest::Approx(6.0));
}

TEST_CASE("partition: the exact optimum of every split of small models, against exhaustive search") {
  // A fixed linear congruential generator: the same 400 models on every machine.
  std::uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>((state >> 33) % 1000) / 1000.0;
  };
  int checked = 0, infeasible = 0;
  for (int k = 0; k < 400; ++k) {
    const int L = 1 + static_cast<int>(next() * 9), S = 1 + static_cast<int>(next() * 5);
    PartitionCosts c = uniform(L, S, 0, 0.3 * next(), 2.0 * next());
    for (std::size_t j = 0; j < c.layer_s.size(); ++j) {
      c.layer_s[j] = 0.2 + next();
      c.layer_bytes[j] = next();
      c.act_bytes[j] = next();
    }
    for (std::size_t s = 0; s < c.stage_s.size(); ++s) {
      c.act_scale[s] = 1 + static_cast<int>(next() * 4);
      c.budget_bytes[s] = k % 3 == 0 ? kInf : 1.0 + 6.0 * next();
    }
    CAPTURE(k);
    const Brute b = brute_force(c);
    const auto p = partition(c);
    CHECK(p.has_value() == b.found);
    if (!p || !b.found) {
      ++infeasible;
      continue;
    }
    CHECK(p->slowest_s == doctest::Approx(b.slowest).epsilon(1e-12));
    CHECK(squares_of(c, p->layers) == doctest::Approx(b.squares).epsilon(1e-9));
    ++checked;
  }
  // Both outcomes were exercised.
  CHECK(checked > 200);
  CHECK(infeasible > 20);
}

// sim/stage_split.hpp: Megatron-LM's rules (transformer_block.py get_num_layers_to_build), the even split,
// and a request resolved onto a layout.
#include "sim/stage_split.hpp"

namespace {

Layout pipeline(int pp, int vpp) {
  Layout l;
  l.pp = pp;
  l.vpp = vpp;
  l.schedule = vpp > 1 ? sched::Kind::interleaved : sched::Kind::one_f_one_b;
  l.global_batch = 8 * pp;
  l.precision = Precision::fp32;  // the cpu system's
  return l;
}

std::string refusal(const SplitRequest& r, int layers, const Layout& l) {
  try {
    megatron_split(r, layers, l);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("stage_split: Megatron-LM's first/last stage counts and account-for flags, derived by hand") {
  // 126 layers at pp 16 with --first-stage-layers 7 --last-stage-layers 7: 126 - 14 = 112 over the other 14
  // ranks, 8 each: 7,8x14,7.
  SplitRequest fl;
  fl.first_stage_layers = 7;
  fl.last_stage_layers = 7;
  CHECK(megatron_split(fl, 126, pipeline(16, 1)) == runs({{7, 1}, {8, 14}, {7, 1}}));
  // The same at vpp 2 (32 virtual stages): each rank's layers over its 2 chunks, stage s on rank s % 16:
  // rank 0 and 15 hold 7 (not a multiple of 2): refused with Megatron's rule.
  CHECK(refusal(fl, 126, pipeline(16, 2)).find("do not split over its vpp 2 chunks") != std::string::npos);
  // Only the first: 10 layers, first 4 at pp 4 -> 6 over 3 ranks, 2 each: 4,2,2,2.
  SplitRequest first;
  first.first_stage_layers = 4;
  CHECK(megatron_split(first, 10, pipeline(4, 1)) == std::vector<int>{4, 2, 2, 2});
  // A remainder the other ranks cannot share: 10 - 3 = 7 over 3 ranks.
  first.first_stage_layers = 3;
  CHECK(refusal(first, 10, pipeline(4, 1)).find("not a multiple of 3") != std::string::npos);
  // Account for embedding and loss: 30 layers + 2 = 32 over pp 4, 8 a rank; the first virtual stage and the
  // last build one fewer: 7,8,8,7. At vpp 2: 4 a chunk, 3,4,4,4,4,4,4,3.
  SplitRequest acc;
  acc.account_for_embedding = acc.account_for_loss = true;
  CHECK(megatron_split(acc, 30, pipeline(4, 1)) == std::vector<int>{7, 8, 8, 7});
  CHECK(megatron_split(acc, 30, pipeline(4, 2)) == std::vector<int>{3, 4, 4, 4, 4, 4, 4, 3});
  // 31 + 2 = 33 does not divide over 4.
  CHECK(refusal(acc, 31, pipeline(4, 1)).find("do not divide over pp 4") != std::string::npos);
  // Megatron refuses both ways at once.
  acc.first_stage_layers = 7;
  CHECK(refusal(acc, 30, pipeline(4, 1)).find("does not combine") != std::string::npos);
}

TEST_CASE("stage_split: the even split and a request resolved onto a layout") {
  // 10 layers over 4 stages: 2 each and the 2 extra on the middle stages (from (4 - 2) / 2 = 1): 2,3,3,2.
  CHECK(even_split(10, 4) == std::vector<int>{2, 3, 3, 2});
  CHECK(even_split(8, 4) == std::vector<int>{2, 2, 2, 2});
  const Model tiny = load_model("tiny");  // 8 layers
  const System cpu = load_system("cpu");
  // An explicit list; one that is even is stored as none (describe() prints no layers=).
  Layout l = pipeline(2, 1);
  SplitRequest r;
  r.stage_layers = {3, 5};
  resolve_split(l, r, tiny, cpu);
  CHECK(l.stage_layers == std::vector<int>{3, 5});
  r.stage_layers = {4, 4};
  resolve_split(l, r, tiny, cpu);
  CHECK(l.stage_layers.empty());
  // A list of the wrong length or sum names the flag and the rule.
  r.stage_layers = {3, 3};
  CHECK_THROWS_WITH_AS(resolve_split(l, r, tiny, cpu), doctest::Contains("--stage-layers: the entries sum to 6, and the model has 8"),
                       InputError);
  // Two ways of splitting at once.
  r.stage_layers = {3, 5};
  r.balance = Balance::even;
  CHECK_THROWS_WITH_AS(resolve_split(l, r, tiny, cpu), doctest::Contains("two ways of splitting"), InputError);
  // No request and 8 layers over 3 stages: the time-balanced split, a middle stage at least as full as the
  // ends (which carry the embedding and the head).
  Layout three = pipeline(3, 1);
  resolve_split(three, SplitRequest{}, tiny, cpu);
  REQUIRE(three.stage_layers.size() == 3);
  CHECK(three.stage_layers[0] + three.stage_layers[1] + three.stage_layers[2] == 8);
  CHECK(three.stage_layers[1] >= std::max(three.stage_layers[0], three.stage_layers[2]));
  // --balance even on the same: 2,3,3 is not possible (3 stages, 2 extra from (3 - 2) / 2 = 0): 3,3,2.
  SplitRequest even;
  even.balance = Balance::even;
  resolve_split(three, even, tiny, cpu);
  CHECK(three.stage_layers == std::vector<int>{3, 3, 2});
  CHECK_THROWS_WITH_AS(parse_balance("fast", "--balance"), doctest::Contains("--balance fast: unknown balance"), InputError);
}
