// The training steps of a trace, so that a measured run of many steps compares with the simulator's one.
//
// A Tessel trace marks no step explicitly; its steps are counted by the optimizer op, which every rank
// records once per step (runtime/optimizer_step.cpp, runtime/cuda/gpu_trainer.cpp; the simulator's trace has
// one). Every step replays the same schedule, so an op identity (rank, op, stage, chunk, mb, layers) that
// occurs n times on a rank of S steps occurs n / S times per step, and its occurrences in start order fall
// into the steps in order. Counting repeats rather than cutting the timeline at each optimizer op keeps
// communication that runs after the optimizer (ZeRO's parameter all-gather) in its own step.
//
// Steps are numbered as `tessel run` printed them: a resumed run's trace starts at the step after its
// checkpoint's, which it records as otherData.first_step (absent: 1).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "traces/trace.hpp"

namespace tessel::trace {

struct StepSplit {
  int first = 1;                     // the number of the trace's first step (otherData.first_step)
  std::vector<int> step_of;          // per event of the trace: its step, from 0
  std::vector<double> durations_us;  // per step: its first op's start to its last op's end, all ranks together
  int count() const { return static_cast<int>(durations_us.size()); }
};

// InputError naming `origin` when ranks disagree on the number of optimizer ops, or when an op's repeats on
// a rank are not a multiple of the steps (not a trace of whole steps), or when otherData.first_step is not an
// integer >= 1. No optimizer op at all: one step.
StepSplit split_steps(const Trace& t, const std::string& origin);

// The step compared: `requested` (numbered as `tessel run` numbers steps, so from the trace's first step)
// when given, else the steady state: the step of median duration (nearest rank, the lower one of an even
// count) after the first, which is warm-up (allocation, cold caches; a resumed run's first step too). A
// one-step trace is its step whatever is requested.
struct StepChoice {
  int count = 1;          // steps in the trace
  int first = 1;          // the number of its first step
  int step = 0;           // the one compared, from 0 (its number: first + step)
  double step_us = 0;
  std::string rule;       // how it was chosen, for people: "only step", "median of steps 2-5", "--step"
  std::vector<double> durations_us;
};
// InputError "`flag` N: <origin> holds S steps; ..." when a requested step is past the trace's steps.
StepChoice choose_step(const StepSplit& s, std::optional<int> requested, const std::string& flag,
                       const std::string& origin);

// The events of one step (in the trace's order) and the counters inside its time span; names and otherData kept.
Trace step_trace(const Trace& t, const StepSplit& s, int step);

// {"count", "first", "compared" (its number, from "first"), "rule", "step_us", "durations_us"}.
nlohmann::json to_json(const StepChoice& c);

}  // namespace tessel::trace
