// The fitted profile as it is written (fit.hpp): its "source" text, read off the written numbers, and the
// check that it loads back through the system parser.
#include <cmath>
#include <sstream>

#include "sim/calibrate/fit.hpp"
#include "util/error.hpp"

namespace tessel::calib {

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
  if (!traces.origins.empty())
    os << " Then the trace fit on " << traces.origins << " scaled the compute times x" << traces.compute_scale
       << " (GEMM ceiling and attention divided, kernel overhead multiplied) and the element-wise memory times x"
       << traces.memory_scale;
  if (!traces.origins.empty() && traces.comm_scale != 1)
    os << " and the communication times x" << traces.comm_scale << " (link latency multiplied, bandwidth divided)";
  if (!traces.origins.empty()) os << "; the numbers above include these scales.";
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
