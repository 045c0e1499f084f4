// `explore --explain LAYOUT`: why a layout ranks where it does, or why it was rejected and what would fit.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "util/error.hpp"
#include "sim/explore/explore.hpp"
#include "util/units.hpp"

namespace tessel::explore {

namespace {

std::string num(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string secs(double s) { return s < 1 ? num(s * 1e3, 1) + " ms" : num(s, 2) + " s"; }

// Variants that trade speed for memory, each tried on a layout that does not fit.
std::vector<std::pair<std::string, Layout>> memory_variants(const Layout& l) {
  std::vector<std::pair<std::string, Layout>> v;
  auto add = [&](const std::string& what, Layout x) { v.emplace_back(what, std::move(x)); };
  if (l.recompute != Recompute::full) {
    Layout x = l;
    x.recompute = l.recompute == Recompute::none ? Recompute::selective : Recompute::full;
    add("recompute " + to_string(x.recompute), x);
    if (l.recompute == Recompute::none) {
      x.recompute = Recompute::full;
      add("recompute full", x);
    }
  }
  if (l.tp > 1 && !l.sequence_parallel) {
    Layout x = l;
    x.sequence_parallel = true;
    add("sequence parallel", x);
  }
  for (int z = l.zero_stage + 1; z <= 3; ++z) {
    Layout x = l;
    x.zero_stage = z;
    add(z == 1 ? "distributed optimizer (zero 1)" : "zero " + std::to_string(z), x);
  }
  if (l.micro_batch > 1) {
    Layout x = l;
    x.micro_batch = l.micro_batch / 2;
    add("micro-batch " + std::to_string(x.micro_batch), x);
  }
  if (l.dp % 2 == 0) {
    Layout x = l;
    x.pp *= 2;
    x.dp /= 2;
    x.stage_layers.clear();
    add("pp " + std::to_string(x.pp) + " (dp " + std::to_string(x.dp) + ")", x);
    Layout y = l;
    y.tp *= 2;
    y.dp /= 2;
    add("tp " + std::to_string(y.tp) + " (dp " + std::to_string(y.dp) + ")", y);
  }
  return v;
}


double gib(double bytes) { return bytes / kGiB; }

Json memory_json(const Estimate& e) {
  const auto& mem = e.memory[static_cast<std::size_t>(e.peak_rank)];
  return {{"peak_GiB", gib(e.peak_memory_bytes)},
          {"peak_rank", e.peak_rank},
          {"capacity_GiB", gib(e.capacity_bytes)},
          {"min_headroom_GiB", gib(e.min_headroom_bytes)},
          {"weights_GiB", gib(mem.weights_bytes)},
          {"gradients_GiB", gib(mem.grads_bytes)},
          {"optimizer_GiB", gib(mem.optimizer_bytes)},
          {"activations_GiB", gib(mem.activations_bytes)},
          {"extras_GiB", gib(mem.extras_bytes + mem.zero3_gather_bytes + mem.recompute_transient_bytes)},
          {"fragmentation_GiB", gib(mem.fragmentation_bytes)},
          {"reserved_GiB", gib(mem.reserved_bytes)}};
}

// The step's terms. exposed_comm_s is explore's column (pipeline + data-parallel communication the busiest rank
// waits on); TP and CP collectives block the compute stream and are listed on their own.
Json step_json(const Estimate& e) {
  return {{"step_s", e.step_s},
          {"compute_s", e.compute_s},
          {"bubble_fraction", e.bubble_fraction},
          {"tp_exposed_s", e.tp_exposed_s},
          {"ep_exposed_s", e.ep_exposed_s},
          {"cp_exposed_s", e.cp_exposed_s},
          {"pp_exposed_s", e.pp_exposed_s},
          {"dp_exposed_s", e.dp_exposed_s},
          {"exposed_comm_s", e.pp_exposed_s + e.dp_exposed_s},
          {"optimizer_s", e.optimizer_s},
          {"grad_norm_s", e.grad_norm_s},
          {"zero_grad_s", e.zero_grad_s},
          {"peak_memory_GiB", gib(e.peak_memory_bytes)}};
}

Json alternatives_json(const Model& m, const System& sys, int gpus, const Layout& l) {
  Json out = Json::array();
  for (const auto& [what, x] : memory_variants(l)) {
    if (layout_problem(x, m, gpus)) continue;
    try {
      const Estimate ex = estimate(m, x, sys, gpus);
      Json a = {{"change", what}, {"describe", x.describe()}, {"peak_memory_GiB", gib(ex.peak_memory_bytes)}, {"fits", ex.fits}};
      if (ex.fits) a["step_s"] = ex.step_s;
      out.push_back(std::move(a));
    } catch (const InfeasibleLayout&) {
    }
  }
  return out;
}

int rank_in_top(const Layout& l, const Result& r) {
  for (std::size_t i = 0; i < r.top.size(); ++i)
    if (r.top[i].layout.describe() == l.describe() && r.top[i].layout.global_batch == l.global_batch)
      return static_cast<int>(i) + 1;
  return 0;
}

// The split's balance: each stage's rank, layers (the first holds the embedding, the last the head and loss),
// seconds per micro-batch and its rank's memory, and the imbalance (stage_imbalance, sim/estimate.hpp).
Json stages_json(const Model& m, const Layout& l, const Estimate& e) {
  Json rows = Json::array();
  std::vector<int> split;
  for (int st = 0; st < l.num_stages(); ++st) {
    const auto k = static_cast<std::size_t>(st);
    const int rank = l.rank_of_stage(st);
    split.push_back(l.layers_of_stage(st, m.layers));
    rows.push_back({{"stage", st},
                    {"rank", rank},
                    {"first_layer", l.first_layer_of_stage(st, m.layers)},
                    {"layers", split.back()},
                    {"time_s", e.stage_f[k] + e.stage_i[k] + e.stage_w[k]},
                    {"rank_memory_GiB", gib(e.memory[static_cast<std::size_t>(rank)].total())}});
  }
  return {{"split", describe_stage_layers(split)}, {"imbalance", stage_imbalance(e)}, {"stages", std::move(rows)}};
}

std::string stage_text(const Json& s, int stages) {
  const int st = s.at("stage").get<int>(), first = s.at("first_layer").get<int>(), n = s.at("layers").get<int>();
  std::string text = "stage " + std::to_string(st) + " (rank " + std::to_string(s.at("rank").get<int>()) + ") layers ";
  if (n == 0) {
    text += "none";
  } else {
    text += std::to_string(first);
    if (n > 1) text += "-" + std::to_string(first + n - 1);
  }
  if (st == 0) text += " + embedding";
  if (st == stages - 1) text += " + head, loss";
  return text + " " + secs(s.at("time_s").get<double>()) + ", rank memory " + num(s.at("rank_memory_GiB").get<double>(), 1) + " GiB";
}

// The first, the slowest and the last stage: the embedding and the head load the ends.
void render_stages(std::ostringstream& os, const Json& j) {
  const Json& rows = j.at("stages");
  const int n = static_cast<int>(rows.size());
  if (n < 2) return;
  const auto time_of = [&](int st) { return rows.at(static_cast<std::size_t>(st)).at("time_s").get<double>(); };
  int slowest = 0;
  for (int st = 1; st < n; ++st)
    if (time_of(st) > time_of(slowest)) slowest = st;
  os << "  stages: layers=" << j.at("split").get<std::string>() << ", imbalance "
     << num(100 * j.at("imbalance").get<double>(), 1) << "% (the slowest stage over the mean)\n    first: "
     << stage_text(rows.at(0), n) << "\n";
  if (slowest != 0 && slowest != n - 1)
    os << "    slowest: " << stage_text(rows.at(static_cast<std::size_t>(slowest)), n) << "\n";
  os << "    last: " << stage_text(rows.at(static_cast<std::size_t>(n - 1)), n) << "\n";
}

void render_memory(std::ostringstream& os, const Json& mem) {
  auto g = [&](const char* k) { return num(mem.at(k).get<double>(), 1); };
  os << "  peak memory " << g("peak_GiB") << " GiB on pipeline rank " << mem.at("peak_rank").get<int>() << " of "
     << g("capacity_GiB") << " GiB: weights " << g("weights_GiB") << ", gradients " << g("gradients_GiB")
     << ", optimizer " << g("optimizer_GiB") << ", activations " << g("activations_GiB") << ", extras "
     << g("extras_GiB") << ", fragmentation " << g("fragmentation_GiB") << ", reserved " << g("reserved_GiB") << "\n";
}

void render_rejection(std::ostringstream& os, const Json& j) {
  const Json& rej = j.at("rejected");
  const std::string rule = rej.at("rule").get<std::string>();
  if (rule == "memory") {
    os << "  rejected: " << rej.at("message").get<std::string>() << "\n";
    for (const Json& a : j.at("alternatives"))
      os << "  with " << a.at("change").get<std::string>() << ": " << num(a.at("peak_memory_GiB").get<double>(), 1)
         << " GiB, " << (a.at("fits").get<bool>() ? "fits, step " + secs(a.at("step_s").get<double>()) : std::string("still too large"))
         << "\n";
    if (j.at("alternatives").empty())
      os << "  no single change (recompute, sp, zero, micro-batch, pp, tp) makes it fit\n";
  } else if (rule == "infeasible") {
    os << "  rejected: " << rej.at("message").get<std::string>() << "\n";
  } else {
    os << "  rejected by rule '" << rule << "': " << rej.at("message").get<std::string>() << "\n";
  }
}

void render_standing(std::ostringstream& os, const Json& j) {
  const Json& st = j.at("step");
  auto t = [&](const char* k) { return secs(st.at(k).get<double>()); };
  os << "  analytical step " << t("step_s") << ": compute " << t("compute_s") << ", bubble "
     << num(100 * st.at("bubble_fraction").get<double>(), 1) << "%, exposed TP " << t("tp_exposed_s")
     << (st.at("ep_exposed_s").get<double>() > 0 ? ", EP " + t("ep_exposed_s") : std::string()) << ", PP "
     << t("pp_exposed_s") << ", DP " << t("dp_exposed_s") << ", optimizer " << t("optimizer_s") << "\n";
  if (!j.contains("top_size")) return;
  if (j.at("rank").get<int>() > 0) {
    os << "  ranks #" << j.at("rank").get<int>() << " of the top " << j.at("top_size").get<int>() << " ("
       << j.at("tier").get<std::string>() << " tier)\n";
  } else {
    os << "  not in the top " << j.at("top_size").get<int>() << ": " << num(j.at("slower_than_best_percent").get<double>(), 1)
       << "% slower than the best's analytical step\n";
  }
  if (!j.contains("best")) return;
  const Json& b = j.at("best");
  auto both = [&](const char* k) { return secs(st.at(k).get<double>()) + " vs " + secs(b.at(k).get<double>()); };
  os << "  against the best (" << b.at("describe").get<std::string>() << ", step " << secs(b.at("step_s").get<double>())
     << "):\n    compute " << both("compute_s") << ", bubble " << num(100 * st.at("bubble_fraction").get<double>(), 1)
     << "% vs " << num(100 * b.at("bubble_fraction").get<double>(), 1) << "%, exposed comm " << both("exposed_comm_s")
     << ", TP/EP/CP collectives "
     << secs(st.at("tp_exposed_s").get<double>() + st.at("ep_exposed_s").get<double>() + st.at("cp_exposed_s").get<double>())
     << " vs " << secs(b.at("tp_exposed_s").get<double>() + b.at("ep_exposed_s").get<double>() + b.at("cp_exposed_s").get<double>())
     << ", memory "
     << num(st.at("peak_memory_GiB").get<double>(), 1) << " vs " << num(b.at("peak_memory_GiB").get<double>(), 1)
     << " GiB\n";
}

}  // namespace

Json explain_json(const Model& m, const System& sys, int gpus, const Layout& l, const Result& r) {
  Json j = {{"layout", layout_to_json(l)}, {"describe", l.describe()}, {"global_batch", l.global_batch}, {"gpus", gpus}};
  if (auto p = layout_problem(l, m, gpus)) {
    j["verdict"] = "rejected";
    j["rejected"] = {{"rule", p->rule}, {"message", p->message}};
    return j;
  }
  Estimate e;
  try {
    e = estimate(m, l, sys, gpus);
  } catch (const InfeasibleLayout& err) {
    j["verdict"] = "rejected";
    j["rejected"] = {{"rule", "infeasible"}, {"message", err.what()}};
    return j;
  }
  j["memory"] = memory_json(e);
  if (!e.fits) {
    j["verdict"] = "rejected";
    // The search's own rejection message (explore.cpp memory_message), so both say the same words.
    j["rejected"] = {{"rule", "memory"}, {"message", memory_message(e)}};
    j["alternatives"] = alternatives_json(m, sys, gpus, l);
    return j;
  }
  j["step"] = step_json(e);
  j["pipeline"] = stages_json(m, l, e);
  j["verdict"] = "fits";
  if (r.top.empty()) return j;
  const Scored& best = r.top.front();
  const int rank = rank_in_top(l, r);
  j["rank"] = rank;
  j["top_size"] = r.top.size();
  j["verdict"] = rank > 0 ? "ranked" : "below_top";
  if (rank > 0) j["tier"] = r.top[static_cast<std::size_t>(rank - 1)].tier;
  else j["slower_than_best_percent"] = 100.0 * (e.step_s / best.analytical_step_s - 1.0);
  if (!(best.layout.describe() == l.describe())) {
    Json b = step_json(estimate(m, best.layout, sys, gpus));
    b["describe"] = best.layout.describe();
    j["best"] = std::move(b);
  }
  return j;
}

std::string explain(const Model& m, const System& sys, int gpus, const Layout& l, const Result& r) {
  const Json j = explain_json(m, sys, gpus, l, r);
  std::ostringstream os;
  os << "layout " << j.at("describe").get<std::string>() << ", global batch " << l.global_batch << " on " << gpus << " GPUs\n";
  if (j.contains("memory")) render_memory(os, j.at("memory"));
  if (j.contains("rejected")) render_rejection(os, j);
  else render_standing(os, j);
  if (j.contains("pipeline")) render_stages(os, j.at("pipeline"));
  return os.str();
}

}  // namespace tessel::explore
