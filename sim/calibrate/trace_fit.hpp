// Calibration from measured traces when no bench measured the kinds: each compute op (the median of its
// steady-state instances, trace_events.hpp) is paired
// with the time the cost model predicts for the same op (the trace's otherData names the model and layout;
// the prediction lowers them on the profile), and per op kind the measured/predicted ratio is summarised.
//
// The correction fitted: the predicted time of an op splits into a compute part G (GEMMs, attention,
// kernel overheads), a memory part M (element-wise kernels, the optimizer), the TP collectives inside the op
// K, and a fixed rest C (a GEMM on the memory roofline), and a measured time m is modelled as
// s_g G + s_m M + s_k K + C. G, M and K are read off the cost model by prediction on probe profiles (compute
// rates halved: +G; memory rate halved: +M; link time doubled: +K), and the scales minimise the absolute
// error sum (s_g G + s_m M + s_k K + C - m)^2 by NNLS (long events weigh more: a step is their sum); s_k only
// when ops without TP collectives pin G, else K stays fixed. A few passes re-linearise around the corrected
// profile (a GEMM may change roofline branch).
#pragma once

#include <string>
#include <vector>

#include "sim/system.hpp"
#include "traces/trace.hpp"

namespace tessel::calib {

struct OpKindFit {
  std::string op;              // forward, backward, input_grad, weight_grad, optimizer
  int events = 0;
  double measured_s = 0;       // total over events
  double predicted_s = 0;      // before the fit
  double predicted_after_s = 0;  // under the fitted profile
  double scale = 1;            // least-squares measured/predicted
  double median_ratio = 1;     // median measured/predicted
  double achieved_flops = 0;   // sum of flops / sum of measured time (FLOP/s), 0 when the trace has no flops
};

struct TraceFit {
  // "scales" (this file: a profile whose kinds no bench measured) or "per-op" (trace_glue.hpp: the glue and
  // the weight-gradient class, the rest measured by the bench).
  std::string method = "scales";
  std::vector<OpKindFit> kinds;
  double compute_scale = 1;    // s_g: multiplies GEMM/attention time and kernel overheads
  double memory_scale = 1;     // s_m: multiplies memory-bound (element-wise, optimizer) time
  double comm_scale = 1;       // s_k: multiplies the TP collectives inside compute ops (the link's time)
  std::vector<std::string> warnings;  // ranks above the host's cores; op kinds the profile cannot hold together
  // per-op: the runtime's glue (bias adds, residual adds, copies: what no bench row times) as rates on the
  // residual ops' charged bytes, forward and backward, and the weight-gradient GEMM class (with the bias
  // sums the runtime computes beside it).
  double glue_fwd_Bps = 0, glue_bwd_Bps = 0, wgrad_factor = 1;
  bool wgrad_fitted = false;   // only when input- and weight-gradient events are apart (a zero-bubble trace)
  double rms_before = 0, rms_after = 0;  // rms of (pred - meas) over the events / their rms duration, before and after
  int events = 0, skipped = 0; // matched ops (each once, the median of its steady-state instances); other events
  double noise = 0;            // median spread of the ops' steady-state instances (trace_events.hpp)
};

// `traces` with their origins (file names, for messages). InputError if a trace lacks otherData model or
// layout, has no compute events of a known kind, or a compute event lasts more than 0 and less than 1 ns
// (the traces' resolution: not a measurement). `profile` is updated with the fitted scales; the caller
// checks the profile loads (check_profile in fit.hpp) before writing it.
TraceFit fit_traces(const std::vector<trace::Trace>& traces, const std::vector<std::string>& origins, System& profile,
                    Precision p, std::vector<std::string>& notes);

// Divides the memory rate by `scale` (bounds as below).
void apply_memory_scale(System& s, double scale, std::vector<std::string>& notes);

// Multiplies every communication time of `s` by `scale` (link latency up, bandwidth down; efficiencies
// kept within [0.01, 1] by moving the datasheet bandwidth, noted).
void apply_comm_scale(System& s, double scale, std::vector<std::string>& notes);

// Scales the compute side of `s` (GEMM, attention and memory rates divided by `scale`, kernel overhead
// multiplied) so the cost model's compute times grow by `scale`; efficiencies stay within [0.01, 1]
// by moving the datasheet value when needed (noted).
void apply_compute_scale(System& s, double scale, Precision p, std::vector<std::string>& notes);

}  // namespace tessel::calib
