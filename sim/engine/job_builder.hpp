// Internal to build_job: the state shared by the pipeline walk (job_pipeline.cpp) and the data-parallel,
// optimizer and ZeRO parts (job_dp.cpp).
#pragma once

#include <limits>
#include <utility>
#include <array>
#include <vector>

#include "sim/cost/comm.hpp"
#include "sim/engine/job.hpp"

namespace tessel::engine::detail {

constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

// A point in a position's backward after which some gradients are final (a bucket can be reduced).
struct GradReady {
  std::uint32_t task;
  double params;
};

// A point along an op's compute where emit_pieces cuts it: an all-to-all (cuts[i]) or a gradient bucket's end.
struct PieceMark {
  double at;
  bool bucket;
  std::size_t i;
};

struct PositionState {
  std::uint32_t prev_compute = kNone;
  std::vector<std::uint32_t> wait;   // transfers the next compute waits for
  std::vector<GradReady> grads;      // in the order they become ready
  std::uint32_t slot = 0;            // next group-collective slot of this position
  std::uint32_t ep_slot = 0;         // next expert all-to-all of this position
  std::uint32_t tail_flow = kNone;   // the all-to-all the last op ended on, until the next compute
};

class JobBuilder {
 public:
  JobBuilder(const JobSpec& spec, const Cluster& c);
  Job build();

 private:
  // job_pipeline.cpp
  void walk_position(int pos);
  void walk_compute(int pos, const sched::Action& a, std::size_t index);
  void walk_comm(int pos, const sched::Action& a);
  std::uint32_t compute_task(int pos, OpKind op, double seconds, int stage, int mb);
  void emit_backward(int pos, const sched::Action& a, bool last_for_stage);
  std::uint32_t emit_zero3_layers(int pos, OpKind op, double seconds, const sched::Action& a);  // first piece
  void release(std::uint32_t task, int pos, const sched::Action& a);
  // One forward or backward op as compute pieces: cut at its expert all-to-alls (each a flow of the ep group
  // between two pieces) and, when `buckets` > 1, at its gradient buckets' ends (`ready`: each bucket of
  // params / buckets joins the position's gradient queue there). Returns the first and last compute task.
  std::pair<std::uint32_t, std::uint32_t> emit_pieces(int pos, OpKind op, double seconds, int stage, int mb,
                                                      const std::vector<A2aCut>& cuts, int buckets, bool ready,
                                                      double params);
  std::uint32_t a2a_flow(int pos, const A2aCut& cut, int stage, int mb);
  int ep_group_of(int pos);
  // job_dp.cpp
  void data_parallel(int pos);
  std::uint32_t group_task(int pos, OpKind op, double seconds, double bytes, int group, std::uint32_t chain_after);
  int dp_group_of(int pos);
  // A data-parallel collective of `bytes` as a flow: its uncontended time on the flat system.
  double flow_seconds(const cost::ParamCollective& c, double bytes) const;
  const StageWork& stage(int s) const { return costs_.work.stages[static_cast<std::size_t>(s)]; }

  const JobSpec& spec_;
  const StepCosts& costs_;
  const Layout& l_;
  const sched::Schedule& s_;
  const Cluster& c_;
  GraphBuilder g_;
  Job job_;
  std::vector<PositionState> st_;
  std::vector<std::uint32_t> transfer_;            // per (direction, producer stage, mb), current replica
  std::vector<std::vector<std::uint32_t>> slots_;  // per pp rank: group task of each slot
  std::vector<std::vector<std::size_t>> last_bwd_;  // per pp rank, per stage: action index of its last W-carrying op
  std::vector<int> dp_group_;                       // per pp rank: index into job_.groups
  std::vector<int> ep_group_;                       // per position: its ep group's index into job_.groups
  std::vector<std::vector<std::uint32_t>> ep_slots_;  // per group index: its all-to-all flows in order
  std::vector<int> ep_first_rank_;                     // per group index (ep groups): the global rank its block starts at
  // One MoE op's all-to-alls on a stage, as flows: where they cut its compute, and their seconds in all (the
  // op's compute is its time less these).
  struct StageA2a {
    std::vector<A2aCut> cuts;
    double seconds = 0;
  };
  enum A2aOp { a2a_forward, a2a_input, a2a_recompute, a2a_ops };  // _recompute: a full recompute's
  std::array<std::vector<StageA2a>, a2a_ops> a2a_;  // per op, per stage; empty when the all-to-alls are not flows
  // The stage's all-to-alls of `op` when they are flows; nullptr when it has none (or they are not flows).
  const StageA2a* a2a_of(A2aOp op, int stage) const {
    const auto& v = a2a_[op];
    const auto k = static_cast<std::size_t>(stage);
    return k < v.size() && !v[k].cuts.empty() ? &v[k] : nullptr;
  }
  std::vector<PieceMark> scratch_marks_;
  std::vector<std::size_t> scratch_infos_;
  std::vector<std::uint32_t> tied_;                 // per (dp, cp): tied-embedding all-reduce task
  std::vector<std::uint32_t> scratch_links_;
  bool explicit_recompute_ = false;
  // A stage's recompute op: its compute cut at its all-to-alls when they are flows, one task otherwise.
  void recompute_task(int pos, int stage, int mb);
  // The step costs' transfers and collectives as flows over the cluster's links: priced on its flat system,
  // because the core link above each pod carries the oversubscription the system's static factor stands for.
  // A transfer is priced by its own pair: on NVLink when both positions share a node, over the NICs otherwise
  // (the closed form prices every transfer as the slowest pair).
  double p2p_near_s_ = 0, p2p_far_s_ = 0, tied_near_s_ = 0, tied_far_s_ = 0;
  double zero3_gather_s_ = 0, zero3_scatter_s_ = 0;
};

}  // namespace tessel::engine::detail
