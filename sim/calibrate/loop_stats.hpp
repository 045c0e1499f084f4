// The closed loop's statistics (tessel calibrate --closed-loop, docs/calibration.md): how a profile's
// predictions of held-out layouts compare with their measurements, step by step and op by op.
#pragma once

#include <string>
#include <vector>

#include "traces/trace.hpp"

namespace tessel::calib {

// Kendall's tau-b (Kendall 1945, "The treatment of ties in ranking problems"): (concordant - discordant) /
// sqrt((pairs - ties in a) (pairs - ties in b)). 1: the same order; 0 with fewer than 2 values or a constant
// side. InputError-free: the sides must have one length (TESSEL_CHECK).
double kendall_tau(const std::vector<double>& a, const std::vector<double>& b);

// Kendall tau between the measurements of every two repeats, in the order (0, 1), (0, 2), ..., (1, 2), ...:
// how far the measured order itself repeats, which bounds the tau a prediction can be expected to reach
// against any one repeat. Every repeat must measure the same layouts in the same order (TESSEL_CHECK).
std::vector<double> tau_between_repeats(const std::vector<std::vector<double>>& measured);

// Per compute op kind, the compared step's totals over ops matched one to one (compare.hpp).
struct OpError {
  std::string op;         // forward, backward, input_grad, weight_grad, optimizer
  int matched = 0;
  double measured_s = 0, predicted_s = 0;
  double error = 0;       // predicted / measured - 1
};

// The simulated trace as the runtime records the same step: a backward's recompute (its own op in the
// simulator's trace, Megatron-style) is inside the backward or input-gradient op of the CPU and CUDA
// runtimes, so each recompute op's time is added to the next backward/input_grad op of its rank, stage and
// micro-batch, and the recompute op removed.
trace::Trace fold_recompute(const trace::Trace& simulated);

// The measured trace's steady-state step (the median after the first, traces/steps.hpp) against the one
// simulated step, per compute op kind (forward, backward, input_grad, weight_grad, optimizer), recompute
// folded. `origin` names the measured trace in messages.
std::vector<OpError> op_errors(const trace::Trace& measured, const trace::Trace& simulated, const std::string& origin);

}  // namespace tessel::calib
