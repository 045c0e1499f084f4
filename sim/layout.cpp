#include "sim/layout.hpp"

#include <algorithm>
#include <array>
#include <numeric>
#include <sstream>

#include "util/error.hpp"

namespace tessel {

std::string to_string(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

std::string to_string(Precision p) {
  switch (p) {
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
    case Precision::fp8: return "fp8";
    case Precision::fp32: return "fp32";
  }
  return "?";
}

std::string to_string(AttentionImpl a) { return a == AttentionImpl::flash ? "flash" : "unfused"; }

std::string to_string(CrossEntropyImpl c) {
  switch (c) {
    case CrossEntropyImpl::megatron: return "megatron";
    case CrossEntropyImpl::megatron_fused: return "megatron-fused";
    case CrossEntropyImpl::te: return "te";
  }
  return "megatron";
}

CrossEntropyImpl parse_cross_entropy(const std::string& s, const std::string& what) {
  for (CrossEntropyImpl c : {CrossEntropyImpl::megatron, CrossEntropyImpl::megatron_fused, CrossEntropyImpl::te})
    if (s == to_string(c)) return c;
  throw InputError(what + ": value \"" + s + "\" is not one of megatron, megatron-fused, te");
}

std::string to_string(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::delayed: return "delayed";
    case Fp8Recipe::current: return "current";
    case Fp8Recipe::mxfp8: return "mxfp8";
  }
  return "delayed";
}

Fp8Recipe parse_fp8_recipe(const std::string& s, const std::string& what) {
  for (Fp8Recipe r : {Fp8Recipe::delayed, Fp8Recipe::current, Fp8Recipe::mxfp8})
    if (s == to_string(r)) return r;
  throw InputError(what + ": value \"" + s + "\" is not one of delayed, current, mxfp8");
}

std::string to_string(Fp8WeightCast c) { return c == Fp8WeightCast::cached ? "cached" : "per_microbatch"; }

Fp8WeightCast parse_fp8_weight_cast(const std::string& s, const std::string& what) {
  for (Fp8WeightCast c : {Fp8WeightCast::cached, Fp8WeightCast::per_microbatch})
    if (s == to_string(c)) return c;
  throw InputError(what + ": value \"" + s + "\" is not one of cached, per_microbatch");
}

std::string to_string(FlashKernel k) { return k == FlashKernel::fa2 ? "fa2" : "cudnn"; }

FlashKernel parse_flash_kernel(const std::string& s, const std::string& what) {
  for (FlashKernel k : {FlashKernel::cudnn, FlashKernel::fa2})
    if (s == to_string(k)) return k;
  throw InputError(what + ": value \"" + s + "\" is not one of cudnn, fa2");
}

namespace {

// The kernels Unfused names, each with its word in flags, layout files and output, in the order they are written.
constexpr std::array<std::pair<bool Unfused::*, const char*>, 3> kUnfusedKernels{
    {{&Unfused::norm, "norm"}, {&Unfused::act, "act"}, {&Unfused::rope, "rope"}}};

std::vector<std::string> unfused_words(const Unfused& u) {
  std::vector<std::string> out;
  for (const auto& [member, word] : kUnfusedKernels)
    if (u.*member) out.emplace_back(word);
  return out;
}

void add_unfused(Unfused& u, const std::string& word, const std::string& what, const std::string& value) {
  for (const auto& [member, name] : kUnfusedKernels)
    if (word == name) {
      u.*member = true;
      return;
    }
  std::string names;
  for (const auto& k : kUnfusedKernels) names += (names.empty() ? "" : ", ") + std::string(k.second);
  throw InputError(what + ": value \"" + value + "\": \"" + word + "\" is not one of " + names +
                   " (a comma-separated list of them, or none)");
}

}  // namespace

std::string to_string(const Unfused& u) {
  std::string out;
  for (const std::string& w : unfused_words(u)) out += (out.empty() ? "" : ",") + w;
  return out.empty() ? "none" : out;
}

Unfused parse_unfused(const std::string& s, const std::string& what) {
  Unfused u;
  if (s == "none") return u;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = s.find(',', start);
    add_unfused(u, s.substr(start, comma == std::string::npos ? std::string::npos : comma - start), what, s);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return u;
}

Unfused parse_unfused_json(const Json& j, const std::string& what) {
  if (!j.is_array()) throw InputError(what + ": must be an array of norm, act, rope (empty: every kernel fused)");
  Unfused u;
  for (const Json& w : j) {
    if (!w.is_string()) throw InputError(what + ": value " + json_brief(w) + " is not one of norm, act, rope");
    add_unfused(u, w.get<std::string>(), what, w.get<std::string>());
  }
  return u;
}

std::string to_string(StateDtype d) { return d == StateDtype::fp32 ? "fp32" : "bf16"; }

std::string to_string(MasterWeights w) {
  switch (w) {
    case MasterWeights::fp32: return "fp32";
    case MasterWeights::remainder: return "remainder";
    case MasterWeights::none: return "none";
  }
  return "fp32";
}

StateDtype parse_state_dtype(const std::string& s, const std::string& what) {
  for (StateDtype d : {StateDtype::fp32, StateDtype::bf16})
    if (s == to_string(d)) return d;
  throw InputError(what + ": value \"" + s + "\" is not one of fp32, bf16");
}

MasterWeights parse_master_weights(const std::string& s, const std::string& what) {
  for (MasterWeights w : {MasterWeights::fp32, MasterWeights::remainder, MasterWeights::none})
    if (s == to_string(w)) return w;
  throw InputError(what + ": value \"" + s + "\" is not one of fp32, remainder, none");
}

Precision parse_precision(const std::string& s, const std::string& what) {
  if (s == "bf16") return Precision::bf16;
  if (s == "fp16") return Precision::fp16;
  if (s == "fp8") return Precision::fp8;
  if (s == "fp32") return Precision::fp32;
  throw InputError(what + ": precision \"" + s + "\" is not one of bf16, fp16, fp8, fp32");
}

Recompute parse_recompute(const std::string& s, const std::string& what) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  throw InputError(what + ": recompute \"" + s + "\" is not one of none, selective, full");
}

int bytes_per_element(Precision p) {
  switch (p) {
    case Precision::fp8: return 1;
    case Precision::fp32: return 4;
    default: return 2;
  }
}

int Layout::layers_of_stage(int stage, int model_layers) const {
  if (!stage_layers.empty()) return stage_layers.at(static_cast<std::size_t>(stage));
  return model_layers / num_stages();
}

int Layout::first_layer_of_stage(int stage, int model_layers) const {
  int first = 0;
  for (int s = 0; s < stage; ++s) first += layers_of_stage(s, model_layers);
  return first;
}

int Layout::rank_of_stage(int stage) const {
  if (v_placement()) return stage < pp ? stage : 2 * pp - 1 - stage;
  return stage % pp;
}

std::string Layout::describe() const {
  std::ostringstream os;
  os << "tp" << tp << " pp" << pp << " dp" << dp;
  if (cp > 1) os << " cp" << cp;
  if (ep > 1) os << " ep" << ep;
  if (etp > 0 && etp != tp) os << " etp" << etp;
  if (moe_capacity > 0) os << " capacity=" << moe_capacity;
  else if (moe_skew != 1.0) os << " skew=" << moe_skew;
  if (deepep) os << " deepep";
  if (a2a_overlap) os << " a2a-overlap";
  if (vpp > 1) os << " vpp" << vpp;
  os << " mbs" << micro_batch;
  if (pp > 1) os << " " << sched::name(schedule);
  if (pp > 1 && microbatch_rule != sched::MicrobatchRule::megatron) os << " mb-rule=" << sched::rule_name(microbatch_rule);
  if (recompute != Recompute::none) os << " " << to_string(recompute);
  // Full recompute's method and layer count change both time and memory: "full-block2" (Megatron's
  // --recompute-method block --recompute-num-layers 2); plain "full" is uniform, 1 layer per block (the only
  // uniform form the cost model prices: parse_layout and the flags refuse more).
  if (recompute == Recompute::full && recompute_method == RecomputeMethod::block)
    os << "-block" << (recompute_layers > 0 ? std::to_string(recompute_layers) : "");
  if (sequence_parallel) os << " sp";
  if (tp_comm_overlap) os << " tp-overlap";
  if (zero_stage > 0) os << " zero" << zero_stage;
  if (fp8_params()) os << " fp8-params";
  if (state.main_grads != StateDtype::fp32) os << " grads=" << to_string(state.main_grads);
  if (state.moments != StateDtype::fp32) os << " moments=" << to_string(state.moments);
  if (state.master_weights != MasterWeights::fp32) os << " master=" << to_string(state.master_weights);
  if (!stage_layers.empty()) os << " layers=" << describe_stage_layers(stage_layers);
  return os.str();
}

std::string describe_stage_layers(const std::vector<int>& stage_layers) {
  std::ostringstream os;
  for (std::size_t i = 0; i < stage_layers.size();) {
    std::size_t j = i;
    while (j < stage_layers.size() && stage_layers[j] == stage_layers[i]) ++j;
    os << (i ? "," : "") << stage_layers[i];
    if (j - i > 1) os << "x" << (j - i);
    i = j;
  }
  return os.str();
}

sched::GenParams schedule_params(const Layout& l) {
  sched::GenParams p;
  p.pp = l.pp;
  p.microbatches = l.num_microbatches();
  p.vpp = l.vpp;
  p.rule = l.microbatch_rule;
  p.combined = l.combined_1f1b();
  return p;
}

bool Layout::a2a_overlap_fits(sched::Kind k, int pp, int vpp) {
  if (k == sched::Kind::dualpipev) return pp > 1;
  if (k == sched::Kind::interleaved) return pp > 1 && vpp > 1;
  return k == sched::Kind::one_f_one_b && pp == 1;
}

Layout parse_layout(const Json& j, const std::string& where) {
  JsonObject o(j, where);
  Layout l;
  constexpr std::int64_t kMaxDegree = 1 << 20;
  l.tp = static_cast<int>(o.opt_integer("tp", 1, kMaxDegree).value_or(1));
  l.pp = static_cast<int>(o.opt_integer("pp", 1, kMaxDegree).value_or(1));
  l.dp = static_cast<int>(o.opt_integer("dp", 1, kMaxDegree).value_or(1));
  l.cp = static_cast<int>(o.opt_integer("cp", 1, kMaxDegree).value_or(1));
  l.ep = static_cast<int>(o.opt_integer("ep", 1, kMaxDegree).value_or(1));
  l.etp = static_cast<int>(o.opt_integer("etp", 1, kMaxDegree).value_or(0));
  l.moe_skew = o.opt_number("moe_skew", 1.0, 1024.0).value_or(1.0);
  l.moe_capacity = o.opt_number("moe_capacity", 0.01, 1024.0).value_or(0.0);
  if (auto d = o.opt_string("moe_dispatcher")) {
    if (*d != "alltoall" && *d != "deepep")
      o.fail("moe_dispatcher", "value \"" + *d + "\" is not one of: alltoall, deepep");
    l.deepep = *d == "deepep";
  }
  l.a2a_overlap = o.opt_boolean("moe_a2a_overlap").value_or(false);
  l.vpp = static_cast<int>(o.opt_integer("vpp", 1, 1024).value_or(1));
  l.micro_batch = static_cast<int>(o.integer("micro_batch", 1, 1 << 20));
  l.global_batch = static_cast<int>(o.integer("global_batch", 1, 1 << 30));
  if (auto sc = o.opt_string("schedule")) {
    const sched::Family* f = sched::find_family(*sc);
    if (!f || !f->layout_schedule)
      o.fail("schedule", "value \"" + *sc + "\" is not one of: " + sched::known_names(true) +
                             (f ? " (" + *sc + " is a generator only the simulator plays)" : ""));
    l.schedule = f->kind;
  }
  if (auto r = o.opt_string("microbatch_rule")) {
    l.microbatch_rule = sched::parse_microbatch_rule(*r, where + ": microbatch_rule");
    if (l.microbatch_rule != sched::MicrobatchRule::megatron && !sched::family(l.schedule).takes_microbatch_rule)
      o.fail("microbatch_rule", "\"" + *r + "\" applies to interleaved only; schedule " + sched::name(l.schedule) +
                                    " has its own micro-batch rule");
  }
  if (auto r = o.opt_string("recompute")) l.recompute = parse_recompute(*r, where + ": recompute");
  if (auto m = o.opt_string("recompute_method")) {
    if (*m != "uniform" && *m != "block") o.fail("recompute_method", "value \"" + *m + "\" is not one of uniform, block");
    l.recompute_method = *m == "uniform" ? RecomputeMethod::uniform : RecomputeMethod::block;
  }
  l.recompute_layers = static_cast<int>(o.opt_integer("recompute_layers", 0, 100000).value_or(0));
  if (l.recompute == Recompute::full && l.recompute_method == RecomputeMethod::uniform && l.recompute_layers > 1)
    o.fail("recompute_layers", std::to_string(l.recompute_layers) +
                                   " with recompute_method uniform: the cost model prices checkpointing every layer's "
                                   "input (1 layer per block), not blocks of several layers; use 1, or method block");
  l.sequence_parallel = o.opt_boolean("sequence_parallel").value_or(false);
  l.zero_stage = static_cast<int>(o.opt_integer("zero_stage", 0, 3).value_or(0));
  if (auto p = o.opt_string("precision")) l.precision = parse_precision(*p, where + ": precision");
  if (auto a = o.opt_string("attention")) {
    if (*a != "flash" && *a != "unfused") o.fail("attention", "value \"" + *a + "\" is not one of flash, unfused");
    l.attention = *a == "flash" ? AttentionImpl::flash : AttentionImpl::unfused;
  }
  if (auto k = o.opt_string("flash_kernel")) {
    l.flash_kernel = parse_flash_kernel(*k, where + ": flash_kernel");
    if (l.attention != AttentionImpl::flash)
      o.fail("flash_kernel", "\"" + *k + "\" is a flash attention kernel; attention is " + to_string(l.attention));
  }
  if (auto c = o.opt_string("cross_entropy")) l.cross_entropy = parse_cross_entropy(*c, where + ": cross_entropy");
  if (auto r = o.opt_string("fp8_recipe")) {
    l.fp8_recipe = parse_fp8_recipe(*r, where + ": fp8_recipe");
    if (l.precision != Precision::fp8)
      o.fail("fp8_recipe", "\"" + *r + "\" is an fp8 recipe; precision is " + to_string(l.precision) + ", not fp8");
  }
  if (auto g = o.opt_boolean("fp8_param_gather")) {
    l.fp8_param_gather = *g;
    if (*g && l.precision != Precision::fp8)
      o.fail("fp8_param_gather", "true keeps fp8 weights; precision is " + to_string(l.precision) + ", not fp8");
    if (*g && l.zero_stage == 0)
      o.fail("fp8_param_gather", "true needs the distributed optimizer (zero_stage >= 1), as Megatron-Core asserts; "
                                 "zero_stage is 0");
  }
  if (auto c = o.opt_string("fp8_weight_cast")) {
    l.fp8_weight_cast = parse_fp8_weight_cast(*c, where + ": fp8_weight_cast");
    if (l.precision != Precision::fp8)
      o.fail("fp8_weight_cast", "\"" + *c + "\" says how fp8 weights are cast; precision is " + to_string(l.precision) +
                                    ", not fp8");
  }
  if (o.has("unfused")) l.unfused = parse_unfused_json(o.raw("unfused"), where + ": unfused");
  else o.ignore("unfused");
  if (auto g = o.opt_string("main_grads")) l.state.main_grads = parse_state_dtype(*g, where + ": main_grads");
  if (auto m = o.opt_string("moments")) l.state.moments = parse_state_dtype(*m, where + ": moments");
  if (auto w = o.opt_string("master_weights")) l.state.master_weights = parse_master_weights(*w, where + ": master_weights");
  l.overlap_grad_reduce = o.opt_boolean("overlap_grad_reduce").value_or(true);
  l.overlap_param_gather = o.opt_boolean("overlap_param_gather").value_or(true);
  l.overlap_p2p = o.opt_boolean("overlap_p2p").value_or(false);
  l.tp_comm_overlap = o.opt_boolean("tp_comm_overlap").value_or(false);
  l.fragmentation = o.opt_number("fragmentation", 0, 1).value_or(0.0);
  if (o.has("stage_layers")) {
    for (double x : o.number_array("stage_layers", 0, 100000)) {
      if (x != static_cast<int>(x)) o.fail("stage_layers", "entries must be whole layer counts, got " + std::to_string(x));
      l.stage_layers.push_back(static_cast<int>(x));
    }
  } else {
    o.ignore("stage_layers");
  }
  // Each degree is bounded, but their product is the GPU count everything downstream multiplies in int:
  // bound it as --gpus is bounded (tools/spec_args.cpp), far above any machine built (~10^5 GPUs).
  // In double: four degrees of up to 2^20 multiply to 2^80, beyond int64 too.
  constexpr double kMaxGpus = 1 << 22;
  const double gpus = static_cast<double>(l.tp) * l.pp * l.dp * l.cp;
  if (gpus > kMaxGpus) {
    std::ostringstream os;
    os << "tp*pp*dp*cp = " << l.tp << "*" << l.pp << "*" << l.dp << "*" << l.cp << " = " << gpus
       << " GPUs, more than the limit " << kMaxGpus;
    o.fail("tp", os.str());
  }
  o.finish();
  return l;
}

Json layout_to_json(const Layout& l) {
  Json j;
  j["tp"] = l.tp;
  j["pp"] = l.pp;
  j["dp"] = l.dp;
  j["cp"] = l.cp;
  if (l.ep > 1) j["ep"] = l.ep;
  if (l.etp > 0) j["etp"] = l.etp;
  if (l.moe_skew != 1.0) j["moe_skew"] = l.moe_skew;
  if (l.moe_capacity > 0) j["moe_capacity"] = l.moe_capacity;
  if (l.deepep) j["moe_dispatcher"] = "deepep";
  if (l.a2a_overlap) j["moe_a2a_overlap"] = true;
  j["vpp"] = l.vpp;
  j["micro_batch"] = l.micro_batch;
  j["global_batch"] = l.global_batch;
  j["schedule"] = sched::name(l.schedule);
  if (l.microbatch_rule != sched::MicrobatchRule::megatron) j["microbatch_rule"] = sched::rule_name(l.microbatch_rule);
  j["recompute"] = to_string(l.recompute);
  j["recompute_method"] = l.recompute_method == RecomputeMethod::uniform ? "uniform" : "block";
  j["recompute_layers"] = l.recompute_layers;
  j["sequence_parallel"] = l.sequence_parallel;
  j["zero_stage"] = l.zero_stage;
  j["precision"] = to_string(l.precision);
  j["attention"] = to_string(l.attention);
  if (l.runs_fa2()) j["flash_kernel"] = to_string(l.flash_kernel);
  if (l.cross_entropy != CrossEntropyImpl::megatron) j["cross_entropy"] = to_string(l.cross_entropy);
  if (l.precision == Precision::fp8 && l.fp8_recipe != Fp8Recipe::delayed) j["fp8_recipe"] = to_string(l.fp8_recipe);
  if (l.fp8_params()) j["fp8_param_gather"] = true;
  if (l.precision == Precision::fp8 && l.fp8_weight_cast != Fp8WeightCast::cached)
    j["fp8_weight_cast"] = to_string(l.fp8_weight_cast);
  if (l.unfused.any()) j["unfused"] = unfused_words(l.unfused);
  if (l.state.main_grads != StateDtype::fp32) j["main_grads"] = to_string(l.state.main_grads);
  if (l.state.moments != StateDtype::fp32) j["moments"] = to_string(l.state.moments);
  if (l.state.master_weights != MasterWeights::fp32) j["master_weights"] = to_string(l.state.master_weights);
  j["overlap_grad_reduce"] = l.overlap_grad_reduce;
  j["overlap_param_gather"] = l.overlap_param_gather;
  j["overlap_p2p"] = l.overlap_p2p;
  j["tp_comm_overlap"] = l.tp_comm_overlap;
  if (l.fragmentation > 0) j["fragmentation"] = l.fragmentation;
  if (!l.stage_layers.empty()) j["stage_layers"] = l.stage_layers;
  return j;
}

namespace {
std::string s(long long v) { return std::to_string(v); }
}  // namespace

namespace {

// Every rule in order; `all` false stops at the first broken one (explore's hot path, estimate, simulate),
// true collects each broken rule once (explore's diagnosis when nothing fits). `broke` says whether to stop.
void collect_problems(const Layout& l, const Model& m, int gpus, bool all, std::vector<LayoutProblem>& out) {
  auto broke = [&](std::string rule, std::string message) {
    out.push_back(LayoutProblem{std::move(rule), std::move(message)});
    return !all;
  };
  const long long product = static_cast<long long>(l.tp) * l.pp * l.dp * l.cp;
  if (gpus > 0 && product != gpus &&
      broke("gpu-count", "tp*pp*dp*cp = " + s(l.tp) + "*" + s(l.pp) + "*" + s(l.dp) + "*" + s(l.cp) + " = " + s(product) +
                             " is not the GPU count " + s(gpus)))
    return;
  if (l.precision == Precision::fp32 &&
      !l.state.all_fp32() &&
      broke("state-dtypes", "main_grads " + to_string(l.state.main_grads) + ", moments " + to_string(l.state.moments) +
                                ", master_weights " + to_string(l.state.master_weights) +
                                " with precision fp32: fp32 training keeps its gradients and moments fp32 and its "
                                "weights are their own master copy; these apply to bf16, fp16 and fp8 training"))
    return;
  if (l.state.master_weights == MasterWeights::remainder && l.precision == Precision::fp16 &&
      broke("master-remainder", "master_weights remainder with precision fp16: a 16-bit remainder completes a bf16 "
                                "weight (the upper half of its fp32 value), not an fp16 one; use fp32 or none"))
    return;
  if (m.heads % l.tp != 0 && broke("tp-divides-heads", "tp " + s(l.tp) + " does not divide heads " + s(m.heads))) return;
  // Megatron replicates KV heads when tp > kv_heads (GQA); it needs tp to be a multiple of kv_heads then.
  if (m.kv_heads % l.tp != 0 && l.tp % m.kv_heads != 0 &&
      broke("tp-kv-heads", "tp " + s(l.tp) + " and kv_heads " + s(m.kv_heads) + ": one must divide the other"))
    return;
  if (m.ffn % l.tp != 0 && broke("tp-divides-ffn", "tp " + s(l.tp) + " does not divide ffn " + s(m.ffn))) return;
  if (l.moe_skew != 1.0 && l.moe_capacity > 0 &&
      broke("moe-routing", "a routing skew and a capacity factor together: a padded capacity sets every expert's load "
                           "whatever the skew; give one"))
    return;
  if (!m.moe.enabled() && (l.moe_skew != 1.0 || l.moe_capacity > 0) &&
      broke("routing-needs-experts", "routing skew / capacity factor: model " + m.name + " has no experts"))
    return;
  if (!m.moe.enabled() && (l.ep > 1 || (l.etp > 0 && l.etp != l.tp)) &&
      broke("ep-needs-experts", "ep " + s(l.ep) + (l.etp > 0 ? " etp " + s(l.etp) : std::string()) + ": model " + m.name +
                                    " has no experts (expert parallelism needs a mixture-of-experts model)"))
    return;
  if (l.deepep && (!m.moe.enabled() || l.ep == 1) &&
      broke("deepep-needs-ep", "deepep (--moe-dispatcher deepep, JSON moe_dispatcher) with " +
                                   (m.moe.enabled() ? "ep 1" : "model " + m.name + ", which has no experts") +
                                   ": DeepEP dispatches tokens among expert-parallel ranks and needs ep > 1"))
    return;
  if (l.a2a_overlap && (!m.moe.enabled() || l.ep == 1 || !Layout::a2a_overlap_fits(l.schedule, l.pp, l.vpp)) &&
      broke("a2a-overlap", "a2a-overlap (--moe-a2a-overlap, JSON moe_a2a_overlap) with " +
                               (m.moe.enabled() ? "ep " + s(l.ep) + ", pp " + s(l.pp) + ", vpp " + s(l.vpp) + " and schedule " +
                                                      sched::name(l.schedule)
                                                : "model " + m.name + ", which has no experts") +
                               ": it hides the expert all-to-alls (ep > 1) under another micro-batch's compute in F&B "
                               "blocks: DualPipeV's (pp > 1), or Megatron-Core's combined 1F1B, which needs schedule "
                               "interleaved with vpp > 1 when pp > 1, or 1f1b with pp 1"))
    return;
  if (l.combined_1f1b() && l.recompute == Recompute::full &&
      broke("a2a-overlap", std::string("a2a-overlap with recompute full (--recompute, JSON recompute) on schedule ") +
                               sched::name(l.schedule) +
                               ": Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm) asserts "
                               "recompute_granularity != full; use selective or none"))
    return;
  if (m.moe.enabled()) {
    const int etp = l.expert_tp();
    if (m.moe.experts % l.ep != 0 &&
        broke("ep-divides-experts", "ep " + s(l.ep) + " does not divide the experts (" + s(m.moe.experts) + ")"))
      return;
    const long long fold = static_cast<long long>(l.tp) * l.cp * l.dp;
    if (fold % (static_cast<long long>(etp) * l.ep) != 0 &&
        broke("expert-folding", "etp x ep = " + s(etp) + " x " + s(l.ep) + " must divide tp x cp x dp = " + s(fold) +
                                    ": the experts fold over the same GPUs as attention (Megatron-Core's parallel folding)"))
      return;
    if (m.moe.expert_ffn % etp != 0 &&
        broke("etp-divides-expert-ffn", "etp " + s(etp) + " does not divide the expert FFN size " + s(m.moe.expert_ffn)))
      return;
    if (m.moe.shared_ffn % l.tp != 0 &&
        broke("tp-divides-shared-ffn", "tp " + s(l.tp) + " does not divide the shared experts' FFN size " + s(m.moe.shared_ffn)))
      return;
    if (l.zero_stage == 3 &&
        broke("moe-zero3", "ZeRO-3 (zero3) with a mixture-of-experts model: not priced (use zero1, Megatron-Core's "
                           "distributed optimizer, or zero2)"))
      return;
    // Megatron-Core asserts it: with tensor and expert parallelism the MoE layer's token dispatcher works on
    // the sequence-parallel shard.
    if (l.tp > 1 && !l.sequence_parallel &&
        broke("moe-tp-needs-sp", "a mixture-of-experts model with tp " + s(l.tp) + " needs sequence parallel (sp), as "
                                 "Megatron-Core requires with tensor and expert parallelism"))
      return;
  }
  if (l.cp > 1 && m.seq_len % (2 * l.cp) != 0 &&
      broke("cp-seq", "cp " + s(l.cp) + ": seq_len " + s(m.seq_len) + " must be divisible by 2*cp (load-balanced chunks)"))
    return;
  if (l.sequence_parallel && l.tp == 1 && broke("sp-needs-tp", "sequence parallel needs tp > 1")) return;
  // Megatron-LM asserts the same: its userbuffer overlap pipelines the all-gathers and reduce-scatters of SP.
  if (l.tp_comm_overlap && !l.sequence_parallel &&
      broke("tp-overlap-needs-sp", "tp communication overlap (tp-overlap, --tp-comm-overlap) needs sequence parallel "
                                   "(sp) and tp > 1: it overlaps SP's all-gathers and reduce-scatters"))
    return;
  if (l.sequence_parallel && (m.seq_len / l.cp) % l.tp != 0 &&
      broke("sp-seq", "sequence parallel: seq_len/cp " + s(m.seq_len / l.cp) + " is not divisible by tp " + s(l.tp)))
    return;
  const bool batch_ok = l.global_batch % (static_cast<long long>(l.micro_batch) * l.dp) == 0;
  if (!batch_ok && broke("batch-divisibility", "global batch " + s(l.global_batch) + " is not divisible by micro_batch*dp = " +
                                                   s(static_cast<long long>(l.micro_batch) * l.dp)))
    return;
  // Stages per rank before the layer split, which depends on them: a schedule's vpp rule is the one to name
  // (the analytical model's and the generator's, sim/schedule/registry.hpp).
  bool vpp_ok = true;
  if (l.pp == 1) {
    // No pipeline: the schedule name does not matter.
    if (l.vpp != 1) {
      vpp_ok = false;
      if (broke("vpp-needs-pp", "vpp " + s(l.vpp) + " needs pp > 1")) return;
    }
  } else if (auto p = sched::layout_vpp_problem(l.schedule, l.vpp)) {
    vpp_ok = false;
    if (broke(std::move(p->rule), std::move(p->message))) return;
  }
  const int stages = l.num_stages();
  if (!l.stage_layers.empty()) {
    const long long sum = std::accumulate(l.stage_layers.begin(), l.stage_layers.end(), 0LL);
    const bool negative = std::any_of(l.stage_layers.begin(), l.stage_layers.end(), [](int x) { return x < 0; });
    if (static_cast<int>(l.stage_layers.size()) != stages) {
      if (broke("stage-layers", "stage_layers has " + s(static_cast<long long>(l.stage_layers.size())) +
                                    " entries, pp*vpp is " + s(stages)))
        return;
    } else if (sum != m.layers) {
      if (broke("stage-layers", "stage_layers sum to " + s(sum) + ", the model has " + s(m.layers) + " layers")) return;
    } else if (negative) {
      if (broke("stage-layers", "stage_layers: negative layer count")) return;
    } else if (stages > 2) {
      // A middle stage without a layer only passes its input on; the first and the last may hold none (the
      // embedding alone, the head and loss alone, as Llama 3 placed them).
      const auto empty = std::find(l.stage_layers.begin() + 1, l.stage_layers.end() - 1, 0);
      if (empty != l.stage_layers.end() - 1 &&
          broke("stage-layers", "stage_layers: stage " + s(empty - l.stage_layers.begin()) + " of " + s(stages) +
                                    " holds no layer; only the first and the last stage may (the embedding, the head alone)"))
        return;
    }
  } else if (m.layers % stages != 0) {
    if (broke("layer-split", "layers " + s(m.layers) + " do not split evenly over pp*vpp = " + s(stages) +
                                 " stages (an uneven split needs stage_layers: --stage-layers, --balance, layers=... in a layout)"))
      return;
  } else if (m.layers < stages) {
    if (broke("layer-split", "layers " + s(m.layers) + " fewer than pp*vpp = " + s(stages) + " stages")) return;
  }
  // Then the micro-batch rule of the schedule generator itself (sim/schedule/registry.hpp), so that estimate,
  // simulate, run and explore refuse every layout the generator would. Without a whole micro-batch count
  // there is no m to check.
  if (l.pp > 1 && batch_ok && vpp_ok) {
    if (auto p = sched::microbatch_problem(l.schedule, l.pp, l.num_microbatches(), l.microbatch_rule)) {
      p->message += " (m = global batch " + s(l.global_batch) + " / (micro_batch " + s(l.micro_batch) + " * dp " +
                    s(l.dp) + "))";
      broke(std::move(p->rule), std::move(p->message));
    }
  }
}

}  // namespace

std::optional<LayoutProblem> layout_problem(const Layout& l, const Model& m, int gpus) {
  std::vector<LayoutProblem> out;
  collect_problems(l, m, gpus, false, out);
  if (out.empty()) return std::nullopt;
  return std::move(out.front());
}

std::vector<LayoutProblem> layout_problems(const Layout& l, const Model& m, int gpus) {
  std::vector<LayoutProblem> out;
  collect_problems(l, m, gpus, true, out);
  return out;
}

void check_layout(const Layout& l, const Model& m, int gpus) {
  if (auto p = layout_problem(l, m, gpus)) throw InfeasibleLayout(p->message);
}

}  // namespace tessel
