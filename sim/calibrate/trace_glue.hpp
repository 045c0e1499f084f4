// The per-op trace fit (docs/calibration.md, "From measured traces"): when the bench measured every kind the
// runtime runs (kind_fit.hpp), a trace fits only what no bench row times, each part from the events it shows
// in:
//   glue forward:   bias adds, residual adds and copies of the forward (forward events), as a rate on the
//                   bytes the cost model charges the residual ops forward (sim/workload.cpp residual1/2);
//   glue backward:  the same in the backward (input-gradient and backward events), on their backward bytes;
//   weight-gradient GEMM class: its factor on the tile model (weight-gradient and backward events), which
//                   takes in the bias sums the runtime computes beside the weight gradient.
// An op's measured median m (trace_events.hpp) is modelled as
//   m = [F + x_f Gf + x_b Gb + x_w W](phi) / share
// F the rest of its prediction (every benched kind), Gf and Gb its glue bytes / 1 GB/s, W its weight-gradient
// GEMM seconds; x_f = 1 GB/s / glue_fwd rate, x_b likewise, x_w the class factor. [.](phi) is the host
// model's interpolation between the op alone and with every core busy at the busy level the trace shows
// around it (the cores computing), share = 1 / the ranks computing on its home core (MeasuredOp::crowd,
// busy_cores; sim/engine/host_model.hpp). The parts come from the
// step costs (sim/step_costs.hpp) on probe profiles (one part switched on at a time), so they are the cost
// model's; x >= 0 by NNLS on absolute errors (a step is a sum of ops: long ones weigh more). x_w is fitted only
// where input- and weight-gradient events are apart (a zero-bubble trace); else it keeps the bench's value.
#pragma once

#include <string>
#include <vector>

#include "sim/calibrate/trace_fit.hpp"
#include "sim/system.hpp"
#include "traces/trace.hpp"

namespace tessel::calib {

// `profile` must hold measured kind rates (GpuSpec::kind_rates()); it gets the glue rates and the class factor.
// `cores`: the host's (profile.host.cores when set, else otherData.host.cores of the traces, else 1).
// InputError as fit_traces for traces that are not measured runs of whole steps, or when no op has glue.
TraceFit fit_trace_glue(const std::vector<trace::Trace>& traces, const std::vector<std::string>& origins, System& profile,
                        std::vector<std::string>& notes);

}  // namespace tessel::calib
