// How a layout's layers are split over its pp * vpp pipeline stages: an explicit list, Megatron-LM's first
// and last stage counts or its account-for-embedding / account-for-loss rule, or a balance policy: the
// partitioner's split (sim/partition.hpp) from the cost model's per-layer time and memory, with the
// embedding on the first stage and the LM head and loss on the last. Resolved once, at the edge (the
// flags, explore's enumeration, validate's rows), into Layout::stage_layers; the rest of the tree reads that.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sim/partition.hpp"
#include "sim/workload.hpp"

namespace tessel {

enum class Balance {
  time,    // the slowest stage as small as memory allows (the default where a split must be chosen)
  memory,  // the largest stage's memory as small as it goes, then the slowest stage
  even,    // cost-blind: layers / stages each, the remainder on the stages nearest the middle
};
const char* to_string(Balance b);
// "time", "memory", "even"; InputError "<what> <name>: ..." listing them.
Balance parse_balance(const std::string& name, const std::string& what);

// A request for a split, as flags (or a Megatron-LM argument file) give it; `*_from` name the flag or the
// file and flag each came from, for messages.
struct SplitRequest {
  std::vector<int> stage_layers;                             // --stage-layers
  std::optional<int> first_stage_layers, last_stage_layers;  // --first-stage-layers, --last-stage-layers
  bool account_for_embedding = false, account_for_loss = false;
  std::optional<Balance> balance;                            // --balance
  std::string stage_layers_from = "--stage-layers", first_from = "--first-stage-layers",
              last_from = "--last-stage-layers", embedding_from = "--account-for-embedding",
              loss_from = "--account-for-loss", balance_from = "--balance";
  bool megatron() const { return first_stage_layers || last_stage_layers || account_for_embedding || account_for_loss; }
  bool any() const { return !stage_layers.empty() || megatron() || balance.has_value(); }
};

// Megatron-LM's split (transformer_block.py get_num_layers_to_build): with first/last stage counts, pipeline
// rank 0 holds the first count and rank pp-1 the last, the other ranks share the rest evenly; with the
// account flags the embedding and the loss count as one layer each, the total is split evenly over the ranks
// and the first (last) virtual stage builds one layer fewer. Each rank's layers are split evenly over its
// vpp chunks. InputError naming the flag, the value and Megatron's rule it breaks.
std::vector<int> megatron_split(const SplitRequest& r, int layers, const Layout& l);
// floor(layers / stages) each, the layers % stages extra ones on the stages nearest the middle (leaving the
// ends, which hold the embedding and the head, the lighter ones).
std::vector<int> even_split(int layers, int stages);

// The partitioner's inputs for this layout (its own stage_layers ignored): per layer its seconds per
// micro-batch (forward, both backward halves, TP and CP collectives, recompute) and its bytes (state, and
// activations per chunk in flight); per stage the embedding or the head and loss, the rank's in-flight
// chunks and its share of the GPU's memory left after the fixed parts (capacity - ZeRO-3 buffers - recompute
// transient - reserved, over vpp stages a rank). `with_memory` false: time only (no budgets, no bytes).
PartitionCosts partition_costs(const Model& m, const Layout& l, const System& sys, const LayerWork* layer = nullptr,
                               bool with_memory = true);
// The split `balance` gives this layout: time and memory through the partitioner, within memory where any
// split fits (else the time split without budgets: estimate reports the peak); even as even_split.
// InfeasibleLayout when the middle stages outnumber the layers.
std::vector<int> balanced_split(const Model& m, const Layout& l, const System& sys, Balance balance,
                                const LayerWork* layer = nullptr);

// Sets l.stage_layers from the request: its explicit list, Megatron's rule, or its --balance; without one,
// the layout's own split when it has one for its stage count, else the even split when the layers divide,
// else the time-balanced one. An even split is stored as none (describe() prints no layers= for it).
// InputError for contradicting requests (two ways of splitting), naming both.
void resolve_split(Layout& l, const SplitRequest& r, const Model& m, const System& sys);
// An explicit split that is the even one becomes none.
void drop_even_split(Layout& l, int model_layers);

}  // namespace tessel
