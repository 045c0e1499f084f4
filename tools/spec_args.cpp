#include "tools/spec_args.hpp"

#include "sim/recipe.hpp"
#include "sim/stack.hpp"

#include <algorithm>

#include "sim/layout_words.hpp"
#include "tools/system_args.hpp"
#include "util/error.hpp"

namespace tessel::cli {

std::vector<OptionSpec> spec_options() {
  std::vector<OptionSpec> o = {
      {"--model", true, "model preset or JSON file (HuggingFace config.json accepted) [gpt3-175b]"},
      {"--system", true, "system preset or JSON file [dgx-a100]"},
      {"--min-headroom", true, kMinHeadroomHelp},
      {"--fragmentation", true, kFragmentationHelp},
      {"--gpus-per-domain", true, kGpusPerDomainHelp},
      {"--gpus", true, "number of GPUs [tp*pp*dp*cp, or 1024 capped at the system's max_gpus]"},
      {"--layout", true, "a layout as explore prints it (\"tp8 pp16 dp8 vpp2 mbs1 interleaved layers=...\") or a layout "
                         "JSON file (docs/layout.md); the flags below override its fields"},
      {"--tp", true, "tensor-parallel size [8]"},
      {"--pp", true, "pipeline-parallel size [8]"},
      {"--dp", true, "data-parallel size [gpus / (tp*pp*cp)]"},
      {"--cp", true, "context-parallel size [1]"},
      {"--ep", true, "expert-parallel size (mixture-of-experts models; folded over tp x cp x dp) [1]"},
      {"--etp", true, "expert tensor-parallel size [tp, as Megatron-Core]"},
      {"--moe-skew", true, "MoE dropless routing: the busiest EP rank's tokens over the mean [1: balanced]"},
      {"--moe-capacity-factor", true, "MoE: experts padded to this capacity factor, tokens beyond dropped (Megatron's --moe-expert-capacity-factor with padding) [dropless]"},
      {"--moe-a2a-overlap", false, "MoE: hide the expert all-to-alls under another micro-batch's compute in F&B blocks: DualPipeV's (DeepSeek's DualPipe), or Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm: --schedule interleaved with --vpp > 1, or --pp 1)"},
      {"--moe-dispatcher", true, "MoE token dispatcher: alltoall (NCCL's all-to-all) or deepep (a token over the network once per node it needs, then NVLink) [alltoall]"},
      {"--vpp", true, "model chunks per pipeline rank [3 for interleaved, 2 for zbv/dualpipev, else 1]"},
      {"--mbs", true, "micro-batch size [1, or the stack's default where it has one]"},
      {"--gbs", true, "global batch size [1536]"},
      {"--seq", true, "sequence length (overrides the model's)"},
      {"--schedule", true, "gpipe|1f1b|interleaved|looped-bfs|zb1p|zb2p|zbv|dualpipev [interleaved]"},
      {"--mb-rule", true, "interleaved's micro-batch rule: megatron (m a multiple of pp) or torch (PyTorch's: m a "
                          "multiple of max(1, m // pp)) [megatron]"},
      {"--recompute", true, "none|selective|full [selective; none on a CPU system]"},
      {"--recompute-method", true, "uniform|block [uniform]"},
      {"--recompute-layers", true, "full recompute: layers recomputed per stage (block) [all]; uniform: 1 only"},
      {"--sp", false, "sequence parallelism [on under tp > 1, except on a CPU system]"},
      {"--no-sp", false, "no sequence parallelism"},
      {"--zero", true, "optimizer sharding: 0 none, 1 distributed optimizer, 2, 3 [0]"},
      {"--precision", true, "bf16|fp16|fp8|fp32 [bf16; fp32 on a CPU system]"},
      {"--attention", true, "flash|unfused [flash; unfused on a CPU system]"},
      {"--fp8-recipe", true, "fp8 scaling (Transformer Engine's recipes): delayed (DelayedScaling), current (Float8CurrentScaling, per-tensor from its own amax) or mxfp8 (Blackwell's 32-element blocks); needs --precision fp8 [delayed, or the stack's]"},
      {"--fp8-param-gather", false, kFp8ParamGatherHelp},
      {"--no-fp8-param-gather", false, kNoFp8ParamGatherHelp},
      {"--cross-entropy", true, "the LM loss: megatron (Megatron's unfused vocab-parallel cross-entropy), megatron-fused (--cross-entropy-loss-fusion) or te (--cross-entropy-fusion-impl te) [megatron, or the stack's]"},
      {"--flash-kernel", true, "the flash attention kernel: cudnn (Transformer Engine's fused attention, NeMo's) or fa2 (FlashAttention-2, PyTorch SDPA's first choice), priced at the system's attention_fa2 of cudnn's rate (docs/stacks.md) [cudnn, or the stack's]"},
      {"--unfused", true, "element-wise kernels run as PyTorch eager runs them, one op a kernel: a comma-separated list of norm (RMSNorm), act (bias + activation, SwiGLU), rope, or none (docs/stacks.md) [none, or the stack's]"},
      {"--main-grads", true, "gradient buffer and its DP reduction: fp32 or bf16 (Megatron-Core --main-grads-dtype, NeMo's grad_sync_dtype) [fp32]"},
      {"--moments", true, "the Adam moments: fp32 or bf16 (Megatron-Core --exp-avg-dtype / --exp-avg-sq-dtype) [fp32]"},
      {"--master-weights", true, "the weights' master copy: fp32, remainder (a 16-bit remainder beside each bf16 weight: store_param_remainders) or none (the optimizer updates the 16-bit weights) [fp32]"},
      {"--no-overlap", false, "do not overlap DP gradient reduction / parameter gather with compute [on a CPU system: never]"},
      {"--overlap-p2p", false, "overlap pipeline send/recv with compute in the steady state"},
      {"--tp-comm-overlap", false, "overlap SP's all-gathers / reduce-scatters with the adjacent GEMMs (Megatron --tp-comm-overlap; needs --sp)"},
      {"--stack", true, "software stack, a preset (megatron-lm-2021, megatron-lm-2022, megatron-zb-2023, megatron-core-2024, megatron-bridge-2025, torchtitan-2025, deepspeed) or JSON: its attention, overlaps and micro-batch rule; a layout it cannot run is refused (docs/stacks.md)"},
      {"--recipe", true, "what a release ran for this model (sim/recipes/: nemo-24.07, dgxc-24.11): its stack, and its recompute, SP, TP overlap, p2p overlap, loss and state dtypes as defaults the flags override (docs/stacks.md)"},
  };
  for (auto& f : split_options()) o.push_back(std::move(f));
  return o;
}

std::vector<OptionSpec> split_options() {
  return {
      {"--stage-layers", true, "layers per pipeline stage, pp*vpp entries in stage order (3,4x6,3 for 3,4,4,4,4,4,4,3)"},
      {"--first-stage-layers", true, "Megatron's --decoder-first-pipeline-num-layers: layers of pipeline rank 0"},
      {"--last-stage-layers", true, "Megatron's --decoder-last-pipeline-num-layers: layers of the last pipeline rank"},
      {"--account-for-embedding", false, "Megatron's --account-for-embedding-in-pipeline-split: the embedding "
                                         "counts as a layer of the first stage"},
      {"--account-for-loss", false, "Megatron's --account-for-loss-in-pipeline-split: the loss counts as a layer of the "
                                    "last stage"},
      {"--balance", true, "time|memory|even: how to split layers over the stages [time where the layers do not "
                          "divide; else the even split]"},
  };
}

RecipeChoice read_recipe(const CommandLine& cl, const std::string& model_name) {
  RecipeChoice c;
  c.stack = cl.get("--stack");
  if (auto r = cl.get("--recipe")) {
    c.recipe = load_recipe(*r, model_name);
    if (c.stack && load_stack(*c.stack).name != c.recipe->stack)
      throw InputError("--stack " + *c.stack + " with --recipe " + c.recipe->release + ": that release runs stack " +
                       c.recipe->stack);
    if (!c.stack) c.stack = c.recipe->stack;
    RecipeTerms& t = c.recipe->terms;
    if (cl.has("--recompute")) t.recompute.reset();
    if (cl.has("--sp") || cl.has("--no-sp")) t.sequence_parallel.reset();
    if (cl.has("--tp-comm-overlap")) t.tp_comm_overlap.reset();
    if (cl.has("--overlap-p2p")) t.overlap_p2p.reset();
    if (cl.has("--cross-entropy")) t.cross_entropy.reset();
    if (cl.has("--main-grads")) t.main_grads.reset();
    if (cl.has("--moments")) t.moments.reset();
    if (cl.has("--master-weights")) t.master_weights.reset();
    if (cl.has("--fp8-param-gather") || cl.has("--no-fp8-param-gather")) t.fp8_param_gather.reset();
  }
  return c;
}

std::optional<bool> read_fp8_param_gather(const CommandLine& cl) {
  const bool on = cl.has("--fp8-param-gather"), off = cl.has("--no-fp8-param-gather");
  if (on && off) throw InputError("--fp8-param-gather and --no-fp8-param-gather contradict each other");
  if (!on && !off) return std::nullopt;
  return on;
}

std::optional<FlashKernel> read_flash_kernel(const CommandLine& cl, AttentionImpl attention) {
  const auto k = cl.get("--flash-kernel");
  if (!k) return std::nullopt;
  const FlashKernel kernel = parse_flash_kernel(*k, "--flash-kernel");
  if (attention != AttentionImpl::flash)
    throw InputError("--flash-kernel " + *k + ": a flash attention kernel, but the attention is " + to_string(attention));
  return kernel;
}

void read_state_dtype_flags(const CommandLine& cl, StateDtypes& s) {
  if (auto g = cl.get("--main-grads")) s.main_grads = parse_state_dtype(*g, "--main-grads");
  if (auto mo = cl.get("--moments")) s.moments = parse_state_dtype(*mo, "--moments");
  if (auto w = cl.get("--master-weights")) s.master_weights = parse_master_weights(*w, "--master-weights");
}

// Megatron's rules for the full-recompute details: --recompute-method and --recompute-num-layers only
// with --recompute-granularity full, and a layer count of at least 1 (omit the flag for all layers).
void check_recompute_flags(const CommandLine& cl, const Layout& l) {
  for (const char* f : {"--recompute-method", "--recompute-layers"})
    if (cl.has(f) && l.recompute != Recompute::full)
      throw InputError(std::string(f) + ": applies to --recompute full only (got --recompute " + to_string(l.recompute) + ")");
}

std::optional<Layout> layout_argument(const CommandLine& cl, int default_gbs) {
  const auto text = cl.get("--layout");
  if (!text) return std::nullopt;
  return parse_layout_words(*text, static_cast<int>(cl.get_int("--gbs", 1, 1 << 30).value_or(default_gbs)), "--layout");
}

SplitRequest split_request(const CommandLine& cl, const std::string& model_arg, const Layout& l) {
  SplitRequest r;
  if (auto v = cl.get("--stage-layers")) r.stage_layers = parse_stage_layers(*v, "--stage-layers");
  if (auto v = cl.get_int("--first-stage-layers", 0, 100000)) r.first_stage_layers = static_cast<int>(*v);
  if (auto v = cl.get_int("--last-stage-layers", 0, 100000)) r.last_stage_layers = static_cast<int>(*v);
  r.account_for_embedding = cl.has("--account-for-embedding");
  r.account_for_loss = cl.has("--account-for-loss");
  if (auto b = cl.get("--balance")) r.balance = parse_balance(*b, "--balance");
  // Without a split of the flags' or the layout's own, a Megatron-LM argument file's flags (its training
  // script's split) decide.
  if (r.any() || !l.stage_layers.empty()) return r;
  const auto meg = load_megatron_pipeline_split(model_arg);
  if (!meg || !meg->any()) return r;
  r.first_stage_layers = meg->first_stage_layers;
  r.last_stage_layers = meg->last_stage_layers;
  r.account_for_embedding = meg->account_for_embedding;
  r.account_for_loss = meg->account_for_loss;
  r.first_from = model_arg + ": --decoder-first-pipeline-num-layers";
  r.last_from = model_arg + ": --decoder-last-pipeline-num-layers";
  r.embedding_from = model_arg + ": --account-for-embedding-in-pipeline-split";
  r.loss_from = model_arg + ": --account-for-loss-in-pipeline-split";
  return r;
}

namespace {

int int_or(const CommandLine& cl, const char* flag, std::int64_t lo, std::int64_t hi, int fallback) {
  return static_cast<int>(cl.get_int(flag, lo, hi).value_or(fallback));
}

// The schedule and its stages per rank: a flag, else the layout's, else the defaults (interleaved with 3
// chunks per rank on a pipeline, as explore --explain and schedule gen default them).
void read_schedule(const CommandLine& cl, const std::optional<Layout>& given, bool played, Layout& l) {
  if (auto sc = cl.get("--schedule")) l.schedule = sched::parse_schedule(*sc, "--schedule", !played);
  else if (!given) l.schedule = l.pp > 1 ? sched::Kind::interleaved : sched::Kind::one_f_one_b;
  if (auto v = cl.get_int("--vpp", 1, 1024)) {
    l.vpp = static_cast<int>(*v);
  } else if (!given || cl.has("--schedule") || cl.has("--pp")) {
    // The layout's chunk count while its schedule still takes it, else the schedule's own.
    const bool keep = given && l.pp > 1 && given->vpp > 1 && !sched::layout_vpp_problem(l.schedule, given->vpp);
    l.vpp = l.pp > 1 ? (keep ? given->vpp : sched::default_vpp(l.schedule, 3)) : 1;
  }
  if (auto r = cl.get("--mb-rule")) l.microbatch_rule = sched::parse_microbatch_rule(*r, "--mb-rule");
  if (l.microbatch_rule != sched::MicrobatchRule::megatron && !sched::family(l.schedule).takes_microbatch_rule)
    throw InputError(std::string(cl.has("--mb-rule") ? "--mb-rule " : "--layout: mb-rule=") +
                     sched::rule_name(l.microbatch_rule) + ": applies to --schedule interleaved only (" +
                     sched::name(l.schedule) + " has its own micro-batch rule)");
}

// Recompute, sequence parallelism, ZeRO, precision, attention and overlaps: each flag given replaces the
// layout's field (the defaults' without --layout: selective recompute, SP where tp > 1). A system of CPU cores
// (`cpu`: a host section, or no 16-bit peak: the cpu preset and its profiles) defaults to what the CPU runtime
// executes: fp32, no recompute, the unfused attention (its probabilities kept), no SP and no communication
// overlapped (docs/runtime.md); the flags still choose otherwise.
void read_options(const CommandLine& cl, const std::optional<Layout>& given, bool cpu, Layout& l) {
  if (auto r = cl.get("--recompute")) l.recompute = parse_recompute(*r, "--recompute");
  else if (!given) l.recompute = cpu ? Recompute::none : Recompute::selective;
  if (auto method = cl.get("--recompute-method")) {
    if (*method != "uniform" && *method != "block")
      throw InputError("--recompute-method " + *method + ": must be uniform or block");
    l.recompute_method = *method == "uniform" ? RecomputeMethod::uniform : RecomputeMethod::block;
  }
  if (auto n = cl.get_int("--recompute-layers", 1, 100000)) l.recompute_layers = static_cast<int>(*n);
  check_recompute_flags(cl, l);
  if (l.recompute_method == RecomputeMethod::uniform && l.recompute_layers > 1)
    throw InputError("--recompute-layers " + std::to_string(l.recompute_layers) +
                     " with --recompute-method uniform: the cost model prices checkpointing every layer's input "
                     "(uniform with 1 layer per block), not blocks of several layers; use 1, or --recompute-method block");
  if (cl.has("--sp") && cl.has("--no-sp")) throw InputError("--sp and --no-sp contradict each other");
  if (cl.has("--sp") || cl.has("--no-sp")) l.sequence_parallel = cl.has("--sp");
  else l.sequence_parallel = (given ? given->sequence_parallel : !cpu) && l.tp > 1;
  l.zero_stage = int_or(cl, "--zero", 0, 3, l.zero_stage);
  if (auto p = cl.get("--precision")) l.precision = parse_precision(*p, "--precision");
  else if (!given && cpu) l.precision = Precision::fp32;
  if (auto attn = cl.get("--attention")) {
    if (*attn != "flash" && *attn != "unfused") throw InputError("--attention " + *attn + ": must be flash or unfused");
    l.attention = *attn == "flash" ? AttentionImpl::flash : AttentionImpl::unfused;
  } else if (!given && cpu) {
    l.attention = AttentionImpl::unfused;
  }
  if (auto c = cl.get("--cross-entropy")) l.cross_entropy = parse_cross_entropy(*c, "--cross-entropy");
  if (auto r = cl.get("--fp8-recipe")) {
    l.fp8_recipe = parse_fp8_recipe(*r, "--fp8-recipe");
    if (l.precision != Precision::fp8)
      throw InputError("--fp8-recipe " + *r + ": an fp8 recipe, but the precision is " + to_string(l.precision) +
                       "; add --precision fp8");
  }
  if (auto u = cl.get("--unfused")) l.unfused = parse_unfused(*u, "--unfused");
  if (auto k = read_flash_kernel(cl, l.attention)) l.flash_kernel = *k;
  read_state_dtype_flags(cl, l.state);
  if (cl.has("--no-overlap") || (!given && cpu)) l.overlap_grad_reduce = l.overlap_param_gather = false;
  if (cl.has("--overlap-p2p")) l.overlap_p2p = true;
  if (cl.has("--tp-comm-overlap")) l.tp_comm_overlap = true;
  if (auto g = read_fp8_param_gather(cl)) l.fp8_param_gather = *g;
  if (auto f = cl.get_double("--fragmentation", 0, 1)) l.fragmentation = *f;
}

// dp and the GPU count: --dp given; else from --gpus (or, without --layout, the default count); else the
// layout's own dp.
int read_gpus(const CommandLine& cl, const std::optional<Layout>& given, const System& sys, Layout& l) {
  const auto gpus_flag = cl.get_int("--gpus", 1, 1 << 22);
  if (auto dp = cl.get_int("--dp", 1, 1 << 22)) {
    l.dp = static_cast<int>(*dp);
    return gpus_flag ? static_cast<int>(*gpus_flag) : l.gpus();
  }
  if (given && !gpus_flag) return l.gpus();
  // Without --gpus: 1024 GPUs, or the system's max_gpus when it has fewer (the cpu preset: 64), so the
  // default never exceeds the system it names.
  const int default_gpus = std::min(1024, sys.max_gpus);
  const int gpus = gpus_flag ? static_cast<int>(*gpus_flag) : default_gpus;
  const std::string gpus_from = gpus_flag ? "--gpus " + std::to_string(gpus)
                                          : "the default --gpus " + std::to_string(gpus) +
                                                (default_gpus < 1024 ? " (" + sys.name + "'s max_gpus)" : "");
  const long long model_parallel = static_cast<long long>(l.tp) * l.pp * l.cp;
  if (gpus % model_parallel != 0)
    throw InputError(gpus_from + " is not divisible by tp*pp*cp = " + std::to_string(model_parallel));
  l.dp = static_cast<int>(gpus / model_parallel);
  // dp came from the GPU count: say so, since the user never gave a --dp to blame.
  if (l.global_batch % (static_cast<long long>(l.micro_batch) * l.dp) != 0)
    throw InputError("--gbs " + std::to_string(l.global_batch) + " is not divisible by micro_batch*dp = " +
                     std::to_string(l.micro_batch) + "*" + std::to_string(l.dp) + ", where dp " + std::to_string(l.dp) +
                     " = " + gpus_from + " / (tp*pp*cp = " + std::to_string(model_parallel) +
                     "); give --dp, --gpus or a --gbs that divides");
  return gpus;
}

}  // namespace

Specs read_specs(const CommandLine& cl, bool played) {
  Specs s;
  const std::string model_arg = cl.get_or("--model", "gpt3-175b");
  s.model = load_model(model_arg, cl.get_int("--seq", 1, 1 << 24));
  s.system = read_system(cl, "dgx-a100");
  const std::optional<Layout> given = layout_argument(cl, 1536);
  Layout& l = s.layout;
  if (given) l = *given;
  l.tp = int_or(cl, "--tp", 1, 1 << 20, given ? given->tp : 8);
  l.pp = int_or(cl, "--pp", 1, 1 << 20, given ? given->pp : 8);
  l.cp = int_or(cl, "--cp", 1, 1 << 20, given ? given->cp : 1);
  l.ep = int_or(cl, "--ep", 1, 1 << 20, given ? given->ep : 1);
  l.etp = cl.has("--etp") ? int_or(cl, "--etp", 1, 1 << 20, 1) : given ? given->etp : 0;
  if (auto v = cl.get_double("--moe-skew", 1.0, 1024.0)) l.moe_skew = *v;
  if (auto v = cl.get_double("--moe-capacity-factor", 0.01, 1024.0)) l.moe_capacity = *v;
  if (auto v = cl.get("--moe-dispatcher")) {
    if (*v != "alltoall" && *v != "deepep")
      throw InputError("--moe-dispatcher " + *v + ": unknown dispatcher; choose alltoall (NCCL's all-to-all, "
                       "Megatron-Core's default) or deepep (DeepEP's node-limited dispatch)");
    l.deepep = *v == "deepep";
  }
  if (cl.has("--moe-a2a-overlap")) l.a2a_overlap = true;
  read_schedule(cl, given, played, l);
  l.micro_batch = int_or(cl, "--mbs", 1, 1 << 20, given ? given->micro_batch : 1);
  l.global_batch = int_or(cl, "--gbs", 1, 1 << 30, given ? given->global_batch : 1536);
  const bool cpu = s.system.host.cores > 0 || !(s.system.gpu.peak(Precision::bf16) > 0);
  // A stack sets the software defaults (attention, overlaps, interleaved's micro-batch rule); the flags below
  // still override them, and a layout the stack cannot run is refused once it is whole.
  // A recipe (sim/recipes/) is what a release ran for this model: its stack, and its terms as the defaults the
  // flags below override. A layout given whole says what it runs, so the two are not combined.
  if (given && cl.has("--recipe"))
    throw InputError("--recipe " + *cl.get("--recipe") + " with --layout: a layout given whole says what it runs; give "
                     "the recipe's terms as words or keys of the layout instead (docs/stacks.md, \"Recipes\")");
  const RecipeChoice choice = read_recipe(cl, s.model.name);
  const std::optional<Recipe>& recipe = choice.recipe;
  std::optional<Stack> stack;
  if (const auto& v = choice.stack) {
    stack = load_stack(*v);
    const sched::MicrobatchRule rule = l.microbatch_rule;
    apply_stack(*stack, l);
    if (cl.has("--mb-rule")) l.microbatch_rule = rule;
  }
  read_options(cl, given, cpu, l);
  if (stack && !stack->sequence_parallel && !cl.has("--sp")) l.sequence_parallel = false;
  // A layout given whole (--layout, a file) says what it runs; otherwise what a flag leaves open is the stack's.
  if (stack && !given) {
    if (!cl.has("--recompute")) l.recompute = stack->recompute_default;
    if (!cl.has("--zero")) l.zero_stage = stack->zero_default;
    if (!cl.has("--mbs") && stack->micro_batch_default) l.micro_batch = *stack->micro_batch_default;
    if (!cl.has("--sp") && !cl.has("--no-sp") && !cpu) l.sequence_parallel = stack->sequence_parallel_default && l.tp > 1;
  }
  if (recipe) {
    const RecipeTerms& t = recipe->terms;  // without what a flag gives (read_recipe)
    if (t.recompute) l.recompute = *t.recompute;
    if (t.sequence_parallel) l.sequence_parallel = *t.sequence_parallel && l.tp > 1;
    apply_recipe_terms(t, l);
  }
  // Asked for, fp8 primary weights must take effect (Layout::fp8_params), not be dropped in silence.
  if (cl.has("--fp8-param-gather") && !l.fp8_params())
    throw InputError(std::string("--fp8-param-gather: fp8 primary weights need ") +
                     (l.precision != Precision::fp8 ? "--precision fp8; the precision is " + to_string(l.precision)
                                                    : "the distributed optimizer (--zero 1 or more), as Megatron-Core asserts; "
                                                      "the ZeRO stage is 0"));
  s.gpus = read_gpus(cl, given, s.system, l);
  resolve_specs_split(cl, s);
  if (stack)
    if (auto p = stack_problem(*stack, l)) throw InputError("--" + *p);
  return s;
}

void resolve_specs_split(const CommandLine& cl, Specs& s) {
  Layout& l = s.layout;
  // A split made for another stage count (the layout's before a schedule file set its vpp) is no request.
  if (l.stage_layers.size() != static_cast<std::size_t>(l.num_stages())) l.stage_layers.clear();
  resolve_split(l, split_request(cl, cl.get_or("--model", "gpt3-175b"), l), s.model, s.system);
}

}  // namespace tessel::cli
