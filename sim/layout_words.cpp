#include "sim/layout_words.hpp"

#include <cstdlib>

#include <map>
#include <sstream>

#include "util/error.hpp"
#include "util/json_reader.hpp"
#include "util/text_numbers.hpp"

namespace tessel {

std::vector<int> parse_stage_layers(const std::string& text, const std::string& what) {
  if (text.empty() || text.front() == ',' || text.back() == ',' || text.find(",,") != std::string::npos)
    throw InputError(what + ": an empty stage entry (give them as describe() prints them: 3,4x6,3)");
  std::vector<int> out;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto x = item.find('x');
    const int layers = static_cast<int>(parse_int(item.substr(0, x), what, 0, 100000));
    const long long times = x == std::string::npos ? 1 : parse_int(item.substr(x + 1), what, 1, 1 << 16);
    if (out.size() + static_cast<std::size_t>(times) > (1u << 16))
      throw InputError(what + ": more than 65536 stages");
    out.insert(out.end(), static_cast<std::size_t>(times), layers);
  }
  if (out.empty()) throw InputError(what + ": no stage layer counts (give them as describe() prints them: 3,4x6,3)");
  return out;
}

Layout parse_layout_words(const std::string& text, int global_batch, const std::string& what) {
  if (text.find(".json") != std::string::npos) return parse_layout(parse_json_file(text, what + " "), text);
  Layout l;
  l.global_batch = global_batch;
  bool sched_given = false;
  std::istringstream in(text);
  std::string w;
  std::map<std::string, std::string> seen;  // term -> the word that gave it
  const auto once = [&](const std::string& term, const std::string& word) {
    const auto [it, fresh] = seen.emplace(term, word);
    if (!fresh)
      throw InputError(what + ": '" + word + "' gives the " + term + " a second time (already '" + it->second +
                       "'); each layout term once");
  };
  auto val = [&](const std::string& word, const std::string& prefix, long long lo = 1) {
    once(prefix, word);
    return static_cast<int>(parse_int(word.substr(prefix.size()), what + " " + word, lo, 1 << 22));
  };
  while (in >> w) {
    if (w == "tp-overlap") {  // before the tpN prefix
      once("tp-overlap", w);
      l.tp_comm_overlap = true;
    } else if (w.rfind("tp", 0) == 0) l.tp = val(w, "tp");
    else if (w.rfind("pp", 0) == 0) l.pp = val(w, "pp");
    else if (w.rfind("dp", 0) == 0) l.dp = val(w, "dp");
    else if (w.rfind("cp", 0) == 0) l.cp = val(w, "cp");
    else if (w.rfind("skew=", 0) == 0 || w.rfind("capacity=", 0) == 0) {
      const bool cap = w[0] == 'c';
      once("routing", w);
      const std::string v = w.substr(cap ? 9 : 5);
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(x >= (cap ? 0.01 : 1.0)) || x > 1024)
        throw InputError(what + " " + w + ": " + (cap ? "capacity=X needs a capacity factor X in [0.01, 1024]"
                                                        : "skew=X needs the busiest EP rank's load over the mean, X in [1, 1024]"));
      (cap ? l.moe_capacity : l.moe_skew) = x;
    }
    else if (w.rfind("etp", 0) == 0) l.etp = val(w, "etp");
    else if (w.rfind("ep", 0) == 0) l.ep = val(w, "ep");
    else if (w.rfind("vpp", 0) == 0) l.vpp = val(w, "vpp");
    else if (w.rfind("mbs", 0) == 0) l.micro_batch = val(w, "mbs");
    else if (w.rfind("zero", 0) == 0) {
      once("zero", w);
      l.zero_stage = static_cast<int>(parse_int(w.substr(4), what + " " + w, 0, 3));
    } else if (w.rfind("mb-rule=", 0) == 0) {
      once("micro-batch rule", w);
      const std::string v = w.substr(8);
      if (v != "megatron" && v != "torch")
        throw InputError(what + " " + w + ": unknown micro-batch rule; choose mb-rule=megatron (Megatron-LM: m a "
                         "multiple of pp) or mb-rule=torch (PyTorch's ScheduleInterleaved1F1B: m a multiple of "
                         "max(1, m // pp))");
      l.microbatch_rule = sched::parse_microbatch_rule(v, what);
    } else if (w.rfind("grads=", 0) == 0) {
      once("gradient dtype", w);
      l.state.main_grads = parse_state_dtype(w.substr(6), what + " " + w);
    } else if (w.rfind("moments=", 0) == 0) {
      once("moment dtype", w);
      l.state.moments = parse_state_dtype(w.substr(8), what + " " + w);
    } else if (w.rfind("master=", 0) == 0) {
      once("master weights", w);
      l.state.master_weights = parse_master_weights(w.substr(7), what + " " + w);
    } else if (w.rfind("layers=", 0) == 0) {
      once("layers", w);
      l.stage_layers = parse_stage_layers(w.substr(7), what + " " + w);
    } else if (w == "a2a-overlap") {
      once("a2a-overlap", w);
      l.a2a_overlap = true;
    } else if (w == "fp8-params") {  // effective under fp8 with ZeRO >= 1 (Layout::fp8_params)
      once("fp8-params", w);
      l.fp8_param_gather = true;
    } else if (w == "deepep") {
      once("dispatcher", w);
      l.deepep = true;
    } else if (w == "sp") {
      once("sp", w);
      l.sequence_parallel = true;

    } else if (w == "selective" || w == "full" || w == "none") {
      once("recompute policy", w);
      l.recompute = parse_recompute(w, what);
    } else if (w.rfind("full-block", 0) == 0) {
      once("recompute policy", w);
      l.recompute = Recompute::full;
      l.recompute_method = RecomputeMethod::block;
      const std::string n = w.substr(10);
      if (!n.empty()) l.recompute_layers = static_cast<int>(parse_int(n, what + " " + w, 1, 100000));
    } else {
      const sched::Family* f = sched::find_family(w);
      if (!f || !f->layout_schedule)
        throw InputError(what + ": word '" + w + "' is not a layout term (tpN ppN dpN cpN epN etpN skew=X capacity=X deepep a2a-overlap vppN mbsN zeroN sp tp-overlap fp8-params layers=... "
                         "mb-rule=megatron|torch grads=fp32|bf16 moments=fp32|bf16 master=fp32|remainder|none, "
                         "a schedule: " + sched::known_names(true) + ", a recompute policy: none, selective, full, full-blockN)");
      once("schedule", w);
      l.schedule = f->kind;
      sched_given = true;
    }
  }
  if (seen.empty()) throw InputError(what + ": '" + text + "' names no layout (give words such as \"tp8 pp8 dp16 mbs1\" or a layout JSON file)");
  if (!sched_given && l.pp > 1) l.schedule = l.vpp > 1 ? sched::Kind::interleaved : sched::Kind::one_f_one_b;
  // No vppN word: the schedule's own chunk count, as estimate and simulate default it.
  if (!seen.count("vpp") && l.pp > 1) l.vpp = sched::default_vpp(l.schedule, 3);
  if (l.microbatch_rule != sched::MicrobatchRule::megatron && !sched::family(l.schedule).takes_microbatch_rule)
    throw InputError(what + ": '" + seen.at("micro-batch rule") + "' applies to interleaved only; schedule " +
                     sched::name(l.schedule) + " has its own micro-batch rule");
  return l;
}

}  // namespace tessel
