#include "tools/spec_args.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace tessel::cli {

std::vector<OptionSpec> spec_options() {
  return {
      {"--model", true, "model preset or JSON file (HuggingFace config.json accepted) [gpt3-175b]"},
      {"--system", true, "system preset or JSON file [dgx-a100]"},
      {"--gpus", true, "number of GPUs [tp*pp*dp*cp, or 1024 capped at the system's max_gpus]"},
      {"--layout", true, "layout JSON file (instead of the layout flags)"},
      {"--tp", true, "tensor-parallel size [8]"},
      {"--pp", true, "pipeline-parallel size [8]"},
      {"--dp", true, "data-parallel size [gpus / (tp*pp*cp)]"},
      {"--cp", true, "context-parallel size [1]"},
      {"--vpp", true, "model chunks per pipeline rank [3 for interleaved, 2 for zbv/dualpipev, else 1]"},
      {"--mbs", true, "micro-batch size [1]"},
      {"--gbs", true, "global batch size [1536]"},
      {"--seq", true, "sequence length (overrides the model's)"},
      {"--schedule", true, "gpipe|1f1b|interleaved|looped-bfs|zb1p|zb2p|zbv|dualpipev [interleaved]"},
      {"--mb-rule", true, "interleaved's micro-batch rule: megatron (m a multiple of pp) or torch (PyTorch's: m a "
                          "multiple of max(1, m // pp)) [megatron]"},
      {"--recompute", true, "none|selective|full [selective]"},
      {"--recompute-method", true, "uniform|block [uniform]"},
      {"--recompute-layers", true, "full recompute: layers recomputed per stage (block) [all]; uniform: 1 only"},
      {"--sp", false, "sequence parallelism [on with the default layout]"},
      {"--no-sp", false, "no sequence parallelism"},
      {"--zero", true, "optimizer sharding: 0 none, 1 distributed optimizer, 2, 3 [0]"},
      {"--precision", true, "bf16|fp16|fp8|fp32 [bf16]"},
      {"--attention", true, "flash|unfused [flash]"},
      {"--no-overlap", false, "do not overlap DP gradient reduction / parameter gather with compute"},
      {"--overlap-p2p", false, "overlap pipeline send/recv with compute in the steady state"},
  };
}

// Megatron's rules for the full-recompute details: --recompute-method and --recompute-num-layers only
// with --recompute-granularity full, and a layer count of at least 1 (omit the flag for all layers).
void check_recompute_flags(const CommandLine& cl, const Layout& l) {
  for (const char* f : {"--recompute-method", "--recompute-layers"})
    if (cl.has(f) && l.recompute != Recompute::full)
      throw InputError(std::string(f) + ": applies to --recompute full only (got --recompute " + to_string(l.recompute) + ")");
}

Specs read_specs(const CommandLine& cl, bool played) {
  Specs s;
  s.model = load_model(cl.get_or("--model", "gpt3-175b"), cl.get_int("--seq", 1, 1 << 24));
  s.system = load_system(cl.get_or("--system", "dgx-a100"));
  const std::vector<const char*> layout_flags = {"--tp", "--pp", "--dp", "--cp", "--vpp", "--mbs", "--gbs",
                                                 "--schedule", "--mb-rule", "--recompute", "--recompute-method",
                                                 "--recompute-layers", "--sp", "--no-sp", "--zero",
                                                 "--precision", "--attention", "--no-overlap", "--overlap-p2p"};
  auto gpus_flag = cl.get_int("--gpus", 1, 1 << 22);
  if (auto path = cl.get("--layout")) {
    for (const char* f : layout_flags)
      if (cl.has(f)) throw InputError(std::string(f) + ": cannot be combined with --layout " + *path);
    s.layout = parse_layout(parse_json_file(*path, "--layout "), *path);
    s.gpus = gpus_flag ? static_cast<int>(*gpus_flag) : s.layout.gpus();
    return s;
  }
  Layout& l = s.layout;
  l.tp = static_cast<int>(cl.get_int("--tp", 1, 1 << 20).value_or(8));
  l.pp = static_cast<int>(cl.get_int("--pp", 1, 1 << 20).value_or(8));
  l.cp = static_cast<int>(cl.get_int("--cp", 1, 1 << 20).value_or(1));
  // zb-greedy has no closed form: only the verbs that play a schedule (simulate) take it.
  l.schedule = sched::parse_schedule(cl.get_or("--schedule", l.pp > 1 ? "interleaved" : "1f1b"), "--schedule", !played);
  // The schedule's own stages per rank (sim/schedule/registry.hpp; explore --explain and schedule gen use the same).
  l.vpp = static_cast<int>(cl.get_int("--vpp", 1, 1024).value_or(l.pp > 1 ? sched::default_vpp(l.schedule, 3) : 1));
  if (auto r = cl.get("--mb-rule")) {
    l.microbatch_rule = sched::parse_microbatch_rule(*r, "--mb-rule");
    if (!sched::family(l.schedule).takes_microbatch_rule)
      throw InputError("--mb-rule " + *r + ": applies to --schedule interleaved only (" + sched::name(l.schedule) +
                       " has its own micro-batch rule)");
  }
  l.micro_batch = static_cast<int>(cl.get_int("--mbs", 1, 1 << 20).value_or(1));
  l.global_batch = static_cast<int>(cl.get_int("--gbs", 1, 1 << 30).value_or(1536));
  l.recompute = parse_recompute(cl.get_or("--recompute", "selective"), "--recompute");
  const std::string method = cl.get_or("--recompute-method", "uniform");
  if (method != "uniform" && method != "block")
    throw InputError("--recompute-method " + method + ": must be uniform or block");
  l.recompute_method = method == "uniform" ? RecomputeMethod::uniform : RecomputeMethod::block;
  l.recompute_layers = static_cast<int>(cl.get_int("--recompute-layers", 1, 100000).value_or(0));
  check_recompute_flags(cl, l);
  if (l.recompute_method == RecomputeMethod::uniform && l.recompute_layers > 1)
    throw InputError("--recompute-layers " + std::to_string(l.recompute_layers) +
                     " with --recompute-method uniform: the cost model prices checkpointing every layer's input "
                     "(uniform with 1 layer per block), not blocks of several layers; use 1, or --recompute-method block");
  if (cl.has("--sp") && cl.has("--no-sp")) throw InputError("--sp and --no-sp contradict each other");
  l.sequence_parallel = cl.has("--sp") || (!cl.has("--no-sp") && l.tp > 1);
  l.zero_stage = static_cast<int>(cl.get_int("--zero", 0, 3).value_or(0));
  l.precision = parse_precision(cl.get_or("--precision", "bf16"), "--precision");
  const std::string attn = cl.get_or("--attention", "flash");
  if (attn != "flash" && attn != "unfused") throw InputError("--attention " + attn + ": must be flash or unfused");
  l.attention = attn == "flash" ? AttentionImpl::flash : AttentionImpl::unfused;
  l.overlap_grad_reduce = l.overlap_param_gather = !cl.has("--no-overlap");
  l.overlap_p2p = cl.has("--overlap-p2p");
  const long long model_parallel = static_cast<long long>(l.tp) * l.pp * l.cp;
  if (auto dp = cl.get_int("--dp", 1, 1 << 22)) {
    l.dp = static_cast<int>(*dp);
    s.gpus = gpus_flag ? static_cast<int>(*gpus_flag) : l.gpus();
  } else {
    // Without --gpus: 1024 GPUs, or the system's max_gpus when it has fewer (the cpu preset: 64), so the
    // default never exceeds the system it names.
    const int default_gpus = std::min(1024, s.system.max_gpus);
    s.gpus = gpus_flag ? static_cast<int>(*gpus_flag) : default_gpus;
    const std::string gpus_from = gpus_flag ? "--gpus " + std::to_string(s.gpus)
                                            : "the default --gpus " + std::to_string(s.gpus) +
                                                  (default_gpus < 1024 ? " (" + s.system.name + "'s max_gpus)" : "");
    if (s.gpus % model_parallel != 0)
      throw InputError(gpus_from + " is not divisible by tp*pp*cp = " + std::to_string(model_parallel));
    l.dp = static_cast<int>(s.gpus / model_parallel);
    // dp came from the GPU count: say so, since the user never gave a --dp to blame.
    if (l.global_batch % (static_cast<long long>(l.micro_batch) * l.dp) != 0)
      throw InputError("--gbs " + std::to_string(l.global_batch) + " is not divisible by micro_batch*dp = " +
                       std::to_string(l.micro_batch) + "*" + std::to_string(l.dp) + ", where dp " + std::to_string(l.dp) +
                       " = " + gpus_from + " / (tp*pp*cp = " + std::to_string(model_parallel) +
                       "); give --dp, --gpus or a --gbs that divides");
  }
  return s;
}

}  // namespace tessel::cli
