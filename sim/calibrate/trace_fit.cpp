#include "sim/calibrate/trace_fit.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "models/model.hpp"
#include "models/util/error.hpp"
#include "sim/calibrate/fit.hpp"
#include "sim/calibrate/nnls.hpp"
#include "sim/estimate.hpp"

namespace tessel::calib {

namespace {

struct Pair {
  double measured = 0, predicted = 0, flops = 0;
};

// Predicted seconds of one event's op, from the estimate's per-stage, per-micro-batch costs.
bool predict(const trace::OpEvent& e, const Estimate& est, double& out) {
  if (e.op == "optimizer") {
    out = est.optimizer_s;
    return out > 0;
  }
  const int st = e.stage;
  if (st < 0 || st >= static_cast<int>(est.stage_f.size())) return false;
  if (e.op == "forward") out = est.stage_f[st];
  else if (e.op == "backward") out = est.stage_i[st] + est.stage_w[st];
  else if (e.op == "input_grad") out = est.stage_i[st];
  else if (e.op == "weight_grad") out = est.stage_w[st];
  else return false;
  return out > 0;
}

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

struct Parsed {
  Model model;
  Layout layout;
};

std::vector<Parsed> parse_specs(const std::vector<trace::Trace>& traces, const std::vector<std::string>& origins) {
  std::vector<Parsed> out;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const Json& od = traces[i].other_data;
    const std::string& where = origins.at(i);
    // A trace of `tessel simulate` carries the prediction itself (and names the model only by name): fitting
    // the cost model to its own output would be circular.
    if (od.is_object() && od.contains("tool") && od.at("tool").is_string() &&
        od.at("tool").get<std::string>().rfind("tessel simulate", 0) == 0)
      throw InputError(where + ": a simulated trace (otherData.tool \"" + od.at("tool").get<std::string>() +
                       "\"); calibrate fits measured traces: write one with `tessel run --trace`");
    if (!od.is_object() || !od.contains("model") || !od.contains("layout"))
      throw InputError(where + ": otherData must hold the model and layout (a trace of `tessel run --trace`)");
    out.push_back({parse_model(od.at("model"), where + ": otherData.model"),
                   parse_layout(od.at("layout"), where + ": otherData.layout")});
  }
  return out;
}

// One matched event with its prediction split into compute (g), memory (m) and fixed (c) parts.
struct Row {
  std::string key;  // trace, rank, op, stage, chunk, micro-batch: the same op in every step
  std::string op;
  double measured = 0, g = 0, m = 0, c = 0, flops = 0;
  double predicted() const { return g + m + c; }
};

System scaled(const System& s, double sg, double sm, Precision p) {
  System t = s;
  std::vector<std::string> ignore;
  if (sg != 1) apply_compute_scale(t, sg, p, ignore);
  if (sm != 1) apply_memory_scale(t, sm, ignore);
  return t;
}

// Each op once, at its fastest step: other work on a shared machine only ever adds time, and the warm-up
// steps (first allocation, cold caches) are slower; the closed loop measures the fastest step likewise
// (tools/closed_loop.py). Order of first appearance is kept (deterministic).
std::vector<Row> fastest_per_op(const std::vector<Row>& rows) {
  std::vector<Row> out;
  std::map<std::string, std::size_t> at;
  for (const Row& r : rows) {
    auto [it, fresh] = at.emplace(r.key, out.size());
    if (fresh) out.push_back(r);
    else if (r.measured < out[it->second].measured) out[it->second] = r;
  }
  return out;
}

// A compute event of a stage op must belong to the trace's layout: a micro-batch or stage outside it would
// be fitted as one more op of the step (and a stage beyond the estimate's silently skipped).
void check_in_layout(const trace::OpEvent& e, const Layout& l, std::size_t stages, const std::string& where) {
  if (e.stream != trace::Stream::compute ||
      (e.op != "forward" && e.op != "backward" && e.op != "input_grad" && e.op != "weight_grad"))
    return;
  const int mbs = l.num_microbatches();
  std::ostringstream os;
  os << where << ": event '" << e.name << "' (rank " << e.rank << ", " << e.op << ", stage " << e.stage << ", mb " << e.mb
     << ", ts " << e.start_us << " us): ";
  if (e.mb < 0 || e.mb >= mbs) {
    os << "mb " << e.mb << " is outside the layout's " << mbs << " micro-batch(es) (global_batch " << l.global_batch
       << " / (micro_batch " << l.micro_batch << " x dp " << l.dp << ")); events must belong to the traced layout";
    throw InputError(os.str());
  }
  if (e.stage < 0 || e.stage >= static_cast<int>(stages)) {
    os << "stage " << e.stage << " is outside the layout's " << stages << " stage(s) (pp " << l.pp << " x vpp " << l.vpp
       << "); events must belong to the traced layout";
    throw InputError(os.str());
  }
}

// A fitted event's duration must be a measurement: Tessel's traces give times to the nanosecond (%.3f us,
// traces/chrome.cpp), so a duration between 0 and 1 ns was not measured, and fitting it would scale the
// rates by up to 1e300. (0 us events are skipped below; the trace reader bounds durations from above.)
constexpr double kMinMeasuredUs = 1e-3;

void check_measured(const trace::OpEvent& e, const std::string& where) {
  if (e.dur_us <= 0 || e.dur_us >= kMinMeasuredUs) return;
  std::ostringstream os;
  os << where << ": event '" << e.name << "' (rank " << e.rank << ", " << e.op << ", stage " << e.stage << ", mb " << e.mb
     << ", ts " << e.start_us << " us): dur " << e.dur_us << " us is below the trace's 1 ns resolution; a fitted "
     << "op's duration must be a measurement (at least 0.001 us)";
  throw InputError(os.str());
}

std::vector<Row> match(const std::vector<trace::Trace>& traces, const std::vector<Parsed>& specs, const System& prof,
                       Precision p, int& skipped, const std::vector<std::string>& origins) {
  std::vector<Row> rows;
  skipped = 0;
  const System pg = scaled(prof, 2, 1, p), pm = scaled(prof, 1, 2, p);
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const Estimate e0 = estimate(specs[i].model, specs[i].layout, prof);
    const Estimate eg = estimate(specs[i].model, specs[i].layout, pg);
    const Estimate em = estimate(specs[i].model, specs[i].layout, pm);
    for (const trace::OpEvent& e : traces[i].events) {
      check_in_layout(e, specs[i].layout, e0.stage_f.size(), origins.at(i));
      if (e.stream == trace::Stream::compute) check_measured(e, origins.at(i));
      double t0 = 0, tg = 0, tm = 0;
      if (e.stream != trace::Stream::compute || e.dur_us <= 0 || !predict(e, e0, t0) || !predict(e, eg, tg) ||
          !predict(e, em, tm)) {
        ++skipped;
        continue;
      }
      Row r;
      r.key = std::to_string(i) + "/" + std::to_string(e.rank) + "/" + e.op + "/" + std::to_string(e.stage) + "/" +
              std::to_string(e.chunk) + "/" + std::to_string(e.mb);
      r.op = e.op;
      r.measured = e.dur_us * 1e-6;
      r.g = std::max(0.0, tg - t0);  // doubling the compute time adds G once
      r.m = std::max(0.0, tm - t0);
      r.c = std::max(0.0, t0 - r.g - r.m);
      r.flops = e.flops;
      rows.push_back(r);
    }
  }
  return fastest_per_op(rows);
}

// sqrt(sum (pred - meas)^2 / sum meas^2): the error the fit minimises (absolute, see fit_traces), as a
// fraction of the events' rms duration.
double rms_rel(const std::vector<Row>& rows, double sg, double sm) {
  double ss = 0, mm = 0;
  for (const Row& r : rows) {
    const double e = sg * r.g + sm * r.m + r.c - r.measured;
    ss += e * e;
    mm += r.measured * r.measured;
  }
  return mm > 0 ? std::sqrt(ss / mm) : 0;
}

}  // namespace

TraceFit fit_traces(const std::vector<trace::Trace>& traces, const std::vector<std::string>& origins, System& profile,
                    Precision p, std::vector<std::string>& notes) {
  const std::vector<Parsed> specs = parse_specs(traces, origins);
  TraceFit out;
  std::vector<Row> rows = match(traces, specs, profile, p, out.skipped, origins);
  if (rows.empty())
    throw InputError("calibrate --trace: no forward/backward/input_grad/weight_grad/optimizer events with a stage in " +
                     (origins.empty() ? std::string("the traces") : origins.front()));
  out.events = static_cast<int>(rows.size());
  out.rms_before = rms_rel(rows, 1, 1);
  std::map<std::string, std::vector<Pair>> by_kind;
  for (const Row& r : rows) by_kind[r.op].push_back({r.measured, r.predicted(), r.flops});
  for (const auto& [op, v] : by_kind) out.kinds.push_back(summarize(op, v));
  // Three passes of: linearise at the current profile, fit (s_g, s_m), apply.
  for (int pass = 0; pass < 3; ++pass) {
    if (pass > 0) rows = match(traces, specs, profile, p, out.skipped, origins);
    // Absolute least squares (every row divided by one constant, the mean duration, for conditioning): a
    // step is a sum of events, so a 60 ms backward must weigh more than a 15 ms optimizer step. A relative
    // fit let the optimizer events (AdamW runs ~7x faster per charged byte than the tanh GELU that shares
    // the memory rate) pull the memory scale down 3x and the compute scale up 4x to compensate.
    double mean = 0;
    for (const Row& r : rows) mean += r.measured / rows.size();
    Matrix A(static_cast<int>(rows.size()), 2);
    std::vector<double> y(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const int r = static_cast<int>(i);
      A.at(r, 0) = rows[i].g / mean;
      A.at(r, 1) = rows[i].m / mean;
      y[i] = (rows[i].measured - rows[i].c) / mean;
    }
    const std::vector<double> x = nnls(A, y);
    // A part with no events to determine it (x = 0) keeps its rate.
    const double sg = x[0] > 0 ? x[0] : 1.0, sm = x[1] > 0 ? x[1] : 1.0;
    if (!std::isfinite(sg) || !std::isfinite(sm)) {
      std::ostringstream os;
      os << "calibrate --trace " << (origins.empty() ? std::string("(none)") : origins.front())
         << (origins.size() > 1 ? " and others" : "") << ": the fit's scales (compute " << sg << ", memory " << sm
         << ") are not finite; the traces' durations cannot be fitted";
      throw InputError(os.str());
    }
    apply_compute_scale(profile, sg, p, notes);
    apply_memory_scale(profile, sm, notes);
    out.compute_scale *= sg;
    out.memory_scale *= sm;
  }
  rows = match(traces, specs, profile, p, out.skipped, origins);
  out.rms_after = rms_rel(rows, 1, 1);
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
  const double gemm = g.memory_bw * (g.gemm_memory_efficiency > 0 ? g.gemm_memory_efficiency : g.memory_efficiency);
  set_memory_rates(g, g.memory_bw * g.memory_efficiency / scale, gemm, notes);
}

void apply_compute_scale(System& s, double scale, Precision p, std::vector<std::string>& notes) {
  TESSEL_CHECK(scale > 0, "compute scale " << scale);
  GpuSpec& g = s.gpu;
  // GEMM and attention share one peak: scale the peak once when either efficiency would leave its bounds.
  double& peak = g.peak_flops[static_cast<int>(p)];
  const double gemm_rate = peak * g.gemm_efficiency / scale, att_rate = peak * g.attention_efficiency / scale;
  rescale(peak, g.gemm_efficiency, scale, "gpu.peak_tflops", notes);
  g.attention_efficiency = std::clamp(att_rate / peak, 0.01, 1.0);
  TESSEL_CHECK(std::abs(peak * g.gemm_efficiency / gemm_rate - 1) < 1e-9, "GEMM rate after rescale");
  g.kernel_overhead_s *= scale;
}

}  // namespace tessel::calib
