// A Monte-Carlo run of a whole training job under failures (docs/goodput.md): the job computes, stops for
// each checkpoint, and on a failure restarts from the last durable checkpoint, losing what it computed since.
// It plays what the closed form (sim/goodput.hpp) summarises, including the window in which an asynchronous
// checkpoint is not yet durable, and gives the spread of the wall time. Seeded and deterministic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/goodput.hpp"

namespace tessel::goodput {

// The job as the Monte Carlo plays it, in seconds.
struct McJob {
  double work_s = 0;      // computation to do
  double interval_s = 0;  // computation between checkpoints
  double blocking_s = 0;  // each checkpoint stops the computation this long
  double lag_s = 0;       // then becomes durable this much later (0: at once)
  double restart_s = 0;   // a restart, from the failure to computing again (including the load)
  double mtbf_s = 0;      // the job's: the failures of all its GPUs and nodes together
};
McJob mc_job(const Plan& p);

struct McResult {
  int runs = 0;
  std::uint64_t seed = 0;
  double mean_wall_s = 0;
  double goodput = 0;  // work / mean wall time, as the closed form defines it
  double p10_s = 0, p50_s = 0, p90_s = 0;  // of the wall time over the runs
  double mean_failures = 0;
  double mean_checkpoint_s = 0, mean_restart_s = 0, mean_lost_s = 0;  // wall = work + these three
};

// `runs` independent runs of the job from `seed` (each run's generator seeded from seed and its index).
McResult monte_carlo(const McJob& job, int runs, std::uint64_t seed);

// Goodput against the checkpoint interval: the closed form on a log-spaced grid around the plan's interval and
// the Monte Carlo at every fourth point, for the SVG.
struct CurvePoint {
  double interval_s = 0;
  double closed_form = 0;
  bool simulated = false;
  double monte_carlo = 0, p10_goodput = 0, p90_goodput = 0;  // work / wall of the mean, P90 and P10 wall
};
std::vector<CurvePoint> goodput_curve(const Plan& p, int runs, std::uint64_t seed);

// The curve as an SVG: goodput (%) against the interval (log scale), the Monte Carlo's points with their
// P10-P90 spread, and Daly's and Young's intervals marked.
std::string goodput_svg(const Plan& p, const std::vector<CurvePoint>& curve, const std::string& title);

}  // namespace tessel::goodput
