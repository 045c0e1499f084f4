// The costs of one training step under a layout, built once from Model + Layout + System and read by both
// ways of composing them into a step time: the closed form (sim/estimate.cpp) and the event engine
// (sim/engine/job_*.cpp). The two differ only in that composition.
//
// - Compute: the workload's ops priced per stage (sim/workload.hpp: seconds per micro-batch, TP and CP
//   collectives inside) and summed per pipeline rank.
// - Communication besides the ops: its work (Workload::p2p and ::sync: kind, group, bytes) and its
//   uncontended time on the system as given, the static oversubscription factor included. The engine plays
//   the transfers and data-parallel collectives as flows over links whose core link models that
//   oversubscription itself, so it prices the same work on its flat system (sim/engine/cluster.hpp).
// - The optimizer step per pipeline rank, and the memory the step's state takes per GPU.
#pragma once

#include <vector>

#include "sim/cost/memory.hpp"
#include "sim/workload.hpp"

namespace tessel {

// Megatron-LM's DDP gradient bucket: 40M parameters (megatron/core/distributed: bucket_size default
// max(40M, ...)). Buckets reduce as their gradients become final, overlapping the backward.
inline constexpr double kBucketParams = 40e6;

// Buckets `params` parameters are reduced (or gathered) in: at least one.
int grad_buckets(double params);

// Per pipeline rank, summed over the rank's stages (its vpp chunks) in stage order; per micro-batch.
struct RankSums {
  std::vector<double> f, i, w;       // seconds, TP and CP communication inside (as StageWork)
  std::vector<double> tp_f, tp_b;    // the TP collectives' part of f and i
  std::vector<double> params;        // parameters one GPU holds
  std::vector<double> expert_params; // of those, routed experts' (their own data-parallel group: edp)
  std::vector<double> wide_params;   // of those, outside the fp8 GEMMs (StageWork::wide_params)
  std::vector<double> sp_grad_params;
  std::vector<double> act;           // one chunk's activations, the average over the rank's chunks
  std::vector<double> extra_first, extra_last;  // the first (last) stage's extras, on the rank holding it
  std::vector<int> layers;           // transformer layers the rank holds, all its chunks
};

// What follows a pipeline rank's last backward, in seconds.
struct RankTail {
  // Data parallel: the rank's whole gradient reduced once (ZeRO-2 runs StepSync::grad_reductions of them)
  // and its parameters gathered; 0 where the layout runs none.
  double grad_s = 0, gather_s = 0;
  // The optimizer step (cost::adamw_time) over the parameters the rank's GPUs step: their share of the
  // dp x cp replicas' under ZeRO (StepCosts::optimizer_shard), all of them otherwise. An fp8 run adds its
  // weights' casts (fp8_weight_cast_s in step_costs.cpp): without fp8 primary weights Transformer Engine casts
  // each GEMM weight on the step's first micro-batch and keeps the cast; with them the optimizer writes its
  // shard's fp8 values and the transposed copy is rebuilt from the gathered weights; under ZeRO-3 either is
  // done every micro-batch. torchao's casts are the GEMMs' own (cost::price), but for FSDP2's float8 all-gather's
  // shard casts.
  double optimizer_s = 0;
  // Its two neighbours (cost::grad_pass_time): the gradient norm for clipping reads the gradients the
  // optimizer steps once, before it (Megatron's clip_grad_norm; the runtime's sum of squares); zeroing the
  // gradient buffer the GPU holds writes it once, after it (Megatron's zero_grad_buffer; the runtime's zero_grad).
  double grad_norm_s = 0, zero_grad_s = 0;
};

struct StepCosts {
  Workload work;       // the lowered ops and stages, priced
  RankSums ranks;
  std::vector<RankTail> tail;  // per pipeline rank
  double p2p_s = 0;    // one pipeline transfer (0 without a pipeline)
  double zero3_gather_s = 0, zero3_scatter_s = 0;  // one layer's, ZeRO-3
  double tied_s = 0;                               // the tied embedding's all-reduce
  double optimizer_shard = 1;
  double expert_optimizer_shard = 1;  // the experts' (edp under ZeRO)
  // Memory per GPU besides activations: weights, gradients and optimizer state per parameter held, and the
  // fixed parts (ZeRO-3's gather buffers, the full-recompute transient, the system's reserved bytes).
  cost::StateBytes state;
  cost::StateBytes expert_state;  // per routed-expert parameter (its optimizer states shared over edp)
  // Bytes of weights, gradients and optimizer states of pipeline rank r's GPUs; of them, the weights.
  double state_bytes(int r) const;
  double weight_bytes(int r) const;
  // Of pipeline rank r's parameters: the fp8 GEMM weights outside the routed experts (all of them but the
  // wide ones), and the routed experts'.
  double gemm_params(int r) const;
  double zero3_gather_bytes = 0, recompute_transient_bytes = 0, reserved_bytes = 0;
  double fixed_bytes() const { return zero3_gather_bytes + reserved_bytes + recompute_transient_bytes; }
};

// InfeasibleLayout if the layout breaks a rule for this model on `gpus` GPUs (0: the layout's own count),
// exceeds the system's max_gpus, or uses a precision the GPU lacks.
void check_runnable(const Model& m, const Layout& l, const System& sys, int gpus);

// `layer`, when given, is the layer already lowered for this model, system and layout (lower()'s argument).
StepCosts step_costs(const Model& m, const Layout& l, const System& sys, const LayerWork* layer = nullptr);

}  // namespace tessel
