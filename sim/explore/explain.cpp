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
