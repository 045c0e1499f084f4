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

// One stage of the split: its rank, layer range (with the embedding or the head), seconds per micro-batch
// and its rank's memory.
std::string stage_text(const Model& m, const Layout& l, const Estimate& e, int st) {
  const int first = l.first_layer_of_stage(st, m.layers), n = l.layers_of_stage(st, m.layers);
  const auto k = static_cast<std::size_t>(st);
  const int rank = l.rank_of_stage(st);
  std::string s = "stage " + std::to_string(st) + " (rank " + std::to_string(rank) + ") layers " +
                  (n == 0 ? std::string("none") : std::to_string(first) + (n > 1 ? "-" + std::to_string(first + n - 1) : ""));
  if (st == 0) s += " + embedding";
  if (st == l.num_stages() - 1) s += " + head, loss";
  return s + " " + secs(e.stage_f[k] + e.stage_i[k] + e.stage_w[k]) + ", rank memory " +
         num(e.memory[static_cast<std::size_t>(rank)].total() / kGiB, 1) + " GiB";
}

// The split's balance: the first, the slowest and the last stage (the embedding and the head load the ends)
// and the imbalance (stage_imbalance).
void explain_stages(const Model& m, const Layout& l, const Estimate& e, std::ostringstream& os) {
  const int stages = l.num_stages();
  if (stages < 2) return;
  int slowest = 0;
  for (int st = 1; st < stages; ++st) {
    const auto k = static_cast<std::size_t>(st), b = static_cast<std::size_t>(slowest);
    if (e.stage_f[k] + e.stage_i[k] + e.stage_w[k] > e.stage_f[b] + e.stage_i[b] + e.stage_w[b]) slowest = st;
  }
  std::vector<int> split(static_cast<std::size_t>(stages));
  for (int st = 0; st < stages; ++st) split[static_cast<std::size_t>(st)] = l.layers_of_stage(st, m.layers);
  os << "  stages: layers=" << describe_stage_layers(split) << ", imbalance " << num(100 * stage_imbalance(e), 1)
     << "% (the slowest stage over the mean)\n    first: " << stage_text(m, l, e, 0) << "\n";
  if (slowest != 0 && slowest != stages - 1) os << "    slowest: " << stage_text(m, l, e, slowest) << "\n";
  os << "    last: " << stage_text(m, l, e, stages - 1) << "\n";
}

}  // namespace

std::string explain(const Model& m, const System& sys, int gpus, const Layout& l, const Result& r) {
  std::ostringstream os;
  os << "layout " << l.describe() << ", global batch " << l.global_batch << " on " << gpus << " GPUs\n";
  if (auto p = layout_problem(l, m, gpus)) {
    os << "  rejected by rule '" << p->rule << "': " << p->message << "\n";
    return os.str();
  }
  Estimate e;
  try {
    e = estimate(m, l, sys, gpus);
  } catch (const InfeasibleLayout& err) {
    os << "  rejected: " << err.what() << "\n";
    return os.str();
  }
  const auto& mem = e.memory[static_cast<std::size_t>(e.peak_rank)];
  os << "  peak memory " << num(e.peak_memory_bytes / kGiB, 1) << " GiB on pipeline rank " << e.peak_rank << " of "
     << num(e.capacity_bytes / kGiB, 1) << " GiB: weights " << num(mem.weights_bytes / kGiB, 1) << ", gradients "
     << num(mem.grads_bytes / kGiB, 1) << ", optimizer " << num(mem.optimizer_bytes / kGiB, 1) << ", activations "
     << num(mem.activations_bytes / kGiB, 1) << ", extras " << num((mem.extras_bytes + mem.zero3_gather_bytes + mem.recompute_transient_bytes) / kGiB, 1)
     << ", reserved " << num(mem.reserved_bytes / kGiB, 1) << "\n";
  if (!e.fits) {
    os << "  rejected: needs " << num(e.peak_memory_bytes / kGiB, 1) << " GiB of " << num(e.capacity_bytes / kGiB, 1) << " GiB\n";
    int shown = 0;
    for (const auto& [what, x] : memory_variants(l)) {
      if (layout_problem(x, m, gpus)) continue;
      try {
        const Estimate ex = estimate(m, x, sys, gpus);
        os << "  with " << what << ": " << num(ex.peak_memory_bytes / kGiB, 1) << " GiB, "
           << (ex.fits ? "fits, step " + secs(ex.step_s) : std::string("still too large")) << "\n";
        ++shown;
      } catch (const InfeasibleLayout&) {
      }
    }
    if (shown == 0) os << "  no single change (recompute, sp, zero, micro-batch, pp, tp) makes it fit\n";
    return os.str();
  }
  os << "  analytical step " << secs(e.step_s) << ": compute " << secs(e.compute_s) << ", bubble "
     << num(100 * e.bubble_fraction, 1) << "%, exposed TP " << secs(e.tp_exposed_s) << ", PP "
     << secs(e.pp_exposed_s) << ", DP " << secs(e.dp_exposed_s) << ", optimizer " << secs(e.optimizer_s) << "\n";
  explain_stages(m, l, e, os);
  if (r.top.empty()) return os.str();
  const Scored& best = r.top.front();
  int rank = 0;
  for (std::size_t i = 0; i < r.top.size(); ++i)
    if (r.top[i].layout.describe() == l.describe() && r.top[i].layout.global_batch == l.global_batch) rank = static_cast<int>(i) + 1;
  if (rank > 0) {
    os << "  ranks #" << rank << " of the top " << r.top.size() << " (" << r.top[rank - 1].tier << " tier)\n";
  } else {
    os << "  not in the top " << r.top.size() << ": " << num(100.0 * (e.step_s / best.analytical_step_s - 1.0), 1)
       << "% slower than the best's analytical step\n";
  }
  if (!(best.layout.describe() == l.describe())) {
    const Estimate b = estimate(m, best.layout, sys, gpus);
    os << "  against the best (" << best.layout.describe() << ", step " << secs(b.step_s) << "):\n"
       << "    compute " << secs(e.compute_s) << " vs " << secs(b.compute_s) << ", bubble "
       << num(100 * e.bubble_fraction, 1) << "% vs " << num(100 * b.bubble_fraction, 1) << "%, exposed comm "
       << secs(e.tp_exposed_s + e.pp_exposed_s + e.dp_exposed_s + e.cp_exposed_s) << " vs "
       << secs(b.tp_exposed_s + b.pp_exposed_s + b.dp_exposed_s + b.cp_exposed_s) << ", memory "
       << num(e.peak_memory_bytes / kGiB, 1) << " vs " << num(b.peak_memory_bytes / kGiB, 1) << " GiB\n";
  }
  return os.str();
}

}  // namespace tessel::explore
