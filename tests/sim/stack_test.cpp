// Software stacks (sim/stack.hpp): every preset reads, sets a layout's software defaults, refuses what it does
// not run with a message naming the stack and the field, and validate's sources map to theirs.
#include <doctest/doctest.h>

#include <string>

#include "sim/layout_words.hpp"
#include "sim/stack.hpp"
#include "util/error.hpp"

using namespace tessel;

namespace {
std::string error_of(const std::string& json) {
  try {
    parse_stack(parse_json_text(json, "s.json"), "s.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("stacks: every preset reads, and each names its sources") {
  const auto names = stack_names();
  CHECK(names.size() == 7);
  for (const auto& n : names) {
    CAPTURE(n);
    const Stack s = load_stack(n);
    CHECK(s.name == n);
    CHECK(s.source.size() > 80);
    CHECK_FALSE(s.schedules.empty());
    CHECK_FALSE(s.recompute.empty());
    CHECK_FALSE(s.zero.empty());
    CHECK(&stack_preset(n) == &stack_preset(n));  // parsed once
  }
  std::string err;
  try {
    load_stack("megatron-lm-2020");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err.rfind("--stack megatron-lm-2020: no such stack (known: deepspeed, megatron-bridge-2025, megatron-core-2024, ", 0) == 0);
}

// The allocator's fragmentation: the stacks on PyTorch's caching allocator at its defaults hold 0.10 of a step's
// dynamic bytes, torchtitan (expandable segments, set by its launcher) 0.05; apply_stack sets the layout's; a
// stack file without the key has none, and one out of [0, 1] is refused, naming the key.
TEST_CASE("stacks: the allocator's fragmentation") {
  for (const auto& n : stack_names()) {
    CAPTURE(n);
    CHECK(stack_preset(n).fragmentation == (n == "torchtitan-2025" ? 0.05 : 0.10));
  }
  Layout l;
  CHECK(l.fragmentation == 0);
  apply_stack(stack_preset("torchtitan-2025"), l);
  CHECK(l.fragmentation == 0.05);
  apply_stack(stack_preset("megatron-core-2024"), l);
  CHECK(l.fragmentation == 0.10);
  const std::string ok = R"({"name":"x","source":"s","attention":"flash",
    "overlap":{"grad_reduce":true,"param_gather":true,"p2p":false},"tp_comm_overlap":"none",
    "sequence_parallel":true,"context_parallel":false,"schedules":["1f1b"],"recompute":["none"],
    "recompute_default":"none","zero":[0]})";
  CHECK(parse_stack(parse_json_text(ok, "s.json"), "s.json").fragmentation == 0);
  std::string bad = ok;
  bad.insert(bad.size() - 1, ",\"fragmentation\":1.5");
  CHECK(error_of(bad).find("fragmentation: value 1.5 is out of range [0, 1]") != std::string::npos);
}

// fp8 primary weights: Megatron-Bridge's fp8 recipes set fp8_param_gather; Megatron-LM, NeMo 1 (the 24.07
// configs), DeepSpeed and torchtitan leave them off. A stack's default takes effect only under fp8 with the
// distributed optimizer (Megatron-Core asserts it); a stack file's non-boolean value is refused.
TEST_CASE("stacks: fp8 primary weights") {
  for (const auto& n : stack_names()) {
    CAPTURE(n);
    CHECK(stack_preset(n).fp8_param_gather == (n == "megatron-bridge-2025"));
  }
  Layout l;
  apply_stack(stack_preset("megatron-bridge-2025"), l);
  CHECK(l.fp8_param_gather);
  CHECK_FALSE(l.fp8_params());  // bf16, ZeRO 0
  l.precision = Precision::fp8;
  CHECK_FALSE(l.fp8_params());
  l.zero_stage = 1;
  CHECK(l.fp8_params());
  CHECK(l.describe().find(" fp8-params") != std::string::npos);
  apply_stack(stack_preset("megatron-core-2024"), l);
  CHECK_FALSE(l.fp8_params());
  const std::string ok = R"({"name":"x","source":"s","attention":"flash",
    "overlap":{"grad_reduce":true,"param_gather":true,"p2p":false},"tp_comm_overlap":"none",
    "sequence_parallel":true,"context_parallel":false,"schedules":["1f1b"],"recompute":["none"],
    "recompute_default":"none","zero":[0]})";
  std::string bad = ok;
  bad.insert(bad.size() - 1, ",\"fp8_param_gather\":\"yes\"");
  CHECK(error_of(bad).find("fp8_param_gather") != std::string::npos);
}

TEST_CASE("stacks: the fp8 recipe a stack runs unless asked") {
  Layout l;
  l.precision = Precision::fp8;
  apply_stack(stack_preset("torchtitan-2025"), l);  // torchao's tensor-wise dynamic scales
  CHECK(l.fp8_recipe == Fp8Recipe::current);
  apply_stack(stack_preset("megatron-core-2024"), l);  // Transformer Engine's DelayedScaling default
  CHECK(l.fp8_recipe == Fp8Recipe::delayed);
}

// How a stack casts fp8 weights: torchao's Float8Linear (torchtitan) every micro-batch, Transformer Engine (every
// other stack) once a step, keeping the copy; a stack file's unknown value is refused naming the key.
TEST_CASE("stacks: how fp8 weights are cast") {
  for (const auto& n : stack_names()) {
    CAPTURE(n);
    CHECK((stack_preset(n).fp8_weight_cast == Fp8WeightCast::per_microbatch) == (n == "torchtitan-2025"));
  }
  Layout l;
  l.precision = Precision::fp8;
  apply_stack(stack_preset("torchtitan-2025"), l);
  CHECK(l.fp8_weight_cast == Fp8WeightCast::per_microbatch);
  apply_stack(stack_preset("megatron-core-2024"), l);
  CHECK(l.fp8_weight_cast == Fp8WeightCast::cached);
  const std::string ok = R"({"name":"x","source":"s","attention":"flash",
    "overlap":{"grad_reduce":true,"param_gather":true,"p2p":false},"tp_comm_overlap":"none",
    "sequence_parallel":true,"context_parallel":false,"schedules":["1f1b"],"recompute":["none"],
    "recompute_default":"none","zero":[0],"fp8_weight_cast":"sometimes"})";
  CHECK(error_of(ok).find("fp8_weight_cast: value \"sometimes\" is not one of cached, per_microbatch") != std::string::npos);
}

// The kernels a stack's model code leaves unfused: torchtitan's eager model (compile off in its configs) and
// the HF Transformers model code taken under DeepSpeed run the norm, activation and RoPE op by op; Megatron-LM
// and NeMo fuse them. A stack file naming another kernel is refused, naming it.
TEST_CASE("stacks: the kernels a stack runs unfused, and its flash attention kernel, unless asked") {
  Layout l;
  apply_stack(stack_preset("torchtitan-2025"), l);
  CHECK(l.unfused == Unfused{true, true, true});
  CHECK(l.flash_kernel == FlashKernel::fa2);  // SDPA's first choice
  apply_stack(stack_preset("megatron-core-2024"), l);
  CHECK(l.unfused == Unfused{});
  CHECK(l.flash_kernel == FlashKernel::cudnn);  // Transformer Engine's fused attention
  apply_stack(stack_preset("deepspeed"), l);
  CHECK(l.unfused == Unfused{true, true, true});
  CHECK(l.flash_kernel == FlashKernel::fa2);
  for (const char* n : {"megatron-lm-2021", "megatron-lm-2022", "megatron-zb-2023", "megatron-bridge-2025"}) {
    CAPTURE(n);
    CHECK_FALSE(stack_preset(n).unfused.any());
  }
  Json j = parse_json_text(R"({"name":"x","source":"a stack file of a test","attention":"flash","unfused":["softmax"],
      "overlap":{"grad_reduce":true,"param_gather":true,"p2p":false},"tp_comm_overlap":"none","sequence_parallel":true,
      "context_parallel":false,"schedules":["1f1b"],"recompute":["none"],"recompute_default":"none","zero":[0]})", "x.json");
  CHECK_THROWS_WITH_AS(parse_stack(j, "x.json"), doctest::Contains("x.json: unfused: value \"softmax\""), InputError);
  j["unfused"] = Json::array({"act"});
  CHECK(parse_stack(j, "x.json").unfused == Unfused{false, true, false});
}

TEST_CASE("stacks: defaults applied, and what a stack lacks refused by name") {
  const Stack& old = stack_preset("megatron-lm-2021");
  Layout l = parse_layout_words("tp8 pp8 dp16 vpp3 mbs1 interleaved full", 1536);
  apply_stack(old, l);
  CHECK(l.attention == AttentionImpl::unfused);
  CHECK_FALSE(l.overlap_grad_reduce);
  CHECK_FALSE(l.overlap_param_gather);
  CHECK_FALSE(l.overlap_p2p);
  CHECK_FALSE(stack_problem(old, l).has_value());
  Layout zbv = l;
  zbv.schedule = sched::Kind::zbv;
  zbv.vpp = 2;
  CHECK(stack_problem(old, zbv) == "stack megatron-lm-2021: schedule zbv is not one of its schedules (1f1b, interleaved)");
  Layout sel = l;
  sel.recompute = Recompute::selective;
  CHECK(stack_problem(old, sel) == "stack megatron-lm-2021: recompute selective is not one of its policies (none, full)");
  Layout sp = l;
  sp.sequence_parallel = true;
  CHECK(stack_problem(old, sp) == "stack megatron-lm-2021: it has no sequence parallelism (sp)");
  Layout z1 = l;
  z1.zero_stage = 1;
  CHECK(stack_problem(old, z1) == "stack megatron-lm-2021: zero1 is not one of its ZeRO stages (zero0)");
  Layout flash = l;
  flash.attention = AttentionImpl::flash;
  CHECK(stack_problem(old, flash) == "stack megatron-lm-2021: it runs unfused attention, the layout asks for flash");
  // Megatron-Core offers TP overlap, DeepSpeed does not; torchtitan's interleaved follows PyTorch's rule.
  Layout tpo = parse_layout_words("tp8 pp8 dp16 vpp3 mbs1 interleaved sp tp-overlap", 1536);
  apply_stack(stack_preset("megatron-core-2024"), tpo);
  CHECK_FALSE(stack_problem(stack_preset("megatron-core-2024"), tpo).has_value());
  CHECK(tpo.overlap_p2p);
  Layout ds = parse_layout_words("tp8 pp8 dp16 mbs1 1f1b tp-overlap", 1536);
  apply_stack(stack_preset("deepspeed"), ds);
  CHECK(stack_problem(stack_preset("deepspeed"), ds) == "stack deepspeed: it does not overlap TP communication (tp-overlap)");
  Layout tt = parse_layout_words("tp8 pp8 dp16 vpp2 mbs1 interleaved sp", 1536);
  apply_stack(stack_preset("torchtitan-2025"), tt);
  CHECK(tt.microbatch_rule == sched::MicrobatchRule::torch);
}

// What each stack runs when a run does not say: validate fills a published row's unstated fields with it.
TEST_CASE("stacks: defaults for what a run does not state") {
  const Stack& lm22 = stack_preset("megatron-lm-2022");
  CHECK(lm22.recompute_default == Recompute::none);
  CHECK_FALSE(lm22.sequence_parallel_default);  // --sequence-parallel is opt-in
  CHECK(lm22.zero_default == 0);                // no distributed optimizer unless asked
  const Stack& mc = stack_preset("megatron-core-2024");
  CHECK(mc.sequence_parallel_default);  // NeMo's recipes: sequence_parallel true
  CHECK(mc.zero_default == 1);          // distributed_fused_adam
  CHECK(stack_preset("torchtitan-2025").zero_default == 3);  // FSDP2
  CHECK(stack_preset("torchtitan-2025").recompute_default == Recompute::selective);
  // The micro-batch: 1 in NeMo's and Megatron-Bridge's configs; none for Megatron-LM (--micro-batch-size must be
  // given), DeepSpeed (derived from the batch) and torchtitan (1 pipelined, the whole local batch otherwise).
  CHECK(mc.micro_batch_default == 1);
  CHECK(stack_preset("megatron-bridge-2025").micro_batch_default == 1);
  for (const char* n : {"megatron-lm-2021", "megatron-lm-2022", "megatron-zb-2023", "deepspeed", "torchtitan-2025"}) {
    CAPTURE(n);
    CHECK_FALSE(stack_preset(n).micro_batch_default.has_value());
  }
  CHECK(defaults_text(mc) == "recompute=none, sequence_parallel=true, zero_stage=1, micro_batch=1 under stack megatron-core-2024");
  CHECK(defaults_text(lm22) == "recompute=none, sequence_parallel=false, zero_stage=0 under stack megatron-lm-2022");
  // Megatron-Bridge's resolved performance configs: Transformer Engine's fused loss, the distributed optimizer
  // with its overlaps, no p2p overlap even when interleaved; DeepEP and the combined-1F1B all-to-all overlap
  // are there to ask for, not on.
  const Stack& mb = stack_preset("megatron-bridge-2025");
  CHECK(mb.cross_entropy == CrossEntropyImpl::te);
  CHECK(mb.zero_default == 1);
  CHECK(mb.sequence_parallel_default);
  CHECK(mb.recompute_default == Recompute::none);
  CHECK_FALSE(mb.overlap_p2p);
  CHECK(mb.overlap_grad_reduce);
  Layout moe = parse_layout_words("tp2 pp8 dp64 ep64 vpp4 mbs1 interleaved sp zero1", 8192);
  apply_stack(mb, moe);
  CHECK_FALSE(moe.overlap_p2p);
  CHECK_FALSE(moe.deepep);
  moe.deepep = true;
  CHECK_FALSE(stack_problem(mb, moe).has_value());
  CHECK(stack_problem(stack_preset("megatron-core-2024"), moe) == "stack megatron-core-2024: it has no DeepEP dispatcher (deepep)");
}

TEST_CASE("stacks: validate's sources map to their stacks") {
  CHECK(source_stack("narayanan21_t2_PTD-P_174.6B") == "megatron-lm-2021");
  CHECK(source_stack("korthikanti22_t5_175B_selective_sp") == "megatron-lm-2022");
  CHECK(source_stack("zb24_t4_1.5B_ZB-2p_m24") == "megatron-zb-2023");
  CHECK(source_stack("nemo2407_GPT3-175B_512gpu") == "megatron-core-2024");
  CHECK(source_stack("mbridge2602_Qwen3-235B-A22B_h100_256gpu") == "megatron-bridge-2025");
  CHECK_FALSE(source_stack("deepseekv3_pretrain_throughput").has_value());
}

TEST_CASE("stacks: a bad stack file names the field, the value and the rule") {
  const std::string ok = R"({"name":"x","source":"s","attention":"flash",
    "overlap":{"grad_reduce":true,"param_gather":true,"p2p":false},"tp_comm_overlap":"none",
    "sequence_parallel":true,"context_parallel":false,"schedules":["1f1b"],"recompute":["none"],
    "recompute_default":"none","zero":[0]})";
  CHECK(error_of(ok).empty());
  std::string bad = ok;
  bad.replace(bad.find("[\"1f1b\"]"), 8, "[\"zz\"]");
  CHECK(error_of(bad).find("schedules") != std::string::npos);
  CHECK(error_of(bad).find("\"zz\" is not a layout schedule") != std::string::npos);
  bad = ok;
  bad.replace(bad.find("\"recompute_default\":\"none\""), 26, "\"recompute_default\":\"full\"");
  CHECK(error_of(bad).find("recompute_default") != std::string::npos);
  bad = ok;
  bad.insert(bad.size() - 1, ",\"zero_default\":1");
  CHECK(error_of(bad).find("zero_default") != std::string::npos);
  CHECK(error_of(bad).find("must be one of the stack's ZeRO stages") != std::string::npos);
  bad = ok;
  bad.insert(bad.size() - 1, ",\"micro_batch_default\":0");
  CHECK(error_of(bad).find("micro_batch_default: value 0 is out of range [1, ") != std::string::npos);
  bad = ok;
  bad.replace(bad.find("\"sequence_parallel\":true"), 24, "\"sequence_parallel\":false,\"sequence_parallel_default\":true");
  CHECK(error_of(bad).find("sequence_parallel_default") != std::string::npos);
  CHECK(error_of(bad).find("cannot be true for a stack without sequence parallelism") != std::string::npos);
  bad = ok;
  bad.insert(bad.size() - 1, ",\"cross_entropy\":\"fused\"");
  CHECK(error_of(bad).find("cross_entropy: value \"fused\" is not one of megatron, megatron-fused, te") != std::string::npos);
  std::string te = ok;
  te.insert(te.size() - 1, ",\"cross_entropy\":\"te\"");
  const Stack st = parse_stack(parse_json_text(te, "s.json"), "s.json");
  CHECK(st.cross_entropy == CrossEntropyImpl::te);
  Layout l;
  apply_stack(st, l);
  CHECK(l.cross_entropy == CrossEntropyImpl::te);
  CHECK(stack_preset("megatron-core-2024").cross_entropy == CrossEntropyImpl::megatron);  // absent: Megatron's default
  bad = ok;
  bad.insert(bad.size() - 1, ",\"fp8\":true");
  CHECK(error_of(bad).find("fp8") != std::string::npos);
}
