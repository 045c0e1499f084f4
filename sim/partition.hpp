// The stage partitioner: contiguous ranges of a model's layers for the S = pp * vpp pipeline stages that
// minimise the slowest stage within every stage's memory, by an exact dynamic programme over the layer
// boundaries. It knows numbers only; sim/stage_split.hpp builds them from the cost model (per-layer time and
// memory, the embedding on the first stage, the LM head and loss on the last) and applies the result.
//
// Why a dynamic programme: the slowest stage of the best split of the first j layers over s + 1 stages is
// min over i of max(best of the first i layers over s stages, cost of stage s holding layers [i, j)), and a
// stage's cost only grows with the layers it holds, so the scan over i stops as soon as stage s alone costs
// more than the best found. Each stage then looks at about as many boundaries as it holds layers: Llama 3
// 405B's 126 layers into 128 virtual stages takes well under a millisecond (BM_Partition126Into128 in tests/explore/bench_explore.cpp).
#pragma once

#include <optional>
#include <vector>

namespace tessel {

// Per micro-batch and per GPU. Layer j costs layer_s[j] seconds, layer_bytes[j] bytes of state (weights,
// gradients, optimizer state) and act_bytes[j] bytes of activations per micro-batch chunk its stage keeps in
// flight; stage s keeps act_scale[s] of them at its peak. Stage s adds stage_s[s] seconds and stage_bytes[s]
// bytes of its own (the embedding, the LM head and loss, extra layers such as multi-token prediction) and may
// hold at most budget_bytes[s] (infinity: no limit). Under Megatron's block recompute the first block_layers
// layers of every stage rerun their forward (block_s seconds more each) and keep only their input
// (block_act_bytes less each).
struct PartitionCosts {
  std::vector<double> layer_s, layer_bytes, act_bytes;
  std::vector<double> stage_s, stage_bytes, act_scale, budget_bytes;
  int block_layers = 0;
  double block_s = 0, block_act_bytes = 0;

  int layers() const { return static_cast<int>(layer_s.size()); }
  int stages() const { return static_cast<int>(stage_s.size()); }
  // Stage s holding layers [first, end): its seconds per micro-batch and its bytes at the peak.
  double time(int s, int first, int end) const;
  double bytes(int s, int first, int end) const;
};

enum class Objective {
  time,    // the slowest stage, within the budgets
  memory,  // the largest stage in bytes, then the slowest stage within that
};

struct Partition {
  std::vector<int> layers;  // per stage
  double slowest_s = 0;     // the largest stage time
  double largest_bytes = 0; // the largest stage memory
};

// The exact optimum of `objective` over every split in which a middle stage holds at least one layer (the
// first and the last may hold none: the embedding alone, the head alone, as Llama 3 placed them) and every
// stage fits its budget; among optima the one with the smallest sum of squared stage times (the most even),
// then the one with the most layers on later stages (which keep fewer micro-batches in flight). nullopt when
// no split fits. The costs' vectors must agree in size (TESSEL_CHECK) and hold non-negative numbers.
std::optional<Partition> partition(const PartitionCosts& c, Objective objective = Objective::time);

}  // namespace tessel
