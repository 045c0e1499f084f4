// Goodput and time to train: what failures, recovery checkpoints and restarts cost a whole training job
// under one layout (docs/goodput.md). The checkpoint's bytes come from the memory model's per-rank state
// (an Estimate) stored as the runtime's checkpoint format stores it; the interval is Daly's; the expected
// wall time is Daly's closed form, which sim/goodput_mc.hpp checks by a Monte-Carlo run of the job.
#pragma once

#include <cstdint>
#include <optional>

#include "sim/estimate.hpp"
#include "sim/system.hpp"
#include "util/json_reader.hpp"

namespace tessel::goodput {

// What a recovery checkpoint of one layout moves, in bytes.
struct CheckpointBytes {
  double total_write = 0;     // the whole checkpoint: every element once
  double max_rank_write = 0;  // the rank that writes the most (what its device-to-host copy moves)
  double max_node_write = 0;  // the node whose ranks write the most
  double total_read = 0;      // a restart: every rank reads the state it holds
  double max_node_read = 0;
};

// Per pipeline rank r: the parameters the rank holds (memory model) less the copies the format stores once
// (the tied head of the last stage, the tp-replicated learned positions beyond one tp rank), at 4 bytes of
// fp32 value and 8 of AdamW moments. ZeRO-sharded state is written by every dp (x cp) rank, its own shard;
// replicated state by dp rank 0 only. Nodes hold consecutive ranks in Megatron's tp-cp-dp-pp order.
CheckpointBytes checkpoint_bytes(const Model& m, const Estimate& e, int gpus_per_node);

// How long a checkpoint takes on a storage path, in seconds.
struct CheckpointTimes {
  double save_s = 0;      // writing to storage: the busiest node at its bandwidth or the aggregate cap
  double blocking_s = 0;  // what training waits for: save_s, or the device-to-host copy when asynchronous
  double lag_s = 0;       // from the end of the blocking part until durable: 0, or save_s when asynchronous
  double load_s = 0;      // reading it back on a restart
};
CheckpointTimes checkpoint_times(const CheckpointBytes& b, const StorageSpec& s);

// The job's mean time between failures: 1 / (gpus / gpu_mtbf + nodes / node_mtbf).
double job_mtbf_s(const ReliabilitySpec& r, int gpus, int gpus_per_node);
// Young 1974: tau = sqrt(2 delta M), compute time between checkpoints.
double young_interval_s(double delta_s, double mtbf_s);
// Daly 2006's higher-order optimum (see goodput.cpp).
double daly_interval_s(double delta_s, double mtbf_s);
// Daly 2006's expected wall time of `work_s` of computation checkpointed every `interval_s` of it.
double expected_wall_s(double work_s, double interval_s, double delta_s, double restart_s, double mtbf_s);

// The job and the conditions it runs under.
struct Job {
  double steps = 0;  // optimizer steps of the whole job
  ReliabilitySpec reliability;
  StorageSpec storage;
  std::optional<double> usd_per_gpu_hour;
};

// The time-to-train block of one layout.
struct Plan {
  int gpus = 0, nodes = 0;
  double steps = 0, step_s = 0, work_s = 0;  // work: the failure-free training time
  CheckpointBytes bytes;
  CheckpointTimes ckpt;
  bool async = false;
  double mtbf_s = 0;       // the job's
  double restart_s = 0;    // restart overhead + load
  double young_s = 0, daly_s = 0;  // optimal intervals of compute between checkpoints (blocking time as delta)
  long long interval_steps = 0;    // Daly's interval rounded to whole steps (at least the write time when async)
  double interval_s = 0;           // interval_steps x step_s: the interval the job uses
  double wall_s = 0, goodput = 0;  // expected wall time; work / wall
  double failures = 0, checkpoints = 0;
  double checkpoint_s = 0, restart_total_s = 0, lost_work_s = 0;  // first-order split of wall - work
  double days = 0, gpu_hours = 0;
  std::optional<double> usd;
};

// InfeasibleLayout when the job would not finish (restarts longer than the time between failures).
Plan plan(const Model& m, const Estimate& e, const System& sys, const Job& job);
// The same layout at another step time (explore's event-simulated tier): its checkpoint is unchanged.
Plan with_step_time(const Plan& p, double step_s, const Job& job);

Json plan_to_json(const Plan& p);

}  // namespace tessel::goodput
