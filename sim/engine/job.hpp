// A training step as a task graph: every position plays its pipeline rank's lowered schedule (sim/schedule),
// with the step costs' per-stage compute, point-to-point transfers as flows, data-parallel gradient buckets
// overlapped with the backward, the optimizer step and the parameter all-gather; activation memory is
// allocated at each forward and released at the end of the micro-batch's backward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/engine/cluster.hpp"
#include "sim/engine/task_graph.hpp"
#include "sim/schedule/schedule.hpp"
#include "sim/step_costs.hpp"
#include "traces/trace.hpp"

namespace tessel::engine {

enum class OpKind : std::uint8_t {
  forward, backward, input_grad, weight_grad, recompute, overlap_f_b, transfer,
  dp_allreduce, dp_reducescatter, dp_allgather, tied_allreduce, tp_allreduce, zero3_allgather, zero3_reducescatter, optimizer
};
const char* op_name(OpKind k);  // as traces/trace.hpp names op kinds ("forward", "dp_allreduce", ...)

// What one task is, for summaries, traces and the critical path (not used by the hot loop).
struct TaskInfo {
  std::int32_t pos = 0;        // position that runs it (transfers: the sender)
  std::int32_t peer = -1;      // transfers: the receiver
  std::int32_t group = -1;     // collectives: index into Job::groups
  std::int32_t stage = -1, mb = -1;
  std::int32_t peer_stage = -1;  // transfers: the consuming stage (the recv's, as the runtime labels it)
  OpKind op = OpKind::forward;
  trace::Stream stream = trace::Stream::compute;
  std::int32_t piece = 0, pieces = 1;  // a backward split into gradient-bucket pieces
  double bytes = 0;
};

struct Job {
  TaskGraph graph;
  std::vector<TaskInfo> info;
  std::vector<std::vector<int>> groups;      // members of each collective group
  std::vector<std::uint32_t> step_end;       // per position: the task after which it can start the next step
  std::vector<double> static_bytes;          // per position: weights, grads, optimizer, reserved
  std::vector<std::uint64_t> flow_ids;       // unused placeholder for stable ids (trace uses task ids)
};

struct JobSpec {
  const Layout* layout = nullptr;
  const System* system = nullptr;
  const sched::Schedule* schedule = nullptr;  // lowered (SEND/RECV present), pp ranks
  // The step's costs (sim/step_costs.hpp): per stage the compute and activations, per pipeline rank the
  // parameters and optimizer step, and the communication's work, which the job plays as flows priced on
  // the cluster's flat system.
  const StepCosts* costs = nullptr;
  Fidelity fidelity = Fidelity::cluster;
};

// InputError if the schedule does not match the layout (ranks, stages, micro-batches).
Job build_job(const JobSpec& spec, const Cluster& cluster);

}  // namespace tessel::engine
