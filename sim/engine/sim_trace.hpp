// A simulated step as a Trace (traces/trace.hpp): pid = global rank of the position's tp rank 0, tid =
// stream; compute ops on compute, each transfer as a send on the sender's pp stream and a recv on the
// receiver's joined by a flow, each collective on the dp stream of every member; the TP collectives inside
// F/B (blocking, folded into the compute op by the engine) expanded on the tp stream at their offsets;
// memory (static + activations) as a counter track per rank.
#pragma once

#include "sim/engine/simulate.hpp"
#include "traces/trace.hpp"

namespace tessel::engine {

struct TraceOptions {
  std::size_t max_tp_slices = 1000000;  // above this many, TP slices are left out (noted in otherData)
};

trace::Trace to_trace(const SimReport& r, const System& sys, const TraceOptions& opt = {});

}  // namespace tessel::engine
