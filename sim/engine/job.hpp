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
  dp_allreduce, dp_reducescatter, dp_allgather, tied_allreduce, tp_allreduce, zero3_allgather, zero3_reducescatter, optimizer,
  ep_alltoall,  // a MoE layer's dispatch or combine, a flow shared by the ep group's positions
  grad_norm,    // the gradient norm's pass over the gradients, before the optimizer (clipping)
  zero_grad     // zeroing the gradient buffer for the next step
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
  std::int32_t piece = 0, pieces = 1;  // an op cut into pieces: gradient buckets, ZeRO-3 layers, the gaps of its
                                       // expert all-to-alls
  std::int32_t layer = -1;             // ep_alltoall: the model layer (-1: an op's all-to-alls coalesced)
  const char* what = nullptr;          // ep_alltoall: the lowered op's name (ep_dispatch, ep_combine)
  double bytes = 0;
};

// A MoE layer's all-to-all inside a stage's forward or input-gradient op: `at` seconds of the op's compute
// (its other work, the all-to-alls before it left out) before it starts, `seconds` long uncontended.
struct A2aCut {
  double at = 0, seconds = 0, bytes = 0;
  int layer = 0;
  const char* what = "";
  const cost::WorkOp* op = nullptr;  // the lowered all-to-all; nullptr for several coalesced into one
  double flat_seconds = 0;           // as a flow: its price on the cluster's flat system (the engine's)
};

struct Job {
  TaskGraph graph;
  std::vector<TaskInfo> info;
  std::vector<std::vector<int>> groups;      // members of each collective group
  std::vector<std::uint32_t> step_end;       // per position: the task after which it can start the next step
  std::vector<double> static_bytes;          // per position: weights, grads, optimizer, reserved
  std::vector<std::uint64_t> flow_ids;       // unused placeholder for stable ids (trace uses task ids)
  // The expert all-to-alls of forward, input-gradient and (full) recompute ops are flows of their own
  // (ep_alltoall tasks), so those ops' compute tasks leave them out (a2a_cuts); otherwise they are inside the
  // compute, as TP's.
  bool ep_flows = false;
  bool ep_coalesced = false;  // one flow per op, at its end, instead of one per all-to-all (SimOptions::ep_piece_budget)
  std::vector<double> forward_compute;  // ep_flows: per stage, the forward op's compute seconds (all-to-alls out)
};

// The expert all-to-alls a stage's forward (or input-gradient) op runs, in order, with where they fall in its
// compute: each layer's lowered ops in sequence after the stage's leading edge work (StageEdges::layers_at_*),
// as the trace draws a TP collective. An MTP module's are left in the compute (it is not a model layer here).
// `recomputed` >= 0: a full recompute's forward instead, over the stage's first `recomputed` layers from 0.
std::vector<A2aCut> a2a_cuts(const StepCosts& costs, const Layout& l, int stage, bool forward, int recomputed = -1);

struct JobSpec {
  const Layout* layout = nullptr;
  const System* system = nullptr;
  const sched::Schedule* schedule = nullptr;  // lowered (SEND/RECV present), pp ranks
  // The step's costs (sim/step_costs.hpp): per stage the compute and activations, per pipeline rank the
  // parameters and optimizer step, and the communication's work, which the job plays as flows priced on
  // the cluster's flat system.
  const StepCosts* costs = nullptr;
  Fidelity fidelity = Fidelity::cluster;
  double ep_piece_budget = 1e6;  // SimOptions::ep_piece_budget
};

// InputError if the schedule does not match the layout (ranks, stages, micro-batches).
Job build_job(const JobSpec& spec, const Cluster& cluster);

}  // namespace tessel::engine
