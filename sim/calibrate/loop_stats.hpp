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
// how far the measured order itself repeats (error_free_tau below turns it into what an exact prediction
// would reach). Every repeat must measure the same layouts in the same order (TESSEL_CHECK).
std::vector<double> tau_between_repeats(const std::vector<std::vector<double>>& measured);

// The Kendall tau an error-free prediction (the layouts' true step times) can be expected to reach against
// one repeat's measurements, from `between`, the mean tau between two repeats' measurements. For a pair of
// layouts let q = 2p - 1, p the chance that a measurement orders the pair as its true times do. If the
// repeats' errors are independent and no pair is more likely measured the wrong way round (p >= 1/2), a
// repeat's expected agreement with the truth on the pair is q and two repeats' agreement with each other q^2;
// so, over the pairs, mean(q^2) <= mean(q) <= sqrt(mean(q^2)): the error-free tau lies in
// [between, sqrt(between)] (ties left out; 0 for a negative `between`). A prediction's tau below `low` is
// more than the measurement's noise can explain.
struct TauBounds {
  double low = 0, high = 0;
};
TauBounds error_free_tau(double between);

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
