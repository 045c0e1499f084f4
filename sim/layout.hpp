// Layout: how a model is split over GPUs. Parsed once (JSON file or command-line flags), checked against the
// model and the GPU count with the broken rule named. The same Layout feeds the simulator and the runtime.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/model.hpp"
#include "sim/schedule/registry.hpp"

namespace tessel {

enum class Recompute { none, selective, full };
enum class RecomputeMethod { uniform, block };  // Megatron --recompute-method
enum class Precision { bf16, fp16, fp8, fp32 };
// How attention is computed: fused flash-style kernels (no s*s matrix kept) or the unfused
// QK^T / softmax / dropout / AV chain of Megatron-LM before FlashAttention (Korthikanti et al. 2022).
enum class AttentionImpl { flash, unfused };
// How the LM loss is computed over the vocabulary (sim/workload.cpp add_head prices each): Megatron's
// vocab-parallel cross-entropy unfused (its default: one kernel a pass over fp32 logits), Megatron's fused
// one (--cross-entropy-loss-fusion, the native implementation: upcast with the max, exp, sum and
// normalisation fused), or Transformer Engine's Triton kernels (--cross-entropy-fusion-impl te: an online
// softmax over the 16-bit logits, the gradient written in place in the backward).
enum class CrossEntropyImpl { megatron, megatron_fused, te };
// How an fp8 run scales its tensors (Transformer Engine's recipes; docs/features/low_precision_training/):
//  - delayed: one scale a tensor from the amax history (DelayedScaling; NeMo 24.07's fp8 configs): the cast
//    reads the 16-bit tensor once, and the amaxes are all-reduced once a micro-batch and direction;
//  - current: one scale a tensor from its own amax (Float8CurrentScaling; Megatron-Bridge's fp8_cs): a first
//    read for the amax, a second for the cast, and a tensor gathered over tp (sequence parallel) reduces its
//    amax over tp before it is quantized;
//  - mxfp8: one power-of-two scale per 32 elements (MXFP8BlockScaling, Blackwell only): one read, the
//    row-wise and column-wise copies quantized apart, no amax shared between GPUs.
enum class Fp8Recipe { delayed, current, mxfp8 };
// How an fp8 run casts its 16-bit GEMM weights (layout and stack key "fp8_weight_cast"):
// - cached: Transformer Engine's modules cast a weight on the step's first micro-batch and keep the fp8 copy
//   (and its Hopper transpose) for the rest (Megatron-Core passes is_first_microbatch): one cast a step, a
//   persistent copy;
// - per_microbatch: torchao's Float8Linear (torchtitan) casts the weight in every forward and again in the
//   backward (it saves the 16-bit weight for the backward, not the fp8 copy): two casts a micro-batch, no
//   persistent copy.
enum class Fp8WeightCast { cached, per_microbatch };
// The kernel that runs flash attention: the fused one Transformer Engine selects (cuDNN's on Hopper; NeMo and
// Megatron-Core), or FlashAttention-2 (PyTorch's SDPA, whose backend priority puts it first, and the model
// code that calls flash_attn). Priced at GpuSpec::attention_fa2 of the fused kernel's rate. Layout key
// "flash_kernel", flag --flash-kernel, stack key "flash_kernel".
enum class FlashKernel { cudnn, fa2 };
// Element-wise kernels a run leaves to PyTorch eager, one kernel an op, where Megatron-Core fuses them
// (sim/workload.cpp prices each; docs/stacks.md "Fused kernels"): `norm`, an RMSNorm as PyTorch's composite
// runs it (upcast, square, mean, rsqrt, scale, downcast, weight: HF's LlamaRMSNorm, nn.RMSNorm before its
// fused kernel); `act`, the MLP activation apart from its bias add, SwiGLU's silu apart from its product;
// `rope`, rotary embedding through rotate_half (chunk, negate, concatenate, two products and a sum). A
// LayerNorm is one kernel in PyTorch too, and a model without biases or rotary embedding loses nothing to
// `act` on GELU or to `rope`. Layout key "unfused" (a list), flag --unfused, stack key "unfused".
struct Unfused {
  bool norm = false, act = false, rope = false;
  bool any() const { return norm || act || rope; }
  bool operator==(const Unfused&) const = default;
};
// The training state's dtypes beside the weights under 16-bit (and fp8) training: the gradient buffer the
// backward accumulates into and the data-parallel reduction sends (Megatron-Core --main-grads-dtype, NeMo's
// grad_sync_dtype), the two Adam moments (--exp-avg-dtype / --exp-avg-sq-dtype, NeMo's optimizer dtype), and
// the master copy of the weights: fp32, a 16-bit remainder beside each bf16 weight that makes it fp32 again
// (Transformer Engine's FusedAdam and NeMo's distributed Adam, store_param_remainders), or none (the optimizer
// updates the 16-bit weights: NeMo's distributed Adam when its dtype is the model's). fp32 training keeps
// every one fp32.
enum class StateDtype { fp32, bf16 };
enum class MasterWeights { fp32, remainder, none };
// The three together, as a run states them (words grads= moments= master=, the JSON keys main_grads, moments,
// master_weights, the flags --main-grads, --moments, --master-weights); never searched.
struct StateDtypes {
  StateDtype main_grads = StateDtype::fp32;            // gradient buffer and its DP reduction
  StateDtype moments = StateDtype::fp32;               // the Adam moments
  MasterWeights master_weights = MasterWeights::fp32;  // the master copy of the weights
  bool all_fp32() const { return *this == StateDtypes{}; }
  bool operator==(const StateDtypes&) const = default;
};

struct Layout {
  int tp = 1, pp = 1, dp = 1, cp = 1;
  int vpp = 1;                 // model chunks (virtual stages) per pipeline rank
  int micro_batch = 1;
  int global_batch = 1;
  sched::Kind schedule = sched::Kind::one_f_one_b;  // a layout schedule of sim/schedule/registry.hpp
  // The micro-batch rule of an interleaved schedule: Megatron-LM's (m a multiple of pp) or PyTorch's
  // ScheduleInterleaved1F1B's (m a multiple of max(1, m // pp)); the same order where both take m.
  sched::MicrobatchRule microbatch_rule = sched::MicrobatchRule::megatron;
  Recompute recompute = Recompute::none;
  RecomputeMethod recompute_method = RecomputeMethod::uniform;
  int recompute_layers = 0;    // full recompute: layers per checkpoint block (uniform; 0 = 1) or per stage (block; 0 = all)
  bool sequence_parallel = false;
  int zero_stage = 0;          // 0: none, 1: distributed optimizer (ZeRO-1), 2, 3
  Precision precision = Precision::bf16;
  AttentionImpl attention = AttentionImpl::flash;
  CrossEntropyImpl cross_entropy = CrossEntropyImpl::megatron;
  Fp8Recipe fp8_recipe = Fp8Recipe::delayed;  // precision fp8 only
  // fp8 primary weights (Megatron-Core's --fp8-param-gather, NeMo's fp8_params; layout key "fp8_param_gather",
  // flag --fp8-param-gather, stack key "fp8_param_gather"): the GEMMs' weights are kept in fp8 instead of 16-bit
  // plus Transformer Engine's cached fp8 cast, and the distributed optimizer all-gathers them in fp8 (half the
  // bytes). Megatron-Core asserts the distributed optimizer (or its FSDP), so it holds where the layout runs
  // fp8 with ZeRO >= 1 (fp8_params()); a stack's default leaves the other layouts as they are.
  bool fp8_param_gather = false;
  bool fp8_params() const { return fp8_param_gather && precision == Precision::fp8 && zero_stage >= 1; }
  Fp8WeightCast fp8_weight_cast = Fp8WeightCast::cached;  // precision fp8 only
  Unfused unfused;                   // element-wise kernels run unfused (see Unfused; default: all fused)
  FlashKernel flash_kernel = FlashKernel::cudnn;  // attention flash only
  // Whether the attention runs FlashAttention-2 (flash attention with that kernel): what prices it at
  // GpuSpec::attention_fa2 and what the verbs say beside a layout.
  bool runs_fa2() const { return attention == AttentionImpl::flash && flash_kernel == FlashKernel::fa2; }
  StateDtypes state;                 // the training state's dtypes (see StateDtype)
  bool overlap_grad_reduce = true;   // DP reduction in buckets overlapped with backward (Megatron --overlap-grad-reduce)
  bool overlap_param_gather = true;  // ZeRO/distributed-optimizer all-gather overlapped with the next forward
  // Pipeline sends/receives overlapped with compute in the steady state (Megatron --overlap-p2p-comm,
  // off by default there: each 1F1B step then waits for its batched send/recv).
  bool overlap_p2p = false;
  // TP communication overlapped with the adjacent GEMMs (Megatron --tp-comm-overlap, Transformer Engine's
  // userbuffers): each sequence-parallel all-gather / reduce-scatter of a layer is cut into tp chunks that
  // move while the GEMM beside it computes on the others (sim/workload.cpp overlap_tp_comm). Needs sp.
  bool tp_comm_overlap = false;
  // Device memory the allocator holds but cannot hand out, as a fraction of the bytes allocated and freed
  // within a step at the peak (activations kept for the backward, the embedding / logits extras, ZeRO-3's
  // gathered weights, the recompute transient: cost::MemoryBreakdown::dynamic_bytes): PyTorch's caching
  // allocator keeps freed blocks cached and splits them, so tensors of varying size and lifetime leave holes.
  // The state (weights, gradient buffers, optimizer states) is allocated once and not counted. 0: none (the
  // tensors alone); a stack sets its allocator's (Stack::fragmentation, docs/stacks.md); --fragmentation
  // replaces it.
  double fragmentation = 0.0;
  std::vector<int> stage_layers;     // explicit layers per stage (pp*vpp entries); empty = even split
  // Expert parallelism (mixture-of-experts models), folded over the same GPUs as attention, as Megatron-Core's
  // parallel folding does (Liu et al. 2025, arXiv:2504.14960; --expert-model-parallel-size,
  // --expert-tensor-parallel-size): attention's tp x cp x dp GPUs of a pipeline stage are also etp x ep x edp
  // for the experts, etp fastest. Each of the ep ranks holds experts/ep routed experts, each split over etp;
  // edp (expert_dp()) replicas of them reduce their gradients. etp 0: as tp (Megatron-Core's default).
  int ep = 1;
  int etp = 0;
  // How the router spreads tokens over the experts (MoE). Dropless (Megatron-Core's default): moe_skew is the
  // busiest EP rank's tokens over the mean (1: balanced, what NVIDIA's benchmarks force); the step waits for
  // that rank's expert GEMMs and its share of the all-to-alls. moe_capacity > 0: Megatron's
  // --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity, every expert padded to capacity x
  // the mean (tokens beyond it dropped): its GEMMs and all-to-alls move that many tokens whatever the skew.
  double moe_skew = 1.0;
  double moe_capacity = 0.0;
  // The token dispatcher (MoE): false, NCCL's all-to-all (Megatron-Core's alltoall dispatcher, its default);
  // true, DeepEP (the flex dispatcher with --moe-enable-deepep): across nodes a token crosses the network
  // once per node it needs, then NVLink (sim/cost/comm.hpp DeepEpRouting). Inside one node the two cost alike.
  bool deepep = false;
  // The expert all-to-alls hidden under another micro-batch's compute (DeepSeek's DualPipe: each F&B block
  // runs one micro-batch's forward beside another's backward, one's dispatch and combine under the other's
  // attention and MLP). Modelled in F&B blocks (sim/workload.hpp fb_block): DualPipeV's, and Megatron-Core's
  // combined 1F1B (--overlap-moe-expert-parallel-comm), interleaved (vpp > 1) or without pipelining (pp 1,
  // schedule 1f1b), whose steady-state F and B become one block (sched::GenParams::combined).
  bool a2a_overlap = false;
  // The schedules that overlap it: the rule a2a-overlap checks and explore enumerates by.
  static bool a2a_overlap_fits(sched::Kind k, int pp, int vpp);
  // Megatron-Core's combined 1F1B: the overlap on a schedule other than DualPipeV (whose blocks are its own).
  bool combined_1f1b() const { return a2a_overlap && schedule != sched::Kind::dualpipev; }
  // The factor the busiest EP rank's expert work and all-to-alls take over balanced routing.
  double moe_load_factor() const { return moe_capacity > 0 ? moe_capacity : moe_skew; }

  int gpus() const { return tp * pp * dp * cp; }
  // Whether data-parallel rank `dp_index` takes the gradient norm's pass before the optimizer step (the
  // simulator's grad_norm op, the one both runtimes trace): under ZeRO every rank over the shard it steps;
  // unsharded replicas hold the same gradients and dp index 0 counts them while the others wait.
  bool counts_grad_norm(int dp_index) const { return zero_stage >= 1 || dp_index == 0; }
  int expert_tp() const { return etp > 0 ? etp : tp; }
  // Replicas of each expert shard: tp x cp x dp / (etp x ep); check_layout requires it whole.
  int expert_dp() const { return tp * cp * dp / (expert_tp() * ep); }
  int num_stages() const { return pp * vpp; }
  // Micro-batches per pipeline per step: B / (b * d) (Narayanan et al. notation m).
  int num_microbatches() const { return global_batch / (micro_batch * dp); }
  // Layers of stage s (0 .. num_stages-1), even split unless stage_layers is given.
  int layers_of_stage(int stage, int model_layers) const;
  int first_layer_of_stage(int stage, int model_layers) const;
  // Rank that holds stage s: loop placement, or V placement for zbv / dualpipev.
  int rank_of_stage(int stage) const;
  bool v_placement() const { return sched::family(schedule).placement == sched::Placement::V; }
  // Short human form: "tp8 pp8 dp16 vpp3 mbs1 interleaved full sp zero1".
  std::string describe() const;
};

// A split in run-length form, as describe() prints it after "layers=": "3,4x6,3" for 3,4,4,4,4,4,4,3.
std::string describe_stage_layers(const std::vector<int>& stage_layers);

// What the schedule generator takes for this layout: pp, its micro-batches, stages per rank and rule.
sched::GenParams schedule_params(const Layout& l);

std::string to_string(Recompute r);
std::string to_string(Precision p);
std::string to_string(AttentionImpl a);
std::string to_string(CrossEntropyImpl c);  // megatron, megatron-fused, te
// "megatron", "megatron-fused" or "te"; InputError naming `what`, the value and the choices otherwise.
CrossEntropyImpl parse_cross_entropy(const std::string& s, const std::string& what);
std::string to_string(Fp8Recipe r);  // delayed, current, mxfp8
std::string to_string(Fp8WeightCast c);  // cached, per_microbatch
Fp8WeightCast parse_fp8_weight_cast(const std::string& s, const std::string& what);
// Throws InputError naming `what` for a word other than those.
Fp8Recipe parse_fp8_recipe(const std::string& s, const std::string& what);
std::string to_string(FlashKernel k);  // cudnn, fa2
// "cudnn" or "fa2"; InputError naming `what`, the value and the choices otherwise.
FlashKernel parse_flash_kernel(const std::string& s, const std::string& what);
// "none" or the kinds unfused, comma-separated in the order norm, act, rope.
std::string to_string(const Unfused& u);
// A comma-separated list of norm, act, rope, or "none"; InputError naming `what`, the value and the choices.
Unfused parse_unfused(const std::string& s, const std::string& what);
// The same from a JSON value: an array of those words (empty: none); InputError naming `what` otherwise.
Unfused parse_unfused_json(const Json& j, const std::string& what);
std::string to_string(StateDtype d);     // fp32, bf16
std::string to_string(MasterWeights w);  // fp32, remainder, none
// Their parsers; InputError naming `what`, the value and the choices otherwise.
StateDtype parse_state_dtype(const std::string& s, const std::string& what);
MasterWeights parse_master_weights(const std::string& s, const std::string& what);
Precision parse_precision(const std::string& s, const std::string& what);
Recompute parse_recompute(const std::string& s, const std::string& what);
int bytes_per_element(Precision p);  // activations/weights in compute precision: 2 (bf16/fp16), 1 (fp8), 4 (fp32)

// Strict JSON (keys: tp, pp, dp, cp, ep, etp, moe_skew, moe_capacity, moe_dispatcher (alltoall | deepep), moe_a2a_overlap, vpp, micro_batch, global_batch, schedule, microbatch_rule, recompute,
// recompute_method, recompute_layers, sequence_parallel, zero_stage, precision, attention, flash_kernel, cross_entropy, fp8_recipe, fp8_param_gather, fp8_weight_cast, unfused,
// main_grads, moments,
// master_weights, overlap_grad_reduce,
// overlap_param_gather, overlap_p2p, tp_comm_overlap, fragmentation, stage_layers; docs/layout.md). Missing optional keys take the defaults
// above; unknown keys fail.
Layout parse_layout(const Json& j, const std::string& where);
Json layout_to_json(const Layout& l);

// The first rule a layout breaks for this model on `gpus` GPUs: a stable key ("tp-divides-heads") for counts
// and a message naming the values. No exceptions: explore calls it for every candidate.
struct LayoutProblem {
  std::string rule;
  std::string message;
};
std::optional<LayoutProblem> layout_problem(const Layout& l, const Model& m, int gpus);
// Every rule the layout breaks, in the same order, each once (the first is layout_problem()'s): what would
// have to change for it to run. Rules that need a value an earlier rule left undefined (the micro-batch
// count when the batch does not divide) are not judged.
std::vector<LayoutProblem> layout_problems(const Layout& l, const Model& m, int gpus);

// Checks every rule that makes a layout impossible for this model on `gpus` GPUs; throws InfeasibleLayout
// naming the rule and the values ("tp 3 does not divide heads 96"). gpus <= 0 skips the GPU-count rule.
void check_layout(const Layout& l, const Model& m, int gpus);

}  // namespace tessel
