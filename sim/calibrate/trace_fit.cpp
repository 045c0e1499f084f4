#include "sim/calibrate/trace_fit.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "models/model.hpp"
#include "models/util/error.hpp"
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

TraceFit fit_traces(const std::vector<trace::Trace>& traces, const std::vector<std::string>& origins, const System& profile) {
  std::map<std::string, std::vector<Pair>> by_kind;
  std::vector<Pair> compute;
  TraceFit out;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const trace::Trace& t = traces[i];
    const std::string& where = origins.at(i);
    const Json& od = t.other_data;
    if (!od.is_object() || !od.contains("model") || !od.contains("layout"))
      throw InputError(where + ": otherData must hold the model and layout (a trace of `tessel run --trace`)");
    const Model m = parse_model(od.at("model"), where + ": otherData.model");
    const Layout l = parse_layout(od.at("layout"), where + ": otherData.layout");
    const Estimate est = estimate(m, l, profile);
    for (const trace::OpEvent& e : t.events) {
      double pred = 0;
      if (e.stream != trace::Stream::compute || e.dur_us <= 0 || !predict(e, est, pred)) {
        ++out.skipped;
        continue;
      }
      Pair p{e.dur_us * 1e-6, pred, e.flops};
      by_kind[e.op].push_back(p);
      if (e.op != "optimizer") compute.push_back(p);
      ++out.events;
    }
  }
  if (out.events == 0)
    throw InputError("calibrate --trace: no forward/backward/input_grad/weight_grad/optimizer events with a stage in " +
                     (origins.empty() ? std::string("the traces") : origins.front()));
  for (const auto& [op, v] : by_kind) out.kinds.push_back(summarize(op, v));
  if (!compute.empty()) out.compute_scale = summarize("compute", compute).scale;
  return out;
}

void apply_compute_scale(System& s, double scale, Precision p, std::vector<std::string>& notes) {
  TESSEL_CHECK(scale > 0, "compute scale " << scale);
  GpuSpec& g = s.gpu;
  const auto rescale = [&](double& datasheet, double& eff, const char* what) {
    const double target = eff / scale;
    if (target <= 1.0 && target >= 0.01) {
      eff = target;
      return;
    }
    // Keep the product (the rate the cost model uses) and move the datasheet value instead.
    const double rate = datasheet * eff / scale;
    eff = std::clamp(target, 0.01, 1.0);
    datasheet = rate / eff;
    std::ostringstream os;
    os << what << " moved to " << datasheet << " to keep the efficiency within [0.01, 1]";
    notes.push_back(os.str());
  };
  // GEMM and attention share one peak: scale the peak once when either efficiency would leave its bounds.
  double& peak = g.peak_flops[static_cast<int>(p)];
  const double gemm_rate = peak * g.gemm_efficiency / scale, att_rate = peak * g.attention_efficiency / scale;
  rescale(peak, g.gemm_efficiency, "gpu.peak_tflops");
  g.attention_efficiency = std::clamp(att_rate / peak, 0.01, 1.0);
  TESSEL_CHECK(std::abs(peak * g.gemm_efficiency / gemm_rate - 1) < 1e-9, "GEMM rate after rescale");
  rescale(g.memory_bw, g.memory_efficiency, "gpu.memory_GBps");
  g.kernel_overhead_s *= scale;
}

}  // namespace tessel::calib
