// A training step as a task graph: every position plays its pipeline rank's lowered schedule (sim/schedule),
// with the workload's per-stage costs, point-to-point transfers as flows, data-parallel gradient buckets
// overlapped with the backward, the optimizer step and the parameter all-gather; activation memory is
// allocated at each forward and released at the end of the micro-batch's backward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/engine/cluster.hpp"
#include "sim/engine/task_graph.hpp"
#include "sim/schedule/schedule.hpp"
#include "traces/trace.hpp"

namespace tessel::engine {

// Per micro-batch costs of one stage (seconds), its parameters and activations on one GPU.
struct StageCost {
  double f = 0, i = 0, w = 0;  // i includes the recompute below (as sim/workload.hpp)
  double recompute = 0;        // seconds of i spent recomputing the forward before the backward
  double tp_f = 0, tp_b = 0;   // TP collective seconds inside f and i (blocking; shown on the tp stream)
  double params = 0;           // parameters held by one GPU (after TP sharding)
  double act_bytes = 0;        // kept per micro-batch from its forward to the end of its backward
  double extra_bytes = 0;      // embedding (first stage, per micro-batch in flight) / logits (last stage)
  double flops = 0;            // model FLOPs per micro-batch (F + B), for the trace
  double sp_grad_params = 0;   // SP: tp-replicated parameters whose gradients are all-reduced over tp
  int layers = 0, first_layer = 0;
};

struct JobCosts {
  std::vector<StageCost> stages;   // one per pipeline stage
  double p2p_seconds = 0;          // one activation transfer, uncontended
  double p2p_bytes = 0;
  double bucket_params = 40e6;     // Megatron DDP bucket size (parameters)
  double tied_seconds = 0;         // tied-embedding gradient all-reduce between first and last stage
  double tied_bytes = 0;           // its bytes (the gradient of the token table's shard)
  double zero3_gather_layer = 0;   // ZeRO-3: all-gather / reduce-scatter of one layer's parameters
  double zero3_scatter_layer = 0;
  double zero3_layer_bytes = 0;    // the bytes each of those moves: one layer's parameters in the weights' dtype
  double static_bytes_per_param = 0;  // weights + grads + optimizer state bytes per parameter
  double fixed_bytes = 0;             // reserved + ZeRO-3 gather buffers, per GPU
};

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
  JobCosts costs;
  Fidelity fidelity = Fidelity::cluster;
};

// InputError if the schedule does not match the layout (ranks, stages, micro-batches).
Job build_job(const JobSpec& spec, const Cluster& cluster);

}  // namespace tessel::engine
