// build_job, part 2: what a position does besides its pipeline schedule. Data-parallel gradient buckets
// (all-reduce, or reduce-scatter under the distributed optimizer) run on the dp stream in the order their
// gradients become final; the tied-embedding all-reduce; the optimizer step; the parameter all-gather of the
// distributed optimizer; ZeRO-3's per-layer gathers and reduce-scatters. A collective is one flow shared by
// every member of its group; it starts when the last member reaches it.
#include <algorithm>
#include <cmath>

#include "util/error.hpp"
#include "sim/engine/job_builder.hpp"
#include "sim/workload.hpp"

namespace tessel::engine::detail {

using cost::Collective;

double JobBuilder::flow_seconds(const cost::ParamCollective& c, double bytes) const {
  return cost::collective_time(c_.flat_system(), c.kind, bytes, c.group).seconds;
}

int JobBuilder::dp_group_of(int pos) {
  if (dp_group_.empty()) dp_group_.assign(static_cast<std::size_t>(l_.pp), -1);
  int& gi = dp_group_[static_cast<std::size_t>(c_.pp_of(pos))];
  if (gi < 0) {
    std::vector<int> members;
    for (int d = 0; d < c_.replicas(); ++d)
      for (int cp = 0; cp < l_.cp; ++cp) members.push_back(c_.position(c_.pp_of(pos), d, cp));
    gi = static_cast<int>(job_.groups.size());
    job_.groups.push_back(std::move(members));
  }
  return gi;
}

// The group collective of this position's next slot: created by the group's first member, shared by the
// others (every member of a DP group plays the same pipeline rank, so their slots line up).
std::uint32_t JobBuilder::group_task(int pos, OpKind op, double seconds, double bytes, int group, std::uint32_t chain_after) {
  PositionState& ps = st_[static_cast<std::size_t>(pos)];
  auto& slots = slots_[static_cast<std::size_t>(c_.pp_of(pos))];
  const std::uint32_t k = ps.slot++;
  if (k < slots.size()) return slots[k];
  const auto& members = job_.groups[static_cast<std::size_t>(group)];
  const int r = c_.pp_of(pos);
  // The full group (all replicas) spans these global ranks, whatever the fidelity.
  const int first = l_.tp * l_.cp * l_.dp * r, last = first + l_.tp * l_.cp * l_.dp - 1;
  scratch_links_.clear();
  c_.group_links(members, first, last, scratch_links_);
  const auto t = g_.add_flow(seconds, scratch_links_);
  TaskInfo ti;
  ti.pos = pos;
  ti.group = group;
  ti.op = op;
  ti.stream = trace::Stream::dp;
  ti.bytes = bytes;
  job_.info.push_back(ti);
  if (chain_after != kNone) g_.edge(chain_after, t);
  slots.push_back(t);
  return t;
}

std::uint32_t JobBuilder::emit_zero3_layers(int pos, OpKind op, double seconds, const sched::Action& a) {
  // DeepSpeed ZeRO-3: each layer's weights (16-bit; fp32 under fp32 training) are gathered before use and its gradients reduce-scattered
  // after the backward. Forward gathers are prefetched one layer ahead; backward ones are not (with
  // recomputation the backward waits for them), as estimate.cpp assumes.
  const int layers = std::max(1, stage(a.stage).layers);
  const bool fwd = op == OpKind::forward;
  const int group = dp_group_of(pos);
  const bool multi = l_.dp * l_.cp > 1;
  std::uint32_t first = kNone, prev_gather = kNone, two_back = kNone;
  PositionState& ps = st_[static_cast<std::size_t>(pos)];
  for (int j = 0; j < layers; ++j) {
    std::uint32_t gather = kNone;
    if (multi) {
      // Prefetch: the gather may start once the layer two back is done (two gathered layers at most).
      const std::uint32_t after = fwd ? (two_back != kNone ? two_back : kNone) : ps.prev_compute;
      gather = group_task(pos, OpKind::zero3_allgather, zero3_gather_s_, costs_.work.sync.zero3_gather.bytes,
                          group, prev_gather);
      if (after != kNone && after != gather) g_.edge(after, gather);
      prev_gather = gather;
    }
    two_back = ps.prev_compute;
    const auto t = compute_task(pos, op, seconds / layers, a.stage, a.mb);
    job_.info.back().piece = j;
    job_.info.back().pieces = layers;
    if (gather != kNone) g_.edge(gather, t);
    if (first == kNone) first = t;
    if (multi && !fwd) {
      const auto rs = group_task(pos, OpKind::zero3_reducescatter, zero3_scatter_s_,
                                 costs_.work.sync.zero3_scatter.bytes, group, prev_gather);
      g_.edge(t, rs);
      prev_gather = rs;
      ps.wait.push_back(rs);  // the next layer's gather and compute come after this reduction
    }
  }
  return first;
}

void JobBuilder::data_parallel(int pos) {
  PositionState& ps = st_[static_cast<std::size_t>(pos)];
  const int r = c_.pp_of(pos);
  const StepSync& sync = costs_.work.sync;
  const double params = costs_.ranks.params[static_cast<std::size_t>(r)];
  job_.static_bytes[static_cast<std::size_t>(pos)] = costs_.state_bytes(r) + costs_.fixed_bytes();
  // The routed experts' share of each bucket: reduced among their edp replicas after the rest of the bucket,
  // on the same GPUs' links (the edp group is a subset of the stage's tp x cp x dp GPUs, which this engine
  // folds into the dp group's positions).
  const auto& experts = costs_.ranks.expert_params;
  const double expert_share =
      params > 0 && static_cast<std::size_t>(r) < experts.size() ? experts[static_cast<std::size_t>(r)] / params : 0.0;
  const std::uint32_t last_compute = ps.prev_compute;
  std::vector<std::uint32_t> before_opt = {last_compute};
  const bool dp = l_.dp * l_.cp > 1;
  const int group = dp ? dp_group_of(pos) : -1;
  std::uint32_t chain = kNone;
  if (sync.grad.runs()) {
    // Without overlap, every bucket waits for the whole backward.
    std::vector<GradReady> ready = ps.grads;
    if (!l_.overlap_grad_reduce || ready.empty()) {
      ready.clear();
      for (int s = 0; s < s_.num_stages; ++s)
        if (s_.rank_of(s) == r) {
          const double p = stage(s).params;
          const int nb = grad_buckets(p);
          for (int k = 0; k < nb * sync.grad_reductions; ++k) ready.push_back({last_compute, p / nb});
        }
    }
    const OpKind op = sync.grad.kind == Collective::all_reduce ? OpKind::dp_allreduce : OpKind::dp_reducescatter;
    for (const auto& g : ready) {
      const double bytes = sync.grad.bytes(g.params * (1 - expert_share));
      const auto t = group_task(pos, op, flow_seconds(sync.grad, bytes), bytes, group, chain);
      g_.edge(g.task, t);
      chain = t;
      if (sync.expert_grad.runs() && expert_share > 0) {
        const double eb = sync.expert_grad.bytes(g.params * expert_share);
        const auto te = group_task(pos, op, flow_seconds(sync.expert_grad, eb), eb, group, chain);
        g_.edge(g.task, te);
        chain = te;
      }
    }
    before_opt.push_back(chain);
  }
  // The experts' reduction (and, below, their gather) when the layers' has no dp group to ride on (dp x cp 1,
  // edp > 1: tp wider than etp x ep): a fixed-length op, priced on the system as given, as the SP one below.
  const double expert_params_here = expert_share * params;
  if (!sync.grad.runs() && sync.expert_grad.runs() && expert_params_here > 0) {
    const OpKind op = sync.expert_grad.kind == Collective::all_reduce ? OpKind::dp_allreduce : OpKind::dp_reducescatter;
    const auto t = compute_task(pos, op, sync.expert_grad.seconds(*spec_.system, expert_params_here), -1, -1);
    job_.info.back().stream = trace::Stream::dp;
    job_.info.back().bytes = sync.expert_grad.bytes(expert_params_here);
    for (auto b : before_opt)
      if (b != kNone && b != t) g_.edge(b, t);
    before_opt = {t};
  }
  // SP: the replicated parameters' gradients summed over tp (Megatron's finalize_model_grads runs it after
  // the data-parallel reduction and before the tied embedding's), blocking the position: a fixed-length
  // op, priced on the system as given.
  const double sp_params = costs_.ranks.sp_grad_params[static_cast<std::size_t>(r)];
  const double sp_seconds = sync.sp_grad.seconds(*spec_.system, sp_params);
  if (sp_seconds > 0) {
    const auto t = compute_task(pos, OpKind::tp_allreduce, sp_seconds, -1, -1);
    job_.info.back().stream = trace::Stream::tp;
    job_.info.back().bytes = sync.sp_grad.bytes(sp_params);
    for (auto b : before_opt)
      if (b != kNone && b != t) g_.edge(b, t);
    before_opt = {t};
  }
  const int last_rank = s_.rank_of(s_.num_stages - 1);
  if (tied_far_s_ > 0 && last_rank != s_.rank_of(0) && (r == 0 || r == last_rank)) {
    const std::size_t key = static_cast<std::size_t>(c_.dp_of(pos) * l_.cp + c_.cp_of(pos));
    if (tied_.empty()) tied_.assign(static_cast<std::size_t>(c_.replicas() * l_.cp), kNone);
    if (tied_[key] == kNone) {
      const int a = c_.position(0, c_.dp_of(pos), c_.cp_of(pos)), b = c_.position(last_rank, c_.dp_of(pos), c_.cp_of(pos));
      scratch_links_.clear();
      c_.p2p_links(a, b, scratch_links_);
      tied_[key] = g_.add_flow(c_.same_node(a, b) ? tied_near_s_ : tied_far_s_, scratch_links_);
      TaskInfo ti;
      ti.pos = a;
      ti.peer = b;
      ti.op = OpKind::tied_allreduce;
      ti.bytes = sync.tied.bytes * sync.tied.times;
      ti.stream = trace::Stream::pp;  // the embedding group of the first and last pipeline rank
      job_.info.push_back(ti);
    }
    for (auto t : before_opt) g_.edge(t, tied_[key]);
    before_opt.push_back(tied_[key]);
  }
  const RankTail& tail = costs_.tail[static_cast<std::size_t>(r)];
  // The gradient norm before the step: each GPU's pass over the gradients it steps, on the ranks that take it
  // (Layout::counts_grad_norm, as the runtimes do; Megatron counts on every replica, each on its own GPU, in the
  // same time); the others go on. The norm's all-reduce, a few floats, is not priced.
  if (tail.grad_norm_s > 0 && l_.counts_grad_norm(c_.dp_of(pos))) {
    const auto t = compute_task(pos, OpKind::grad_norm, tail.grad_norm_s, -1, -1);
    for (auto b : before_opt)
      if (b != kNone && b != t) g_.edge(b, t);
    before_opt = {t};
  }
  const auto opt = compute_task(pos, OpKind::optimizer, tail.optimizer_s, -1, -1);
  for (auto t : before_opt)
    if (t != kNone && t != opt) g_.edge(t, opt);
  job_.step_end[static_cast<std::size_t>(pos)] = opt;
  if (!sync.param_gather.runs() && sync.expert_param_gather.runs() && expert_params_here > 0) {
    const auto t = compute_task(pos, OpKind::dp_allgather, sync.expert_param_gather.seconds(*spec_.system, expert_params_here), -1, -1);
    job_.info.back().stream = trace::Stream::dp;
    job_.info.back().bytes = sync.expert_param_gather.bytes(expert_params_here);
    g_.edge(opt, t);
    job_.step_end[static_cast<std::size_t>(pos)] = t;
  }
  if (sync.param_gather.runs()) {
    // Distributed optimizer: gather the updated parameters (16-bit; fp32 under fp32 training), bucket by
    // bucket in forward order. With overlap_param_gather only the first bucket holds the next step's first
    // forward.
    std::uint32_t prev = kNone;
    for (int s = 0; s < s_.num_stages; ++s) {
      if (s_.rank_of(s) != r) continue;
      const double p = stage(s).params;
      const int nb = grad_buckets(p);
      for (int k = 0; k < nb; ++k) {
        const double bytes = sync.param_gather.bytes(p * (1 - expert_share)) / nb;
        double seconds = flow_seconds(sync.param_gather, bytes);
        if (sync.expert_param_gather.runs() && expert_share > 0)
          seconds += flow_seconds(sync.expert_param_gather, sync.expert_param_gather.bytes(p * expert_share) / nb);
        const auto t = group_task(pos, OpKind::dp_allgather, seconds, bytes, group, prev);
        g_.edge(opt, t);
        if (prev == kNone || !l_.overlap_param_gather) job_.step_end[static_cast<std::size_t>(pos)] = t;
        prev = t;
      }
    }
  }
  // Zeroing the gradient buffer for the next step, on the compute stream after the optimizer and what holds
  // the next step's first forward (Megatron zeroes it as the next step begins: the same place in the cycle).
  if (tail.zero_grad_s > 0) {
    std::uint32_t& end = job_.step_end[static_cast<std::size_t>(pos)];
    const auto t = compute_task(pos, OpKind::zero_grad, tail.zero_grad_s, -1, -1);
    if (end != t) g_.edge(end, t);
    end = t;
  }
}

}  // namespace tessel::engine::detail
