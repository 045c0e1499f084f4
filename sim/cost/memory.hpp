// Memory per GPU: weights, gradients and optimizer states under each sharding; activations per
// Korthikanti et al. 2022 (arXiv:2205.05198) Table 2 for every TP / SP / recompute combination, times the
// micro-batches a schedule keeps in flight; embedding and logits extras; the allocator's fragmentation; a stated
// allowance.
#pragma once

#include <string>
#include <vector>

#include "models/model.hpp"
#include "sim/layout.hpp"
#include "sim/system.hpp"

namespace tessel::cost {

// Bytes of activations one transformer layer keeps for one micro-batch until its backward, under the
// layout's TP/SP/recompute/attention settings. For an h-wide GPT without recompute and unfused attention
// this is s b h (10 + 24/t + 5 a s / (h t)) (Table 2); with SP s b h (34/t + 5 a s/(h t)); selective
// recompute (or flash attention) drops the 5 a s/(h t) term; full recompute keeps the layer input only.
double layer_activation_bytes(const Model& m, const Layout& l);
// A stage of `layers` layers of which `recomputed` keep only their input (full recompute, block method).
double stage_activation_bytes(const Model& m, const Layout& l, int layers, int recomputed);
// Outside the transformer layers (Korthikanti Sec. 4.3): embedding dropout output on the first stage, final
// norm + head input + fp32 logits on the last (one micro-batch's worth).
double stage_extra_activation_bytes(const Model& m, const Layout& l, bool first, bool last);

// ZeRO-3 working set: DeepSpeed gathers parameters per module (one Linear at a time, the next one prefetched),
// so two of the largest weight matrices as they are used (fp8_gemm_gathered_bytes; the embedding or head in
// the weights' dtype), not whole layers.
double zero3_gather_bytes(const Model& m, const Layout& l, GpuArch arch = GpuArch::hopper);

// Full recompute re-creates one layer's activations while that layer's backward runs (not in Korthikanti's
// formula, which counts what is stored between passes): the peak holds one layer without recompute on top.
double recompute_transient_bytes(const Model& m, const Layout& l);

// What Tessel's own runtime (runtime/: the GPT it trains, tracked by its Recorder) keeps for the backward,
// per micro-batch of one stage: Korthikanti's terms (stage_activation_bytes) plus what his formula leaves out
// and the runtime keeps:
// - per kept layer, LayerNorm's mean and 1/std (2 norms x 2 fp32 values per local token), and under SP the
//   norm outputs kept all-gathered (T h each) where Megatron keeps its shard and gathers again backward;
// - on the last stage, the final norm's input and statistics, its gathered output, fp32 logits and the
//   softmax's row max and sum (vocabulary-parallel cross entropy) instead of the formula's extras;
// - full recompute as the runtime runs it (Megatron's uniform method: blocks of recompute_layers layers,
//   one saved input each; block method: the first recompute_layers layers checkpointed one by one), with
//   one block's full activations alive during its backward;
// - a split I (zero-bubble schedules) keeps the weight GEMMs' inputs (the norm outputs, attention's output,
//   the activation's output; the head's input) and output gradients (of qkv, projection, both MLP GEMMs; the
//   logits) until its W.
// Tensors take the layout's activation width (2 bytes, 4 under fp32), statistics 4.
struct RuntimeActivations {
  double held = 0;       // from the forward to the end of its B (or I)
  double transient = 0;  // during the backward only: one recomputed block
  double w_inputs = 0, w_grads = 0;  // a split I: kept from I to W
};
RuntimeActivations runtime_stage_activations(const Model& m, const Layout& l, int stage);
// Rank r's activation peak under schedule `s` (compute order as played, F&B pairs in order): each F adds its
// stage's held bytes, B releases them (peaking with its transient), I trades them for its W buffers (peaking
// with the transient and the output gradients), W releases those.
double runtime_activation_peak(const Model& m, const Layout& l, const sched::Schedule& s, int rank);

// Micro-batches (in units of one stage-chunk's activations) that rank r keeps in flight at its peak under the
// layout's schedule: 1F1B min(m, p - r); GPipe m; interleaved (Megatron warmup) min(m v, 2(p-1-r) + (v-1) p) + 1
// chunk-activations; ZB-1P p and ZB-2P 2p on every rank (activations live until W); ZB-V and DualPipeV per
// reference/schedules.md. Counts chunks: multiply by one chunk's bytes.
double inflight_chunks(const Layout& l, int rank);
// Micro-batches whose last-stage extras (the logits, the MTP module's) are alive at once on the last rank: they
// live from the last stage's forward to its backward, so all m under a forwards-first schedule (GPipe, looped
// BFS), two under the combined 1F1B (a block runs the last stage's F(j+1) beside its B(j)), else one.
double last_stage_extras_alive(const Layout& l);

// Bytes per parameter held by one GPU for weights, gradients and optimizer state (mixed-precision AdamW as
// Megatron-LM runs it by default: bf16/fp16 weights, fp32 gradient buffer, fp32 master weights and two moments;
// the layout's main_grads, moments and master_weights change the last three), divided over the data-parallel
// group by the ZeRO stage. fp32 training keeps fp32 weights and no master copy.
// Under fp8 the weights of the GEMMs Transformer Engine runs in fp8 (the layers' linear layers and experts; not
// the embeddings, the head, the norms or the router) take `gemm_weights` bytes in place of `weights`
// (fp8_gemm_weight_bytes); other precisions: the same.
struct StateBytes {
  double weights = 0, grads = 0, optimizer = 0;
  double gemm_weights = 0;
  double total() const { return weights + grads + optimizer; }
  double gemm_total() const { return gemm_weights + grads + optimizer; }
  // A rank's bytes for `params` parameters of which `gemm` are fp8 GEMM weights.
  double state_bytes(double params, double gemm) const { return (params - gemm) * total() + gemm * gemm_total(); }
};
// `arch`: whether fp8 copies need a transposed twin (Hopper's, GpuSpec::fp8_transposed_copy); absent: Hopper's.
StateBytes state_bytes_per_param(const Layout& l, GpuArch arch = GpuArch::hopper);  // over dp x cp (CP ranks hold the same weights)
// The same over `replicas` data-parallel copies; the routed experts' over their edp replicas
// (Layout::expert_dp(): Megatron-Core's expert data-parallel group shards their optimizer states).
StateBytes state_bytes_per_param(const Layout& l, double replicas, GpuArch arch = GpuArch::hopper);
StateBytes expert_state_bytes_per_param(const Layout& l, GpuArch arch = GpuArch::hopper);
// Bytes one fp8 GEMM weight takes on a GPU before ZeRO-3's sharding (precision fp8 only; under ZeRO-3 a shard
// holds fp8_gemm_gather_bytes, or the 16-bit weight under torchao's casts):
//  - torchao's casts (Layout::fp8_weight_cast per_microbatch): the 16-bit weight alone, no fp8 copy kept;
//  - fp8 primary weights (Layout::fp8_params(): Megatron-Core's --fp8-param-gather, NeMo's fp8_params): the
//    fp8 weight, plus its transposed copy where the tensor cores need one (Hopper), or MXFP8's row- and
//    column-wise copies with their block scales; the 16-bit weight is not kept;
//  - otherwise the 16-bit weight (2) and the fp8 cast Transformer Engine caches over a step's micro-batches
//    (Megatron-Core passes is_first_microbatch, so the weight is cast once a step): the same copies again.
double fp8_gemm_weight_bytes(const Layout& l, GpuArch arch);
// Bytes per parameter ZeRO's parameter all-gather moves for an fp8 GEMM weight: 1 with fp8 primary weights
// under delayed or current scaling (Megatron-Core gathers the fp8 data and rebuilds the transpose after),
// otherwise the 16-bit weight's 2 (MXFP8 gathers the 16-bit values into the gradient buffer and quantizes
// after: Megatron-Bridge's reuse_grad_buf_for_mxfp8_param_ag).
double fp8_gemm_gather_bytes(const Layout& l);
// Bytes an fp8 GEMM weight takes once gathered by ZeRO-3, while its GEMMs run: the gathered bytes, and beside
// fp8 data its Hopper transpose, beside 16-bit values their fp8 cast (one copy under torchao's casts, which
// make the transpose in the backward's own cast). Other precisions: the weight's bytes.
double fp8_gemm_gathered_bytes(const Layout& l, GpuArch arch);
// Bytes of one gradient element as Megatron-LM keeps and reduces it: fp32 main_grad under bf16 (it forces
// --accumulate-allreduce-grads-in-fp32; fp8 training runs under bf16) and fp32; fp16 gradients under fp16
// (that flag's default, off).
double grad_bytes(Precision p);
// The same for a layout: 2 where it keeps bf16 gradients (Layout::main_grads) under 16-bit or fp8 training.
double grad_bytes(const Layout& l);
// Bytes of one model weight as training holds and communicates it: 2 (bf16/fp16; fp8 training keeps bf16
// weights), 4 under fp32. ZeRO's parameter all-gathers and ZeRO-3's gradient reduce-scatters move this
// many bytes per parameter (DeepSpeed communicates in the model's dtype).
double weight_bytes(Precision p);

struct MemoryBreakdown {
  int rank = 0;
  double weights_bytes = 0, grads_bytes = 0, optimizer_bytes = 0;
  double activations_bytes = 0;     // peak activations of the rank (all its chunks)
  double extras_bytes = 0;          // embedding / logits extras
  double zero3_gather_bytes = 0;    // ZeRO-3: the largest gathered layer's full weights
  double recompute_transient_bytes = 0;  // full recompute: one layer's activations re-created during its backward
  double fragmentation_bytes = 0;   // the allocator's holes: Layout::fragmentation x dynamic_bytes()
  double reserved_bytes = 0;        // the system's allowance (CUDA context, NCCL buffers, library workspaces)
  // What is allocated and freed within a step: activations, extras, ZeRO-3's gathered weights, the recompute
  // transient (the allocator fragments these; the state is allocated once).
  double dynamic_bytes() const { return activations_bytes + extras_bytes + zero3_gather_bytes + recompute_transient_bytes; }
  // What the tensors take at the peak: torch.cuda.max_memory_allocated's counterpart.
  double allocated() const {
    return weights_bytes + grads_bytes + optimizer_bytes + activations_bytes + extras_bytes + zero3_gather_bytes +
           recompute_transient_bytes;
  }
  double total() const { return allocated() + fragmentation_bytes + reserved_bytes; }
};

}  // namespace tessel::cost
