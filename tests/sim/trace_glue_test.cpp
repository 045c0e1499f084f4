// The per-op trace fit (sim/calibrate/trace_glue.hpp) on traces the simulator made from a known profile: with
// every benched kind right, it recovers the glue rates forward and backward and the weight-gradient class
// (exactly: the cost model made the data), and leaves the class alone where no zero-bubble trace tells it apart.
#include <doctest/doctest.h>

#include <cmath>

#include "sim/calibrate/trace_glue.hpp"
#include "sim/engine/sim_trace.hpp"
#include "sim/engine/simulate.hpp"

using namespace tessel;
using namespace tessel::calib;

namespace {
// Exact synthetic data: the fit's NNLS on a few dozen rows recovers the numbers to rounding.
constexpr double kRecover = 1e-6;

// The cpu preset with measured kinds (any positive rates: they are the same on both sides), a 2-core host
// without contention, and the truth's glue and weight-gradient class.
System truth() {
  System s = load_system("cpu");
  s.gpu.kernel_Bps[idx(CostKind::norm)] = {5e9, 4e9};
  s.gpu.kernel_Bps[idx(CostKind::activation)] = {1e9, 0.7e9};
  s.gpu.kernel_Bps[idx(CostKind::cross_entropy)] = {4e9, 3.5e9};
  s.gpu.kernel_Bps[idx(CostKind::optimizer)] = {8e9, 0};
  s.gpu.attention_flops = {6e9, 15e9};
  s.gpu.kernel_Bps[idx(CostKind::glue)] = {0.9e9, 0.6e9};
  s.gpu.gemm_wgrad_factor = 1.25;
  s.host = HostSpec{};
  s.host.cores = 2;
  return s;
}

// A "measured" trace of `l` made by the simulator on `s`: otherData as tessel run writes it (the model whole,
// the tool tessel run), one step.
trace::Trace made(const Layout& l, const System& s) {
  const Model m = load_model("tiny");
  const engine::SimReport r = engine::simulate(m, l, s);
  trace::Trace t = engine::to_trace(r, s);
  t.other_data["model"] = model_to_json(m);
  t.other_data["tool"] = "tessel run (made by the simulator for a test)";
  return t;
}

Layout layout(int pp, sched::Kind k) {
  Layout l;
  l.pp = pp;
  l.global_batch = 4;
  l.schedule = k;
  l.precision = Precision::fp32;
  l.recompute = Recompute::none;
  l.attention = AttentionImpl::unfused;
  l.sequence_parallel = false;
  l.overlap_grad_reduce = l.overlap_param_gather = false;
  return l;
}
}  // namespace

TEST_CASE("per-op trace fit: glue forward and backward and the weight-gradient class from a 1-rank and a zb1p trace") {
  const System t = truth();
  const std::vector<trace::Trace> traces = {made(layout(1, sched::Kind::one_f_one_b), t), made(layout(2, sched::Kind::zb1p), t)};
  System p = t;
  p.gpu.kernel_Bps[idx(CostKind::glue)] = {};  // unknown: priced at the general rate before the fit
  p.gpu.gemm_wgrad_factor = 1.0;
  std::vector<std::string> notes;
  const TraceFit f = fit_trace_glue(traces, {"one.json", "zb.json"}, p, notes);
  CHECK(f.method == "per-op");
  CHECK(f.wgrad_fitted);
  CHECK(std::abs(f.glue_fwd_Bps / 0.9e9 - 1) < kRecover);
  CHECK(std::abs(f.glue_bwd_Bps / 0.6e9 - 1) < kRecover);
  CHECK(std::abs(f.wgrad_factor / 1.25 - 1) < kRecover);
  CHECK(std::abs(p.gpu.kernel_Bps[idx(CostKind::glue)].fwd / 0.9e9 - 1) < kRecover);
  CHECK(f.rms_after < 1e-6);
  CHECK(f.rms_after < f.rms_before);
  // Every op kind of the traces is summarised (forward, backward, input_grad, weight_grad, optimizer).
  CHECK(f.kinds.size() == 5);
  CHECK(f.noise == 0);  // one step each: no repeats to vary
}

TEST_CASE("per-op trace fit: without input- and weight-gradient ops apart the class keeps the bench's value") {
  const System t = truth();
  System p = t;
  p.gpu.kernel_Bps[idx(CostKind::glue)] = {};
  p.gpu.gemm_wgrad_factor = 1.25;  // the bench's (here: the truth)
  std::vector<std::string> notes;
  const TraceFit f = fit_trace_glue({made(layout(1, sched::Kind::one_f_one_b), t)}, {"one.json"}, p, notes);
  CHECK(!f.wgrad_fitted);
  CHECK(f.wgrad_factor == 1.25);
  CHECK(std::abs(f.glue_fwd_Bps / 0.9e9 - 1) < kRecover);
  CHECK(std::abs(f.glue_bwd_Bps / 0.6e9 - 1) < kRecover);
}
