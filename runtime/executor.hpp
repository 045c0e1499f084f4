// Walks one pipeline rank's action list of a lowered schedule (sim/schedule/schedule.hpp) on real stages,
// in its order, blocking at each recv where the list has it (runtime_schedule: on the CPU runtime, exactly
// the list the simulator simulates). One walker for every runtime: it decides where
// each tensor comes from and goes, the message tags and the trace's flow ids; a PipelineBackend runs the
// stages and moves the tensors (the CPU runtime below over host vectors, threads or MPI; the CUDA runtime,
// runtime/cuda/gpu_trainer.cpp, over device buffers and NCCL).
//   F s mb       forward of stage s (input: tokens on stage 0, the local output of stage s-1 when it lives on
//                this rank (V placement), or what RECV_F delivered);
//   B s mb       input gradient then weight gradient;  I s mb / W s mb: the two halves (zero bubble);
//   OVERLAP_F_B  its two sub-actions in order (DualPipe F&B; the backends do not overlap their compute);
//   SEND_F/RECV_F, SEND_B/RECV_B  point-to-point over the pipeline communicator;
//   REDUCE_GRAD, OPTIMIZER_STEP, UNSHARD, RESHARD, RECOMPUTE: no-ops here, the trainer runs the step after
//   the flush and recomputation is done inside B/I as the Layout says.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/comm.hpp"
#include "runtime/gpt_stage.hpp"
#include "runtime/recorder.hpp"
#include "sim/schedule/schedule.hpp"
#include "util/error.hpp"

namespace tessel::rt {

// Where a rank's walk stands: its pipeline rank, the step (optimizer steps done before it), and its
// replica among the tp x dp ranks that play the same pipeline rank (tp rank + tp x dp rank).
struct WalkPosition {
  int pp_rank = 0;
  int step = 0;
  int replica = 0, replicas = 1;
};

// A tensor travelling into stage `to` (dir 0 forward, 1 backward) for micro-batch mb. Its message tag on
// the pipeline communicator is unique within a step (the backends match sends to receives by it, or by
// issue order where the communicator ignores tags: NCCL); its trace flow id is unique over the run and
// the world (per step, per replica), so every flow joins exactly one send to its recv.
int p2p_tag(const sched::Schedule& s, int dir, int to, int mb);
std::int64_t p2p_flow(const sched::Schedule& s, const WalkPosition& at, int dir, int to, int mb);

// One compute action of the walk (F, B, I or W) on a stage of this rank.
struct ComputeAction {
  sched::ActionType type = sched::ActionType::F;
  int stage = 0, mb = 0;
  double flops = 0;  // forward_flops x (2 for B, 1 otherwise): what the trace claims the op computed
  OpIdentity id;     // the simulator's op identity ("forward", "backward", "input_grad", "weight_grad")
  std::string name;  // "F s0 mb1"
  // F reads weights; B reads weights and completes the micro-batch's gradients; I reads weights and
  // makes some (norms, biases); W makes the rest and completes them.
  bool reads_weights() const { return type != sched::ActionType::W; }
  bool makes_grads() const { return type != sched::ActionType::F; }
  bool grads_done() const { return type == sched::ActionType::B || type == sched::ActionType::W; }
};

// One point-to-point action: SEND_x names the producing stage, RECV_x the consuming one (PyTorch's
// _add_send_recv convention).
struct P2pAction {
  bool send = false, forward = false;
  int stage = 0, mb = 0;
  int peer = 0;  // pipeline rank of the other side
  int tag = 0;
  std::int64_t flow = -1;
  OpIdentity id;     // "send" or "recv" of (stage, mb)
  std::string name;  // the action's token, "1SEND_F3"
};

// What a runtime supplies to the walker. Tensor: the backend's activation or gradient buffer; a
// default-constructed Tensor stands for "none" (stage 0's input, the last stage's output gradient).
// Around a compute action the walker calls before_compute, begin_compute, the action itself,
// end_compute, after_compute: the first and last are where ZeRO gathers values and reduces gradients,
// the middle two time and record the op.
template <class Tensor>
class PipelineBackend {
 public:
  virtual ~PipelineBackend() = default;
  virtual std::pair<int, int> stage_layers(int stage) = 0;  // [first, end) of the model's layers
  virtual double forward_flops(int stage) = 0;

  virtual void before_compute(const ComputeAction&) {}
  virtual void begin_compute(const ComputeAction& c) = 0;
  virtual void end_compute(const ComputeAction& c) = 0;
  virtual void after_compute(const ComputeAction&) {}

  // The stage's output (unused on the last stage, where the backend keeps the loss).
  virtual Tensor forward(int stage, int mb, Tensor in) = 0;
  // The gradient of the stage's input (unused on stage 0); full: the weight gradient too (B), else I.
  virtual Tensor backward(int stage, int mb, Tensor dout, bool full) = 0;
  virtual void weight(int stage, int mb) = 0;

  // Moves the tensor and records the op on the pp lane with its bytes and flow id.
  virtual void send(const P2pAction& p, Tensor t) = 0;
  virtual Tensor recv(const P2pAction& p) = 0;
};

// Runs rank at.pp_rank's actions of `s` (lowered) on `b`. Throws (TESSEL_CHECK) when the schedule asks for
// a stage this rank does not hold, runs an op before its input arrived, or ends with tensors undelivered.
template <class Tensor>
void walk_pipeline(const sched::Schedule& s, const WalkPosition& at, PipelineBackend<Tensor>& b);

// ---- the CPU runtime's backend ----

struct MicroBatch {
  std::vector<std::int32_t> tokens, targets;  // micro_batch * seq each
};

struct ExecutorContext {
  const sched::Schedule* schedule = nullptr;  // lowered (compute + comm)
  WalkPosition at;
  Comm* pp = nullptr;  // host buffers; sends are buffered (eager semantics)
  std::map<int, std::unique_ptr<Stage>>* stages = nullptr;  // this rank's stages by stage index
  std::function<const MicroBatch&(int mb)> data;
  Recorder* rec = nullptr;
  // Around each compute action of a stage (optional; ZeRO uses them): before(stage, reads_weights,
  // makes_grads), after(stage, grads_done), as ComputeAction says.
  std::function<void(int stage, bool reads_weights, bool makes_grads)> before_compute;
  std::function<void(int stage, bool grads_done)> after_compute;
};

// What a rank's actions of one step add up to: the sum of its last-stage micro-batch mean losses (0 when
// the last stage lives elsewhere), and of its parts of the micro-batches' load-balancing losses (MoE layers).
struct PipelineLosses {
  double loss = 0, aux_loss = 0;
};
PipelineLosses run_pipeline(const ExecutorContext& ctx);

// ---- the walker ----

namespace detail {

template <class Tensor>
class Walker {
 public:
  using Key = std::pair<int, int>;  // (stage, mb)
  Walker(const sched::Schedule& s, const WalkPosition& at, PipelineBackend<Tensor>& b) : s_(s), at_(at), b_(b) {}

  void run() {
    for (const sched::Action& a : s_.ranks.at(static_cast<std::size_t>(at_.pp_rank))) execute(a);
    TESSEL_CHECK(fwd_in_.empty() && bwd_in_.empty() && fwd_out_.empty() && bwd_out_.empty(),
                 "pipeline rank " << at_.pp_rank << " finished with undelivered tensors: the schedule is incomplete");
  }

 private:
  void check_here(int stage) const {
    TESSEL_CHECK(stage >= 0 && stage < s_.num_stages && s_.rank_of(stage) == at_.pp_rank,
                 "stage " << stage << " is not on pipeline rank " << at_.pp_rank);
  }
  static Tensor take(std::map<Key, Tensor>& m, Key k, const char* what) {
    auto it = m.find(k);
    TESSEL_CHECK(it != m.end(), "" << what << " for stage " << k.first << " mb " << k.second
                                   << " missing: the schedule ran an op before its input arrived");
    Tensor v = std::move(it->second);
    m.erase(it);
    return v;
  }
  OpIdentity id_of(const char* op, int stage, int mb) {
    const auto [l0, l1] = b_.stage_layers(stage);
    return {op, stage, s_.chunk_of(stage), mb, l0, l1};
  }

  template <class F>
  void compute(sched::ActionType type, int stage, int mb, F&& body) {
    using sched::ActionType;
    check_here(stage);
    ComputeAction c;
    c.type = type;
    c.stage = stage;
    c.mb = mb;
    c.flops = (type == ActionType::B ? 2.0 : 1.0) * b_.forward_flops(stage);
    const char* op = type == ActionType::F ? "forward" : type == ActionType::B ? "backward"
                     : type == ActionType::I ? "input_grad" : "weight_grad";
    c.id = id_of(op, stage, mb);
    c.name = std::string(sched::type_name(type)) + " s" + std::to_string(stage) + " mb" + std::to_string(mb);
    b_.before_compute(c);
    b_.begin_compute(c);
    body();
    b_.end_compute(c);
    b_.after_compute(c);
  }

  void forward(int st, int mb) {
    compute(sched::ActionType::F, st, mb, [&] {
      Tensor in = st == 0 ? Tensor{} : take(fwd_in_, {st, mb}, "forward input");
      Tensor out = b_.forward(st, mb, std::move(in));
      if (st == s_.num_stages - 1) return;
      if (s_.rank_of(st + 1) == at_.pp_rank) fwd_in_[{st + 1, mb}] = std::move(out);
      else fwd_out_[{st, mb}] = std::move(out);
    });
  }

  void backward(int st, int mb, bool full) {
    compute(full ? sched::ActionType::B : sched::ActionType::I, st, mb, [&] {
      Tensor dout = st == s_.num_stages - 1 ? Tensor{} : take(bwd_in_, {st, mb}, "output gradient");
      Tensor dx = b_.backward(st, mb, std::move(dout), full);
      if (st == 0) return;
      if (s_.rank_of(st - 1) == at_.pp_rank) bwd_in_[{st - 1, mb}] = std::move(dx);
      else bwd_out_[{st, mb}] = std::move(dx);
    });
  }

  void p2p(const sched::Action& a) {
    P2pAction p;
    p.forward = a.type == sched::ActionType::SEND_F || a.type == sched::ActionType::RECV_F;
    p.send = sched::is_send(a.type);
    p.stage = a.stage;
    p.mb = a.mb;
    check_here(p.stage);
    const int dir = p.forward ? 0 : 1;
    const int to = p.send ? (p.forward ? p.stage + 1 : p.stage - 1) : p.stage;
    p.peer = a.peer >= 0 ? a.peer : s_.rank_of(p.send ? to : (p.forward ? p.stage - 1 : p.stage + 1));
    p.tag = p2p_tag(s_, dir, to, p.mb);
    p.flow = p2p_flow(s_, at_, dir, to, p.mb);
    p.id = id_of(p.send ? "send" : "recv", p.stage, p.mb);
    p.name = a.token();
    if (p.send) {
      b_.send(p, take(p.forward ? fwd_out_ : bwd_out_, {p.stage, p.mb},
                      p.forward ? "activation to send" : "gradient to send"));
    } else {
      (p.forward ? fwd_in_ : bwd_in_)[{p.stage, p.mb}] = b_.recv(p);
    }
  }

  void execute(const sched::Action& a) {
    using sched::ActionType;
    switch (a.type) {
      case ActionType::F: forward(a.stage, a.mb); break;
      case ActionType::B: backward(a.stage, a.mb, true); break;
      case ActionType::I: backward(a.stage, a.mb, false); break;
      case ActionType::W: compute(ActionType::W, a.stage, a.mb, [&] { b_.weight(a.stage, a.mb); }); break;
      case ActionType::OVERLAP_F_B:
        for (const sched::Action& sub : a.sub) execute(sub);
        break;
      case ActionType::SEND_F: case ActionType::RECV_F: case ActionType::SEND_B: case ActionType::RECV_B:
        p2p(a);
        break;
      case ActionType::RECOMPUTE: case ActionType::REDUCE_GRAD: case ActionType::OPTIMIZER_STEP:
      case ActionType::UNSHARD: case ActionType::RESHARD:
      case ActionType::WAIT_SEND_F: case ActionType::WAIT_SEND_B: case ActionType::WAIT_REDUCE_GRAD:  // sends are buffered
        break;
    }
  }

  const sched::Schedule& s_;
  WalkPosition at_;
  PipelineBackend<Tensor>& b_;
  std::map<Key, Tensor> fwd_in_, bwd_in_, fwd_out_, bwd_out_;
};

}  // namespace detail

template <class Tensor>
void walk_pipeline(const sched::Schedule& s, const WalkPosition& at, PipelineBackend<Tensor>& b) {
  detail::Walker<Tensor>(s, at, b).run();
}

}  // namespace tessel::rt
