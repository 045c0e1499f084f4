// Walks one pipeline rank's action list of a lowered schedule (sim/schedule/schedule.hpp) on real stages:
// exactly the list the simulator simulates, in its order.
//   F s mb       forward of stage s (input: tokens on stage 0, the local output of stage s-1 when it lives on
//                this rank (V placement), or what RECV_F delivered);
//   B s mb       input gradient then weight gradient;  I s mb / W s mb: the two halves (zero bubble);
//   OVERLAP_F_B  its two sub-actions in order (DualPipe F&B; no compute overlap on a CPU rank);
//   SEND_F/RECV_F, SEND_B/RECV_B  point-to-point over the pipeline communicator (buffered sends);
//   REDUCE_GRAD, OPTIMIZER_STEP, UNSHARD, RESHARD, RECOMPUTE: no-ops here, the trainer runs the step after
//   the flush and recomputation is done inside B/I as the Layout says.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "runtime/comm/comm.hpp"
#include "runtime/gpt_stage.hpp"
#include "runtime/recorder.hpp"
#include "sim/schedule/schedule.hpp"

namespace tessel::rt {

struct MicroBatch {
  std::vector<std::int32_t> tokens, targets;  // micro_batch * seq each
};

struct ExecutorContext {
  const sched::Schedule* schedule = nullptr;  // lowered (compute + comm)
  int pp_rank = 0;
  Comm* pp = nullptr;
  std::map<int, std::unique_ptr<Stage>>* stages = nullptr;  // this rank's stages by stage index
  std::function<const MicroBatch&(int mb)> data;
  Recorder* rec = nullptr;
  std::int64_t flow_base = 0;  // makes send/recv flow ids unique per step and per tp/dp replica
  // Around each compute action of a stage (optional; ZeRO uses them): before(stage, reads_weights,
  // makes_grads), after(stage, grads_done). F reads weights; B reads weights and completes the micro-batch's
  // gradients; I reads weights and makes some (norms, biases); W makes the rest and completes them.
  std::function<void(int stage, bool reads_weights, bool makes_grads)> before_compute;
  std::function<void(int stage, bool grads_done)> after_compute;
};

// Runs the rank's actions; returns the sum of this rank's last-stage micro-batch mean losses (0 when the
// last stage lives elsewhere).
double run_pipeline(const ExecutorContext& ctx);

}  // namespace tessel::rt
