// Workload: a Model lowered under a Layout to the ops one GPU runs, with FLOPs, bytes, shapes per TP shard
// and their times on a System. One layer is lowered once (every transformer layer has the same shape);
// stages add the embedding (first) and logits + loss (last). The runtime builds the same ops for real.
#pragma once

#include <string>
#include <vector>

#include "models/model.hpp"
#include "sim/cost/comm.hpp"
#include "sim/cost/compute.hpp"
#include "sim/layout.hpp"
#include "sim/system.hpp"

namespace tessel {

enum class OpClass : std::uint8_t { gemm, attention, elementwise, collective };

// One op of one layer (or of the embedding / head), for one micro-batch on one GPU.
struct WorkOp {
  std::string name;           // qkv, attn_scores, softmax_dropout, attn_v, flash_attn, proj, mlp_up, act, mlp_down,
                              // norm1, norm2, residual1, residual2, tp_*, embedding, logits, cross_entropy
  OpClass cls = OpClass::gemm;
  cost::GemmShape gemm;       // for gemm ops (forward shape)
  double flops_f = 0;         // forward FLOPs
  double flops_b = 0;         // backward FLOPs (input grad + weight grad)
  double bytes_f = 0;         // memory traffic, forward
  double bytes_b = 0;         // memory traffic, backward
  double t_f = 0;             // seconds forward
  double t_i = 0;             // seconds backward for inputs (I)
  double t_w = 0;             // seconds backward for weights (W); 0 for ops without weights
  bool attention_core = false;   // recomputed under selective recompute
  cost::Collective coll = cost::Collective::all_reduce;
  double comm_bytes = 0;      // collectives: buffer size as nccl-tests counts it
};

// Per micro-batch costs of one transformer layer on one GPU.
struct LayerWork {
  std::vector<WorkOp> ops;
  double t_f = 0, t_i = 0, t_w = 0;    // compute only
  double t_tp_f = 0, t_tp_b = 0;       // TP (+SP) collectives, blocking (Megatron does not overlap them)
  double t_cp_f = 0, t_cp_b = 0;       // CP KV exchange, exposed part (ring attention overlaps it)
  double cp_comm_f = 0, cp_comm_b = 0; // CP KV exchange, all of it
  double t_recompute = 0;              // added to backward by the layout's recompute policy (per recomputed layer)
  double flops_model_f = 0;            // model FLOPs of the forward (Narayanan eq. 3 counts GEMMs only)
  double flops_hw_extra = 0;           // recompute FLOPs per recomputed layer (hardware FLOPs)
  double act_bytes = 0;                // activations kept per micro-batch under the recompute policy
  double act_bytes_unfused_full = 0;   // Korthikanti Table 2 value without recompute, for reports
};

// A TP collective of a stage outside its layers: the vocab-parallel embedding's reduction, the cross-entropy's
// three all-reduces, the head's gather (SP) and its input gradient's reduction. `at`: seconds from the start
// of the stage's forward op (or input-gradient op, when `backward`) to the collective's start.
struct EdgeCollective {
  const char* name = "";
  cost::Collective coll = cost::Collective::all_reduce;
  double bytes = 0, seconds = 0, at = 0;
  bool backward = false;
};

// The edge collectives of the first or the last stage (tp > 1), and when its first layer starts in its
// forward and input-gradient ops (after the embedding; after the head's backward). The trace draws them.
struct StageEdges {
  static constexpr int kMax = 7;
  EdgeCollective edges[kMax];
  int count = 0;
  double layers_at_f = 0, layers_at_i = 0;
};

// Per micro-batch costs of one pipeline stage (one model chunk on one rank).
struct StageWork {
  int stage = 0;
  int layers = 0;
  int recomputed_layers = 0;  // layers whose forward is recomputed in backward (full recompute)
  double f = 0, i = 0, w = 0; // seconds per micro-batch: forward, input-grad (+recompute), weight-grad; TP comm included
  double flops_model = 0;     // model FLOPs per micro-batch (forward + backward, no recompute)
  double flops_hw = 0;        // hardware FLOPs per micro-batch (with recompute)
  double act_bytes = 0;       // activation bytes one micro-batch keeps on this stage until its backward
  double act_extra_bytes = 0; // embedding/logit extras on first/last stage (one micro-batch)
  double params = 0;          // parameters of this stage held by one GPU (after TP sharding)
  double tp_comm_f = 0, tp_comm_b = 0;
  double sp_grad_params = 0;  // SP: tp-replicated parameters whose gradients the step all-reduces over tp
};

struct Workload {
  Model model;
  Layout layout;
  LayerWork layer;
  std::vector<StageWork> stages;   // pp*vpp entries, in stage order
  double tokens_per_mb = 0;        // b * s
  double p2p_bytes = 0;            // activation sent between adjacent stages per micro-batch
  double p2p_seconds = 0;          // one transfer
  int p2p_distance = 0;            // global-rank distance between adjacent pipeline ranks
  StageEdges first_edges, last_edges;  // of stage 0 and of the last stage (the same, first_edges, when one)
  // The edges of `stage`: first_edges, last_edges or none (a stage holding neither embedding nor head).
  const StageEdges* edges_of(int stage) const;
};

// The lowering. InfeasibleLayout if the layout breaks a rule (check_layout is applied first).
// `layer`, when given, is a LayerWork already lowered for the same model, system and the layout fields it
// depends on (tp, cp, micro_batch, sequence_parallel, recompute, attention, precision): explore reuses it.
Workload lower(const Model& m, const Layout& l, const System& sys, const LayerWork* layer = nullptr);
// InputError for a model beyond the dense transformer (Model::beyond_dense), which the cost model does not
// price yet; lower() calls it, and explore::run before its worker threads (where it would abort the process).
void refuse_unpriced(const Model& m);
// One transformer layer under the layout (the expensive, cacheable part of lower()).
LayerWork lower_layer(const Model& m, const Layout& l, const System& sys);

// Megatron-style placement of the parallel groups: tp fastest, then cp, dp, pp.
cost::GroupPlacement tp_group(const Layout& l);
// Under SP, once a step before the optimizer, the gradients of the parameters every tp rank holds whole
// (norms, row-parallel biases: they saw only the rank's part of the sequence) are summed over tp in one
// fp32 all-reduce (Megatron-LM's finalize_model_grads); `params` of them on the rank. 0 without SP.
double sp_grad_allreduce_seconds(const System& sys, const Layout& l, double params);
// Tied embeddings on different pipeline ranks: the first and last stage's copies of the token table's
// gradient (fp32, this tp rank's vocabulary shard) are all-reduced between the two ranks, a ring of two:
// each sends half, then the other half (2 steps of S/2, S / bandwidth in all). 0 when untied or one stage.
double tied_allreduce_seconds(const System& sys, const Model& m, const Layout& l);
double tied_allreduce_bytes(const Model& m, const Layout& l);  // S above (each rank's gradient shard); 0 likewise
cost::GroupPlacement cp_group(const Layout& l);
cost::GroupPlacement dp_group(const Layout& l);  // data-parallel replicas (cp ranks join the gradient reduction)

}  // namespace tessel
