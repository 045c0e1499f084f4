#include "sim/stage_split.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

#include "sim/cost/memory.hpp"
#include "util/error.hpp"

namespace tessel {

namespace {

std::string s(long long v) { return std::to_string(v); }

[[noreturn]] void refuse(const std::string& message) { throw InputError(message); }

// Megatron's layers per pipeline rank from the first/last stage counts (the other ranks share the rest).
std::vector<int> first_last_per_rank(const SplitRequest& r, int layers, int pp) {
  const std::string first = r.first_stage_layers ? r.first_from + " " + s(*r.first_stage_layers) : "";
  const std::string last = r.last_stage_layers ? r.last_from + " " + s(*r.last_stage_layers) : "";
  const std::string both = first + (first.empty() || last.empty() ? "" : " and ") + last;
  if (r.account_for_embedding || r.account_for_loss)
    refuse(both + " with " + (r.account_for_embedding ? r.embedding_from : r.loss_from) +
           ": Megatron-LM does not combine first/last stage layer counts with the account-for flags "
           "(transformer_block.py get_num_layers_to_build: \"Does not support standalone embedding stage and "
           "standalone loss stage with uneven pp\"); give one or the other");
  if (pp < 2) refuse(both + ": a first or last pipeline stage of its own needs pp > 1 (got pp " + s(pp) + ")");
  int left = layers, ranks = pp;
  if (r.first_stage_layers) left -= *r.first_stage_layers, --ranks;
  if (r.last_stage_layers) left -= *r.last_stage_layers, --ranks;
  if (left < 0) refuse(both + ": more than the model's " + s(layers) + " layers");
  if (ranks == 0 && left != 0)
    refuse(both + ": " + s(layers - left) + " layers of the model's " + s(layers) + ", and pp 2 has no other rank for the rest");
  if (ranks > 0 && left % ranks != 0)
    refuse(both + ": leave " + s(left) + " layers for the other " + s(ranks) + " pipeline ranks, not a multiple of " +
           s(ranks) + " (Megatron-LM: \"the left over layers must be divisible by left over stages\")");
  std::vector<int> per_rank(static_cast<std::size_t>(pp), ranks > 0 ? left / ranks : 0);
  if (r.first_stage_layers) per_rank.front() = *r.first_stage_layers;
  if (r.last_stage_layers) per_rank.back() = *r.last_stage_layers;
  return per_rank;
}

// Megatron's layers per pipeline rank with the embedding and the loss counted as layers.
std::vector<int> accounted_per_rank(const SplitRequest& r, int layers, int pp) {
  const int total = layers + (r.account_for_embedding ? 1 : 0) + (r.account_for_loss ? 1 : 0);
  if (total % pp != 0) {
    std::string flags = r.account_for_embedding ? r.embedding_from : "";
    if (r.account_for_loss) flags += (flags.empty() ? "" : " and ") + r.loss_from;
    refuse(flags + ": the model's " + s(layers) + " layers + " + s(total - layers) + " = " + s(total) +
           " do not divide over pp " + s(pp) +
           " (Megatron-LM: \"num_layers should be divisible by pipeline_model_parallel_size\")");
  }
  return std::vector<int>(static_cast<std::size_t>(pp), total / pp);
}

// The cost model's seconds per micro-batch of one transformer layer, recompute included where every layer
// reruns (full uniform, selective); Megatron's block method is the partitioner's block_* terms instead.
bool block_recompute(const Layout& l) {
  return l.recompute == Recompute::full && l.recompute_method == RecomputeMethod::block && l.recompute_layers > 0;
}

void fill_memory(PartitionCosts& c, const Model& m, const Layout& l, const System& sys,
                 const std::vector<StageWork>& ends) {
  const int S = l.num_stages(), L = m.layers;
  const cost::StateBytes sb = cost::state_bytes_per_param(l, sys.gpu.arch);
  // A MoE layer's routed experts keep their states over their own replicas (edp); under fp8 the GEMMs' weights
  // (all but the wide parameters) take their fp8 bytes (cost::StateBytes::gemm_weights).
  const double expert_state = cost::expert_state_bytes_per_param(l, sys.gpu.arch).gemm_total();
  const auto layer_state_of = [&](const Model& lm) {
    const double experts = layer_expert_params_per_gpu(lm, l), others = layer_params_per_gpu(lm, l) - experts;
    return sb.state_bytes(others, others - layer_wide_params_per_gpu(lm, l)) + expert_state * experts;
  };
  const double layer_state = layer_state_of(m);
  const double mb = l.num_microbatches();
  c.layer_bytes.assign(static_cast<std::size_t>(L), layer_state);
  // Per layer as the workload's stages count them (cost::stage_activation_bytes): under block recompute the
  // layers beyond the block keep everything, the block's keep their input only.
  const int rec = l.recompute == Recompute::full && !block_recompute(l) ? 1 : 0;
  const double kept = cost::stage_activation_bytes(m, l, 1, rec);
  c.act_bytes.assign(static_cast<std::size_t>(L), kept);
  if (mixed_layers(m)) {
    // A MoE model's dense layers: their own parameters and activations. (The block method's saving below is
    // the MoE layers'; a block of dense layers saves a little less.)
    const Model dm = dense_part(m);
    for (int i : m.moe.dense_layers) {
      c.layer_bytes[static_cast<std::size_t>(i)] = layer_state_of(dm);
      c.act_bytes[static_cast<std::size_t>(i)] = cost::stage_activation_bytes(dm, l, 1, rec);
    }
  }
  if (block_recompute(l)) {
    c.block_act_bytes = kept - cost::stage_activation_bytes(m, l, 1, 1);
    // The partitioner takes one block saving for every stage: with dense layers among MoE layers, the smaller
    // (a dense layer's), so that no stage is thought to fit when it does not (stage_work counts each kind).
    if (mixed_layers(m)) {
      const Model dm = dense_part(m);
      c.block_act_bytes = std::min(c.block_act_bytes, cost::stage_activation_bytes(dm, l, 1, 0) - cost::stage_activation_bytes(dm, l, 1, 1));
    }
  }
  const double fixed = (1.0 + l.fragmentation) * (cost::zero3_gather_bytes(m, l, sys.gpu.arch) + cost::recompute_transient_bytes(m, l)) +
                       sys.memory_reserved_bytes;
  const double budget = std::max(0.0, sys.gpu.memory_bytes - fixed) / l.vpp;
  for (int st = 0; st < S; ++st) {
    const auto k = static_cast<std::size_t>(st);
    const double chunks = cost::inflight_chunks(l, l.rank_of_stage(st));
    // estimate.cpp: a rank's chunks in flight times its average chunk, and the allocator's fragmentation on them.
    const double frag = 1.0 + l.fragmentation;
    c.act_scale[k] = frag * chunks / l.vpp;
    c.budget_bytes[k] = budget;
    const StageWork& e = ends[k];
    // The first stage's extras live per micro-batch in flight, the last stage's logits until its backward
    // (cost::last_stage_extras_alive), as estimate.cpp's memory() counts them.
    const double extras = frag * (st == 0 ? e.act_extra_bytes * std::min(chunks, mb)
                                  : st == S - 1 ? e.act_extra_bytes * cost::last_stage_extras_alive(l) : 0.0);
    // A stage's own activations besides its layers' (the last stage's MTP module), as the estimate counts them.
    const double others = e.params - e.expert_params;
    c.stage_bytes[k] = sb.state_bytes(others, std::max(0.0, others - e.wide_params)) + expert_state * e.expert_params +
                       extras + c.act_scale[k] * e.act_bytes;
  }
}

}  // namespace

const char* to_string(Balance b) {
  switch (b) {
    case Balance::time: return "time";
    case Balance::memory: return "memory";
    case Balance::even: return "even";
  }
  return "?";
}

Balance parse_balance(const std::string& name, const std::string& what) {
  if (name == "time") return Balance::time;
  if (name == "memory") return Balance::memory;
  if (name == "even") return Balance::even;
  refuse(what + " " + name + ": unknown balance; choose time (the slowest stage as small as memory allows), memory "
         "(the largest stage's memory as small as it goes) or even (layers / stages each, cost-blind)");
}

std::vector<int> megatron_split(const SplitRequest& r, int layers, const Layout& l) {
  const std::vector<int> per_rank = r.first_stage_layers || r.last_stage_layers ? first_last_per_rank(r, layers, l.pp)
                                                                                : accounted_per_rank(r, layers, l.pp);
  const std::string from = r.first_stage_layers || r.last_stage_layers ? "the first/last stage layer counts"
                                                                       : "the account-for flags";
  for (int k = 0; k < l.pp; ++k)
    if (per_rank[static_cast<std::size_t>(k)] % l.vpp != 0)
      refuse(from + " give pipeline rank " + s(k) + " " + s(per_rank[static_cast<std::size_t>(k)]) +
             " layers, which do not split over its vpp " + s(l.vpp) +
             " chunks (Megatron-LM: \"num_layers_per_pipeline_rank should be divisible by vp_size\")");
  std::vector<int> out(static_cast<std::size_t>(l.num_stages()));
  for (int st = 0; st < l.num_stages(); ++st)
    out[static_cast<std::size_t>(st)] = per_rank[static_cast<std::size_t>(l.rank_of_stage(st))] / l.vpp;
  // "The embedding (or loss) layer cannot function as a standalone transformer layer": the first (last)
  // virtual stage builds one layer fewer.
  if (r.account_for_embedding && out.front()-- == 0)
    refuse(r.embedding_from + ": the first virtual stage has no layer to give up for the embedding "
           "(Megatron-LM: \"Not enough layers in the first virtual pipeline stage\")");
  if (r.account_for_loss && out.back()-- == 0)
    refuse(r.loss_from + ": the last virtual stage has no layer to give up for the loss "
           "(Megatron-LM: \"Not enough layers in the last virtual pipeline stage\")");
  return out;
}

std::vector<int> even_split(int layers, int stages) {
  std::vector<int> out(static_cast<std::size_t>(stages), layers / stages);
  const int extra = layers % stages, from = (stages - extra) / 2;
  for (int k = from; k < from + extra; ++k) ++out[static_cast<std::size_t>(k)];
  return out;
}

PartitionCosts partition_costs(const Model& m, const Layout& l, const System& sys, const LayerWork* layer, bool with_memory) {
  LayerWork own;
  if (!layer) own = lower_layer(m, l, sys);
  const LayerWork& lw = layer ? *layer : own;
  // Each kind of layer (a MoE model's dense layers, windowed attention layers) priced as its own.
  std::array<LayerWork, kLayerKinds - 1> others;
  const KindWork kinds = lower_other_kinds(m, l, sys, lw, others);
  const int S = l.num_stages(), L = m.layers;
  constexpr double kNoLimit = std::numeric_limits<double>::infinity();
  PartitionCosts c;
  const bool reruns = l.recompute != Recompute::none && !block_recompute(l);
  const auto layer_s = [&](const LayerWork& x) {
    return x.t_f + x.t_tp_f + x.t_cp_f + x.t_i + x.t_tp_b + x.t_cp_b + x.t_w + (reruns ? x.t_recompute : 0.0);
  };
  c.layer_s.assign(static_cast<std::size_t>(L), layer_s(lw));
  if (kinds[1] || kinds[2] || kinds[3])
    for (int i = 0; i < L; ++i) c.layer_s[static_cast<std::size_t>(i)] = layer_s(*kinds[static_cast<std::size_t>(layer_kind(m, i))]);
  if (block_recompute(l)) {
    c.block_layers = l.recompute_layers;
    // One block saving for every stage: the smallest kind's, so that no stage is thought faster than it is.
    c.block_s = lw.t_recompute;
    for (const LayerWork* k : kinds)
      if (k) c.block_s = std::min(c.block_s, k->t_recompute);
  }
  c.layer_bytes.assign(static_cast<std::size_t>(L), 0.0);
  c.act_bytes.assign(static_cast<std::size_t>(L), 0.0);
  for (auto* v : {&c.stage_s, &c.stage_bytes, &c.act_scale}) v->assign(static_cast<std::size_t>(S), 0.0);
  c.budget_bytes.assign(static_cast<std::size_t>(S), kNoLimit);
  // The first and the last stage alone, without a transformer layer: the embedding, the head and loss.
  std::vector<StageWork> ends(static_cast<std::size_t>(S));
  StageEdges first_edges, last_edges;
  for (int st : {0, S - 1}) {
    ends[static_cast<std::size_t>(st)] = stage_work(m, l, sys, kinds, st, 0, first_edges, last_edges, st == 0 ? 0 : L);
    const StageWork& e = ends[static_cast<std::size_t>(st)];
    c.stage_s[static_cast<std::size_t>(st)] = e.f + e.i + e.w;
  }
  if (with_memory) fill_memory(c, m, l, sys, ends);
  return c;
}

std::vector<int> balanced_split(const Model& m, const Layout& l, const System& sys, Balance balance, const LayerWork* layer) {
  const int S = l.num_stages();
  if (m.layers < S - 2)
    throw InfeasibleLayout("layers " + s(m.layers) + " over pp*vpp = " + s(S) + " stages: every stage but the first and "
                           "the last needs a layer, " + s(S - 2) + " of them");
  if (balance == Balance::even) return even_split(m.layers, S);
  const Objective objective = balance == Balance::memory ? Objective::memory : Objective::time;
  PartitionCosts c = partition_costs(m, l, sys, layer);
  std::optional<Partition> p = partition(c, objective);
  if (!p) {
    // Nothing fits: the split balanced without budgets, whose peak estimate then reports.
    std::fill(c.budget_bytes.begin(), c.budget_bytes.end(), std::numeric_limits<double>::infinity());
    p = partition(c, objective);
  }
  TESSEL_CHECK(p, "partition found no split of " << m.layers << " layers over " << S << " stages without budgets");
  return p->layers;
}

void drop_even_split(Layout& l, int model_layers) {
  const int S = l.num_stages();
  if (l.stage_layers.empty() || model_layers % S != 0) return;
  if (std::all_of(l.stage_layers.begin(), l.stage_layers.end(), [&](int n) { return n == model_layers / S; }))
    l.stage_layers.clear();
}

void resolve_split(Layout& l, const SplitRequest& r, const Model& m, const System& sys) {
  std::vector<std::string> ways;
  if (!r.stage_layers.empty()) ways.push_back(r.stage_layers_from);
  if (r.megatron())
    ways.push_back(r.first_stage_layers ? r.first_from : r.last_stage_layers ? r.last_from
                   : r.account_for_embedding ? r.embedding_from : r.loss_from);
  if (r.balance) ways.push_back(r.balance_from + " " + to_string(*r.balance));
  if (ways.size() > 1) refuse(ways[0] + " and " + ways[1] + ": two ways of splitting the layers over the stages; give one");
  const int S = l.num_stages(), L = m.layers;
  if (!r.stage_layers.empty()) {
    l.stage_layers = r.stage_layers;
    if (static_cast<int>(l.stage_layers.size()) != S)
      refuse(r.stage_layers_from + ": " + s(static_cast<long long>(l.stage_layers.size())) + " entries, and pp*vpp is " + s(S));
    const long long sum = std::accumulate(l.stage_layers.begin(), l.stage_layers.end(), 0LL);
    if (sum != L) refuse(r.stage_layers_from + ": the entries sum to " + s(sum) + ", and the model has " + s(L) + " layers");
  } else if (r.megatron()) {
    l.stage_layers = megatron_split(r, L, l);
  } else if (r.balance || (l.stage_layers.size() != static_cast<std::size_t>(S) && L % S != 0)) {
    // A split must be chosen: the one asked for, or (no split for this stage count, layers that do not divide)
    // the time-balanced one. A layout broken otherwise keeps a placeholder: its own rule is the one to report.
    l.stage_layers = even_split(L, S);
    // The costs need a layout the cost model prices (its rules, the GPU's precision); else estimate names
    // what is wrong with it.
    if (L >= S - 2 && !layout_problem(l, m, 0) && sys.gpu.peak(l.precision) > 0)
      l.stage_layers = balanced_split(m, l, sys, r.balance.value_or(Balance::time));
  } else if (l.stage_layers.size() != static_cast<std::size_t>(S)) {
    l.stage_layers.clear();  // a split of another stage count (pp or vpp given anew): the even split
  }
  drop_even_split(l, L);
}

}  // namespace tessel
