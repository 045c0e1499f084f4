// Per-step summaries that any two traces share, for comparing traces that do not align op by op (a
// PyTorch profiler trace against a Tessel trace, or two profiler traces): step time, compute busy time,
// communication and exposed communication, and time per category (op kind or kernel category).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "traces/kineto.hpp"
#include "traces/trace.hpp"

namespace tessel::trace {

struct CategoryTime {
  std::string name;
  double count = 0;     // per rank and step
  double total_us = 0;  // per rank and step
};

struct TraceSummary {
  std::string source;   // "tessel" or "pytorch profiler"
  int ranks = 0;
  int steps = 1;        // ProfilerSteps in a profiler trace; a Tessel trace's steps (set by its caller)
  double step_us = 0;
  double compute_us = 0, comm_us = 0, exposed_comm_us = 0;  // per rank and step
  std::vector<CategoryTime> categories;                     // by name
};

// A Tessel trace taken as one step (a multi-step one is cut to one first: traces/steps.hpp); per-rank values
// are the mean over ranks.
TraceSummary summarize(const Trace& t);
// A profiler trace: step time is the mean ProfilerStep; whole-trace GPU totals divided by the step count.
TraceSummary summarize(const kineto::KinetoTrace& k);

// {"a": {...}, "b": {...}, "step_error_pct": ...}; errors are (B - A) / A.
nlohmann::json summary_json(const TraceSummary& a, const TraceSummary& b);

}  // namespace tessel::trace
