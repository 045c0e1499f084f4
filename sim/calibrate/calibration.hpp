// One calibration as `tessel calibrate` and its closed loop run it: the bench fit (fit.hpp, kind_fit.hpp), then
// the trace fit that applies (per op when the bench measured the kinds: trace_glue.hpp; scales otherwise:
// trace_fit.hpp), the profile's source text, and the noise verdict.
//
// Noise: the repeat variation of what was fitted, the larger of the bench rows' median spread and the trace
// ops' (each the interquartile range of repeats over their median). A fit on measurements that vary by X%
// between repeats can be off by about as much, so the verdict flags a noise above `flag` (the profile is
// written, and said untrusted) and refuses one above `refuse` (InputError: nothing written).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sim/calibrate/bench_data.hpp"
#include "sim/calibrate/checkpoint_fit.hpp"
#include "sim/calibrate/fit.hpp"
#include "sim/calibrate/trace_fit.hpp"
#include "traces/trace.hpp"

namespace tessel::calib {

// Flag and refuse levels of the noise (fractions): 10% is the closed loop's accuracy target, so a profile
// from noisier measurements cannot be trusted to meet it; 25%: profiles 1.7-1.9x apart came from runs whose
// ops ranged several-fold (docs/calibration.md), well past it.
inline constexpr double kNoiseFlag = 0.10;
inline constexpr double kNoiseRefuse = 0.25;

struct Calibration {
  Precision precision = Precision::fp32;
  FitResult fit;              // the bench fit (its profile updated by the trace fit); fit.profile is the result
  bool traced = false;
  TraceFit trace;
  TraceProvenance provenance;
  double noise = -1;          // max(bench, trace) noise; -1: nothing measured it
  // The contention fit's unsteadiness (FitResult::contention_noise, ContentionFit::unsteadiness); -1: no
  // contention measured. A host whose cores were shared unevenly during the bench gives one kind's rows two
  // slowdowns, and one that changed between the two benches makes a kind faster under load than alone; the
  // fitted factor then holds for part of the time only.
  double contention_noise = -1;
  bool flagged = false;       // noise or contention_noise above the flag level
  std::optional<CheckpointFit> checkpoint;  // the storage bandwidths from run documents, when given
  std::string source;         // the profile's "source" text
};

struct CalibrationInputs {
  std::vector<BenchData> benches;          // none, one, or one alone and one of several threads
  std::vector<trace::Trace> traces;
  std::vector<std::string> trace_origins;  // file names, for messages and the source text
  std::vector<std::string> checkpoint_runs;  // `tessel run --json` documents: the storage fit (checkpoint_fit.hpp)
  System base;
  FitOptions options;
  std::string name;                        // the profile's name; empty: <base>-calibrated
  double refuse_noise = kNoiseRefuse;      // fraction
  std::string output;                      // where the profile goes (named when it is not written)
};

// "the gemm rows' slowdown with every core busy was 1.01x to 1.87x between their quartiles (an interquartile
// range of 50.1% of the median; fitted factor 1.72x)": why a contention fit is not steady; empty when it is (or
// none was measured).
std::string contention_unsteady_text(const FitResult& f);

// A noise (a fraction) as messages write it, in percent: 3 significant digits, whole numbers from 1000% on
// (a bench under heavy load spreads by 100x; no exponent).
std::string noise_text(double fraction);

// InputError when neither benches nor traces are given, from the fits, when the profile would not load, or
// when the noise exceeds `refuse_noise` (naming both noises and the rule).
Calibration calibrate(const CalibrationInputs& in);

}  // namespace tessel::calib
