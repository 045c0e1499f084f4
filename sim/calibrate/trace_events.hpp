// The measured ops of `tessel run` traces as the trace fits read them: each op identity (rank, op kind, stage,
// chunk, micro-batch) once, at the median of its steady-state instances, with their spread and the number of
// ranks computing beside it (for the host model).
//
// Steady state: the steps after the first (allocation, cold caches), as compare chooses (traces/steps.hpp);
// a one-step trace is its step. The median, not the fastest instance: under load one forward ranged 1.5-17.6
// ms within a run, and the fastest of many disturbed instances is a different draw each run (two
// calibrations of one machine gave profiles 1.7-1.9x apart); the median of a few is stable when fewer than
// half of them are disturbed, and their spread says when more are.
#pragma once

#include <string>
#include <vector>

#include "models/model.hpp"
#include "sim/step_costs.hpp"
#include "sim/layout.hpp"
#include "traces/trace.hpp"

namespace tessel::calib {

// The model and layout a measured trace records (otherData). InputError naming the trace for a simulated
// trace (fitting the cost model to its own output would be circular) or one without them.
struct TraceSpec {
  Model model;
  Layout layout;
};
std::vector<TraceSpec> trace_specs(const std::vector<trace::Trace>& traces, const std::vector<std::string>& origins);

// Every compute event must belong to its trace's layout (a micro-batch or stage inside it) and last a
// measurable time (0, or at least the traces' 1 ns resolution): InputError naming the trace and the event.
void check_events(const std::vector<trace::Trace>& traces, const std::vector<TraceSpec>& specs,
                  const std::vector<std::string>& origins);

// The step costs' seconds of one op (sim/step_costs.hpp, what the estimate and the simulator price): forward,
// backward = input + weight gradient (its recompute included, as the runtimes record it), input_grad,
// weight_grad of `stage`, or the optimizer step of `rank`'s pipeline rank (its own parameters; Megatron's rank
// order, tp fastest, then cp, dp, pp); false for another kind or a stage outside the layout.
bool predicted_op(const std::string& op, int stage, int rank, const Layout& l, const StepCosts& c, double& out);

struct MeasuredOp {
  std::size_t trace = 0;  // index into the traces
  int rank = 0;
  std::string op;         // forward, backward, input_grad, weight_grad, optimizer
  int stage = -1, chunk = -1, mb = -1;
  int instances = 0;      // steady-state instances
  double median_s = 0;    // their median duration
  double spread = 0;      // (p75 - p25) / median of their durations; 0 with fewer than 2
  double busy_ranks = 1;  // mean number of ranks computing during its instances, itself included
  // With the host's cores known (measure_ops' `cores` > 0), the host model's view (sim/engine/host_model.hpp):
  // the mean ranks computing on its rank's home core, itself included, and the mean cores computing.
  double crowd = 1, busy_cores = 1;
  double flops = 0;
};

struct MeasuredOps {
  std::vector<MeasuredOp> ops;  // in order of first appearance (deterministic)
  int skipped = 0;              // events of other kinds or streams (communication, unknown ops)
  double noise = 0;             // median spread over the ops: the traces' repeat variation
};

// Compute-stream events of the op kinds above with a positive duration; `origins` name the traces in
// messages (InputError from the step split: traces not of whole steps).
MeasuredOps measure_ops(const std::vector<trace::Trace>& traces, const std::vector<std::string>& origins, int cores = 0);

// Median and (p75 - p25) / median by nearest rank on the sorted values (the bench's spread).
double median_of(std::vector<double> v);
double spread_of(std::vector<double> v);

}  // namespace tessel::calib
