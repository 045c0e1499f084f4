#include "sim/calibrate/calibration.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "util/error.hpp"
#include "sim/calibrate/trace_glue.hpp"

namespace tessel::calib {

namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

std::string bench_origins(const std::vector<BenchData>& b) {
  std::string s;
  for (const BenchData& d : b) s += (s.empty() ? "" : ",") + d.origin;
  return s;
}

}  // namespace

std::string contention_unsteady_text(const FitResult& f) {
  std::string out;
  for (const ContentionFit& c : f.contention) {
    if (!(c.unsteadiness() > kNoiseFlag)) continue;
    std::ostringstream os;
    os.precision(3);
    os << (out.empty() ? "" : "; ") << "the " << to_string(c.kind) << " rows' slowdown with every core busy was " << c.q1
       << "x to " << c.q3 << "x between their quartiles (";
    if (c.spread >= 0) os << "an interquartile range of " << noise_text(c.spread) << " of the median; ";
    os << "fitted factor " << c.factor << "x";
    if (c.faster > kNoiseFlag) os << ": faster with every core busy than alone, so the host changed between the benches";
    os << ")";
    out += os.str();
  }
  return out;
}

std::string noise_text(double fraction) {
  std::ostringstream os;
  if (100 * fraction >= 1000) os << std::fixed << std::setprecision(0);
  else os << std::setprecision(3);
  os << 100 * fraction << "%";
  return os.str();
}

namespace {

void check_noise(const Calibration& c, const CalibrationInputs& in) {
  if (!(c.noise > in.refuse_noise)) return;
  std::ostringstream os;
  os << "the measurements vary by " << noise_text(c.noise) << " between repeats (";
  if (c.fit.noise >= 0) os << "bench rows' median spread " << noise_text(c.fit.noise);
  if (c.traced) os << (c.fit.noise >= 0 ? ", " : "") << "trace ops' " << noise_text(c.trace.noise);
  os << "), over the --max-noise " << noise_text(in.refuse_noise) << ": a profile fitted from them could be off by as much, so "
     << "none is written" << (in.output.empty() ? std::string() : " (-o " + in.output + ")")
     << "; measure on a quieter machine (see the load average) or raise --max-noise";
  throw InputError(os.str());
}

}  // namespace

Calibration calibrate(const CalibrationInputs& in) {
  if (in.benches.empty() && in.traces.empty() && in.checkpoint_runs.empty())
    throw InputError("give --bench FILE and/or --trace FILES, or --published ROWS (or --checkpoints RUNS "
                     "for the storage bandwidth)");
  Calibration c;
  if (!in.benches.empty()) {
    c.precision = parse_precision(in.benches.front().precision, in.benches.front().origin + ": precision");
    c.fit = in.benches.size() == 1 ? fit_profile(in.benches.front(), in.base, in.options)
                                   : fit_profile(in.benches, in.base, in.options);
  } else {
    c.fit.profile = in.base;
    c.fit.profile.name = in.base.name + "-calibrated";
  }
  if (!in.traces.empty()) {
    c.traced = true;
    std::vector<std::string>& notes = c.provenance.notes;
    c.trace = c.fit.profile.gpu.kind_rates() ? fit_trace_glue(in.traces, in.trace_origins, c.fit.profile, notes)
                                             : fit_traces(in.traces, in.trace_origins, c.fit.profile, c.precision, notes);
    c.provenance.origins = joined(in.trace_origins);
    c.provenance.method = c.trace.method;
    c.provenance.compute_scale = c.trace.compute_scale;
    c.provenance.memory_scale = c.trace.memory_scale;
    c.provenance.comm_scale = c.trace.comm_scale;
    c.provenance.wgrad_fitted = c.trace.wgrad_fitted;
    c.provenance.noise = c.trace.noise;
  }
  std::string checkpoint_origin;
  if (!in.checkpoint_runs.empty()) {
    checkpoint_origin = "--checkpoints " + joined(in.checkpoint_runs);
    c.checkpoint = fit_checkpoints(in.checkpoint_runs);
    apply_checkpoint_fit(c.fit.profile, *c.checkpoint, checkpoint_origin);
  }
  if (!in.name.empty()) c.fit.profile.name = in.name;
  // The base's validated error bands do not hold for a refit profile: unknown until the profile is measured.
  c.fit.profile.drop_error_bands();
  c.noise = std::max(c.fit.noise, c.traced ? c.trace.noise : -1.0);
  c.contention_noise = c.fit.contention_noise;
  c.flagged = c.noise > kNoiseFlag || c.contention_noise > kNoiseFlag;
  check_noise(c, in);
  std::string inputs;
  if (!in.benches.empty()) inputs += " --bench " + bench_origins(in.benches);
  if (c.traced) inputs += " --trace " + c.provenance.origins;
  check_profile(c.fit.profile, c.precision,
                "calibrate" + inputs + (in.output.empty() ? std::string() : " (-o " + in.output + " not written)"));
  c.source = describe_fit(c.fit, c.fit.profile, c.precision, bench_origins(in.benches), in.base.name, c.provenance);
  if (c.checkpoint) c.source += describe_checkpoint_fit(*c.checkpoint, joined(in.checkpoint_runs));
  return c;
}

}  // namespace tessel::calib
