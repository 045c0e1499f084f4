// The analytical estimate of one layout: the step costs (sim/step_costs.hpp) composed in closed form: the
// pipeline's span from the schedule's makespan formula, exposed communication, the DP tail and the optimizer
// step; memory per pipeline rank. The event simulator (sim/engine) composes the same step costs by playing
// the schedule; explore uses both.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sim/cost/memory.hpp"
#include "sim/workload.hpp"

namespace tessel {

struct Estimate {
  Layout layout;
  int gpus = 0;
  int microbatches = 0;
  double step_s = 0;
  double tokens_per_s = 0;          // whole job
  double samples_per_s = 0;
  // Narayanan et al. eq. 3 convention (counts 4x the forward GEMMs, as if fully recomputed), per GPU.
  double tflops_eq3_per_gpu = 0;
  // Model FLOPs (eq. 7: 3x forward, no recompute) and hardware FLOPs (with this layout's recompute), per GPU.
  double model_tflops_per_gpu = 0;
  double hw_tflops_per_gpu = 0;
  double mfu = 0, hfu = 0;          // fractions of the GPU's peak in the layout's precision
  // Model FLOPs count the attention core full (non-causal), as Megatron-LM (Narayanan eq. 3) and PaLM do; a
  // causal model computes half of its QK^T and AV. The _causal rates count that half only.
  double model_tflops_per_gpu_causal = 0, mfu_causal = 0;
  double bubble_fraction = 0;       // idle share of the step on the busiest pipeline rank (not computing,
                                    // not waiting on a transfer)
  double pipeline_s = 0;            // the pipeline's span: busiest rank's work, idle time, exposed transfers
  double busy_s = 0;                // busiest rank's work per step (compute with its TP and CP collectives)
  double compute_s = 0;             // busiest rank's compute per step (TP, EP and CP collectives excluded)
  double tp_comm_s = 0, tp_exposed_s = 0;
  double ep_comm_s = 0, ep_exposed_s = 0;  // MoE: the experts' all-to-alls and etp collectives (blocking)
  double cp_comm_s = 0, cp_exposed_s = 0;
  double pp_comm_s = 0, pp_exposed_s = 0;
  double dp_comm_s = 0, dp_exposed_s = 0;
  double optimizer_s = 0;
  // The optimizer's neighbours (RankTail): the gradient norm's pass before it and the gradients' zeroing after
  // it, the largest rank's.
  double grad_norm_s = 0, zero_grad_s = 0;
  // Compute lost to communication that overlaps it (GpuSpec::overlap_slowdown): a compute op slowed to
  // 1 / (1 + s) of its rate for the overlapped time t_o loses t_o s / (1 + s). Counted for the busiest rank's
  // overlapped DP reductions and parameter gathers, overlapped p2p and ZeRO-3's prefetched gathers.
  double overlapped_comm_s = 0, overlap_slowdown_s = 0;
  std::vector<cost::MemoryBreakdown> memory;  // one per pipeline rank
  std::vector<double> rank_params;            // per pipeline rank: parameters one GPU holds (before ZeRO-3's sharding)
  std::vector<double> expert_params;          // per pipeline rank: routed-expert parameters one GPU holds (MoE)
  double peak_memory_bytes = 0;
  int peak_rank = 0;
  double capacity_bytes = 0;        // GPU memory
  double min_headroom_bytes = 0;    // the margin asked for (System::min_headroom_bytes)
  bool fits = true;                 // peak + min_headroom <= capacity
  std::vector<double> stage_f, stage_i, stage_w;  // seconds per micro-batch per stage (for the simulator)
};

// gpus == 0 takes the layout's own count. InfeasibleLayout if a rule is broken (memory is reported, not
// enforced: `fits` says whether the peak is within capacity).
Estimate estimate(const Model& m, const Layout& l, const System& sys, int gpus = 0, const LayerWork* layer = nullptr);

// The pipeline stages' imbalance: the slowest stage's seconds per micro-batch (forward and backward) over
// the mean of all pp * vpp stages, less 1 (0 for a balanced or a single stage).
double stage_imbalance(const Estimate& e);

// Model FLOPs per global batch (eq. 7 generalised: 3x the forward of layers and head).
double model_flops_per_step(const Workload& w);
struct StepCosts;
// The all-to-all overlap (Layout::a2a_overlap; DualPipeV, or Megatron-Core's combined 1F1B): the seconds each
// pipeline rank hides of its expert all-to-alls in its F&B blocks over a step of m micro-batches (zeros
// without the overlap).
std::vector<double> a2a_hidden(const StepCosts& c, double m);

// Pipeline makespan of the schedule's closed form, given per-rank per-micro-batch costs (seconds).
// See estimate.cpp for each schedule's formula and its source.
double pipeline_time(const Layout& l, const std::vector<double>& rank_f, const std::vector<double>& rank_i,
                     const std::vector<double>& rank_w);

}  // namespace tessel

namespace tessel {
Json estimate_to_json(const Estimate& e);
}  // namespace tessel
