// Software stacks: what a training framework of a given era overlaps, which attention kernel it runs, which
// schedules, recompute policies, ZeRO stages and parallelisms it offers (sim/stacks/*.json, each with its
// sources). A stack sets a layout's software defaults (apply_stack), says when a layout asks for something the
// stack does not have (stack_problem), and bounds explore's search (sim/explore). validate predicts each
// published source under its stack (source_stack). docs/stacks.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sim/layout.hpp"
#include "sim/schedule/registry.hpp"
#include "util/json_reader.hpp"

namespace tessel {

enum class TpOverlap { none, optional };  // --tp-comm-overlap: absent from the stack, or there and off unless asked

struct Stack {
  std::string name, source;
  AttentionImpl attention = AttentionImpl::flash;
  // The LM loss it computes unless asked otherwise (key "cross_entropy", absent: Megatron's unfused one); a
  // layout may choose another (the implementations are flags of the same software, not other software).
  CrossEntropyImpl cross_entropy = CrossEntropyImpl::megatron;
  // How an fp8 run scales its tensors unless asked otherwise (key "fp8_recipe", absent: delayed, Transformer
  // Engine's DelayedScaling default that Megatron-LM and NeMo run; torchtitan's torchao float8: current).
  Fp8Recipe fp8_recipe = Fp8Recipe::delayed;
  // Whether its fp8 runs keep fp8 primary weights (key "fp8_param_gather", absent: false; Layout::fp8_param_gather):
  // Megatron-Bridge's and NeMo 2.0's fp8 mixed-precision recipes turn it on; Megatron-LM's --fp8-param-gather and
  // NeMo 1's fp8_params are off unless asked.
  bool fp8_param_gather = false;
  // How its fp8 runs cast the 16-bit GEMM weights (key "fp8_weight_cast", absent: cached, Transformer Engine's
  // cast once a step; torchtitan's torchao Float8Linear: per_microbatch; Layout::fp8_weight_cast).
  Fp8WeightCast fp8_weight_cast = Fp8WeightCast::cached;
  // The element-wise kernels its model code runs unfused unless asked otherwise (key "unfused", a list of
  // norm, act, rope; absent: all fused, as Megatron-LM and NeMo's configs run them).
  Unfused unfused;
  // The flash attention kernel it runs (key "flash_kernel", absent: cudnn, Transformer Engine's choice on
  // Hopper; torchtitan's SDPA: fa2).
  FlashKernel flash_kernel = FlashKernel::cudnn;
  bool overlap_grad_reduce = true, overlap_param_gather = true, overlap_p2p = false;
  TpOverlap tp_comm_overlap = TpOverlap::none;
  bool sequence_parallel = true, context_parallel = true;
  std::vector<sched::Kind> schedules;
  sched::MicrobatchRule microbatch_rule = sched::MicrobatchRule::megatron;
  std::vector<Recompute> recompute;
  Recompute recompute_default = Recompute::none;  // without a recompute flag (Megatron-LM: none; torchtitan: selective)
  std::vector<int> zero;
  // What the stack runs when a run does not say (validate fills a published row's unstated fields with them):
  // sequence parallelism under tp > 1 (Megatron-LM: --sequence-parallel is opt-in; NeMo's recipes set it),
  // and the ZeRO stage (Megatron-LM: no distributed optimizer unless asked; NeMo: distributed_fused_adam).
  bool sequence_parallel_default = false;  // key "sequence_parallel_default", absent: false
  int zero_default = 0;                    // key "zero_default", absent: the first of "zero"
  // The micro-batch size its configs run where a run does not say (key "micro_batch_default", absent: none,
  // as Megatron-LM's --micro-batch-size, which has no default and must be given; NeMo's configs: 1).
  std::optional<int> micro_batch_default;
  // Memory its allocator holds beyond the tensors, as a fraction of what a step allocates and frees (key
  // "fragmentation", absent: 0; Layout::fragmentation): PyTorch's caching allocator as Megatron-LM, NeMo and
  // DeepSpeed run it, or with expandable segments as torchtitan's launcher sets them (docs/stacks.md).
  double fragmentation = 0.0;
  bool deepep = false;       // the DeepEP token dispatcher for MoE models (key "deepep", absent: false)
  bool a2a_overlap = false;  // DualPipe's all-to-all overlap in its F&B blocks (key "a2a_overlap", absent: false)
};

Stack parse_stack(const Json& j, const std::string& where);
std::vector<std::string> stack_names();
// A preset name (sim/stacks/) or a stack JSON file; InputError naming the known presets otherwise.
Stack load_stack(const std::string& name_or_path);

// The stack's software defaults on `l`: attention, the loss, the fp8 recipe, the unfused kernels, the DP / p2p
// overlaps, the interleaved micro-batch rule, the allocator's fragmentation.
void apply_stack(const Stack& s, Layout& l);
// The first thing `l` asks for that the stack does not have, as a message naming the stack, the field and the
// values it offers; nullopt when the stack runs the layout.
std::optional<std::string> stack_problem(const Stack& s, const Layout& l);

// What the stack runs when a layout does not say: "recompute=none, sequence_parallel=true, zero_stage=1,
// micro_batch=1 under stack megatron-core-2024" (no micro_batch term for a stack without that default).
std::string defaults_text(const Stack& s);

// A preset, parsed once (validate looks one up per row, thousands of times in a fit).
const Stack& stack_preset(const std::string& name);

// The stack a published row's source ran (by its id's prefix: narayanan21, korthikanti22, zb24, nemo...),
// or nullopt for a source without one.
std::optional<std::string> source_stack(const std::string& row_id);

}  // namespace tessel
