// tessel simulate's library entry: build the step costs (sim/step_costs.hpp), generate (or take) the schedule,
// build the step's task graph for every position (or one replica), play it, and summarise: step time,
// throughput, per-rank busy / bubble / exposed communication, peak memory, the critical path.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "models/model.hpp"
#include "util/json_reader.hpp"
#include "sim/engine/job.hpp"
#include "sim/engine/simulator.hpp"
#include "sim/workload.hpp"

namespace tessel::engine {

struct SimOptions {
  Fidelity fidelity = Fidelity::cluster;
  std::optional<sched::Schedule> schedule;  // from a file (compute-only or lowered); else generated
  bool memory_timeline = false;             // keep every memory change (traces, SVG)
  bool critical_path = true;
  // Pieces a MoE job's forward and input-gradient ops may be cut into at their expert all-to-alls (one flow
  // each) before each op's all-to-alls are coalesced into one flow at its end (job.hpp, Job::ep_coalesced).
  double ep_piece_budget = 1e6;
};

struct RankSummary {
  int pos = 0, global_rank = 0, pp = 0, dp = 0, cp = 0;
  double busy_s = 0;          // compute stream busy (TP collectives inside F/B included: they block it)
  double comm_s = 0;          // time any of its pp/dp transfers is in flight
  double exposed_comm_s = 0;  // of that, while its compute stream is idle
  double bubble_s = 0;        // step - busy - exposed_comm
  double peak_bytes = 0;    // weights, grads, optimizer state, reserved + peak activations and their fragmentation
  double peak_activation_bytes = 0;
};

struct CriticalOp {
  std::uint32_t task = 0;
  int global_rank = 0;
  std::string what;  // "F s3 mb7", "dp_allreduce", "send s2 mb5 -> rank 16"
  double start_s = 0, end_s = 0;
};

struct SimReport {
  Model model;
  Layout layout;
  std::string system_name;
  sched::Schedule schedule;  // lowered, as played
  Fidelity fidelity = Fidelity::cluster;
  int gpus = 0, positions = 0, microbatches = 0;
  double step_s = 0;
  double tokens_per_s = 0;
  double model_tflops_per_gpu = 0, mfu = 0;
  std::uint64_t events = 0;
  std::size_t tasks = 0;
  double schedule_s = 0;  // wall time generating, lowering and validating the schedule (part of build_s)
  double build_s = 0, run_s = 0, analysis_s = 0;  // wall time of the simulator's phases
  std::vector<RankSummary> ranks;  // one per position
  std::vector<CriticalOp> critical_path;
  double peak_bytes = 0, capacity_bytes = 0;
  int peak_rank = 0;
  bool fits = true;
  Job job;
  RunResult run;
  StepCosts costs;  // what the job was built from; costs.work is the lowered workload
};

// InfeasibleLayout / InputError as estimate() for the layout; InputError naming the schedule for a schedule
// that does not match the layout or fails validation (the validator's message).
SimReport simulate(const Model& m, const Layout& l, const System& sys, SimOptions opt = {});

// The longest path over the executed DAG (durations as played), as the ops on it in time order.
std::vector<std::uint32_t> critical_path(const Job& job, const RunResult& run);
std::string describe_task(const Job& job, std::uint32_t task, const Cluster& c);
// Busy / exposed communication / bubble and peak memory per position.
std::vector<RankSummary> summarize_ranks(const Job& job, const RunResult& run, const Cluster& c, double step_s);

Json report_to_json(const SimReport& r);

}  // namespace tessel::engine
