#include "sim/calibrate/trace_fit.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "models/model.hpp"
#include "util/error.hpp"
#include "sim/calibrate/fit.hpp"
#include "sim/calibrate/nnls.hpp"
#include "sim/calibrate/trace_events.hpp"
#include "sim/step_costs.hpp"

namespace tessel::calib {

namespace {

struct Pair {
  double measured = 0, predicted = 0, flops = 0;
};

OpKindFit summarize(const std::string& op, const std::vector<Pair>& v) {
  OpKindFit k;
  k.op = op;
  k.events = static_cast<int>(v.size());
  double a = 0, b = 0, flops = 0;
  std::vector<double> ratios;
  for (const Pair& p : v) {
    const double q = p.predicted / p.measured;
    a += q;
    b += q * q;
    k.measured_s += p.measured;
    k.predicted_s += p.predicted;
    flops += p.flops;
    ratios.push_back(p.measured / p.predicted);
  }
  k.scale = b > 0 ? a / b : 1.0;
  std::sort(ratios.begin(), ratios.end());
  const std::size_t n = ratios.size();
  k.median_ratio = n % 2 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]);
  k.achieved_flops = k.measured_s > 0 ? flops / k.measured_s : 0;
  return k;
}

}  // namespace

namespace {

// One matched event with its prediction split into compute (g), memory (m), communication inside the op
// (k: TP collectives) and fixed (c) parts.
struct Row {
  std::string op;
  double measured = 0, g = 0, m = 0, k = 0, c = 0, flops = 0;
  double predicted() const { return g + m + k + c; }
};

System scaled(const System& s, double sg, double sm, double sk, Precision p) {
  System t = s;
  std::vector<std::string> ignore;
  if (sg != 1) apply_compute_scale(t, sg, p, ignore);
  if (sm != 1) apply_memory_scale(t, sm, ignore);
  if (sk != 1) apply_comm_scale(t, sk, ignore);
  return t;
}

// Each op once, at the median of its steady-state instances (trace_events.hpp), with its prediction split
// into the parts the scales multiply.
std::vector<Row> match(const MeasuredOps& ops, const std::vector<TraceSpec>& specs, const System& prof, Precision p) {
  std::vector<Row> rows;
  const System pg = scaled(prof, 2, 1, 1, p), pm = scaled(prof, 1, 2, 1, p), pk = scaled(prof, 1, 1, 2, p);
  std::vector<StepCosts> e0, eg, em, ek;
  for (const TraceSpec& sp : specs) {
    e0.push_back(step_costs(sp.model, sp.layout, prof));
    eg.push_back(step_costs(sp.model, sp.layout, pg));
    em.push_back(step_costs(sp.model, sp.layout, pm));
    ek.push_back(step_costs(sp.model, sp.layout, pk));
  }
  for (const MeasuredOp& m : ops.ops) {
    double t0 = 0, tg = 0, tm = 0, tk = 0;
    const std::size_t i = m.trace;
    const Layout& l = specs[i].layout;
    if (!predicted_op(m.op, m.stage, m.rank, l, e0[i], t0) || !predicted_op(m.op, m.stage, m.rank, l, eg[i], tg) ||
        !predicted_op(m.op, m.stage, m.rank, l, em[i], tm) || !predicted_op(m.op, m.stage, m.rank, l, ek[i], tk))
      continue;
    Row r;
    r.op = m.op;
    r.measured = m.median_s;
    r.g = std::max(0.0, tg - t0);  // doubling the compute time adds G once
    r.m = std::max(0.0, tm - t0);
    r.k = std::max(0.0, tk - t0);  // doubling the link's time adds the TP collectives inside the op once
    r.c = std::max(0.0, t0 - r.g - r.m - r.k);
    r.flops = m.flops;
    rows.push_back(r);
  }
  return rows;
}

// sqrt(sum (pred - meas)^2 / sum meas^2): the error the fit minimises (absolute, see fit_traces), as a
// fraction of the events' rms duration.
double rms_rel(const std::vector<Row>& rows) {
  double ss = 0, mm = 0;
  for (const Row& r : rows) {
    const double e = r.predicted() - r.measured;
    ss += e * e;
    mm += r.measured * r.measured;
  }
  return mm > 0 ? std::sqrt(ss / mm) : 0;
}

// Ranks that outnumber the cores they ran on wait for each other's time slices inside every collective and
// at every send: the measured times are then the machine's scheduling, not rates a profile can hold (the
// closed loop keeps ranks <= cores for this reason, docs/calibration.md). Said when the trace records its
// host's cores (otherData.host.cores); otherwise, and in any case, when the fitted profile still disagrees
// with an op kind by more than kInconsistent either way, or the TP collectives inside the ops took more
// than kCommWait times the link model's time (the signature of waiting for descheduled peers).
constexpr double kInconsistent = 2.0;
constexpr double kCommWait = 4.0;

std::vector<std::string> consistency_warnings(const std::vector<trace::Trace>& traces,
                                              const std::vector<std::string>& origins, const TraceFit& f) {
  std::vector<std::string> w;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    std::set<int> ranks;
    for (const trace::OpEvent& e : traces[i].events) ranks.insert(e.rank);
    const Json& od = traces[i].other_data;
    if (!od.is_object() || !od.contains("host") || !od.at("host").is_object() || !od.at("host").contains("cores") ||
        !od.at("host").at("cores").is_number())
      continue;
    const double cores = od.at("host").at("cores").get<double>();
    if (cores > 0 && static_cast<double>(ranks.size()) > cores) {
      std::ostringstream os;
      os << origins.at(i) << ": " << ranks.size() << " ranks ran on a host of " << cores
         << " cores (otherData.host.cores): the ranks waited for each other's time slices, so the fitted rates "
         << "describe this oversubscribed machine, not its cores; record traces with ranks <= cores";
      w.push_back(os.str());
    }
  }
  for (const OpKindFit& k : f.kinds) {
    if (!(k.measured_s > 0) || !(k.predicted_after_s > 0)) continue;
    const double r = k.predicted_after_s / k.measured_s;
    if (r <= kInconsistent && r >= 1 / kInconsistent) continue;
    std::ostringstream os;
    os.precision(3);
    os << "after the fit the profile predicts the " << k.op << " events at " << r << "x their measured total ("
       << k.predicted_after_s * 1e3 << " ms vs " << k.measured_s * 1e3 << " ms): one profile cannot hold the trace's op "
       << "kinds together (ranks outnumbering cores, or other load, distort some kinds more than others)";
    w.push_back(os.str());
  }
  if (f.comm_scale > kCommWait) {
    std::ostringstream os;
    os.precision(3);
    os << "the TP collectives inside the compute ops took " << f.comm_scale << "x the link model's time: typical of "
       << "ranks outnumbering cores (a collective waits for descheduled peers); the fitted link then holds that wait";
    w.push_back(os.str());
  }
  return w;
}

}  // namespace

TraceFit fit_traces(const std::vector<trace::Trace>& traces, const std::vector<std::string>& origins, System& profile,
                    Precision p, std::vector<std::string>& notes) {
  const std::vector<TraceSpec> specs = trace_specs(traces, origins);
  check_events(traces, specs, origins);
  const MeasuredOps ops = measure_ops(traces, origins);
  TraceFit out;
  out.method = "scales";
  out.skipped = ops.skipped;
  out.noise = ops.noise;
  std::vector<Row> rows = match(ops, specs, profile, p);
  if (rows.empty())
    throw InputError("calibrate --trace: no forward/backward/input_grad/weight_grad/optimizer events with a stage in " +
                     (origins.empty() ? std::string("the traces") : origins.front()));
  out.events = static_cast<int>(rows.size());
  out.rms_before = rms_rel(rows);
  std::map<std::string, std::vector<Pair>> by_kind;
  for (const Row& r : rows) by_kind[r.op].push_back({r.measured, r.predicted(), r.flops});
  for (const auto& [op, v] : by_kind) out.kinds.push_back(summarize(op, v));
  // Three passes of: linearise at the current profile, fit (s_g, s_m), apply. The notes of the last pass
  // say where its bounds put the written numbers; an earlier pass's would name intermediate values that
  // are not in the profile, so a datasheet value moved by any pass is noted once, with its final value.
  const System before = profile;
  std::vector<std::string> pass_notes;
  for (int pass = 0; pass < 3; ++pass) {
    pass_notes.clear();
    if (pass > 0) rows = match(ops, specs, profile, p);
    // Absolute least squares (every row divided by one constant, the mean duration, for conditioning): a
    // step is a sum of events, so a 60 ms backward must weigh more than a 15 ms optimizer step. A relative
    // fit let the optimizer events (AdamW runs ~7x faster per charged byte than the tanh GELU that shares
    // the memory rate) pull the memory scale down 3x and the compute scale up 4x to compensate.
    double mean = 0;
    for (const Row& r : rows) mean += r.measured / rows.size();
    // Three columns: compute G, memory M and the communication K inside the ops (TP collectives). Without
    // K the TP collectives were fixed, and whatever they took beyond the link model went to G: an 8-rank
    // run on 2 cores, whose TP all-reduces wait for descheduled peers (forward measured 10x its
    // prediction, of which 52% was TP time), fitted compute x16.4 though the weight-gradient ops, pure
    // GEMM, measured x0.95, and the profile then predicted them 18x slow. With K the weight-gradient ops
    // pin G and the wait goes to K. K is fitted only when the data tell it from G: some compute rows
    // without TP collectives (weight-gradient ops, a tp1 trace) next to rows with them. Where every op with
    // GEMMs also holds TP collectives (a tp2 1F1B run), G and K grow together layer by layer and their split
    // is arbitrary (a 2-rank tp2 run split x1.9 / x4.3 where its dp2 twin fitted compute x4.4): K stays
    // fixed there (in C), as before.
    bool with_k = false, without_k = false;
    for (const Row& r : rows) {
      with_k = with_k || (r.g > 0 && r.k > 0);
      without_k = without_k || (r.g > 0 && r.k == 0);
    }
    const bool fit_k = with_k && without_k;
    Matrix A(static_cast<int>(rows.size()), fit_k ? 3 : 2);
    std::vector<double> y(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const int r = static_cast<int>(i);
      A.at(r, 0) = rows[i].g / mean;
      A.at(r, 1) = rows[i].m / mean;
      if (fit_k) A.at(r, 2) = rows[i].k / mean;
      y[i] = (rows[i].measured - rows[i].c - (fit_k ? 0 : rows[i].k)) / mean;
    }
    const std::vector<double> x = nnls(A, y);
    // A part with no events to determine it (x = 0) keeps its rate.
    const double sg = x[0] > 0 ? x[0] : 1.0, sm = x[1] > 0 ? x[1] : 1.0, sk = fit_k && x[2] > 0 ? x[2] : 1.0;
    if (!std::isfinite(sg) || !std::isfinite(sm) || !std::isfinite(sk)) {
      std::ostringstream os;
      os << "calibrate --trace " << (origins.empty() ? std::string("(none)") : origins.front())
         << (origins.size() > 1 ? " and others" : "") << ": the fit's scales (compute " << sg << ", memory " << sm
         << ", communication " << sk << ") are not finite; the traces' durations cannot be fitted";
      throw InputError(os.str());
    }
    apply_compute_scale(profile, sg, p, pass_notes);
    apply_memory_scale(profile, sm, pass_notes);
    apply_comm_scale(profile, sk, pass_notes);
    out.compute_scale *= sg;
    out.memory_scale *= sm;
    out.comm_scale *= sk;
  }
  auto moved = [&](const char* field, double was, double now, double unit) {
    if (was == now) return;
    std::ostringstream os;
    os << field << " set to " << now / unit << " (was " << was / unit << ") to keep its efficiencies within the schema's bounds";
    notes.push_back(os.str());
  };
  moved(("gpu.peak_tflops." + to_string(p)).c_str(), before.gpu.peak(p), profile.gpu.peak(p), 1e12);
  moved("gpu.memory_GBps", before.gpu.memory_bw_Bps, profile.gpu.memory_bw_Bps, 1e9);
  moved("node.intra_GBps", before.node.intra_bw_Bps, profile.node.intra_bw_Bps, 1e9);
  moved("network.nic_GBps", before.net.nic_bw_Bps, profile.net.nic_bw_Bps, 1e9);
  for (const std::string& n : pass_notes)
    if (n.find(" moved to ") == std::string::npos && n.find("gpu.memory_GBps: ") != 0) notes.push_back(n);
  rows = match(ops, specs, profile, p);
  out.rms_after = rms_rel(rows);
  std::map<std::string, double> after;
  for (const Row& r : rows) after[r.op] += r.predicted();
  for (OpKindFit& k : out.kinds) k.predicted_after_s = after[k.op];
  out.warnings = consistency_warnings(traces, origins, out);
  return out;
}

namespace {
// Divides the rate datasheet * eff by `scale`, keeping eff within the parser's [0.01, 1] (the compute
// efficiencies' range) by moving the datasheet value when needed.
void rescale(double& datasheet, double& eff, double scale, const char* what, std::vector<std::string>& notes) {
  const double target = eff / scale;
  if (target <= 1.0 && target >= 0.01) {
    eff = target;
    return;
  }
  const double rate = datasheet * eff / scale;
  eff = std::clamp(target, 0.01, 1.0);
  datasheet = rate / eff;
  std::ostringstream os;
  os << what << " moved to " << datasheet << " to keep the efficiency within [0.01, 1]";
  notes.push_back(os.str());
}
}  // namespace

// The element-wise rate only: the GEMM roofline stays where the bench rows put it (the probe that finds the
// memory part M halves this rate, so M is the element-wise work and the optimizer, not GEMM time).
void apply_memory_scale(System& s, double scale, std::vector<std::string>& notes) {
  TESSEL_CHECK(scale > 0, "memory scale " << scale);
  GpuSpec& g = s.gpu;
  const double gemm = g.memory_bw_Bps * (g.gemm_memory_efficiency > 0 ? g.gemm_memory_efficiency : g.memory_efficiency);
  set_memory_rates(g, g.memory_bw_Bps * g.memory_efficiency / scale, gemm, notes);
}

// Every collective and transfer time scales by `scale`: latency multiplied, bandwidth divided (on the node's
// link and the network alike, so a layout that leaves the node sees the same correction).
void apply_comm_scale(System& s, double scale, std::vector<std::string>& notes) {
  TESSEL_CHECK(scale > 0, "communication scale " << scale);
  if (scale == 1) return;
  s.node.intra_latency_s *= scale;
  rescale(s.node.intra_bw_Bps, s.node.intra_efficiency, scale, "node.intra_GBps", notes);
  s.net.latency_s *= scale;
  rescale(s.net.nic_bw_Bps, s.net.efficiency, scale, "network.nic_GBps", notes);
}

void apply_compute_scale(System& s, double scale, Precision p, std::vector<std::string>& notes) {
  TESSEL_CHECK(scale > 0, "compute scale " << scale);
  GpuSpec& g = s.gpu;
  // GEMM and attention share one peak: scale the peak once when either efficiency would leave its bounds.
  double& peak = g.peak_flops[static_cast<int>(p)];
  const double gemm_rate = peak * g.gemm_efficiency / scale, att_rate = peak * g.attention_efficiency / scale;
  // Both rates kept exactly: the peak moves into [max rate, min rate / 0.01] when it must (both efficiencies
  // then within [0.01, 1]; fit_traces notes a moved peak with its final value). Rates over 100x apart keep
  // the GEMM's exact and clamp attention at the bound it crosses, noted here.
  const double lo = std::max(gemm_rate, att_rate), hi = std::min(gemm_rate, att_rate) / 0.01;
  if (lo <= hi) peak = std::clamp(peak, lo, hi);
  else peak = att_rate < gemm_rate ? gemm_rate : gemm_rate / 0.01;
  g.gemm_efficiency = gemm_rate / peak;
  g.attention_efficiency = std::clamp(att_rate / peak, 0.01, 1.0);
  if (att_rate / peak < 0.01 || att_rate / peak > 1.0) {
    std::ostringstream os;
    os << "attention efficiency clamped at " << g.attention_efficiency << " (its fitted rate " << att_rate
       << " FLOP/s is over 100x from the GEMM's " << gemm_rate << ")";
    notes.push_back(os.str());
  }
  TESSEL_CHECK(std::abs(peak * g.gemm_efficiency / gemm_rate - 1) < 1e-9, "GEMM rate after rescale");
  g.kernel_overhead_s *= scale;
}

}  // namespace tessel::calib
