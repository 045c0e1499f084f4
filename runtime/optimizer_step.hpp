// The step after a pipeline flush: gradient synchronisation, global-norm clipping and AdamW, for one rank.
//
// Order (Megatron-LM finalize_model_grads, then optimizer.step):
//  1. tied embeddings on two pipeline ranks: each adds the other's embed.tok gradient (first + last, the
//     same order on both), so both copies take identical steps;
//  2. sequence parallel: gradients of tp-replicated parameters (norms, row-parallel biases, positions) are
//     partial sums over the tp group's tokens and are all-reduced over tp;
//  3. data parallel: ZeRO 0 all-reduces the flat gradient over dp; ZeRO >= 1 (distributed optimizer,
//     Rajbhandari et al. 2020) reduce-scatters it, updates this rank's 1/dp slice, and all-gathers the
//     parameters. ZeRO-2/3 keep the same arithmetic (only what is resident between steps differs), so
//     they run as ZeRO-1 here;
//  4. per-parameter squared norms, each element counted once in the world (a tp-replicated parameter on tp
//     rank 0 only; the tied copy on the first stage only; dp replicas on dp rank 0 unless sharded), summed
//     over the world: these give both the clip coefficient and the per-parameter gradient norms.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/optimizer.hpp"
#include "runtime/params.hpp"
#include "runtime/rank_groups.hpp"
#include "runtime/recorder.hpp"

namespace tessel::rt {

struct OptimizerConfig {
  kernels::cpu::AdamW adamw{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  double clip_norm = 1.0;
};

struct OptimizerReport {
  double grad_norm = 0;                  // global, before clipping
  std::vector<double> param_grad_norms;  // per gpt_param_specs() entry, before clipping
};

class DistributedOptimizer {
 public:
  // tied_peer: pipeline rank holding the other copy of embed.tok, or -1 (none, or same rank).
  // tied_is_first: this rank holds the first stage's copy (the one counted in norms).
  DistributedOptimizer(const Model& m, const Layout& l, ParamStore& store, RankGroups& groups, Recorder& rec,
                       const OptimizerConfig& cfg, int tied_peer, bool tied_is_first);

  OptimizerReport step();
  int steps_done() const { return step_; }

  // Optimizer state of this rank: Adam moments over [shard_begin, shard_end) of the flat buffers.
  std::vector<float>& exp_avg() { return m_; }
  std::vector<float>& exp_avg_sq() { return v_; }
  std::size_t shard_begin() const { return lo_; }
  std::size_t shard_end() const { return hi_; }
  void set_steps_done(int s) { step_ = s; }

 private:
  void sync_tied();
  void sync_sequence_parallel();
  void reduce_data_parallel();
  OptimizerReport norms();
  void update(float clip);
  void gather_params();

  Model model_;
  Layout layout_;
  ParamStore& store_;
  RankGroups& g_;
  Recorder& rec_;
  OptimizerConfig cfg_;
  int tied_peer_;
  bool tied_is_first_;
  int step_ = 0;
  std::size_t padded_ = 0, lo_ = 0, hi_ = 0;
  std::vector<float> shard_grad_;  // ZeRO: this rank's reduced slice
  std::vector<float> m_, v_;
};

}  // namespace tessel::rt
