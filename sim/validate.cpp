#include "sim/validate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "sim/estimate.hpp"
#include "sim/recipe.hpp"
#include "sim/stack.hpp"
#include "sim/stage_split.hpp"
#include "util/suggest.hpp"
#include "util/units.hpp"

namespace tessel {

namespace {

struct RowSkip {
  std::string reason;
};

int int_field(const Json& obj, const char* key, const std::string& where) {
  const Json& v = obj.at(key);
  if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > (1 << 24))
    throw InputError(where + "." + key + ": value " + json_brief(v) + " must be a positive integer");
  return v.get<int>();
}

bool is_null(const Json& obj, const char* key) { return !obj.contains(key) || obj.at(key).is_null(); }

// A string field, or `fallback` when absent or null; any other type is an InputError naming it.
std::string str_field(const Json& obj, const char* key, const std::string& where, const std::string& fallback = "") {
  if (!obj.is_object()) throw InputError(where + ": must be an object, got " + json_brief(obj));
  if (is_null(obj, key)) return fallback;
  const Json& v = obj.at(key);
  if (!v.is_string()) throw InputError(where + "." + key + ": value " + json_brief(v) + " must be a string");
  return v.get<std::string>();
}

// A MoE row's model: the preset of its name, its shape and MoE keys checked against the row (published-moe.json's
// keys: experts, experts_per_token, expert_ffn, layers, hidden), the row's sequence length.
Model moe_model_of(const Json& mj, const std::string& where, std::vector<std::string>& assumed) {
  const std::string name = str_field(mj, "name", where + ".model", "row model");
  std::optional<std::string> preset;
  for (const auto& n : model_preset_names())
    if (folded_name(n) == folded_name(name)) preset = n;
  if (!preset) throw RowSkip{"model: mixture of experts " + name + " has no model preset to take its architecture from"};
  Model m = load_model(*preset);
  const auto agree = [&](const char* key, long long have) {
    if (!is_null(mj, key) && mj.at(key).is_number_integer() && mj.at(key).get<long long>() != have)
      throw RowSkip{"model." + std::string(key) + " " + json_brief(mj.at(key)) + " differs from preset " + *preset + "'s " +
                    std::to_string(have)};
  };
  agree("layers", m.layers);
  agree("hidden", m.hidden);
  agree("experts", m.moe.experts);
  agree("experts_per_token", m.moe.top_k);
  agree("expert_ffn", m.moe.expert_ffn);
  if (!is_null(mj, "seq_len")) m.seq_len = int_field(mj, "seq_len", where + ".model");
  assumed.push_back("model from preset " + *preset);
  return m;
}

// The row's model. Architecture facts not in the row follow the model family: Llama rows are SwiGLU,
// RMSNorm, rotary, untied and bias-free; GPT rows GELU, LayerNorm, learned positions, tied, with biases.
Model model_of(const Json& row, const std::string& where, std::vector<std::string>& assumed) {
  const Json& mj = row.at("model");
  Model m;
  m.name = str_field(mj, "name", where + ".model", "row model");
  // A mixture of experts read as the dense model of its other keys would be a silently wrong prediction: it
  // takes its preset (the row's MoE keys checked against it) or is skipped.
  if (!is_null(mj, "experts") && mj.at("experts").is_number() && mj.at("experts").get<double>() > 1)
    return moe_model_of(mj, where, assumed);
  if (is_null(mj, "layers") || is_null(mj, "hidden") || is_null(mj, "heads")) {
    // A row that names a known model without its shape ("LLAMA2-7B") takes the preset's shape.
    for (const auto& name : model_preset_names())
      if (folded_name(name) == folded_name(m.name)) {
        Model p = load_model(name);
        if (!is_null(mj, "seq_len")) p.seq_len = int_field(mj, "seq_len", where + ".model");
        assumed.push_back("model shape from preset " + name);
        return p;
      }
    for (const char* k : {"layers", "hidden", "heads"})
      if (is_null(mj, k)) throw RowSkip{std::string("model.") + k + " is not given"};
  }
  m.layers = int_field(mj, "layers", where + ".model");
  m.hidden = int_field(mj, "hidden", where + ".model");
  m.heads = int_field(mj, "heads", where + ".model");
  m.kv_heads = is_null(mj, "kv_heads") ? m.heads : int_field(mj, "kv_heads", where + ".model");
  m.head_dim = m.hidden / m.heads;
  m.ffn = is_null(mj, "ffn") ? 4 * m.hidden : int_field(mj, "ffn", where + ".model");
  m.seq_len = is_null(mj, "seq_len") ? 2048 : int_field(mj, "seq_len", where + ".model");
  if (is_null(mj, "vocab")) {
    m.vocab = 51200;
    assumed.push_back("vocab=51200 (not stated; GPT-2 BPE padded as in Megatron-LM)");
  } else {
    m.vocab = int_field(mj, "vocab", where + ".model");
  }
  std::string lname = m.name;
  std::transform(lname.begin(), lname.end(), lname.begin(), ::tolower);
  const bool llama = lname.find("llama") != std::string::npos;
  m.activation = llama ? Activation::swiglu : Activation::gelu;
  m.norm = llama ? Norm::rmsnorm : Norm::layernorm;
  m.position = llama ? PositionEmbedding::rotary : PositionEmbedding::learned;
  m.tied_embeddings = !llama;
  m.bias = !llama;
  m.dropout = !llama;
  if (m.hidden % m.heads != 0) throw RowSkip{"hidden not divisible by heads"};
  return m;
}

// Software facts of the source: Megatron-LM as Narayanan et al. (2021) and Korthikanti et al. (2022) ran it
// had no fused attention and did not overlap the DP gradient all-reduce with backward (Korthikanti Sec. 6.3
// and formulas.md); later sources (ZB 2024, NeMo 24.07) use fused attention and overlap.
// The Zero Bubble runs (Megatron-LM fork, 2023) are taken as unfused attention too: their reported peak
// memory (e.g. 59 GB for 1.5B ZB-2P, 30 GB for 1F1B) matches the 5 a s^2 b score term of Korthikanti's
// formula and is less than half of it without (an inference from the numbers; the paper does not say).
// Those facts are the stacks' (sim/stacks/, one per source: source_stack); a source without one keeps the
// Layout defaults with the pipeline sends overlapped.
void apply_source_conventions(const std::string& id, Layout& l, std::vector<std::string>& assumed) {
  if (const auto name = source_stack(id)) {
    const Stack& s = stack_preset(*name);
    apply_stack(s, l);
    assumed.push_back("stack " + s.name + " (attention " + to_string(s.attention) +
                      (s.overlap_grad_reduce ? "" : ", no DP overlap") + ")");
    if (s.name == "megatron-zb-2023") assumed.push_back("attention=unfused (inferred from the reported memory)");
    return;
  }
  l.attention = AttentionImpl::flash;
  l.overlap_grad_reduce = l.overlap_param_gather = l.overlap_p2p = true;
}

using Candidate = RowCandidate;

// Builds every layout the row allows: fixed fields from the row, the null ones enumerated.
std::vector<Candidate> candidates_of(const Json& row, const Model& m, int gpus, const std::string& where,
                                     std::vector<std::string>& notes) {
  const Json& lj = row.at("layout");
  const std::string id = row.at("id").is_string() ? row.at("id").get<std::string>() : std::string("?");
  for (const char* k : {"tp", "pp"})
    if (is_null(lj, k)) throw RowSkip{std::string("layout.") + k + " is not given"};
  Layout base;
  if (!is_null(lj, "ep")) base.ep = int_field(lj, "ep", where + ".layout");
  if (!is_null(lj, "etp")) base.etp = int_field(lj, "etp", where + ".layout");
  if (m.moe.enabled()) {
    // Routing: balanced is what the published benchmarks force; a dropless row is priced balanced too.
    const std::string routing = lj.contains("routing") && lj.at("routing").is_string() ? lj.at("routing").get<std::string>() : "";
    notes.push_back("routing balanced" + (routing.empty() || routing == "balanced" ? std::string() : " (row: " + routing + ")"));
  }
  base.tp = int_field(lj, "tp", where + ".layout");
  base.pp = int_field(lj, "pp", where + ".layout");
  base.cp = is_null(lj, "cp") ? 1 : int_field(lj, "cp", where + ".layout");
  if (is_null(lj, "dp")) {
    if (gpus % (base.tp * base.pp * base.cp) != 0) throw RowSkip{"dp not given and not derivable"};
    base.dp = gpus / (base.tp * base.pp * base.cp);
  } else {
    base.dp = int_field(lj, "dp", where + ".layout");
  }
  const std::string prec = str_field(lj, "precision", where + ".layout", "fp16_or_bf16");
  base.precision = prec == "fp8" ? Precision::fp8 : Precision::bf16;
  apply_source_conventions(id, base, notes);
  // The fp8 recipe a row's table names in its precision column (Megatron-Bridge's "FP8-CS", "MXFP8"; NeMo's
  // "FP8 current scaling"); unnamed, the stack's.
  if (base.precision == Precision::fp8 && row.contains("parallel") && row.at("parallel").is_object() &&
      row.at("parallel").contains("precision") && row.at("parallel").at("precision").is_string()) {
    const std::string label = row.at("parallel").at("precision").get<std::string>();
    std::string low = label;
    std::transform(low.begin(), low.end(), low.begin(), ::tolower);
    const std::optional<Fp8Recipe> named = low.find("mxfp8") != std::string::npos ? std::optional(Fp8Recipe::mxfp8)
                                           : low.find("fp8-cs") != std::string::npos || low.find("current") != std::string::npos
                                               ? std::optional(Fp8Recipe::current)
                                               : std::nullopt;
    if (named) {
      base.fp8_recipe = *named;
      notes.push_back("fp8_recipe=" + to_string(*named) + " (the row's precision: " + label + ")");
    }
  }
  // What the row's release documents for its model (sim/recipes/): it fills the unstated fields before the
  // stack's generic defaults do.
  const std::string model_name = str_field(row.at("model"), "name", where + ".model");
  const std::optional<Recipe> recipe = row_recipe(id, model_name);
  RecipeTerms terms = recipe ? recipe->terms : RecipeTerms{};
  if (!is_null(lj, "recompute")) terms.recompute.reset();  // the row's own word wins
  if (!is_null(lj, "sequence_parallel")) terms.sequence_parallel.reset();
  if (recipe) {
    apply_recipe_terms(terms, base);
    notes.push_back("recipe " + recipe->release + " " + recipe->model + " (" + recipe->config + "): " + describe(terms));
  }
  // First and last pipeline stages one layer short (ZB paper Table 3; Llama 3).
  const std::string arch = str_field(row.at("model"), "arch", where + ".model");
  const bool fewer = arch.find("one fewer") != std::string::npos;

  std::vector<int> mbs_opts, vpp_opts, zero_opts;
  std::vector<Recompute> rec_opts;
  std::vector<int> sp_opts;
  std::vector<sched::Kind> sched_opts;
  if (is_null(lj, "micro_batch")) mbs_opts = {1, 2, 4, 8};
  else mbs_opts = {int_field(lj, "micro_batch", where + ".layout")};
  // A row's schedule: a layout schedule (sim/schedule/registry.hpp), "none" (no pipeline), "dualpipe" (the
  // bidirectional DualPipe, not modelled), or null (not stated: 1F1B and interleaved are tried).
  const std::string stated = str_field(lj, "schedule", where + ".layout");
  using sched::Kind;
  const sched::Family* named = sched::find_family(stated);
  if (!stated.empty() && stated != "none" && stated != "dualpipe" && (!named || !named->layout_schedule))
    throw InputError(where + ".layout.schedule: value \"" + stated + "\" is not a known schedule (none, dualpipe, " +
                     sched::known_names(true) + ")");
  if (stated == "none" || base.pp == 1) sched_opts = {Kind::one_f_one_b};
  else if (stated.empty()) sched_opts = {Kind::one_f_one_b, Kind::interleaved};
  else if (stated == "dualpipe") throw RowSkip{"bidirectional DualPipe is not modelled (dualpipev is)"};
  else sched_opts = {named->kind};
  const Json& vj = lj.contains("vpp") ? lj.at("vpp") : Json();
  if (vj.is_string()) {
    // "max": every transformer layer is its own chunk (the ZB paper's 1F1B-I rows). With the first and last
    // stages one layer short, the first and the last virtual stage hold the embedding and the head alone.
    const int layers = m.layers + (fewer ? 2 : 0);
    if (vj.get<std::string>() != "max")
      throw InputError(where + ".layout.vpp: value \"" + vj.get<std::string>() + "\" must be a whole number, \"max\" or null");
    if (base.pp < 2 || layers % base.pp != 0)
      throw RowSkip{"vpp \"max\" (one layer per chunk) needs the layers" + std::string(fewer ? " + 2" : "") + " (" +
                    std::to_string(layers) + ") to split evenly over pp " + std::to_string(base.pp)};
    vpp_opts = {layers / base.pp};
  } else if (vj.is_null()) {
    for (int v = 1; v <= 8; ++v) vpp_opts.push_back(v);
  } else {
    vpp_opts = {int_field(lj, "vpp", where + ".layout")};
  }
  // The source's stack bounds what an unstated field may be (a Megatron-LM 2022 row has no distributed optimizer)
  // and says what it is by default (Stack::recompute_default, sequence_parallel_default, zero_default,
  // micro_batch_default).
  const std::optional<std::string> stack_name = source_stack(id);
  const Stack* stack = stack_name ? &stack_preset(*stack_name) : nullptr;
  if (!stack) notes.push_back("no software stack for this source: unstated fields at their fastest");
  if (stack && stated.empty() && sched_opts.size() > 1) {
    std::erase_if(sched_opts, [&](Kind k) { return std::find(stack->schedules.begin(), stack->schedules.end(), k) == stack->schedules.end(); });
    if (sched_opts.empty()) sched_opts = {Kind::one_f_one_b};
  }
  const bool recipe_recompute = terms.recompute.has_value(), recipe_sp = terms.sequence_parallel.has_value();
  if (recipe_recompute) rec_opts = {*terms.recompute};
  else if (is_null(lj, "recompute")) rec_opts = stack ? stack->recompute : std::vector<Recompute>{Recompute::none, Recompute::selective, Recompute::full};
  else rec_opts = {parse_recompute(str_field(lj, "recompute", where + ".layout"), where + ".layout.recompute")};
  if (recipe_sp) sp_opts = {base.tp > 1 && *terms.sequence_parallel ? 1 : 0};
  else if (is_null(lj, "sequence_parallel")) sp_opts = base.tp > 1 && (!stack || stack->sequence_parallel) ? std::vector<int>{0, 1} : std::vector<int>{0};
  else if (!lj.at("sequence_parallel").is_boolean())
    throw InputError(where + ".layout.sequence_parallel: value " + json_brief(lj.at("sequence_parallel")) + " must be true, false or null");
  else sp_opts = {lj.at("sequence_parallel").get<bool>() ? 1 : 0};
  if (is_null(lj, "zero_stage")) zero_opts = stack ? stack->zero : std::vector<int>{0, 1};
  else {
    const Json& z = lj.at("zero_stage");
    if (!z.is_number_integer() || z.get<int>() < 0 || z.get<int>() > 3)
      throw InputError(where + ".layout.zero_stage: value " + json_brief(z) + " must be 0, 1, 2 or 3");
    zero_opts = {z.get<int>()};
  }

  std::vector<Candidate> out;
  for (int mb : mbs_opts)
    for (const auto& sc : sched_opts)
      for (int v : vpp_opts)
        for (Recompute rc : rec_opts)
          for (int sp : sp_opts)
            for (int z : zero_opts) {
              Layout l = base;
              l.micro_batch = mb;
              l.schedule = sc;
              l.vpp = sched::default_vpp(sc, v);
              // "Interleaved" with one chunk per rank is plain 1F1B (Korthikanti's 1T runs, v = 1).
              if (sc == Kind::interleaved && l.vpp == 1) l.schedule = Kind::one_f_one_b;
              if (l.pp == 1) l.vpp = 1;
              if (vj.is_null() && l.vpp != v && v != 1) continue;
              l.recompute = rc;
              l.sequence_parallel = sp == 1;
              // The TP overlap needs sequence parallelism; the recipe's holds where the candidate runs it.
              if (terms.tp_comm_overlap) l.tp_comm_overlap = *terms.tp_comm_overlap && l.sequence_parallel && l.tp > 1;
              l.zero_stage = z;
              if (is_null(lj, "global_batch")) {
                if (is_null(lj, "num_microbatches")) throw RowSkip{"global batch not given"};
                l.global_batch = mb * l.dp * int_field(lj, "num_microbatches", where + ".layout");
              } else {
                l.global_batch = int_field(lj, "global_batch", where + ".layout");
              }
              if (fewer && l.pp > 1) {
                const int stages = l.num_stages();
                const int total = m.layers + 2;
                if (total % stages != 0) continue;
                l.stage_layers.assign(stages, total / stages);
                l.stage_layers.front() -= 1;
                l.stage_layers.back() -= 1;
              }
              Candidate c;
              c.layout = l;
              if (is_null(lj, "micro_batch")) c.assumed.push_back("micro_batch=" + std::to_string(mb));
              if (stated.empty() && l.pp > 1) c.assumed.push_back(std::string("schedule=") + sched::name(sc));
              if (vj.is_null() && l.pp > 1 && sc == Kind::interleaved) c.assumed.push_back("vpp=" + std::to_string(l.vpp));
              if (is_null(lj, "recompute") && !recipe_recompute) c.assumed.push_back("recompute=" + to_string(rc));
              if (is_null(lj, "sequence_parallel") && !recipe_sp && l.tp > 1)
                c.assumed.push_back(std::string("sequence_parallel=") + (sp ? "true" : "false"));
              if (is_null(lj, "zero_stage")) c.assumed.push_back("zero_stage=" + std::to_string(z));
              if (stack) {
                // A recipe's term is what the release ran, not a departure from it.
                c.departures += is_null(lj, "recompute") && !recipe_recompute && rc != stack->recompute_default;
                c.departures += is_null(lj, "sequence_parallel") && !recipe_sp && l.tp > 1 && (sp == 1) != stack->sequence_parallel_default;
                c.departures += is_null(lj, "zero_stage") && z != stack->zero_default;
                c.departures += is_null(lj, "micro_batch") && stack->micro_batch_default && mb != *stack->micro_batch_default;
              }
              out.push_back(std::move(c));
            }
  return out;
}

// The metrics predict_metric and predict_layer_metric below compare; a measured value of one of them must be a
// positive number (errors are relative to it) or null. Other keys of "measured" (notes, per-schedule objects
// such as the ZB paper's bubble_rate by schedule) are not compared.
constexpr const char* kPredictedMetrics[] = {
    "iteration_time_s", "tflops_per_gpu", "mfu_pct", "hfu_pct", "samples_per_gpu_per_s", "tokens_per_s_per_gpu",
    "model_tflops_per_gpu", "memory_GB", "bubble_rate", "forward_ms_per_layer", "backward_ms_per_layer",
    "combined_ms_per_layer", "T_F", "T_B_input_grad", "T_W_weight_grad"};

void check_measured(const Json& row, const std::string& rw, const std::string& id) {
  const Json& meas = row.at("measured");
  if (!meas.is_object()) throw InputError(rw + " (" + id + ").measured: must be an object, got " + json_brief(meas));
  if (meas.contains("out_of_memory") && !meas.at("out_of_memory").is_boolean())
    throw InputError(rw + " (" + id + "): measured.out_of_memory: value " + json_brief(meas.at("out_of_memory")) +
                     " must be true or false (true: the source reports the run out of memory)");
  for (const char* metric : kPredictedMetrics) {
    if (!meas.contains(metric)) continue;
    const Json& v = meas.at(metric);
    if (v.is_null() || v.is_object()) continue;
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      throw InputError(rw + " (" + id + "): measured." + metric + ": value " + json_brief(v) +
                       " must be a positive number (or null when not measured)");
  }
}

struct Prediction {
  Estimate est;
  double step_s = 0;
};

std::optional<double> predict_metric(const std::string& metric, const Model& m, const Prediction& p,
                                     const System& sys) {
  const Estimate& e = p.est;
  const double gpus = e.gpus;
  const double step = p.step_s;
  const double scale = e.step_s / step;  // rates scale inversely with the step time
  if (metric == "iteration_time_s") return step;
  if (metric == "tflops_per_gpu") return e.tflops_eq3_per_gpu * scale;
  if (metric == "mfu_pct") {
    // Korthikanti et al. and Chowdhery et al. define MFU against the 16-bit peak.
    return 100.0 * e.model_tflops_per_gpu * scale * 1e12 / sys.gpu.peak(Precision::bf16);
  }
  if (metric == "hfu_pct") {
    // The published HFU is the source's hardware-FLOP count over the measured time, so the prediction uses
    // the same count over the predicted time. Korthikanti et al. eq. 8 (selective recompute) adds
    // 72 B L s h^2 s/(6h) = 12 B L s^2 h to the model FLOPs of eq. 7: more than the forward of the attention
    // core that selective recompute runs again (4 B L s^2 h, which Tessel's own HFU counts). That term is added
    // to Tessel's model FLOPs, which equal eq. 7 for the GPT rows that publish HFU (Korthikanti Table 5:
    // LayerNorm, GELU, MHA, tied head); a row of another architecture would mix conventions. Full recompute
    // and none: Tessel's count is the source's (eq. 3 / eq. 7).
    if (e.layout.recompute == Recompute::selective) {
      const double B = e.layout.global_batch, L = m.layers, s = m.seq_len, h = m.hidden;
      const double eq8 = e.model_tflops_per_gpu * 1e12 * e.step_s * gpus + 12.0 * B * L * s * s * h;
      return 100.0 * eq8 / (step * gpus) / sys.gpu.peak(Precision::bf16);
    }
    return 100.0 * e.hw_tflops_per_gpu * scale * 1e12 / sys.gpu.peak(Precision::bf16);
  }
  if (metric == "samples_per_gpu_per_s") return e.layout.global_batch / step / gpus;
  if (metric == "tokens_per_s_per_gpu") return static_cast<double>(e.layout.global_batch) * m.seq_len / step / gpus;
  // MoE sources count their model FLOPs their own way (published-moe.json README): compared by tokens/s.
  if (metric == "model_tflops_per_gpu") {
    if (m.moe.enabled()) return std::nullopt;
    return e.model_tflops_per_gpu * scale;
  }
  if (metric == "memory_GB") {
    // Papers report the allocator's peak (torch.cuda.max_memory_allocated), without the context allowance.
    double peak = 0;
    for (const auto& mb : e.memory) peak = std::max(peak, mb.allocated());
    return peak / kGiB;
  }
  // Qi et al. (Zero Bubble) define the rate on the pipeline alone, transfers counted in it:
  // (cost - m (T_F + T_B + T_W)) / cost, cost the longest stage's span.
  if (metric == "bubble_rate") return e.pipeline_s > 0 ? (e.pipeline_s - e.busy_s) / e.pipeline_s : 0.0;
  // Qi et al. Table 9: a stage's forward (T_F), input-gradient (T_B) and weight-gradient (T_W) time per
  // micro-batch, profiled in ms. A middle pipeline rank's, its chunks summed (the ends carry the embedding
  // and the head, which the paper balanced with one layer fewer).
  const bool tf = metric == "T_F", tb = metric == "T_B_input_grad", tw = metric == "T_W_weight_grad";
  if (tf || tb || tw) {
    const int rank = e.layout.pp / 2;
    const std::vector<double>& v = tf ? e.stage_f : tb ? e.stage_i : e.stage_w;
    double sum = 0;
    for (int st = 0; st < static_cast<int>(v.size()); ++st)
      if (e.layout.rank_of_stage(st) == rank) sum += v[static_cast<std::size_t>(st)];
    return 1e3 * sum;
  }
  return std::nullopt;
}

// Per-layer times (Korthikanti Table 4): one layer, one micro-batch, TP collectives included.
std::optional<double> predict_layer_metric(const std::string& metric, const Model& m, const Layout& l,
                                           const System& sys) {
  if (metric != "forward_ms_per_layer" && metric != "backward_ms_per_layer" && metric != "combined_ms_per_layer")
    return std::nullopt;
  const Workload w = lower(m, l, sys);
  const LayerWork& lw = w.layer;
  const double fwd = lw.t_f + lw.t_tp_f;
  const double bwd = lw.t_i + lw.t_w + lw.t_tp_b + (l.recompute != Recompute::none ? lw.t_recompute : 0.0);
  if (metric == "forward_ms_per_layer") return 1e3 * fwd;
  if (metric == "backward_ms_per_layer") return 1e3 * bwd;
  return 1e3 * (fwd + bwd);
}

// The row is an object with the keys every row has.
void check_row_keys(const Json& row, const std::string& rw) {
  if (!row.is_object()) throw InputError(rw + ": a row must be an object");
  for (const char* k : {"id", "model", "hardware", "layout", "measured"})
    if (!row.contains(k)) throw InputError(rw + ": missing key " + k);
}

std::string row_id(const Json& row, const std::string& rw) {
  return row.at("id").is_string() ? row.at("id").get<std::string>() : rw;
}

// The Zero Bubble paper's bubble-rate tables (Tables 5 and 8) give one rate per schedule for one
// configuration: each becomes a row of its own, id "ID/SCHEDULE", its layout's schedule and vpp set from the
// name, its measurement that rate. A name Tessel has no schedule for is skipped with the reason.
struct ExpandedRow {
  Json row;
  std::string rw, note;  // note: how the paper's schedule is played, listed with the row's assumptions
};

std::vector<ExpandedRow> expand_rows(const Json& rows, const std::string& where, std::vector<SkippedRow>& skipped) {
  struct Played {
    const char* schedule;
    Json vpp;
    const char* note;
  };
  const std::map<std::string, Played> kPlayed = {
      {"1F1B", {"1f1b", 1, ""}},
      {"1F1B-I", {"interleaved", "max", ""}},
      {"ZB-H1", {"zb1p", 1, ""}},
      {"ZB-1p", {"zb1p", 1, "ZB-1p (the paper's searched schedule) played as zb1p, the ZB-H1 shape of the same memory"}},
      {"ZB-2p", {"zb2p", 1, ""}},
      {"ZB-V", {"zbv", 2, ""}},
  };
  std::vector<ExpandedRow> out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Json& row = rows[i];
    const std::string rw = where + "[" + std::to_string(i) + "]";
    const bool per_schedule = row.is_object() && row.contains("measured") && row.at("measured").is_object() &&
                              row.at("measured").contains("bubble_rate") && row.at("measured").at("bubble_rate").is_object() &&
                              row.contains("layout") && row.at("layout").is_object();
    if (!per_schedule) {
      out.push_back({row, rw, ""});
      continue;
    }
    const std::string id = row_id(row, rw);
    for (const auto& [name, rate] : row.at("measured").at("bubble_rate").items()) {
      const auto it = kPlayed.find(name);
      if (it == kPlayed.end()) {
        skipped.push_back({id + "/" + name, name == "ZB-H2"
                                                ? "the handcrafted ZB-H2 schedule is not one of Tessel's (zb2p is the searched ZB-2p)"
                                                : "bubble_rate of schedule \"" + name + "\": no Tessel schedule plays it"});
        continue;
      }
      Json r = row;
      r["id"] = id + "/" + name;
      r["layout"]["schedule"] = it->second.schedule;
      r["layout"]["vpp"] = it->second.vpp;
      r["measured"] = Json{{"bubble_rate", rate}};
      out.push_back({std::move(r), rw + ".measured.bubble_rate." + name, it->second.note});
    }
  }
  return out;
}

// The measured keys of a row, for the reason a row with nothing validate predicts is skipped.
std::string measured_keys(const Json& row) {
  std::string keys;
  for (const auto& kv : row.at("measured").items()) keys += (keys.empty() ? "" : ", ") + kv.key();
  return keys;
}

}  // namespace

std::variant<MappedRow, SkippedRow> map_row(const Json& row, const std::string& rw, const System* system_override) {
  check_row_keys(row, rw);
  const std::string id = row_id(row, rw);
  try {
    const Json& hw = row.at("hardware");
    if (!hw.contains("gpu") || !hw.at("gpu").is_string()) throw InputError(rw + ".hardware.gpu: must be a string");
    MappedRow out;
    out.id = id;
    if (system_override) {
      out.system = *system_override;
    } else {
      // A GPU without a preset is the row's limit, not the file's: the row is listed under skipped with the
      // presets there are, and the other rows are still predicted.
      const std::string gpu = hw.at("gpu").get<std::string>();
      const auto preset = system_preset_for_gpu(gpu);
      if (!preset) {
        std::string list;
        for (const auto& n : system_preset_names()) list += (list.empty() ? "" : ", ") + n;
        throw RowSkip{"hardware.gpu \"" + gpu + "\" matches no system preset (known: " + list + ")"};
      }
      out.system = load_system(*preset);
    }
    if (is_null(hw, "gpu_count")) throw RowSkip{"hardware.gpu_count is not given"};
    out.gpus = int_field(hw, "gpu_count", rw + ".hardware");
    out.model = model_of(row, rw, out.notes);
    out.candidates = candidates_of(row, out.model, out.gpus, rw, out.notes);
    // Rows state no placement. On GB200 NVL72 NVIDIA's scheduling guidance for jobs of 128 GPUs and more is
    // Slurm's --segment 16 (16 trays, 64 of a rack's 72 GPUs; NVIDIA technical blog, "Unlock Exascale Performance
    // on NVIDIA GB200 NVL72 with Slurm Topology-Aware Job Scheduling": segment 16 for jobs of 128+ GPUs such as
    // MoE training): ranks filling racks 72 at a time would put ep groups of 32 or 64 across racks. Smaller jobs
    // are left in one rack, as the cost model had them.
    if (!system_override && out.system.name == "gb200" && out.gpus >= 128 && out.system.node.gpus_per_node > 64) {
      out.system.node.gpus_per_node = 64;
      out.notes.push_back("64 GPUs per NVL72 rack (Slurm --segment 16, NVIDIA's guidance for 128+ GPUs)");
    }
    return out;
  } catch (const RowSkip& s) {
    return SkippedRow{id, s.reason};
  } catch (const Json::exception& e) {
    // A field of an unexpected type or shape that no check names: still the row's fault.
    throw InputError(rw + " (" + id + "): a field has an unexpected type or is missing (" + e.what() + ")");
  }
}

// A candidate whose layers do not divide over its stages and whose source states no split (its arch's
// "one fewer" is a stated one) is predicted with the time-balanced split (sim/stage_split.hpp), listed as
// assumed, rather than skipped.
void assume_balanced_split(const Model& m, const System& sys, Candidate& c) {
  Layout& l = c.layout;
  const int stages = l.num_stages();
  if (!l.stage_layers.empty() || stages < 2 || m.layers % stages == 0 || m.layers < stages - 2) return;
  l.stage_layers = even_split(m.layers, stages);
  if (layout_problem(l, m, 0) || sys.gpu.peak(l.precision) <= 0) return;  // estimate names what breaks
  l.stage_layers = balanced_split(m, l, sys, Balance::time);
  c.assumed.push_back("stage_layers=" + describe_stage_layers(l.stage_layers) + " (time-balanced)");
}

ValidationResult validate_rows(const Json& rows, const std::string& where, const StepTimeFn& step_time,
                               const System* system_override) {
  if (!rows.is_array()) throw InputError(where + ": expected a JSON array of rows, got " + json_brief(rows));
  ValidationResult out;
  for (const ExpandedRow& x : expand_rows(rows, where, out.skipped)) {
    const Json& row = x.row;
    const std::string& rw = x.rw;
    check_row_keys(row, rw);
    const std::string id = row_id(row, rw);
    check_measured(row, rw, id);
    auto mapped = map_row(row, rw, system_override);
    if (auto* skip = std::get_if<SkippedRow>(&mapped)) {
      out.skipped.push_back(std::move(*skip));
      continue;
    }
    try {
      const MappedRow& mr = std::get<MappedRow>(mapped);
      const System& sys = mr.system;
      const int gpus = mr.gpus;
      const std::vector<std::string>& notes = mr.notes;
      const Model& m = mr.model;
      const std::vector<Candidate>& cands = mr.candidates;
      // Two picks among the candidates, each preferring those that fit in memory: the stack's (fewest
      // departures from the source stack's defaults, then the fastest: what the source ran when it did not say
      // otherwise) and the best case (the fastest). validate scores the first and reports the second where it
      // is another layout.
      struct Scored {
        Prediction p;
        std::size_t index = 0;
        bool fits = false;
      };
      std::optional<Scored> chosen, best, as_run;  // as_run: the fewest departures, then the fastest, fit or not
      std::string last_reason;
      // A row whose layers divide under some of its candidates (an unstated vpp among them) keeps those:
      // the balanced split is assumed only for a layout that cannot be split evenly.
      const bool divides = std::any_of(cands.begin(), cands.end(), [&](const Candidate& c) {
        return !c.layout.stage_layers.empty() || m.layers % c.layout.num_stages() == 0;
      });
      std::vector<Candidate> tried(cands.begin(), cands.end());
      for (std::size_t i = 0; i < tried.size(); ++i) {
        Candidate& c = tried[i];
        Estimate e;
        try {
          if (!divides) assume_balanced_split(m, sys, c);
          e = estimate(m, c.layout, sys, gpus);
        } catch (const InfeasibleLayout& err) {
          last_reason = err.what();
          continue;
        }
        const Scored sc{Prediction{e, e.step_s}, i, e.fits};
        const auto faster = [&](const Scored& o) { return e.step_s < o.p.est.step_s; };
        if (!best || (e.fits && !best->fits) || (e.fits == best->fits && faster(*best))) best = sc;
        const int d = c.departures, od = chosen ? tried[chosen->index].departures : 0;
        if (!chosen || (e.fits && !chosen->fits) || (e.fits == chosen->fits && (d < od || (d == od && faster(*chosen)))))
          chosen = sc;
        const int ad = as_run ? tried[as_run->index].departures : 0;
        if (!as_run || d < ad || (d == ad && faster(*as_run))) as_run = sc;
      }
      if (!chosen) throw RowSkip{"no feasible layout: " + last_reason};
      if (step_time) chosen->p.step_s = step_time(m, chosen->p.est.layout, sys);
      const bool differ = best->index != chosen->index;
      if (differ && step_time) best->p.step_s = step_time(m, best->p.est.layout, sys);
      const Candidate& cc = tried[chosen->index];
      std::vector<std::string> assumed = notes;
      assumed.insert(assumed.end(), cc.assumed.begin(), cc.assumed.end());
      if (cc.departures > 0) {  // departures are counted from a stack's defaults: the row's source has one
        const auto st = source_stack(id);
        assumed.push_back("no layout with the stack's defaults fits (" +
                          (st ? defaults_text(stack_preset(*st)) : std::string("no stack")) + ")");
      }
      if (!chosen->fits) assumed.push_back("predicted peak memory exceeds the GPU");
      if (!x.note.empty()) assumed.push_back(x.note);
      const Json& meas = row.at("measured");
      const bool oom = meas.contains("out_of_memory") && meas.at("out_of_memory").get<bool>();
      {
        const Estimate& v = (oom ? *as_run : *chosen).p.est;
        MemoryVerdict mv{id, !oom, v.fits, v.peak_memory_bytes / kGiB, v.capacity_bytes / kGiB, std::nullopt};
        if (v.layout.precision == Precision::fp8 && v.layout.zero_stage >= 1 && !v.layout.fp8_params()) {
          Layout fp8w = v.layout;
          fp8w.fp8_param_gather = true;
          mv.fp8_weights_peak_GiB = estimate(m, fp8w, sys, gpus).peak_memory_bytes / kGiB;
        }
        out.memory.push_back(std::move(mv));
      }
      const std::size_t scored_before = out.rows.size();
      for (auto it = meas.begin(); it != meas.end(); ++it) {
        if (!it.value().is_number()) continue;
        const double measured = it.value().get<double>();
        if (!(measured > 0) || !std::isfinite(measured)) continue;
        // A step metric from the prediction, else a per-layer one from its layout.
        const auto predict = [&](const Prediction& p) {
          auto v = predict_metric(it.key(), m, p, sys);
          return v ? v : predict_layer_metric(it.key(), m, p.est.layout, sys);
        };
        // A bubble rate near zero (ZB-2p's 0.1-0.4%) has no meaningful relative error: its error is the
        // difference in percentage points of the pipeline's time.
        const bool points = it.key() == "bubble_rate";
        const auto error = [&](double v) { return points ? 100.0 * (v - measured) : 100.0 * (v - measured) / measured; };
        const auto pred = predict(chosen->p);
        if (!pred) continue;
        MetricResult r;
        r.id = id;
        r.metric = it.key();
        r.measured = measured;
        r.predicted = *pred;
        r.points = points;
        r.error_pct = error(*pred);
        r.assumed = assumed;
        if (differ) {
          const auto other = predict(best->p);
          if (other && *other != *pred) {
            MetricResult::BestCase b;
            b.predicted = *other;
            b.error_pct = error(*other);
            b.assumed = tried[best->index].assumed;
            if (!best->fits) b.assumed.push_back("predicted peak memory exceeds the GPU");
            r.best_case = std::move(b);
          }
        }
        out.rows.push_back(std::move(r));
      }
      if (out.rows.size() == scored_before && !oom) {
        out.memory.pop_back();
        throw RowSkip{"measured holds no number validate predicts (" + measured_keys(row) + ")"};
      }
      // Per-layer times (Korthikanti's Table 4) were measured on one layer, not the whole model: no verdict.
      const auto per_layer = [](const MetricResult& r) { return r.metric.find("_ms_per_layer") != std::string::npos; };
      if (!oom && std::all_of(out.rows.begin() + static_cast<std::ptrdiff_t>(scored_before), out.rows.end(), per_layer))
        out.memory.pop_back();
    } catch (const RowSkip& s) {
      out.skipped.push_back({id, s.reason});
    } catch (const Json::exception& e) {
      // A field of an unexpected type or shape that no check above names: still the row's fault.
      throw InputError(rw + " (" + id + "): a field has an unexpected type or is missing (" + e.what() + ")");
    }
  }
  std::map<std::string, std::pair<double, int>> acc;
  for (const auto& r : out.rows) {
    auto& a = acc[r.metric];
    a.first += std::fabs(r.error_pct);
    a.second += 1;
    out.max_abs_pct[r.metric] = std::max(out.max_abs_pct[r.metric], std::fabs(r.error_pct));
  }
  for (const auto& [metric, a] : acc) out.mape_pct[metric] = a.first / a.second;
  return out;
}

Json select_rows(const Json& rows, const std::string& where, const std::vector<std::string>& prefixes) {
  if (!rows.is_array()) throw InputError(where + ": expected a JSON array of rows, got " + json_brief(rows));
  const auto id_of = [](const Json& r) {
    return r.is_object() && r.contains("id") && r["id"].is_string() ? r["id"].get<std::string>() : std::string();
  };
  Json kept = Json::array();
  for (const auto& r : rows) {
    const std::string id = id_of(r);
    for (const auto& p : prefixes)
      if (id.rfind(p, 0) == 0) {
        kept.push_back(r);
        break;
      }
  }
  std::string unmatched;
  for (const auto& p : prefixes) {
    bool any = false;
    for (const auto& r : rows) any = any || id_of(r).rfind(p, 0) == 0;
    if (any) continue;
    if (!unmatched.empty()) unmatched += ',';
    unmatched += p;
  }
  if (!unmatched.empty()) {
    // The ids' first words (the source: korthikanti22, narayanan21...), in the file's order.
    std::vector<std::string> heads;
    for (const auto& r : rows) {
      const std::string id = id_of(r);
      const std::string head = id.substr(0, id.find('_'));
      if (!head.empty() && std::find(heads.begin(), heads.end(), head) == heads.end()) heads.push_back(head);
    }
    std::string list;
    for (const auto& h : heads) {
      if (!list.empty()) list += ", ";
      list += h;
    }
    throw InputError("--only " + unmatched + ": no row id in " + where + " starts with it (" +
                     std::to_string(rows.size()) + " rows; ids start with: " + list + ")");
  }
  return kept;
}

MemoryCounts count_memory_verdicts(const std::vector<MemoryVerdict>& verdicts) {
  MemoryCounts n;
  for (const auto& v : verdicts) {
    (v.ran ? n.ran : n.out_of_memory) += 1;
    (v.ran ? n.ran_right : n.out_of_memory_right) += v.right();
  }
  return n;
}

Json validation_to_json(const ValidationResult& r) {
  Json j;
  j["rows"] = Json::array();
  for (const auto& m : r.rows) {
    Json row = {{"id", m.id}, {"metric", m.metric}, {"measured", m.measured}, {"predicted", m.predicted},
                {"error_pct", m.error_pct}, {"error_unit", m.points ? "points" : "percent"}, {"assumed", m.assumed}};
    if (m.best_case)
      row["best_case"] = {{"predicted", m.best_case->predicted}, {"error_pct", m.best_case->error_pct},
                          {"assumed", m.best_case->assumed}};
    j["rows"].push_back(std::move(row));
  }
  Json mem = Json::array();
  for (const auto& v : r.memory) {
    Json x = {{"id", v.id}, {"measured", v.ran ? "ran" : "out of memory"}, {"predicted_fits", v.predicted_fits},
              {"peak_GiB", v.peak_GiB}, {"capacity_GiB", v.capacity_GiB}, {"right", v.right()}};
    if (v.fp8_weights_peak_GiB) x["fp8_weights_peak_GiB"] = *v.fp8_weights_peak_GiB;
    mem.push_back(std::move(x));
  }
  const MemoryCounts n = count_memory_verdicts(r.memory);
  j["memory_verdicts"] = {{"rows", mem}, {"ran", n.ran}, {"ran_predicted_to_fit", n.ran_right},
                          {"out_of_memory", n.out_of_memory}, {"out_of_memory_predicted_not_to_fit", n.out_of_memory_right}};
  j["mape_pct"] = r.mape_pct;
  j["max_abs_error_pct"] = r.max_abs_pct;
  j["skipped"] = Json::array();
  for (const auto& s : r.skipped) j["skipped"].push_back({{"id", s.id}, {"reason", s.reason}});
  return j;
}

std::string hardware_class(const std::string& preset) {
  if (preset == "dgx-a100") return "A100";
  if (preset == "dgx-h100" || preset == "meta-h100" || preset == "h800" || preset == "dgx-h200" || preset == "h200")
    return "Hopper";
  if (preset == "dgx-b200" || preset == "gb200") return "Blackwell";
  return "";
}

std::map<std::string, double> step_errors(const ValidationResult& r) {
  // Time first, then rates (equal to 1/step up to constants, so one per row).
  static const char* kOrder[] = {"iteration_time_s", "tokens_per_s_per_gpu", "samples_per_gpu_per_s",
                                 "model_tflops_per_gpu", "tflops_per_gpu", "mfu_pct"};
  std::map<std::string, std::map<std::string, double>> by_row;  // id -> metric -> error_pct
  for (const auto& m : r.rows) by_row[m.id][m.metric] = m.error_pct;
  std::map<std::string, double> out;
  for (const auto& [id, metrics] : by_row) {
    for (const char* k : kOrder) {
      const auto it = metrics.find(k);
      if (it == metrics.end()) continue;
      const double e = it->second / 100;
      out[id] = std::string(k) == "iteration_time_s" ? e : 1.0 / (1.0 + e) - 1.0;
      break;
    }
  }
  return out;
}

std::map<std::string, ErrorBand> step_error_bands(const Json& rows, const ValidationResult& r) {
  std::map<std::string, std::string> class_of_row;
  for (const auto& row : rows) {
    if (!row.is_object() || !row.contains("id") || !row.contains("hardware")) continue;
    const Json& hw = row.at("hardware");
    if (!hw.contains("gpu") || !hw.at("gpu").is_string()) continue;
    if (auto p = system_preset_for_gpu(hw.at("gpu").get<std::string>()))
      class_of_row[row.at("id").get<std::string>()] = hardware_class(*p);
  }
  std::map<std::string, std::pair<double, int>> acc;
  for (const auto& [id, step_err] : step_errors(r)) {
    const auto cls = class_of_row.find(id);
    if (cls == class_of_row.end() || cls->second.empty()) continue;
    acc[cls->second].first += std::fabs(step_err);
    acc[cls->second].second += 1;
  }
  std::map<std::string, ErrorBand> out;
  for (const auto& [cls, a] : acc)
    out[cls] = ErrorBand{cls, 100 * a.first / a.second, a.second,
                         "mean |step error| of " + std::to_string(a.second) + " " + cls +
                             " rows under validate (docs/validation.md)",
                         ""};
  return out;
}

}  // namespace tessel
