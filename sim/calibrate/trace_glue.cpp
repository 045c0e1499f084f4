#include "sim/calibrate/trace_glue.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "util/error.hpp"
#include "sim/calibrate/nnls.hpp"
#include "sim/calibrate/trace_events.hpp"
#include "sim/engine/host_model.hpp"
#include "sim/step_costs.hpp"

namespace tessel::calib {

namespace {

constexpr double kProbeRate = 1e9;  // x = 1 GB/s / rate: a part's column is its seconds at 1 GB/s
constexpr double kNoTime = 1e300;   // a rate at which a part's bytes take no time
// The schema's largest measured rate (sim/system.cpp): a glue the fit finds free is written at it.
constexpr double kMaxRateBps = 1e15;

// The profile with the glue rates and the weight-gradient factor set (kNoTime / 0: that part switched off).
System probe(const System& s, double fwd, double bwd, double wgrad) {
  System p = s;
  p.gpu.kernel_Bps[idx(CostKind::glue)] = {fwd, bwd};
  p.gpu.gemm_wgrad_factor = wgrad;
  return p;
}

// Seconds of each part of one op, alone or with every core busy: the rest F, then per unit of x.
struct Parts {
  double f = 0, gf = 0, gb = 0, w = 0;
};

// The parts of every op of one trace's step costs on `s` (alone) or busy_system(s).
std::vector<Parts> op_parts(const MeasuredOps& ops, std::size_t ti, const TraceSpec& sp, const System& s, bool busy,
                            std::vector<bool>& ok) {
  const System probes[4] = {probe(s, kNoTime, kNoTime, 0), probe(s, kProbeRate, kNoTime, 0),
                            probe(s, kNoTime, kProbeRate, 0), probe(s, kNoTime, kNoTime, 1)};
  StepCosts e[4];
  for (int k = 0; k < 4; ++k) e[k] = step_costs(sp.model, sp.layout, busy ? engine::busy_system(probes[k]) : probes[k]);
  std::vector<Parts> out(ops.ops.size());
  for (std::size_t i = 0; i < ops.ops.size(); ++i) {
    const MeasuredOp& m = ops.ops[i];
    if (m.trace != ti) continue;
    double t[4];
    bool have = true;
    for (int k = 0; k < 4; ++k) have = have && predicted_op(m.op, m.stage, m.rank, sp.layout, e[k], t[k]);
    if (!have) {
      ok[i] = false;
      continue;
    }
    out[i] = {t[0], std::max(0.0, t[1] - t[0]), std::max(0.0, t[2] - t[0]), std::max(0.0, t[3] - t[0])};
  }
  return out;
}

// One op as a row of the fit: its parts at the busy level the trace shows around it.
struct Row {
  const MeasuredOp* m = nullptr;
  double f = 0, gf = 0, gb = 0, w = 0;
  double predicted(double xf, double xb, double xw) const { return f + xf * gf + xb * gb + xw * w; }
};

Row row_of(const MeasuredOp& m, const Parts& alone, const Parts& busy, int cores) {
  // The host model's rate (sim/engine/host_model.hpp) for the mean load the trace shows around the op: a time
  // interpolated between alone and busy by phi (the cores computing), over its share of its home core.
  const double share = 1.0 / std::max(1.0, m.crowd);
  const double phi = cores > 1 ? (std::clamp(m.busy_cores, 1.0, static_cast<double>(cores)) - 1) / (cores - 1) : 0.0;
  const auto at = [&](double a, double b) { return (a + (b - a) * phi) / share; };
  return {&m, at(alone.f, busy.f), at(alone.gf, busy.gf), at(alone.gb, busy.gb), at(alone.w, busy.w)};
}

std::vector<Row> build_rows(const MeasuredOps& ops, const std::vector<TraceSpec>& specs, const System& s, int cores) {
  std::vector<bool> ok(ops.ops.size(), true);
  std::vector<Parts> alone(ops.ops.size()), busy(ops.ops.size());
  for (std::size_t ti = 0; ti < specs.size(); ++ti) {
    const std::vector<Parts> a = op_parts(ops, ti, specs[ti], s, false, ok), b = op_parts(ops, ti, specs[ti], s, true, ok);
    for (std::size_t i = 0; i < ops.ops.size(); ++i)
      if (ops.ops[i].trace == ti) {
        alone[i] = a[i];
        busy[i] = b[i];
      }
  }
  std::vector<Row> rows;
  for (std::size_t i = 0; i < ops.ops.size(); ++i)
    if (ok[i]) rows.push_back(row_of(ops.ops[i], alone[i], busy[i], cores));
  return rows;
}

// The host's cores: the profile's, else the most any trace records (otherData.host.cores), else 1.
int host_cores(const System& s, const std::vector<trace::Trace>& traces) {
  if (s.host.cores > 0) return s.host.cores;
  int cores = 0;
  for (const trace::Trace& t : traces) {
    const Json& od = t.other_data;
    if (od.is_object() && od.contains("host") && od["host"].is_object() && od["host"].contains("cores") &&
        od["host"]["cores"].is_number_integer())
      cores = std::max(cores, od["host"]["cores"].get<int>());
  }
  return std::max(1, cores);
}

// Per op kind: measured and predicted totals before (x0) and after (x) the fit, their ratios.
std::vector<OpKindFit> kind_summary(const std::vector<Row>& rows, const double x0[3], const double x[3]) {
  std::map<std::string, OpKindFit> by;
  std::map<std::string, std::vector<double>> ratios;
  for (const Row& r : rows) {
    OpKindFit& k = by[r.m->op];
    k.op = r.m->op;
    ++k.events;
    k.measured_s += r.m->median_s;
    k.predicted_s += r.predicted(x0[0], x0[1], x0[2]);
    const double after = r.predicted(x[0], x[1], x[2]);
    k.predicted_after_s += after;
    k.achieved_flops += r.m->flops;
    ratios[k.op].push_back(r.m->median_s / after);
  }
  std::vector<OpKindFit> out;
  for (auto& [op, k] : by) {
    k.scale = k.predicted_after_s > 0 ? k.measured_s / k.predicted_after_s : 1;
    k.median_ratio = median_of(ratios[op]);
    k.achieved_flops = k.measured_s > 0 ? k.achieved_flops / k.measured_s : 0;
    out.push_back(k);
  }
  return out;
}

double rms_rel(const std::vector<Row>& rows, const double x[3]) {
  double ss = 0, mm = 0;
  for (const Row& r : rows) {
    const double e = r.predicted(x[0], x[1], x[2]) - r.m->median_s;
    ss += e * e;
    mm += r.m->median_s * r.m->median_s;
  }
  return mm > 0 ? std::sqrt(ss / mm) : 0;
}

}  // namespace

TraceFit fit_trace_glue(const std::vector<trace::Trace>& traces, const std::vector<std::string>& origins, System& profile,
                        std::vector<std::string>& notes) {
  TESSEL_CHECK(profile.gpu.kind_rates(), "the per-op trace fit needs measured kind rates");
  const std::vector<TraceSpec> specs = trace_specs(traces, origins);
  check_events(traces, specs, origins);
  const int cores = host_cores(profile, traces);
  const MeasuredOps ops = measure_ops(traces, origins, cores);
  TraceFit out;
  out.method = "per-op";
  out.skipped = ops.skipped;
  out.noise = ops.noise;
  if (profile.host.cores == 0 && cores > 1) {
    profile.host.cores = cores;
    notes.push_back("host.cores " + std::to_string(cores) + " from the traces (otherData.host.cores); no bench of several "
                    "threads measured the contention, taken as 1");
  }
  const std::vector<Row> rows = build_rows(ops, specs, profile, cores);
  if (rows.empty())
    throw InputError("calibrate --trace: no forward/backward/input_grad/weight_grad/optimizer events with a stage in " +
                     (origins.empty() ? std::string("the traces") : origins.front()));
  out.events = static_cast<int>(rows.size());
  // Before: the glue on the general memory rate (what the profile prices it at unmeasured), the bench's class.
  const GpuSpec& g = profile.gpu;
  const double general = g.memory_bw_Bps * g.memory_efficiency;
  const DirRate glue = g.kernel_Bps[idx(CostKind::glue)];
  const double x0[3] = {kProbeRate / (glue.fwd > 0 ? glue.fwd : general), kProbeRate / (glue.bwd > 0 ? glue.bwd : general),
                        g.gemm_wgrad_factor};
  // The weight-gradient class is told apart from the backward glue only by ops holding one without the
  // other (a zero-bubble trace's input- and weight-gradient ops).
  bool w_alone = false, b_alone = false;
  double sum_f = 0, sum_b = 0;
  for (const Row& r : rows) {
    w_alone = w_alone || (r.w > 0 && r.gb == 0);
    b_alone = b_alone || (r.gb > 0 && r.w == 0);
    sum_f += r.gf;
    sum_b += r.gb;
  }
  out.wgrad_fitted = w_alone && b_alone;
  if (!(sum_f > 0) && !(sum_b > 0))
    throw InputError("calibrate --trace " + origins.front() + ": no op of the traces holds glue (residual adds) to fit");
  double mean = 0;
  for (const Row& r : rows) mean += r.m->median_s / rows.size();
  const int cols = out.wgrad_fitted ? 3 : 2;
  Matrix A(static_cast<int>(rows.size()), cols);
  std::vector<double> y(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    A.at(static_cast<int>(i), 0) = r.gf / mean;
    A.at(static_cast<int>(i), 1) = r.gb / mean;
    if (out.wgrad_fitted) A.at(static_cast<int>(i), 2) = r.w / mean;
    y[i] = (r.m->median_s - r.f - (out.wgrad_fitted ? 0.0 : x0[2] * r.w)) / mean;
  }
  const std::vector<double> sol = nnls(A, y);
  // A part no op shows keeps its value before; one fitted at 0 takes no time (the schema's largest rate).
  const double x[3] = {sum_f > 0 ? sol[0] : x0[0], sum_b > 0 ? sol[1] : x0[1],
                       out.wgrad_fitted ? std::clamp(sol[2], 0.1, 20.0) : x0[2]};
  for (double v : x)
    if (!std::isfinite(v)) throw InputError("calibrate --trace " + origins.front() + ": the glue fit is not finite");
  out.glue_fwd_Bps = x[0] > 0 ? kProbeRate / x[0] : kMaxRateBps;
  out.glue_bwd_Bps = x[1] > 0 ? kProbeRate / x[1] : kMaxRateBps;
  out.wgrad_factor = x[2];
  profile.gpu.kernel_Bps[idx(CostKind::glue)] = {std::min(out.glue_fwd_Bps, kMaxRateBps), std::min(out.glue_bwd_Bps, kMaxRateBps)};
  profile.gpu.gemm_wgrad_factor = out.wgrad_factor;
  if (out.wgrad_fitted && (sol[2] < 0.1 || sol[2] > 20)) {
    std::ostringstream os;
    os << "gemm_wgrad: fitted factor " << sol[2] << " clamped to the schema's [0.1, 20]";
    notes.push_back(os.str());
  }
  out.rms_before = rms_rel(rows, x0);
  out.rms_after = rms_rel(rows, x);
  out.kinds = kind_summary(rows, x0, x);
  for (const OpKindFit& k : out.kinds) {
    const double r = k.predicted_after_s / k.measured_s;
    if (r > 1.5 || r < 1 / 1.5) {
      std::ostringstream os;
      os.precision(3);
      os << "after the fit the profile predicts the " << k.op << " events at " << r << "x their measured total: the "
         << "benched kinds and the glue do not hold this kind (a kind the bench does not time, or load)";
      out.warnings.push_back(os.str());
    }
  }
  return out;
}

}  // namespace tessel::calib
