// Per-op-kind calibration from measured traces (the runtime's Chrome traces): each compute event is paired
// with the time the cost model predicts for the same op (the trace's otherData names the model and layout;
// the prediction lowers them on the profile), and per op kind the measured/predicted ratio is summarised.
// The least-squares scale s_k = argmin_s sum_e ((s p_e - m_e)/m_e)^2 = sum(p/m) / sum((p/m)^2) (relative
// error, as in fit.hpp) is the correction factor: s_k > 1 means ops of kind k run slower than predicted.
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
  double predicted_s = 0;
  double scale = 1;            // least-squares measured/predicted
  double median_ratio = 1;     // median measured/predicted
  double achieved_flops = 0;   // sum of flops / sum of measured time (FLOP/s), 0 when the trace has no flops
};

struct TraceFit {
  std::vector<OpKindFit> kinds;
  double compute_scale = 1;    // over forward/backward/input_grad/weight_grad events together
  int events = 0, skipped = 0; // matched compute events; events of other kinds (communication, unknown)
};

// `traces` with their origins (file names, for messages). InputError if a trace lacks otherData model or
// layout, or has no compute events of a known kind.
TraceFit fit_traces(const std::vector<trace::Trace>& traces, const std::vector<std::string>& origins, const System& profile);

// Scales the compute side of `s` (GEMM, attention and memory rates divided by `scale`, kernel overhead
// multiplied) so the cost model's compute times grow by `scale`; efficiencies stay within [0.01, 1]
// by moving the datasheet value when needed (noted).
void apply_compute_scale(System& s, double scale, Precision p, std::vector<std::string>& notes);

}  // namespace tessel::calib
