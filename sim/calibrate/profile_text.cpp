// The fitted profile as it is written (fit.hpp): its "source" text, read off the written numbers, and the
// check that it loads back through the system parser.
#include <cmath>
#include <sstream>

#include "sim/calibrate/fit.hpp"
#include "util/error.hpp"

namespace tessel::calib {

namespace {

// The measured per-kind sections of the profile (system.hpp: gpu.kernels, node.collectives, host), if any.
void describe_measured(std::ostringstream& os, const System& s) {
  const GpuSpec& g = s.gpu;
  if (g.kind_rates() || g.attention_flops.fwd > 0) {
    os << " Measured per kind (GB/s of the bytes the cost model charges, forward/backward):";
    bool first = true;
    for (int k = idx(CostKind::memory); k <= idx(CostKind::glue); ++k) {
      const DirRate& d = g.kernel_Bps[static_cast<std::size_t>(k)];
      if (!(d.fwd > 0) && !(d.bwd > 0)) continue;
      os << (first ? " " : ", ") << to_string(static_cast<CostKind>(k)) << " " << d.fwd / 1e9;
      if (k != idx(CostKind::optimizer)) os << "/" << d.bwd / 1e9;
      if (k == idx(CostKind::optimizer) && !g.optimizer_params.empty()) {
        os << " (by the parameters a rank steps:";
        for (std::size_t i = 0; i < g.optimizer_params.size(); ++i)
          os << (i ? "," : "") << " " << g.optimizer_params[i] / 1e6 << " M " << g.optimizer_Bps[i] / 1e9;
        os << ")";
      }
      first = false;
    }
    if (g.attention_flops.fwd > 0)
      os << (first ? " " : ", ") << "attention core " << g.attention_flops.fwd / 1e9 << "/" << g.attention_flops.bwd / 1e9
         << " GFLOP/s";
    os << "; GEMM gradient classes x" << g.gemm_dgrad_factor << " (dgrad), x" << g.gemm_wgrad_factor << " (wgrad).";
  }
  bool links = false;
  static const char* names[6] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"};
  for (int c = 0; c < 6; ++c) {
    const LinkRate& l = s.node.collective[static_cast<std::size_t>(c)];
    if (!(l.bw_Bps > 0)) continue;
    os << (links ? ", " : " Per collective (us per step, GB/s): ") << names[c] << " " << l.latency_s * 1e6 << " + "
       << l.bw_Bps / 1e9;
    if (l.large_bytes > 0 && l.large_bw_Bps > 0) os << " (past " << l.large_bytes / 1e6 << " MB: " << l.large_bw_Bps / 1e9 << ")";
    links = true;
  }
  if (links) os << ".";
  if (s.host.cores > 0) {
    os << " Host: " << s.host.cores << " cores shared by the ranks; with every core busy each kind takes x";
    bool first = true;
    for (int k = 0; k < kCostKinds; ++k) {
      const double c = s.host.contention[static_cast<std::size_t>(k)];
      if (c == 1) continue;
      os << (first ? " " : ", ") << c << " (" << to_string(static_cast<CostKind>(k)) << ")";
      first = false;
    }
    if (first) os << " 1 (no contention measured)";
    os << ".";
  }
}

}  // namespace

std::string describe_fit(const FitResult& f, const System& written, Precision p, const std::string& bench_origin,
                         const std::string& base_name, const TraceProvenance& traces) {
  const GpuSpec& g = written.gpu;
  std::ostringstream os;
  os.precision(4);
  // What the file holds, read off the written profile: every number below is one of its fields (or a
  // product of two, datasheet x efficiency, as the simulator uses them).
  os << "Profile fitted by `tessel calibrate` (" << to_string(p) << "). It holds: GEMM ceiling "
     << g.peak(p) * g.gemm_efficiency / 1e9 << " GFLOP/s, K overhead " << g.gemm_k_overhead << ", tile";
  if (g.gemm_tiles.size() > 1) os << "s";
  for (std::size_t i = 0; i < g.gemm_tiles.size(); ++i) os << (i ? ", " : " ") << g.gemm_tiles[i].m << "x" << g.gemm_tiles[i].n;
  const double roof = g.memory_bw_Bps * (g.gemm_memory_efficiency > 0 ? g.gemm_memory_efficiency : g.memory_efficiency);
  os << ", kernel overhead " << g.kernel_overhead_s * 1e6 << " us, element-wise memory "
     << g.memory_bw_Bps * g.memory_efficiency / 1e9 << " GB/s, GEMM memory roofline " << roof / 1e9 << " GB/s, attention "
     << g.peak(p) * g.attention_efficiency / 1e9 << " GFLOP/s, intra-node link " << written.node.intra_latency_s * 1e6
     << " us and " << written.node.intra_bw_Bps * written.node.intra_efficiency / 1e9 << " GB/s.";
  describe_measured(os, written);
  // Which fit set which field.
  std::vector<std::string> fitted, kept;
  auto from_bench = [&](bool yes, const char* what) { (yes ? fitted : kept).emplace_back(what); };
  const bool bench = !bench_origin.empty();
  from_bench(bench && f.gemm_rate > 0, "GEMM ceiling");
  from_bench(bench && f.gemm_rate > 0, "K overhead");
  from_bench(bench && f.gemm_rate > 0, "tile");
  from_bench(bench && (f.gemm_rate > 0 || f.stream_rate > 0), "kernel overhead");
  from_bench(bench && f.mem_rate > 0, f.stream_rate > 0 && f.stream_rate != f.mem_rate ? "element-wise memory (runtime kernel rows)"
                                                                                         : "element-wise memory");
  from_bench(bench && (f.gemm_memory_rate > 0 || f.stream_rate > 0), "GEMM memory roofline");
  from_bench(bench && f.attention_rate > 0, "attention");
  from_bench(bench && f.link_bw > 0, "link");
  auto list = [&](const std::vector<std::string>& v) {
    for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  };
  if (bench && !fitted.empty()) {
    os << " From " << bench_origin << " (weighted least squares on relative error against sim/cost): ";
    list(fitted);
    os << ".";
  }
  if (!kept.empty()) {
    os << " Kept from the base system " << base_name << ": ";
    list(kept);
    os << ".";
  }
  if (!traces.origins.empty() && traces.method == "per-op")
    os << " Then the trace fit on " << traces.origins << " (per op: only what no bench row times) set the glue rates"
       << (traces.wgrad_fitted ? " and the weight-gradient class" : " (the weight-gradient class is the bench's: no "
                                                                    "input- and weight-gradient ops apart)")
       << "; the numbers above include them.";
  else if (!traces.origins.empty())
    os << " Then the trace fit on " << traces.origins << " scaled the compute times x" << traces.compute_scale
       << " (GEMM ceiling and attention divided, kernel overhead multiplied) and the element-wise memory times x"
       << traces.memory_scale;
  if (!traces.origins.empty() && traces.method != "per-op" && traces.comm_scale != 1)
    os << " and the communication times x" << traces.comm_scale << " (link latency multiplied, bandwidth divided)";
  if (!traces.origins.empty() && traces.method != "per-op") os << "; the numbers above include these scales.";
  if (f.noise >= 0 || traces.noise >= 0) {
    os << " Noise (repeat variation, median interquartile range over median):";
    if (f.noise >= 0) os << " bench rows " << 100 * f.noise << "%";
    if (traces.noise >= 0) os << (f.noise >= 0 ? "," : "") << " trace ops " << 100 * traces.noise << "%";
    os << ".";
  }
  if (bench)
    for (const std::string& n : f.notes) os << " Bench fit: " << n << ".";
  for (const std::string& n : traces.notes) os << " Trace fit: " << n << ".";
  return os.str();
}

void check_profile(const System& profile, Precision p, const std::string& what) {
  auto rate = [&](const char* field, double v) {
    if (std::isfinite(v) && v > 0) return;
    std::ostringstream os;
    os << what << ": the fitted " << field << " is " << v << ", not a positive finite rate; the measurements cannot be "
       << "fitted to this model";
    throw InputError(os.str());
  };
  rate("peak FLOP/s of the fitted precision", profile.gpu.peak(p));
  rate("GEMM efficiency", profile.gpu.gemm_efficiency);
  rate("memory bandwidth", profile.gpu.memory_bw_Bps * profile.gpu.memory_efficiency);
  try {
    (void)parse_system(system_to_json(profile), "the fitted profile");
  } catch (const InputError& e) {
    throw InputError(what + ": " + e.what() + " (the measurements are too far from the model's prediction to fit)");
  }
}

}  // namespace tessel::calib
