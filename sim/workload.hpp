// Workload: a Model lowered under a Layout to the ops one GPU runs: their work (shapes, FLOPs and bytes per TP
// shard; collectives with kind, bytes and group), each priced on a System by sim/cost/op.hpp. One layer is
// lowered once (every transformer layer has the same shape); stages add the embedding (first) and logits +
// loss (last). The runtime builds the same ops for real.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "models/model.hpp"
#include "sim/cost/comm.hpp"
#include "sim/cost/compute.hpp"
#include "sim/cost/op.hpp"
#include "sim/layout.hpp"
#include "sim/system.hpp"

namespace tessel {

// The op as work and its price: sim/cost/op.hpp.
using cost::OpClass;
using cost::WorkOp;

// Per micro-batch costs of one transformer layer on one GPU.
struct LayerWork {
  std::vector<WorkOp> ops;
  double t_f = 0, t_i = 0, t_w = 0;    // compute only
  double t_tp_f = 0, t_tp_b = 0;       // TP (+SP) collectives, blocking (Megatron's default), or under
                                       // tp_comm_overlap their part not hidden plus the GEMMs' slowdown
  double tp_hidden_f = 0, tp_hidden_b = 0;  // tp_comm_overlap: TP seconds hidden behind the GEMMs
  double t_ep_f = 0, t_ep_b = 0;       // of t_tp_*: the MoE layer's expert all-to-alls and etp gathers
  double t_cp_f = 0, t_cp_b = 0;       // CP KV exchange, exposed part (ring attention overlaps it)
  double cp_comm_f = 0, cp_comm_b = 0; // CP KV exchange, all of it
  double cp_kv_bytes = 0;              // CP: one K and V chunk, passed cp-1 times forward and twice that backward
  double t_recompute = 0;              // added to backward by the layout's recompute policy (per recomputed layer)
  double flops_model_f = 0;            // model FLOPs of the forward (Narayanan eq. 3 counts GEMMs only)
  double flops_attention_f = 0;        // of that, the attention core's QK^T and AV, counted full (non-causal):
                                       // what the causal convention halves; 0 for a windowed layer, whose
                                       // band is counted as computed (causal) in flops_model_f
  int window = 0;                      // attention through a window shorter than the sequence (kind bit 2)
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

// Layer kinds: what makes two layers of one model cost differently. Bit 1: a dense layer of a MoE model
// (DeepSeek's first ones, Model::moe.dense_layers); bit 2: a layer whose attention window is shorter than the
// sequence (GPT-OSS's every other layer, Model::window_layers). Kind 0: every layer of a plain model, a MoE
// model's MoE layers with full attention.
constexpr int kLayerKinds = 4;
int layer_kind(const Model& m, int i);
bool has_layer_kind(const Model& m, int k);
// How many of layers [first, end) are of each kind.
std::array<int, kLayerKinds> layer_kinds_in(const Model& m, int first, int end);
// The model whose every layer is of kind k (lower_layer(kind_model(m, k), ...) is that kind's work).
Model kind_model(const Model& m, int k);
// The attention window every layer of `m` has, when it is shorter than the sequence; 0 otherwise (some layer,
// or every layer, sees all earlier positions). lower_layer prices windowed attention only then.
int uniform_window(const Model& m);
// The lowered work of each kind (null for a kind the model lacks).
using KindWork = std::array<const LayerWork*, kLayerKinds>;
// Kind 0's work as given (`kind0`), the model's other kinds lowered into `others` (lower() and the partitioner).
KindWork lower_other_kinds(const Model& m, const Layout& l, const System& sys, const LayerWork& kind0,
                           std::array<LayerWork, kLayerKinds - 1>& others);

// Per micro-batch costs of one pipeline stage (one model chunk on one rank).
struct StageWork {
  int stage = 0;
  int layers = 0;
  int recomputed_layers = 0;  // layers whose forward is recomputed in backward (full recompute)
  double f = 0, i = 0, w = 0; // seconds per micro-batch: forward, input-grad (+recompute), weight-grad; TP comm included
  double recompute = 0;       // seconds of i spent recomputing the forward, before the input gradient
  double flops_model = 0;     // model FLOPs per micro-batch (forward + backward, no recompute)
  double flops_layers_f = 0;  // of the forward, its transformer layers' (the embedding and head excluded)
  int moe_layers = 0;         // of its layers, MoE layers (their expert all-to-alls); an MTP module's included
  std::array<int, kLayerKinds> kind_layers{}, kind_recomputed{};  // of layers and recomputed_layers, each kind's
  double flops_hw = 0;        // hardware FLOPs per micro-batch (with recompute)
  double act_bytes = 0;       // activation bytes one micro-batch keeps on this stage until its backward
  double act_extra_bytes = 0; // embedding/logit extras on first/last stage (one micro-batch)
  double params = 0;          // parameters of this stage held by one GPU (after TP sharding)
  double expert_params = 0;   // of those, routed experts' (sharded over ep x etp, replicated over edp)
  // Of `params`, those outside the GEMMs Transformer Engine runs in fp8 (layer_wide_params_per_gpu; the
  // embeddings, the head): 16-bit under an fp8 recipe, where the GEMMs' weights take fp8 copies.
  double wide_params = 0;
  double tp_comm_f = 0, tp_comm_b = 0;
  double ep_f = 0, ep_b = 0;  // of f and i (and of tp_comm_*): the expert all-to-alls and etp gathers
  double sp_grad_params = 0;  // SP: tp-replicated parameters whose gradients the step all-reduces over tp
};

// One DualPipe F&B block on a rank: `fwd`'s forward beside `bwd`'s backward (its input gradient, and its weight
// gradient when `with_w`). Without the all-to-all overlap the two run one after the other (`serial`); with it
// (Layout::a2a_overlap) the forward's expert all-to-alls run under the backward's compute and the backward's
// under the forward's, each hiding at most that compute (TP collectives are not compute): `hidden`, while the
// compute is slowed as any overlapped compute is (GpuSpec::overlap_slowdown): the block takes
// serial - hidden / (1 + overlap_slowdown).
struct FbBlock {
  double serial = 0, hidden = 0;
};
FbBlock fb_block(const StageWork& fwd, const StageWork& bwd, bool with_w, bool a2a_overlap);

// The step's communication besides the stages' ops, once a step on every GPU, as work (what moves, among
// whom); sim/step_costs.hpp prices it. A member the layout does not run moves no bytes.
struct StepSync {
  // Data parallel, over the dp x cp replicas (cp ranks hold the same weights and join the reduction): the
  // main gradients are all-reduced, or reduce-scattered under the distributed optimizer (ZeRO-1/2), in
  // buckets; ZeRO-1/2 then all-gather the updated parameters. ZeRO-3 reduces per layer instead (below).
  cost::ParamCollective grad;
  int grad_reductions = 1;  // per step: ZeRO-2 keeps no whole gradient to accumulate into, so every
                            // micro-batch's is reduce-scattered (DeepSpeed's stage 2, FSDP's SHARD_GRAD_OP)
  cost::ParamCollective param_gather;
  // ZeRO-3 (DeepSpeed): one layer's weights, gathered before each use and its gradients reduce-scattered
  // after its backward, in the weights' dtype (DeepSpeed communicates in it). Flat rings through each GPU's
  // own NIC (the assumption estimate.cpp states).
  cost::CollectiveWork zero3_gather, zero3_scatter;
  // Tied embeddings on different pipeline ranks: the first and last stage's copies of the token table's
  // gradient (fp32, this tp rank's vocabulary shard, S bytes) are all-reduced between the two ranks, a ring of
  // two: each sends half, then the other half (2 transfers of S/2, S / bandwidth in all).
  cost::TransferWork tied;
  // Under SP, once a step before the optimizer, the gradients of the parameters every tp rank holds whole
  // (norms, row-parallel biases: they saw only the rank's part of the sequence; StageWork::sp_grad_params)
  // are summed over tp in one fp32 all-reduce (Megatron-LM's finalize_model_grads).
  cost::ParamCollective sp_grad;
  // Mixture of experts: the routed experts' gradients reduced (and, under the distributed optimizer, their
  // parameters gathered) among the expert data-parallel replicas, Layout::expert_dp(); `grad` and
  // `param_gather` above then carry the other parameters.
  cost::ParamCollective expert_grad, expert_param_gather;
};

struct Workload {
  Model model;
  Layout layout;
  LayerWork layer;                 // kind 0's: every layer's, or a MoE model's MoE layers' (full attention)
  std::array<LayerWork, kLayerKinds - 1> other_kinds;  // kinds 1, 2, 3, lowered when the model has them
  std::vector<StageWork> stages;   // pp*vpp entries, in stage order
  double tokens_per_mb = 0;        // b * s
  // One micro-batch's activation (or its gradient) between adjacent stages on adjacent pipeline ranks;
  // no bytes without a pipeline.
  cost::TransferWork p2p;
  StepSync sync;
  StageEdges first_edges, last_edges;  // of stage 0 and of the last stage (the same, first_edges, when one)
  // The edges of `stage`: first_edges, last_edges or none (a stage holding neither embedding nor head).
  const StageEdges* edges_of(int stage) const;
  const LayerWork& kind(int k) const { return k == 0 ? layer : other_kinds[static_cast<std::size_t>(k - 1)]; }
  const LayerWork& layer_of(int i) const { return kind(layer_kind(model, i)); }  // layer i's work
  // The timeline of one compute op of `stage` (its forward, or its input gradient): calls
  // f(layer, op, at) for each lowered op of its layers in order, `at` being the seconds from the op's start
  // at which that op begins: the stage's edge work comes first (StageEdges::layers_at_f / _i), then each
  // layer's ops, each lasting its t_f or t_i. `layers` < 0: all the stage's layers; otherwise the first
  // `layers` of them replayed from 0 without the edge work (a full recompute's forward).
  template <class F>
  void walk_stage_ops(int stage, bool forward, F&& f, int layers = -1) const;
};

template <class F>
void Workload::walk_stage_ops(int stage, bool forward, F&& f, int layers) const {
  const StageWork& st = stages[static_cast<std::size_t>(stage)];
  const int lb = layout.first_layer_of_stage(stage, model.layers);
  double t = 0;
  if (layers < 0) {
    layers = st.layers;
    if (const StageEdges* e = edges_of(stage)) t = forward ? e->layers_at_f : e->layers_at_i;
  }
  for (int k = lb; k < lb + layers; ++k)
    for (const auto& op : layer_of(k).ops) {
      f(k, op, t);
      t += forward ? op.t_f : op.t_i;
    }
}

// The lowering. InfeasibleLayout if the layout breaks a rule (check_layout is applied first).
// `layer`, when given, is a LayerWork already lowered for the same model, system and the layout fields it
// depends on (tp, cp, micro_batch, sequence_parallel, recompute, attention, precision, tp_comm_overlap):
// explore reuses it.
Workload lower(const Model& m, const Layout& l, const System& sys, const LayerWork* layer = nullptr);
// Stage s of the layout holding `layers` transformer layers (lower() builds each stage with its own count;
// the partitioner prices a stage's embedding or head alone with 0): its work per micro-batch, and the edge
// collectives of the first or last stage recorded into first_edges or last_edges.
// `kinds` holds the work of each kind of layer the model has (kind 0 always; the others may be null when the
// model has none) and `first_layer` is the stage's first layer index: each kind is counted among its layers.
StageWork stage_work(const Model& m, const Layout& l, const System& sys, const KindWork& kinds, int s, int layers,
                     StageEdges& first_edges, StageEdges& last_edges, int first_layer = 0);
// A MoE model with dense layers among its MoE layers; the model its dense layers are (no experts).
bool mixed_layers(const Model& m);
Model dense_part(const Model& m);
// One transformer layer under the layout (the expensive, cacheable part of lower()).
LayerWork lower_layer(const Model& m, const Layout& l, const System& sys);

// Megatron-style placement of the parallel groups: tp fastest, then cp, dp, pp.
cost::GroupPlacement tp_group(const Layout& l);
cost::GroupPlacement cp_group(const Layout& l);
cost::GroupPlacement dp_group(const Layout& l);  // data-parallel replicas (cp ranks join the gradient reduction)
// Expert parallelism, folded over a stage's tp x cp x dp GPUs (etp fastest, then ep, then edp).
cost::GroupPlacement etp_group(const Layout& l);
cost::GroupPlacement ep_group(const Layout& l);
cost::GroupPlacement edp_group(const Layout& l);
// Parameters of one transformer layer held by one GPU, and of those the routed experts'.
double layer_params_per_gpu(const Model& m, const Layout& l);
double layer_expert_params_per_gpu(const Model& m, const Layout& l);
// Of a layer's, those outside its linear layers (the norms, the router, a shared expert's gate): Transformer
// Engine runs the linear layers' GEMMs in fp8, these stay 16-bit. (The linear layers' biases, a hidden or ffn
// vector each, are counted with their weights.)
double layer_wide_params_per_gpu(const Model& m, const Layout& l);
// Of the non-expert parameters a GPU holds over the whole model, the fraction that are fp8 GEMM weights
// (1 - wide / non-expert, summed over the stages); 1 for a model without any.
double fp8_gemm_share(const Workload& w);

}  // namespace tessel
