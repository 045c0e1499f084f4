#include "sim/calibrate/fit.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "util/error.hpp"
#include "sim/calibrate/kind_fit.hpp"
#include "sim/calibrate/nnls.hpp"
#include "sim/cost/comm.hpp"
#include "sim/cost/compute.hpp"

namespace tessel::calib {

namespace {

// A rate so large that its term vanishes next to the others (the probe switches a term off with it).
constexpr double kHuge = 1e300;
// Columns of the compute fit.
enum Col { kU = 0, kV = 1, kC = 2, kW = 3, kCols = 4 };

// The GPU with unit rates and no overheads, one tile: gemm_time on it is A(g) (seconds per unit of u).
GpuSpec probe_gpu(const GpuSpec& base, GemmTile tile, Precision p) {
  GpuSpec g = base;
  g.peak_flops.fill(0);
  g.peak_flops[static_cast<int>(p)] = 1.0;
  g.gemm_efficiency = 1.0;
  g.gemm_k_overhead = 0;
  g.gemm_tiles = {tile};
  g.kernel_overhead_s = 0;
  g.memory_bw_Bps = kHuge;
  g.memory_efficiency = 1.0;
  g.gemm_memory_efficiency = 0;  // the GEMM roofline at memory_bw_Bps: the bytes coefficient is bytes / memory_bw_Bps
  g.time_factor.fill(1.0);
  return g;
}

struct GemmCoef {
  double a = 0, b = 0, bytes = 0;  // t = a u + b v (compute) or bytes w (memory), plus c
};

GemmCoef gemm_coef(const GpuSpec& base, GemmTile tile, Precision p, const GemmRow& r) {
  const cost::GemmShape s{r.m, r.n, r.k, r.batch};
  GpuSpec g = probe_gpu(base, tile, p);
  GemmCoef c;
  c.a = cost::gemm_time(g, p, s);
  g.gemm_k_overhead = 1;  // t is linear in k_overhead: the difference is its coefficient
  c.b = cost::gemm_time(g, p, s) - c.a;
  g = probe_gpu(base, tile, p);
  g.peak_flops[static_cast<int>(p)] = kHuge;
  g.memory_bw_Bps = 1.0;
  c.bytes = cost::gemm_time(g, p, s);
  return c;
}

struct ComputeFit {
  std::vector<double> x = std::vector<double>(kCols, 0.0);
  std::vector<bool> memory_bound;
  double sse = 0;
};

// One weighted NNLS per roofline classification, until the classification stops changing. The GEMM rows'
// memory roofline and the STREAM rows share one rate (w): the copy loops and a memory-bound GEMM stream
// their operands alike (gpu.efficiency.gemm_memory when kernel rows set the element-wise rate apart).
ComputeFit fit_compute(const BenchData& b, const GpuSpec& base, GemmTile tile, Precision p) {
  std::vector<GemmCoef> coef;
  for (const GemmRow& r : b.gemm) coef.push_back(gemm_coef(base, tile, p, r));
  const int rows = static_cast<int>(b.gemm.size() + b.membw.size());
  ComputeFit f, best;
  f.memory_bound.assign(b.gemm.size(), false);
  best.sse = -1;
  std::vector<std::vector<bool>> seen;
  // The fixed point is reached at once on data the model can fit; on data it cannot (a wrong tile, noise)
  // the classification may cycle: stop at a repeat and keep the lowest error seen.
  for (int iter = 0; iter < 50; ++iter) {
    seen.push_back(f.memory_bound);
    Matrix A(rows, kCols);
    std::vector<double> y(rows, 1.0);  // measured / measured
    for (std::size_t i = 0; i < b.gemm.size(); ++i) {
      const double wgt = 1.0 / b.gemm[i].time_s;
      const int r = static_cast<int>(i);
      if (f.memory_bound[i]) {
        A.at(r, kW) = coef[i].bytes * wgt;
      } else {
        A.at(r, kU) = coef[i].a * wgt;
        A.at(r, kV) = coef[i].b * wgt;
      }
      A.at(r, kC) = wgt;
    }
    for (std::size_t i = 0; i < b.membw.size(); ++i) {
      const int r = static_cast<int>(b.gemm.size() + i);
      const double wgt = 1.0 / b.membw[i].time_s;
      A.at(r, kW) = b.membw[i].bytes * wgt;  // memory_time's coefficient of w is the bytes moved
      A.at(r, kC) = wgt;                      // one kernel launch
    }
    f.x = nnls(A, y);
    // The error of the model itself (each GEMM on the higher of its two rooflines), not of this iteration's
    // classification: a classification that ignores a roofline the rates put a row on must not win.
    f.sse = 0;
    for (std::size_t i = 0; i < b.gemm.size(); ++i) {
      const double t = std::max(coef[i].a * f.x[kU] + coef[i].b * f.x[kV], coef[i].bytes * f.x[kW]) + f.x[kC];
      f.sse += (t / b.gemm[i].time_s - 1) * (t / b.gemm[i].time_s - 1);
    }
    for (std::size_t i = 0; i < b.membw.size(); ++i) {
      const double t = b.membw[i].bytes * f.x[kW] + f.x[kC];
      f.sse += (t / b.membw[i].time_s - 1) * (t / b.membw[i].time_s - 1);
    }
    if (best.sse < 0 || f.sse < best.sse) best = f;
    for (std::size_t i = 0; i < b.gemm.size(); ++i) {
      // Without memory rows w may be 0: then nothing is memory-bound (the base's bandwidth is kept).
      f.memory_bound[i] = f.x[kW] > 0 && coef[i].bytes * f.x[kW] > coef[i].a * f.x[kU] + coef[i].b * f.x[kV];
    }
    if (std::find(seen.begin(), seen.end(), f.memory_bound) != seen.end()) break;
  }
  return best;
}

std::vector<GemmTile> tile_candidates(const System& base, const FitOptions& o) {
  if (!o.tiles.empty()) return o.tiles;
  std::vector<GemmTile> t = base.gpu.gemm_tiles;
  for (int m : {256, 128, 64, 32, 16, 8})
    for (int n : {256, 128, 64, 32, 16, 8}) t.push_back({m, n});
  return t;
}

// Puts an achieved rate into (datasheet value, efficiency) with the efficiency inside the parser's
// [0.01, 1]: keep the datasheet number when possible, else set it to the rate (efficiency 1) and say so.
void set_rate(double& datasheet, double& eff, double rate, const std::string& what, std::vector<std::string>& notes) {
  const double e = datasheet > 0 ? rate / datasheet : 0;
  if (e >= 0.01 && e <= 1.0) {
    eff = e;
    return;
  }
  std::ostringstream os;
  os << what << ": fitted rate " << rate << " is " << e << " of the base value " << datasheet
     << "; the base value is replaced by the fitted rate (efficiency 1)";
  notes.push_back(os.str());
  datasheet = rate;
  eff = 1.0;
}

Residuals summarize(const std::string& category, std::vector<double> rel) {
  Residuals r;
  r.category = category;
  r.rows = static_cast<int>(rel.size());
  if (rel.empty()) return r;
  double ss = 0;
  for (double& e : rel) {
    ss += e * e;
    e = std::abs(e);
  }
  std::sort(rel.begin(), rel.end());
  const std::size_t n = rel.size();
  r.median_abs = n % 2 ? rel[n / 2] : 0.5 * (rel[n / 2 - 1] + rel[n / 2]);
  r.max_abs = rel.back();
  r.rms = std::sqrt(ss / n);
  return r;
}

double link_time(const System& s, const CollRow& r) {
  if (r.collective == cost::Collective::send_recv) return cost::p2p_time(s, r.bytes, 1).seconds;
  return cost::collective_time(s, r.collective, r.bytes, {r.ranks, 1}).seconds;
}

// Probe system: every group inside one node, unit rates; one term on at a time.
System link_probe(const System& base, double latency, double bw) {
  System s = base;
  s.node.gpus_per_node = 1 << 30;
  s.node.intra_latency_s = latency;
  s.node.intra_bw_Bps = bw;
  s.node.intra_efficiency = 1.0;
  s.node.collective = {};  // a base fitted before carries its own links: the probe measures the node's
  s.gpu.time_factor.fill(1.0);
  return s;
}

// alpha/beta over `rows` (weighted relative); returns {alpha, 1/beta, rms}.
LinkFit fit_link(const std::vector<CollRow>& rows, const System& base) {
  Matrix A(static_cast<int>(rows.size()), 2);
  std::vector<double> y(rows.size(), 1.0);
  const System pa = link_probe(base, 1.0, kHuge), pb = link_probe(base, 0.0, 1.0);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const int r = static_cast<int>(i);
    A.at(r, 0) = link_time(pa, rows[i]) / rows[i].time_s;
    A.at(r, 1) = link_time(pb, rows[i]) / rows[i].time_s;
  }
  const std::vector<double> x = nnls(A, y);
  LinkFit f;
  f.rows = static_cast<int>(rows.size());
  f.alpha_s = x[0];
  f.bw = x[1] > 0 ? 1.0 / x[1] : 0.0;
  double ss = 0;
  for (int r = 0; r < A.rows; ++r) {
    const double e = A.at(r, 0) * x[0] + A.at(r, 1) * x[1] - 1;
    ss += e * e;
  }
  f.rms = rows.empty() ? 0 : std::sqrt(ss / rows.size());
  return f;
}

// The rate at which the reference step's total time on a path is right: with n_i the rows' per_step counts,
// x = sum n_i (t_i - c) / sum n_i a_i, for t_i = a_i x + c. Not a relative least squares: the kernels of one
// path run at 0.5..200 GB/s of the bytes the cost model charges (tanh GELU vs an embedding gather), so no
// single rate fits every row, and a step's time on the path is a sum in which a 3 ms GELU that runs 16 times
// matters and a 2 us gather does not. Per kernel the error remains (see kernel_residuals); the step's sum
// is exact for the reference step.
double fit_total_rate(const std::vector<double>& a, const std::vector<double>& t, const std::vector<double>& n,
                      double c) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += n[i] * (t[i] - c);
    den += n[i] * a[i];
  }
  return den > 0 ? num / den : 0;
}

// A kernel row's time on `s` as the simulator prices its op: at its kind's measured rate when the profile has
// one (kind_fit.hpp), else on its path's general rate.
double kernel_time(const KernelRow& r, const System& s, Precision p) {
  CostKind kind = CostKind::memory;
  bool bwd = false;
  const bool known = kernel_kind(r.kernel, kind, bwd);
  if (r.path == "attention")
    return known && cost::measured_attention_core(s.gpu) ? cost::attention_core_time(s.gpu, r.flops, bwd)
                                                         : cost::attention_time(s.gpu, p, r.flops, r.bytes);
  return known ? cost::memory_time(s.gpu, r.bytes, 1, kind, bwd) : cost::memory_time(s.gpu, r.bytes, 1);
}

// 1/rate of the runtime's memory-path kernel rows (see fit.hpp) with kernel overhead c: from the rows' totals.
// 0 when there are no such rows.
double kernel_memory_w(const BenchData& bench, double c) {
  std::vector<double> a, t, n;
  for (const KernelRow& r : bench.kernels)
    if (r.path == "memory") {
      a.push_back(r.bytes);
      t.push_back(r.time_s);
      n.push_back(r.per_step);
    }
  if (a.empty()) return 0;
  const double w = fit_total_rate(a, t, n, c);
  if (!(w > 0)) throw InputError(bench.origin + ": the memory kernel rows do not determine a rate (fitted 1/rate <= 0)");
  return w;
}

// The attention rate from the runtime's attention-path kernel rows, from their totals (kernel overhead c).
void fit_attention_rows(const BenchData& bench, Precision p, double c, FitResult& out) {
  System& s = out.profile;
  std::vector<double> aa, ta, na;
  for (const KernelRow& r : bench.kernels)
    if (r.path == "attention") {
      aa.push_back(r.flops);  // compute branch of attention_time; its memory branch is far below on a CPU
      ta.push_back(r.time_s);
      na.push_back(r.per_step);
    }
  if (aa.empty()) return;
  const double u = fit_total_rate(aa, ta, na, c);
  if (!(u > 0)) throw InputError(bench.origin + ": the attention kernel rows do not determine a rate (fitted 1/rate <= 0)");
  out.attention_rate = 1.0 / u;
  const double peak = s.gpu.peak(p);
  const double e = out.attention_rate / peak;
  if (e < 0.01 || e > 1.0) {
    std::ostringstream os;
    os << "attention: fitted rate " << out.attention_rate << " FLOP/s is " << e << " of the " << to_string(p)
       << " peak; clamped to the schema's efficiency range [0.01, 1]";
    out.notes.push_back(os.str());
  }
  s.gpu.attention_efficiency = std::clamp(e, 0.01, 1.0);
  // The base's curve is a published kernel's shape around a long-sequence level; this rate is the runtime's
  // kernel at the bench's shapes, which the rows do not record: the profile prices every shape at it.
  if (!s.gpu.attention_curve.empty()) {
    s.gpu.attention_curve = {};
    out.notes.push_back("attention: the rate is the runtime's kernel at the bench's shapes; the base's attention_curve is "
                        "not kept (every shape at this rate)");
  }
}

}  // namespace

LinkFit fit_link_regimes(const std::vector<CollRow>& rows, const System& base) {
  LinkFit best = fit_link(rows, base);
  best.rms_one_line = best.rms;
  // A line within 1% of every row (relative rms) leaves nothing for a second regime to explain.
  if (best.rms < 0.01) return best;
  std::vector<double> sizes;
  for (const CollRow& r : rows) sizes.push_back(r.bytes);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const System pa = link_probe(base, 1.0, kHuge), pb = link_probe(base, 0.0, 1.0);
  // Every breakpoint with at least two sizes on each side: the line on the sizes up to it, then the one rate of
  // the bytes past it that fits the larger rows best (relative least squares, one unknown).
  for (std::size_t j = 1; j + 2 < sizes.size(); ++j) {
    const double L = sizes[j];
    std::vector<CollRow> small;
    for (const CollRow& r : rows)
      if (r.bytes <= L) small.push_back(r);
    const LinkFit line = fit_link(small, base);
    if (!(line.bw > 0)) continue;
    double num = 0, den = 0;
    std::vector<std::pair<double, double>> cd;  // per large row: the known part and the coefficient of 1/large_bw
    for (const CollRow& r : rows) {
      if (r.bytes <= L) continue;
      const double steps = link_time(pa, r), moved = link_time(pb, r);  // alpha steps; bus factor x bytes
      const double per_byte = moved / r.bytes;
      const double c = (steps * line.alpha_s + per_byte * L / line.bw) / r.time_s;
      const double d = per_byte * (r.bytes - L) / r.time_s;
      cd.push_back({c, d});
      num += d * (1 - c);
      den += d * d;
    }
    if (!(den > 0) || !(num > 0)) continue;
    const double x = num / den;  // 1 / large_bw
    const double large_bw = 1.0 / x;
    if (!(large_bw < line.bw)) continue;  // leaving the caches is slower; a faster tail is not this regime
    double ss = line.rms * line.rms * small.size();  // the small rows' residuals under their own line
    for (const auto& [c, d] : cd) ss += (c + d * x - 1) * (c + d * x - 1);
    const double rms = std::sqrt(ss / rows.size());
    if (rms < best.rms) {
      best.alpha_s = line.alpha_s;
      best.bw = line.bw;
      best.large_bytes = L;
      best.large_bw = large_bw;
      best.rms = rms;
    }
  }
  return best;
}

Residuals kernel_residuals(const std::vector<KernelRow>& rows, const std::string& path, const System& sys, Precision p) {
  std::vector<double> rel;
  for (const KernelRow& r : rows)
    if (r.path == path) rel.push_back(kernel_time(r, sys, p) / r.time_s - 1);
  return summarize("kernels (" + path + ")", rel);
}

Residuals gemm_residuals(const std::vector<GemmRow>& rows, const System& sys, Precision p) {
  std::vector<double> rel;
  for (const GemmRow& r : rows)
    if (r.cls == GemmClass::fwd) rel.push_back(cost::gemm_time(sys.gpu, p, {r.m, r.n, r.k, r.batch}) / r.time_s - 1);
  return summarize("gemm", rel);
}

// The STREAM rows against the rate fitted with them: the GEMM roofline's when the profile carries it apart.
Residuals mem_residuals(const std::vector<MemRow>& rows, const System& sys) {
  GpuSpec g = sys.gpu;
  if (g.gemm_memory_efficiency > 0) g.memory_efficiency = g.gemm_memory_efficiency;
  std::vector<double> rel;
  for (const MemRow& r : rows) rel.push_back(cost::memory_time(g, r.bytes, 1) / r.time_s - 1);
  return summarize("membw", rel);
}

// See fit.hpp. A rate kept from the base keeps its value; the GEMM roofline is stored as 0 (follow the
// element-wise rate) only when the two are equal.
void set_memory_rates(GpuSpec& g, double mem, double gemm, std::vector<std::string>& notes) {
  if (gemm < 0) gemm = g.memory_bw_Bps * (g.gemm_memory_efficiency > 0 ? g.gemm_memory_efficiency : g.memory_efficiency);
  if (!(mem > 0)) mem = g.memory_bw_Bps * g.memory_efficiency;
  const double hi = std::max(mem, gemm), lo = std::min(mem, gemm);
  if (hi > g.memory_bw_Bps || lo < kMinMemoryEfficiency * g.memory_bw_Bps) {
    std::ostringstream os;
    os << "gpu.memory_GBps: fitted rates " << lo / 1e9 << " and " << hi / 1e9 << " GB/s do not both fit under the base value "
       << g.memory_bw_Bps / 1e9 << " GB/s at efficiencies in [" << kMinMemoryEfficiency << ", 1]; it is replaced by the larger";
    notes.push_back(os.str());
    g.memory_bw_Bps = hi;
  }
  auto eff = [&](double rate, const char* what) {
    const double e = rate / g.memory_bw_Bps;
    if (e < kMinMemoryEfficiency) {
      std::ostringstream os;
      os << what << ": fitted rate " << rate / 1e9 << " GB/s is " << e << " of gpu.memory_GBps; clamped to " << kMinMemoryEfficiency;
      notes.push_back(os.str());
    }
    return std::clamp(e, kMinMemoryEfficiency, 1.0);
  };
  g.memory_efficiency = eff(mem, "gpu.efficiency.memory");
  g.gemm_memory_efficiency = gemm != mem ? eff(gemm, "gpu.efficiency.gemm_memory") : 0.0;
}

namespace {

// Input rules of a bench document against the base system and the options (InputError naming the file).
void check_bench(const BenchData& bench, const System& base, const FitOptions& opts, Precision p) {
  bool attention_rows = false;
  for (const KernelRow& r : bench.kernels) attention_rows = attention_rows || r.path == "attention";
  // GEMM and attention rates are fitted as efficiencies of the base's peak in the bench's precision: a base
  // without that peak has nothing to hold them (and the simulator would refuse the precision on it anyway).
  if ((!bench.gemm.empty() || attention_rows) && !(base.gpu.peak(p) > 0))
    throw InputError(bench.origin + ": precision '" + bench.precision + "': the base system '" + base.name + "' has no " +
                     bench.precision + " peak (gpu.peak_tflops." + bench.precision +
                     " = 0), so its GEMM/attention rows cannot be fitted; give --base-system with a " + bench.precision + " peak");
  // Something in the document must apply: a bench of only another communicator's (or larger groups')
  // collective rows would otherwise write the base unchanged and report zero rates.
  if (bench.gemm.empty() && bench.membw.empty() && bench.kernels.empty()) {
    int usable = 0;
    for (const CollRow& r : bench.collectives)
      usable += r.comm == opts.comm && (opts.max_ranks <= 0 || r.ranks <= opts.max_ranks);
    if (usable == 0)
      throw InputError(bench.origin + ": nothing in the file can be fitted for --comm " + opts.comm +
                       (opts.max_ranks > 0 ? " --max-ranks " + std::to_string(opts.max_ranks) : std::string()) +
                       ": no gemm, membw or kernels rows, and none of its " + std::to_string(bench.collectives.size()) +
                       " collective rows is a " + opts.comm + " row" + (opts.max_ranks > 0 ? " of <= max-ranks ranks" : ""));
  }
  const auto fwd = std::count_if(bench.gemm.begin(), bench.gemm.end(), [](const GemmRow& r) { return r.cls == GemmClass::fwd; });
  if (!bench.gemm.empty() && fwd < 3)
    throw InputError(bench.origin + ": " + std::to_string(fwd) +
                     " forward GEMM rows cannot determine rate, K overhead and kernel overhead (need >= 3)");
  if (bench.gemm.empty() && bench.membw.size() == 1)
    throw InputError(bench.origin + ": one membw row cannot determine bandwidth and kernel overhead (need >= 2)");
}

// Compute side: GEMM ceiling, K overhead, tile, memory rate, kernel overhead, one fit per tile candidate
// (the element-wise memory rate from kernel rows alone when there are no GEMM or membw rows).
void fit_compute_side(const BenchData& all, const System& base, const FitOptions& opts, Precision p, FitResult& out) {
  System& s = out.profile;
  // The tile model is fitted on the forward GEMMs; the gradient classes are factors on it (kind_fit.hpp).
  BenchData bench = all;
  std::erase_if(bench.gemm, [](const GemmRow& r) { return r.cls != GemmClass::fwd; });
  if (!bench.gemm.empty() || !bench.membw.empty()) {
    std::vector<GemmTile> cands = bench.gemm.empty() ? std::vector<GemmTile>{base.gpu.gemm_tiles.front()}
                                                     : tile_candidates(base, opts);
    ComputeFit best;
    bool have = false;
    for (const GemmTile& t : cands) {
      ComputeFit f = fit_compute(bench, base.gpu, t, p);
      // Strictly better by more than rounding, so among tiles the data cannot tell apart the first wins.
      if (!have || f.sse < best.sse * (1 - 1e-9) - 1e-300) {
        best = f;
        out.tile = t;
        have = true;
      }
    }
    const std::vector<double>& x = best.x;
    out.kernel_overhead_s = x[kC];
    s.gpu.kernel_overhead_s = x[kC];
    if (!bench.membw.empty()) {
      if (!(x[kW] > 0)) throw InputError(bench.origin + ": the membw rows do not determine a bandwidth (fitted 1/bandwidth = 0)");
      out.stream_rate = 1.0 / x[kW];
    }
    // The runtime's element-wise kernels, when measured, set the rate of everything the simulator prices by
    // bytes alone; the GEMMs keep the roofline they were fitted with (the STREAM rows' rate), which the
    // profile carries apart (gpu.efficiency.gemm_memory): on a CPU the runtime's scalar loops run some 100x
    // below the copy rate BLAS streams at, and one shared rate put the QA's bench GEMMs 3x slow.
    const double wk = kernel_memory_w(bench, x[kC]);
    out.mem_rate = wk > 0 ? 1.0 / wk : out.stream_rate;
    double gemm_roof = -1;  // keep the base's
    if (!bench.gemm.empty()) {
      if (!(x[kU] > 0)) throw InputError(bench.origin + ": the GEMM rows do not determine a compute rate (fitted 1/rate = 0)");
      out.gemm_rate = 1.0 / x[kU];
      out.k_overhead = x[kV] / x[kU];
      out.gemm_memory_bound = static_cast<int>(std::count(best.memory_bound.begin(), best.memory_bound.end(), true));
      const double att_rate = base.gpu.peak(p) * base.gpu.attention_efficiency;
      double& peak = s.gpu.peak_flops[static_cast<int>(p)];
      set_rate(peak, s.gpu.gemm_efficiency, out.gemm_rate, "gpu.peak_tflops." + to_string(p), out.notes);
      s.gpu.gemm_k_overhead = out.k_overhead;
      s.gpu.gemm_tiles = {out.tile};
      // Attention is not benchmarked by these rows: keep its absolute rate from the base system.
      s.gpu.attention_efficiency = std::clamp(att_rate / peak, 0.01, 1.0);
      // No STREAM row and no memory-bound GEMM: nothing bounds the roofline; it goes to the datasheet rate.
      out.gemm_memory_rate = x[kW] > 0 ? 1.0 / x[kW] : 0;
      gemm_roof = out.gemm_memory_rate > 0 ? out.gemm_memory_rate : s.gpu.memory_bw_Bps;
      if (!(out.gemm_memory_rate > 0))
        out.notes.push_back("no membw row and no memory-bound GEMM row: the GEMM memory roofline is set to the datasheet bandwidth");
    } else {
      out.notes.push_back("no GEMM rows: GEMM efficiency, K overhead and tiles kept from " + base.name);
      if (out.stream_rate > 0) gemm_roof = out.stream_rate;  // the rate a memory-bound GEMM streams at
    }
    set_memory_rates(s.gpu, out.mem_rate, gemm_roof, out.notes);
    if (!(out.mem_rate > 0)) out.notes.push_back("no membw or memory kernel rows: memory bandwidth kept from " + base.name);
  } else {
    out.notes.push_back("no GEMM or membw rows: compute numbers kept from " + base.name);
    if (const double w = kernel_memory_w(bench, s.gpu.kernel_overhead_s); w > 0) {
      out.mem_rate = 1.0 / w;
      set_memory_rates(s.gpu, out.mem_rate, -1, out.notes);
    }
  }
}

// Communication: one alpha/beta for the intra-node link from the chosen communicator's rows (returned: the
// rows it used), and one per collective for the report.
std::vector<CollRow> fit_link_side(const BenchData& bench, const System& base, const FitOptions& opts, FitResult& out) {
  System& s = out.profile;
  std::vector<CollRow> rows;
  for (const CollRow& r : bench.collectives)
    if (r.comm == opts.comm && (opts.max_ranks <= 0 || r.ranks <= opts.max_ranks)) rows.push_back(r);
  if (rows.size() == 1) throw InputError(bench.origin + ": one collective row (" + opts.comm + ") cannot determine latency and bandwidth (need >= 2)");
  // The System has one intra link for collectives and p2p alike. The link is fitted to the collectives
  // (what TP and DP pay on every layer); send/recv rows get their own alpha/beta in `links` only, because a
  // buffered send (the thread communicator's) costs one copy, not a collective's synchronised steps.
  std::vector<CollRow> coll_rows;
  for (const CollRow& r : rows)
    if (r.collective != cost::Collective::send_recv) coll_rows.push_back(r);
  if (coll_rows.size() < 2) coll_rows = rows;  // only send/recv measured: they are all there is
  if (!rows.empty()) {
    LinkFit all = fit_link(coll_rows, base);
    if (!(all.bw > 0)) throw InputError(bench.origin + ": the " + opts.comm + " collective rows do not determine a bandwidth");
    out.link_latency_s = all.alpha_s;
    out.link_bw = all.bw;
    s.node.intra_latency_s = all.alpha_s;
    set_rate(s.node.intra_bw_Bps, s.node.intra_efficiency, all.bw, "node.intra_GBps", out.notes);
    // One machine: nothing leaves the "node", but keep the network consistent for layouts that would.
    s.net.latency_s = all.alpha_s;
    s.net.nic_bw_Bps = s.node.intra_bw_Bps;
    s.net.efficiency = s.node.intra_efficiency;
    for (cost::Collective c : {cost::Collective::all_reduce, cost::Collective::all_gather, cost::Collective::reduce_scatter,
                               cost::Collective::broadcast, cost::Collective::send_recv}) {
      std::vector<CollRow> mine;
      for (const CollRow& r : rows)
        if (r.collective == c) mine.push_back(r);
      if (mine.size() < 2) continue;
      LinkFit f = fit_link_regimes(mine, base);
      f.comm = opts.comm;
      f.collective = cost::to_string(c);
      out.links.push_back(f);
    }
  } else {
    out.notes.push_back("no " + opts.comm + " collective rows: links kept from " + base.name);
  }
  return rows;
}

// Residuals under the final profile, through the cost functions the simulator calls.
void add_residuals(const BenchData& bench, const std::vector<CollRow>& rows, const FitOptions& opts, Precision p,
                   FitResult& out) {
  const System& s = out.profile;
  if (!bench.gemm.empty()) out.residuals.push_back(gemm_residuals(bench.gemm, s, p));
  if (!bench.membw.empty()) out.residuals.push_back(mem_residuals(bench.membw, s));
  for (const char* path : {"memory", "attention"}) {
    Residuals r = kernel_residuals(bench.kernels, path, s, p);
    if (r.rows > 0) out.residuals.push_back(r);
  }
  for (cost::Collective c : {cost::Collective::all_reduce, cost::Collective::all_gather, cost::Collective::reduce_scatter,
                             cost::Collective::broadcast, cost::Collective::send_recv}) {
    std::vector<double> rel;
    for (const CollRow& r : rows)
      if (r.collective == c) rel.push_back(link_time(s, r) / r.time_s - 1);
    if (!rel.empty()) out.residuals.push_back(summarize(std::string(cost::to_string(c)) + " (" + opts.comm + ")", rel));
  }
}

}  // namespace

FitResult fit_profile(const BenchData& bench, const System& base, const FitOptions& opts) {
  FitResult out;
  out.profile = base;
  out.profile.name = base.name + "-calibrated";
  const Precision p = parse_precision(bench.precision, bench.origin + ": precision");
  check_bench(bench, base, opts, p);
  fit_compute_side(bench, base, opts, p, out);
  fit_attention_rows(bench, p, out.profile.gpu.kernel_overhead_s, out);
  // Per op (kind_fit.hpp): each runtime kernel's kind at its own rate, the GEMM gradient classes, each
  // collective on its own link. The general rates above stay for what no row measures.
  out.kinds = fit_kind_rates(bench, out.profile.gpu.kernel_overhead_s, out.profile);
  const std::vector<Residuals> classes = fit_gemm_classes(bench.gemm, p, out.profile);
  const std::vector<CollRow> rows = fit_link_side(bench, base, opts, out);
  set_collective_links(out.links, out.profile);
  add_residuals(bench, rows, opts, p, out);
  out.residuals.insert(out.residuals.begin() + (bench.gemm.empty() ? 0 : 1), classes.begin(), classes.end());
  out.noise = bench_noise(bench);
  return out;
}

FitResult fit_profile(const std::vector<BenchData>& benches, const System& base, const FitOptions& opts) {
  TESSEL_CHECK(!benches.empty(), "no bench documents");
  std::vector<const BenchData*> order;
  for (const BenchData& b : benches) order.push_back(&b);
  std::sort(order.begin(), order.end(), [](const BenchData* a, const BenchData* b) { return a->concurrent < b->concurrent; });
  for (std::size_t i = 1; i < order.size(); ++i)
    if (order[i]->concurrent == order[i - 1]->concurrent)
      throw InputError("--bench " + order[i - 1]->origin + " and " + order[i]->origin + ": both ran " +
                       std::to_string(order[i]->concurrent) + " thread(s) at once; give one document alone and one of "
                       "several threads (--concurrent N, N the host's cores)");
  if (order.size() > 2)
    throw InputError("--bench: " + std::to_string(order.size()) + " documents; give one alone and at most one of several "
                     "threads at once");
  FitResult out = fit_profile(*order[0], base, opts);
  if (order.size() == 2) {
    if (order[0]->concurrent != 1)
      throw InputError("--bench " + order[0]->origin + ": ran " + std::to_string(order[0]->concurrent) + " threads at once; "
                       "the rates are fitted from a document of one thread alone (tessel bench without --concurrent)");
    out.contention = fit_contention(*order[0], *order[1], out.profile);
    for (const ContentionFit& c : out.contention) out.contention_noise = std::max(out.contention_noise, c.unsteadiness());
    const double n2 = bench_noise(*order[1]);
    out.noise = std::max(out.noise, n2);
  }
  return out;
}

}  // namespace tessel::calib
