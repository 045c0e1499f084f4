// The step after a pipeline flush: gradient synchronisation, global-norm clipping and AdamW, for one rank.
//
// Order (Megatron-LM finalize_model_grads, then optimizer.step):
//  1. tied embeddings on two pipeline ranks: each adds the other's embed.tok gradient (first + last, the
//     same order on both), so both copies take identical steps;
//  2. sequence parallel: gradients of tp-replicated parameters (norms, row-parallel biases, positions) are
//     partial sums over the tp group's tokens and are all-reduced over tp;
//  3. data parallel: ZeRO 0 all-reduces the flat gradient over dp. ZeRO >= 1 shards per parameter group
//     (zero_partition.hpp; Rajbhandari et al. 2020): every rank keeps the Adam moments of its shard only;
//     ZeRO-1 reduce-scatters the accumulated gradient group by group after the flush, ZeRO-2 and ZeRO-3
//     reduce-scatter a stage's groups as soon as one of its micro-batches has finished its weight gradient
//     (DeepSpeed's per-micro-batch reduction) into a sharded accumulator, so no full gradient outlives the
//     backward that made it; ZeRO-1/2 update their shard in place and all-gather the parameters, ZeRO-3
//     keeps only its shard of the parameters and gathers a stage's groups around each forward and input-
//     gradient action (the weight-gradient GEMMs read no weights). Outside those windows ZeRO-3 fills the
//     full parameter buffer with NaN, so a use without its gather cannot go unnoticed. The sums are the same
//     as ZeRO 0's in another order (fp32 rounding only). With sharded gradients, the tied-embedding and
//     sequence-parallel sums (1, 2) run on the shards after the reduction (they are linear);
//     A MoE model's routed experts (their own store, replicated over edp, not dp) are reduced and sharded
//     the same way over the edp group by a second optimizer this one drives;
//  4. per-parameter squared norms, each element counted once in the world (a tp-replicated parameter on tp
//     rank 0 only; the tied copy on the first stage only; dp replicas on dp rank 0 unless sharded), summed
//     over the world: these give both the clip coefficient and the per-parameter gradient norms.
#pragma once

#include <cstdint>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/optimizer.hpp"
#include "runtime/params.hpp"
#include "runtime/rank_groups.hpp"
#include "runtime/recorder.hpp"
#include "runtime/zero_partition.hpp"

namespace tessel::rt {

// Sees the fully reduced gradient before clipping, once per element of the model in the world: elements
// [begin, end) of parameter p's local tensor-parallel shard (row-major over p.rows x p.cols), values g.
// Called from every rank's thread at once (tests compare gradients element by element across layouts).
using GradObserver = std::function<void(int step, const Param& p, std::size_t begin, std::size_t end, const float* g)>;

struct OptimizerConfig {
  kernels::cpu::AdamW adamw{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  double clip_norm = 1.0;
  GradObserver observe_grads;  // optional
};

// Bytes of parameters, gradients and optimizer state a rank holds (fp32 everywhere on this runtime).
// persistent: between steps; peak: the most at any time, with gathered (ZeRO-3) parameters and the full
// gradients of stages between their backward and their reduction (ZeRO-2/3).
struct StateMemory {
  std::int64_t weights = 0, grads = 0, optimizer = 0;  // persistent, by kind
  std::int64_t peak = 0;
  std::int64_t persistent() const { return weights + grads + optimizer; }
};

struct OptimizerReport {
  double grad_norm = 0;                  // global, before clipping
  std::vector<double> param_grad_norms;  // per gpt_param_specs() entry, before clipping
};

class DistributedOptimizer {
 public:
  // tied_peer: pipeline rank holding the other copy of embed.tok, or -1 (none, or same rank).
  // tied_is_first: this rank holds the first stage's copy (the one counted in norms).
  // experts: this rank's routed experts (a MoE model). They get an optimizer of their own over the edp group
  // (groups.edp) in place of dp, driven by this one: their gradients are reduced over edp, and under ZeRO their
  // Adam moments are sharded over edp (Megatron-Core's distributed optimizer shards expert states over the
  // expert data-parallel group); the global norm and clipping cover both.
  DistributedOptimizer(const Model& m, const Layout& l, ParamStore& store, RankGroups& groups, Recorder& rec,
                       const OptimizerConfig& cfg, int tied_peer, bool tied_is_first, ParamStore* experts = nullptr);
  ~DistributedOptimizer();

  OptimizerReport step();
  int steps_done() const { return step_; }

  // ZeRO hooks around one compute action of the stage covering layers [l0, l1) (the executor calls them).
  // before: ZeRO-3 gathers the stage's parameter groups when the action reads weights (forward, input
  // gradient). after: ZeRO-3 releases them; ZeRO-2/3 reduce-scatter the stage's gradients when the action
  // finished a micro-batch's weight gradient (B, or W after I).
  void before_compute(int l0, int l1, bool first, bool last, bool reads_weights, bool makes_grads);
  void after_compute(int l0, int l1, bool first, bool last, bool grads_done);

  // Checkpoints: Adam moments as full flat vectors (a dp collective under ZeRO), and back from them; the
  // experts' moments follow their store's flat order.
  void full_moments(std::vector<float>& m, std::vector<float>& v);
  void load_moments(const std::vector<float>& m, const std::vector<float>& v);
  // The experts' moments, full over their store (an edp collective under ZeRO); no-ops without experts.
  void expert_moments(std::vector<float>& m, std::vector<float>& v);
  void load_expert_moments(const std::vector<float>& m, const std::vector<float>& v);
  // ZeRO-3: the full parameters for a checkpoint save (a dp collective) and back to shards; no-ops below 3.
  void materialize_params();
  void release_params();
  // After the full parameter buffer was overwritten (checkpoint load): ZeRO-3 takes its shard from it.
  void params_loaded();
  void set_steps_done(int s);

  // Parameters, gradients and Adam moments of this rank, experts included.
  StateMemory state_memory() const;

 private:
  // The communicators one optimizer reduces over: the layout's, or for the experts' optimizer world and edp
  // (as its dp; no tp or pp peers).
  struct Groups {
    Comm* world = nullptr;
    Comm* tp = nullptr;
    Comm* pp = nullptr;
    Comm* dp = nullptr;
    RankCoords at;
  };
  DistributedOptimizer(const Model& m, const Layout& l, ParamStore& store, const Groups& groups, Recorder& rec,
                       const OptimizerConfig& cfg);
  void init();
  void reduce();                                   // every gradient synchronisation of the step
  void add_squares(std::vector<float>& sq);        // this rank's squared norms per gpt_param_specs() entry
  void add_tied_peer(float* g, std::size_t n);  // g += the tied copy's gradient, in a fixed order
  void sync_tied();                  // on the flat gradient, or on the shards when sharded_
  void sync_sequence_parallel();     // likewise
  void flush_group(std::size_t g);
  void gather_group(std::size_t g);
  void release_group(std::size_t g);
  std::int64_t gathered_bytes(const ZeroGroup& g) const;
  const std::vector<std::size_t>& stage_groups(int l0, int l1, bool first, bool last);

  void update(float clip);
  void gather_params();
  void clear_grads();  // after the update and the gathers: the gradients zeroed for the next step
  void track(std::int64_t delta);
  // Calls f(param, flat_begin, flat_end, local_begin) for each owned run of each parameter (ZeRO >= 1).
  template <class F>
  void for_owned_params(F&& f);

  Model model_;
  Layout layout_;
  ParamStore& store_;
  Groups g_;
  Recorder& rec_;
  OptimizerConfig cfg_;
  int tied_peer_;
  bool tied_is_first_;
  int step_ = 0;
  bool sharded_ = false;
  ZeroPartition part_;
  std::vector<float> shard_grad_;   // ZeRO >= 1: this rank's reduced gradient, in shard order
  std::vector<float> shard_param_;  // ZeRO-3: this rank's parameters, in shard order
  std::vector<float> m_, v_;        // Adam moments: flat (ZeRO 0) or shard order
  std::map<std::string, std::size_t> spec_index_;  // gpt_param_specs() entry of each parameter name
  std::unique_ptr<DistributedOptimizer> experts_;  // over the experts' store and edp
  std::vector<char> gathered_, pending_;  // per group: ZeRO-3 gathered now; ZeRO-2/3 full gradient live
  std::map<std::array<int, 4>, std::vector<std::size_t>> stage_groups_;  // (l0, l1, first, last) -> groups
  StateMemory mem_;
  std::int64_t live_ = 0;
};

}  // namespace tessel::rt
