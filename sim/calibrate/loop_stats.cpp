#include "sim/calibrate/loop_stats.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>

#include "traces/compare.hpp"
#include "traces/steps.hpp"
#include "util/error.hpp"

namespace tessel::calib {

double kendall_tau(const std::vector<double>& a, const std::vector<double>& b) {
  TESSEL_CHECK(a.size() == b.size(), "kendall tau of " << a.size() << " and " << b.size() << " values");
  double s = 0, ties_a = 0, ties_b = 0;
  const std::size_t n = a.size();
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j < n; ++j) {
      const double x = a[i] - a[j], y = b[i] - b[j];
      ties_a += x == 0;
      ties_b += y == 0;
      s += (x * y > 0) - (x * y < 0);
    }
  const double pairs = n * (n - 1) / 2.0;
  const double den = std::sqrt((pairs - ties_a) * (pairs - ties_b));
  return den > 0 ? s / den : 0.0;
}

std::vector<double> tau_between_repeats(const std::vector<std::vector<double>>& measured) {
  std::vector<double> out;
  for (std::size_t i = 0; i < measured.size(); ++i)
    for (std::size_t j = i + 1; j < measured.size(); ++j) out.push_back(kendall_tau(measured[i], measured[j]));
  return out;
}

TauBounds error_free_tau(double between) {
  const double t = std::max(0.0, between);
  return {t, std::sqrt(t)};
}

trace::Trace fold_recompute(const trace::Trace& simulated) {
  trace::Trace out = simulated;
  out.events.clear();
  // Recompute time waiting for its backward, per (rank, stage, mb).
  std::map<std::tuple<int, int, int>, double> pending;
  for (const trace::OpEvent& e : simulated.events) {
    const auto key = std::make_tuple(e.rank, e.stage, e.mb);
    if (e.stream == trace::Stream::compute && e.op == "recompute") {
      pending[key] += e.dur_us;
      continue;
    }
    trace::OpEvent f = e;
    if (e.stream == trace::Stream::compute && (e.op == "backward" || e.op == "input_grad")) {
      auto it = pending.find(key);
      if (it != pending.end()) {
        f.start_us -= it->second;  // the backward began where its recompute did
        f.dur_us += it->second;
        pending.erase(it);
      }
    }
    out.events.push_back(f);
  }
  return out;
}

std::vector<OpError> op_errors(const trace::Trace& measured, const trace::Trace& simulated, const std::string& origin) {
  const trace::StepSplit split = trace::split_steps(measured, origin);
  const trace::StepChoice step = trace::choose_step(split, std::nullopt, "--step", origin);
  const trace::Trace m = trace::step_trace(measured, split, step.step);
  const trace::Comparison c = trace::compare_traces(m, fold_recompute(simulated));
  std::vector<OpError> out;
  for (const char* op : {"forward", "backward", "input_grad", "weight_grad", "optimizer"})
    for (const trace::OpKindStats& k : c.kinds)
      if (k.op == op && k.matched > 0 && k.total_a_us > 0) {
        OpError e;
        e.op = op;
        e.matched = static_cast<int>(k.matched);
        e.measured_s = k.total_a_us * 1e-6;
        e.predicted_s = k.total_b_us * 1e-6;
        e.error = e.predicted_s / e.measured_s - 1;
        out.push_back(e);
      }
  return out;
}

}  // namespace tessel::calib
