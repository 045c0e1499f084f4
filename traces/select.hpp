// Traces of thousands of ranks made readable: keep the ranks asked for, and draw each run of identical
// ranks once (the tensor-parallel ranks of a stage, which the simulator plays alike).
#pragma once

#include <string>
#include <vector>

#include "traces/trace.hpp"

namespace tessel::trace {

// "0-7,64,100-103" -> {0, ..., 7, 64, 100, ..., 103}: ascending, each once, every rank < `ranks` (the trace's
// rank count). InputError naming `what`, the text and the rule otherwise.
std::vector<int> parse_rank_list(const std::string& text, const std::string& what, int ranks);

// The events, counters and process names of the listed ranks only (other_data kept).
Trace select_ranks(const Trace& t, const std::vector<int>& ranks);

// Each run of consecutive ranks whose events are the same (name, op, stream, stage, micro-batch, start and
// duration) and whose counters are the same, drawn once: the first rank of the run stays, named
// "ranks A-B (N identical): <its name>". Ranks that differ in anything stay apart.
Trace collapse_identical_ranks(const Trace& t);

}  // namespace tessel::trace
