// build_job, part 1: each position walks its pipeline rank's lowered action list. Compute ops chain on the
// compute stream; a SEND/RECV pair is one transfer flow that starts when its producer ends (NCCL's send
// is posted right after the producing op, and a recv posted earlier never holds it: the schedule
// validator's "eager" model). The consumer waits for the transfer. Without --overlap-p2p-comm the sender's
// next op waits for it too (Megatron waits on the batch_isend_irecv requests before the next step), which
// is the steady-state exposure estimate.cpp counts; a rendezvous (the sender held until the receiver posts)
// is not modelled, because Megatron posts matching pairs together in the 1F1B steady state.
// A MoE stage's forward, input-gradient and full-recompute ops are cut at their expert all-to-alls: each
// dispatch and combine is a flow shared by the positions of its ep group, on their NVLink (the group inside
// one NVLink domain) or NIC links, so it contends with the pipeline transfers and gradient reductions on
// those links and waits for its slowest member, as NCCL's all-to-all does. F&B blocks and ZeRO-3's
// per-layer ops keep theirs inside the compute (fixed-length, as priced).
#include <algorithm>
#include <cmath>
#include <map>

#include "util/error.hpp"
#include "sim/engine/job_builder.hpp"

namespace tessel::engine::detail {

using sched::ActionType;

JobBuilder::JobBuilder(const JobSpec& spec, const Cluster& c)
    : spec_(spec), costs_(*spec.costs), l_(*spec.layout), s_(*spec.schedule), c_(c),
      g_(c.num_positions(), c.link_capacity()) {
  g_.overlap(spec.system->gpu.overlap_slowdown, c.num_positions());
  const int S = s_.num_stages, M = s_.num_microbatches;
  if (s_.num_ranks != l_.pp)
    throw InputError("schedule '" + s_.generator + "' has " + std::to_string(s_.num_ranks) + " ranks; the layout has pp " +
                     std::to_string(l_.pp));
  if (S != l_.num_stages())
    throw InputError("schedule '" + s_.generator + "' has " + std::to_string(S) + " stages; the layout has pp*vpp " +
                     std::to_string(l_.num_stages()));
  if (M != l_.num_microbatches())
    throw InputError("schedule '" + s_.generator + "' has " + std::to_string(M) +
                     " micro-batches; the layout has global_batch/(micro_batch*dp) " + std::to_string(l_.num_microbatches()));
  TESSEL_CHECK(costs_.work.stages.size() == static_cast<std::size_t>(S), "costs for " << costs_.work.stages.size() << " stages");
  p2p_near_s_ = costs_.work.p2p.seconds_within_node(c.flat_system());
  p2p_far_s_ = costs_.work.p2p.seconds_across_nodes(c.flat_system());
  tied_near_s_ = costs_.work.sync.tied.seconds_within_node(c.flat_system());
  tied_far_s_ = costs_.work.sync.tied.seconds_across_nodes(c.flat_system());
  zero3_gather_s_ = costs_.work.sync.zero3_gather.seconds(c.flat_system());
  zero3_scatter_s_ = costs_.work.sync.zero3_scatter.seconds(c.flat_system());
  st_.resize(static_cast<std::size_t>(c.num_positions()));
  transfer_.assign(2 * static_cast<std::size_t>(S) * M, kNone);
  slots_.resize(static_cast<std::size_t>(l_.pp));
  last_bwd_.assign(static_cast<std::size_t>(l_.pp), std::vector<std::size_t>(static_cast<std::size_t>(S), 0));
  for (int r = 0; r < l_.pp; ++r) {
    const auto& acts = s_.ranks[static_cast<std::size_t>(r)];
    for (std::size_t k = 0; k < acts.size(); ++k) {
      const auto& a = acts[k];
      if (a.type == ActionType::RECOMPUTE) explicit_recompute_ = true;
      auto note = [&](const sched::Action& x) {
        if (x.type == ActionType::B || x.type == ActionType::W) last_bwd_[static_cast<std::size_t>(r)][static_cast<std::size_t>(x.stage)] = k;
      };
      note(a);
      for (const auto& sub : a.sub) note(sub);
    }
  }
  if (l_.ep > 1 && l_.zero_stage < 3 && costs_.work.model.moe.enabled()) {
    for (auto& v : a2a_) v.resize(static_cast<std::size_t>(S));
    job_.forward_compute.resize(static_cast<std::size_t>(S));
    for (int st = 0; st < S; ++st) {
      const auto k = static_cast<std::size_t>(st);
      a2a_[a2a_forward][k].cuts = a2a_cuts(costs_, l_, st, true);
      a2a_[a2a_input][k].cuts = a2a_cuts(costs_, l_, st, false);
      // Full recompute replays the first recomputed_layers' forward, all-to-alls included (selective replays
      // the attention core only: none).
      if (l_.recompute == Recompute::full && stage(st).recompute > 0)
        a2a_[a2a_recompute][k].cuts = a2a_cuts(costs_, l_, st, true, stage(st).recomputed_layers);
      for (auto& v : a2a_) {
        // Each flow's uncontended time: the cost model's on the flat system, as every flow's.
        for (auto& x : v[k].cuts) {
          x.flat_seconds = cost::collective_time(c.flat_system(), x.op->coll, x.op->comm_bytes, x.op->group, 1.0, x.op->deepep).seconds;
          v[k].seconds += x.seconds;
        }
      }
      job_.forward_compute[k] = stage(st).f - a2a_[a2a_forward][k].seconds;
      job_.ep_flows = job_.ep_flows || a2a_of(a2a_forward, st) || a2a_of(a2a_input, st);
    }
    // A flow per all-to-all cuts each MoE op into as many pieces. Past spec.ep_piece_budget pieces in all
    // (DeepSeek-V3 on 2,048 GPUs in cluster fidelity would have 3.6 M), each op's all-to-alls become one flow
    // at its end: the same seconds on the same links, contending with the same traffic, without the
    // per-layer timeline.
    double extra = 0;
    const auto pieces = [&](A2aOp op, std::size_t k) { return 2.0 * static_cast<double>(a2a_[op][k].cuts.size()); };
    for (int r = 0; r < l_.pp; ++r)
      for (const auto& a : s_.ranks[static_cast<std::size_t>(r)]) {
        const auto k = static_cast<std::size_t>(a.stage);
        if (a.type == ActionType::F) extra += pieces(a2a_forward, k);
        if (a.type == ActionType::B || a.type == ActionType::I) extra += pieces(a2a_input, k);
        // The recompute before an input gradient, or a schedule's own RECOMPUTE action.
        if ((!explicit_recompute_ && (a.type == ActionType::B || a.type == ActionType::I)) || a.type == ActionType::RECOMPUTE)
          extra += pieces(a2a_recompute, k);
      }
    extra *= static_cast<double>(c.replicas() * l_.cp);
    if (extra > spec.ep_piece_budget) {
      job_.ep_coalesced = true;
      for (auto& v : a2a_)
        for (auto& sa : v) {
          if (sa.cuts.empty()) continue;
          A2aCut all{std::numeric_limits<double>::infinity(), 0, 0, -1, "ep_alltoall", nullptr};
          for (const auto& x : sa.cuts) {
            all.seconds += x.seconds;
            all.bytes += x.bytes;
            all.flat_seconds += x.flat_seconds;
          }
          sa.cuts.assign(1, all);
        }
    }
  }
  // Room for the graph up front (an estimate, about twice what a MoE step uses: untouched room costs no
  // memory), so the arrays are not copied as they grow; the task infos too (56 bytes a task).
  const std::size_t tasks = s_.num_actions() * static_cast<std::size_t>(c.replicas() * l_.cp) * 2;
  g_.reserve(tasks, 2 * tasks);
  job_.info.reserve(tasks);
}

std::uint32_t JobBuilder::compute_task(int pos, OpKind op, double seconds, int stage, int mb) {
  PositionState& ps = st_[static_cast<std::size_t>(pos)];
  const auto t = g_.add_fixed(seconds);
  g_.compute_on(t, pos);
  TaskInfo ti;
  ti.pos = pos;
  ti.op = op;
  ti.stage = stage;
  ti.mb = mb;
  job_.info.push_back(ti);
  if (ps.prev_compute != kNone) g_.edge(ps.prev_compute, t);
  for (auto w : ps.wait) g_.edge(w, t);
  ps.wait.clear();
  ps.prev_compute = t;
  ps.tail_flow = kNone;
  return t;
}

// Frees what the forward of (stage, mb) allocated, at the end of `task`: the logits with the input-grad
// (B or I) of the last stage, everything else with the op that ends the micro-batch's backward (B or W).
void JobBuilder::release(std::uint32_t task, int pos, const sched::Action& a) {
  const StageWork& sc = stage(a.stage);
  const bool last = a.stage == s_.num_stages - 1;
  double bytes = 0;
  if (a.type == ActionType::B || a.type == ActionType::I) bytes += last ? sc.act_extra_bytes : 0.0;
  if (a.type == ActionType::B || a.type == ActionType::W) bytes += sc.act_bytes + (last ? 0.0 : sc.act_extra_bytes);
  if (bytes > 0) g_.memory(task, pos, 0, -bytes);
}

void JobBuilder::emit_backward(int pos, const sched::Action& a, bool last_for_stage) {
  const StageWork& sc = stage(a.stage);
  const bool input = a.type == ActionType::B || a.type == ActionType::I;
  const bool weight = a.type == ActionType::B || a.type == ActionType::W;
  if (input && sc.recompute > 0 && !explicit_recompute_) recompute_task(pos, a.stage, a.mb);
  const double secs = (input ? sc.i - sc.recompute : 0.0) + (weight ? sc.w : 0.0);
  const OpKind op = a.type == ActionType::B ? OpKind::backward : a.type == ActionType::I ? OpKind::input_grad : OpKind::weight_grad;
  if (l_.zero_stage == 3 && input) {
    emit_zero3_layers(pos, op, secs, a);
    release(st_[static_cast<std::size_t>(pos)].prev_compute, pos, a);
    return;
  }
  // The last weight-gradient op of a stage is cut into bucket-sized pieces: each bucket's reduction can
  // start when its piece ends (Megatron's overlap_grad_reduce hooks fire as the gradients are final).
  // ZeRO-2 reduces every micro-batch's gradient (it keeps no whole gradient to accumulate into), so every
  // weight-gradient op is cut.
  // A stage of one bucket or less is one piece, and its reduction starts when the op ends.
  const bool ready = (last_for_stage || l_.zero_stage == 2) && weight && l_.overlap_grad_reduce &&
                     l_.dp * l_.cp > 1 && l_.zero_stage < 3;
  const int pieces = ready ? grad_buckets(sc.params) : 1;
  if (const StageA2a* x = input ? a2a_of(a2a_input, a.stage) : nullptr) {
    const auto ends = emit_pieces(pos, op, secs - x->seconds, a.stage, a.mb, x->cuts, pieces, ready, sc.params);
    release(ends.second, pos, a);
    return;
  }
  std::uint32_t t = kNone;
  for (int k = 0; k < pieces; ++k) {
    t = compute_task(pos, op, secs / pieces, a.stage, a.mb);
    job_.info.back().piece = k;
    job_.info.back().pieces = pieces;
    if (ready) st_[static_cast<std::size_t>(pos)].grads.push_back({t, sc.params / pieces});
  }
  release(t, pos, a);
}

void JobBuilder::recompute_task(int pos, int stage_index, int mb) {
  const double secs = stage(stage_index).recompute;
  if (const StageA2a* x = a2a_of(a2a_recompute, stage_index))
    emit_pieces(pos, OpKind::recompute, secs - x->seconds, stage_index, mb, x->cuts, 1, false, 0);
  else
    compute_task(pos, OpKind::recompute, secs, stage_index, mb);
}

std::pair<std::uint32_t, std::uint32_t> JobBuilder::emit_pieces(int pos, OpKind op, double seconds, int stage, int mb,
                                                                 const std::vector<A2aCut>& cuts, int buckets,
                                                                 bool ready, double params) {
  // Marks along the op's compute: all-to-alls where they start, bucket ends; at a tie the bucket ends first
  // (its gradients are final before the all-to-all that follows).
  std::vector<PieceMark>& marks = scratch_marks_;
  marks.clear();
  for (std::size_t i = 0; i < cuts.size(); ++i) marks.push_back({std::clamp(cuts[i].at, 0.0, seconds), false, i});
  for (int k = 0; k < buckets; ++k) marks.push_back({seconds * (k + 1) / buckets, true, static_cast<std::size_t>(k)});
  std::stable_sort(marks.begin(), marks.end(),
                   [](const PieceMark& a, const PieceMark& b) { return a.at != b.at ? a.at < b.at : a.bucket && !b.bucket; });
  PositionState& ps = st_[static_cast<std::size_t>(pos)];
  std::vector<std::size_t>& infos = scratch_infos_;
  infos.clear();
  std::int32_t bucket = 0;
  std::uint32_t first = kNone, last = kNone;
  bool after_flow = true;  // the last task emitted for this op is not one of its compute pieces
  std::uint32_t flow = kNone;
  double cursor = 0;
  auto piece = [&](double secs) {
    last = compute_task(pos, op, std::max(0.0, secs), stage, mb);
    job_.info.back().piece = bucket;
    infos.push_back(job_.info.size() - 1);
    if (first == kNone) first = last;
    after_flow = false;
  };
  for (const PieceMark& m : marks) {
    if (m.at > cursor || (m.bucket && after_flow)) piece(m.at - cursor);
    cursor = std::max(cursor, m.at);
    if (m.bucket) {
      if (ready) ps.grads.push_back({last, params / buckets});
      ++bucket;
    } else {
      flow = a2a_flow(pos, cuts[m.i], stage, mb);
      after_flow = true;
    }
  }
  // An op whose last part is an all-to-all ends on it: what waits for the op (its send, the next compute)
  // waits for the flow.
  if (after_flow) ps.tail_flow = flow;
  // Numbered by gradient bucket, as an op without all-to-alls: the trace draws one event per number.
  for (std::size_t k : infos) job_.info[k].pieces = buckets;
  return {first, last};
}

// The ep group of a position: the positions of its pipeline rank whose first GPU falls in the same block of
// ep x etp consecutive ranks (Megatron's expert order: etp fastest, then ep). A group narrower than tp lies
// inside the position (its tp GPUs hold tp / (ep x etp) groups, folded like its TP collectives).
int JobBuilder::ep_group_of(int pos) {
  if (ep_group_.empty()) ep_group_.assign(static_cast<std::size_t>(c_.num_positions()), -1);
  if (ep_group_[static_cast<std::size_t>(pos)] >= 0) return ep_group_[static_cast<std::size_t>(pos)];
  const int r = c_.pp_of(pos);
  const int base = l_.tp * l_.cp * l_.dp * r, block = l_.ep * l_.expert_tp();
  std::map<int, int> of_block;
  for (int d = 0; d < c_.replicas(); ++d)
    for (int cp = 0; cp < l_.cp; ++cp) {
      const int p = c_.position(r, d, cp);
      const int b = (c_.global_rank(p) - base) / block;
      auto [it, fresh] = of_block.try_emplace(b, static_cast<int>(job_.groups.size()));
      if (fresh) {
        job_.groups.emplace_back();
        ep_slots_.resize(job_.groups.size());
        ep_first_rank_.resize(job_.groups.size());
        ep_first_rank_[static_cast<std::size_t>(it->second)] = base + b * block;
      }
      job_.groups[static_cast<std::size_t>(it->second)].push_back(p);
      ep_group_[static_cast<std::size_t>(p)] = it->second;
    }
  return ep_group_[static_cast<std::size_t>(pos)];
}

// The position's next all-to-all: created by the group's first member, shared by the others (every member
// plays the same pipeline rank's schedule, so their all-to-alls line up). It starts when every member has
// finished the compute before it and received what that compute waited for, and the member's next piece
// waits for it.
std::uint32_t JobBuilder::a2a_flow(int pos, const A2aCut& cut, int stage, int mb) {
  PositionState& ps = st_[static_cast<std::size_t>(pos)];
  const int group = ep_group_of(pos);
  auto& slots = ep_slots_[static_cast<std::size_t>(group)];
  const std::uint32_t k = ps.ep_slot++;
  std::uint32_t t;
  if (k < slots.size()) {
    t = slots[k];
  } else {
    const int first = ep_first_rank_[static_cast<std::size_t>(group)];
    scratch_links_.clear();
    c_.group_links(job_.groups[static_cast<std::size_t>(group)], first, first + l_.ep * l_.expert_tp() - 1, scratch_links_);
    t = g_.add_flow(cut.flat_seconds, scratch_links_);
    TaskInfo ti;
    ti.pos = pos;
    ti.group = group;
    ti.op = OpKind::ep_alltoall;
    ti.stream = trace::Stream::tp;  // where the runtime records it
    ti.stage = stage;
    ti.mb = mb;
    ti.layer = cut.layer;
    ti.what = cut.what;
    ti.bytes = cut.bytes;
    job_.info.push_back(ti);
    slots.push_back(t);
  }
  if (ps.prev_compute != kNone) g_.edge(ps.prev_compute, t);
  for (auto w : ps.wait) g_.edge(w, t);
  ps.wait.assign(1, t);
  return t;
}

void JobBuilder::walk_compute(int pos, const sched::Action& a, std::size_t index) {
  const auto r = static_cast<std::size_t>(c_.pp_of(pos));
  switch (a.type) {
    case ActionType::F: {
      const StageWork& sc = stage(a.stage);
      if (l_.zero_stage == 3) {
        const auto first = emit_zero3_layers(pos, OpKind::forward, sc.f, a);
        g_.memory(first, pos, sc.act_bytes + sc.act_extra_bytes, 0);
        return;
      }
      const StageA2a* x = a2a_of(a2a_forward, a.stage);
      const auto t = x ? emit_pieces(pos, OpKind::forward, sc.f - x->seconds, a.stage, a.mb, x->cuts, 1, false, 0).first
                       : compute_task(pos, OpKind::forward, sc.f, a.stage, a.mb);
      g_.memory(t, pos, sc.act_bytes + sc.act_extra_bytes, 0);
      return;
    }
    case ActionType::B:
    case ActionType::I:
    case ActionType::W:
      emit_backward(pos, a, last_bwd_[r][static_cast<std::size_t>(a.stage)] == index);
      return;
    case ActionType::RECOMPUTE:
      recompute_task(pos, a.stage, a.mb);
      return;
    case ActionType::OVERLAP_F_B: {
      // DualPipe's F&B: one op running both parts; under the all-to-all overlap each part's expert all-to-alls
      // hide under the other's compute (workload.hpp fb_block).
      TESSEL_CHECK(a.sub.size() == 2 && a.sub[0].type == ActionType::F &&
                       (a.sub[1].type == ActionType::B || a.sub[1].type == ActionType::I),
                   "an F&B block is a forward and a backward, got " << a.token());
      const FbBlock fb = fb_block(stage(a.sub[0].stage), stage(a.sub[1].stage), a.sub[1].type != ActionType::I, l_.a2a_overlap);
      const double secs = fb.serial - fb.hidden / (1.0 + c_.flat_system().gpu.overlap_slowdown);
      const auto t = compute_task(pos, OpKind::overlap_f_b, secs, a.sub[0].stage, a.sub[0].mb);
      const StageWork& fc = stage(a.sub[0].stage);
      g_.memory(t, pos, fc.act_bytes + fc.act_extra_bytes, 0);
      release(t, pos, a.sub[1]);
      if ((last_bwd_[r][static_cast<std::size_t>(a.sub[1].stage)] == index || l_.zero_stage == 2) &&
          a.sub[1].type != ActionType::I && l_.dp * l_.cp > 1)
        st_[static_cast<std::size_t>(pos)].grads.push_back(
            {t, stage(a.sub[1].stage).params});
      return;
    }
    default:
      throw InputError("schedule action '" + a.token() + "' is not simulated (REDUCE_GRAD, X_OPTIMIZER_STEP, UNSHARD and "
                       "RESHARD come from the layout, not the schedule file)");
  }
}

void JobBuilder::walk_comm(int pos, const sched::Action& a) {
  const bool fwd = a.type == ActionType::SEND_F || a.type == ActionType::RECV_F;
  const bool send = sched::is_send(a.type);
  const int producer = send ? a.stage : (fwd ? a.stage - 1 : a.stage + 1);
  const int consumer = fwd ? producer + 1 : producer - 1;
  if (producer < 0 || producer >= s_.num_stages || consumer < 0 || consumer >= s_.num_stages)
    throw InputError("schedule action '" + a.token() + "' has no peer stage");
  const std::size_t key = (static_cast<std::size_t>(fwd ? 0 : 1) * s_.num_stages + producer) * s_.num_microbatches + a.mb;
  PositionState& ps = st_[static_cast<std::size_t>(pos)];
  std::uint32_t& t = transfer_[key];
  if (t == kNone) {
    const int d = c_.dp_of(pos), cp = c_.cp_of(pos);
    const int from = c_.position(s_.rank_of(producer), d, cp), to = c_.position(s_.rank_of(consumer), d, cp);
    scratch_links_.clear();
    c_.p2p_links(from, to, scratch_links_);
    t = g_.add_flow(c_.same_node(from, to) ? p2p_near_s_ : p2p_far_s_, scratch_links_);
    TaskInfo ti;
    ti.pos = from;
    ti.peer = to;
    ti.op = OpKind::transfer;
    ti.stream = trace::Stream::pp;
    ti.stage = producer;
    ti.peer_stage = consumer;
    ti.mb = a.mb;
    ti.bytes = costs_.work.p2p.bytes;
    job_.info.push_back(ti);
  }
  // The transfer starts when the producer's output exists; the consumer waits for it, and so does the
  // sender's next compute unless p2p overlaps.
  if (send && ps.prev_compute != kNone) g_.edge(ps.prev_compute, t);
  if (send && ps.tail_flow != kNone) g_.edge(ps.tail_flow, t);
  if (!send || !l_.overlap_p2p) ps.wait.push_back(t);
}

void JobBuilder::walk_position(int pos) {
  const auto& acts = s_.ranks[static_cast<std::size_t>(c_.pp_of(pos))];
  for (std::size_t k = 0; k < acts.size(); ++k) {
    if (sched::is_comm(acts[k].type)) walk_comm(pos, acts[k]);
    else walk_compute(pos, acts[k], k);
  }
}

Job JobBuilder::build() {
  job_.groups.clear();
  for (int d = 0; d < c_.replicas(); ++d)
    for (int cp = 0; cp < l_.cp; ++cp) {
      std::fill(transfer_.begin(), transfer_.end(), kNone);
      for (int r = 0; r < l_.pp; ++r) walk_position(c_.position(r, d, cp));
    }
  job_.step_end.assign(static_cast<std::size_t>(c_.num_positions()), kNone);
  job_.static_bytes.assign(static_cast<std::size_t>(c_.num_positions()), 0.0);
  for (int pos = 0; pos < c_.num_positions(); ++pos) data_parallel(pos);
  job_.graph = g_.finish();
  TESSEL_CHECK(job_.info.size() == job_.graph.size(), job_.info.size() << " infos for " << job_.graph.size() << " tasks");
  return std::move(job_);
}

}  // namespace tessel::engine::detail

namespace tessel::engine {

std::vector<A2aCut> a2a_cuts(const StepCosts& costs, const Layout& l, int stage, bool forward, int recomputed) {
  std::vector<A2aCut> out;
  const Workload& w = costs.work;
  if (l.ep <= 1 || w.stages[static_cast<std::size_t>(stage)].moe_layers == 0) return out;
  double a2a = 0;  // the all-to-alls before: their time is not the compute's
  w.walk_stage_ops(stage, forward, [&](int k, const cost::WorkOp& op, double t) {
    const double d = forward ? op.t_f : op.t_i;
    if (op.cls == cost::OpClass::collective && op.coll == cost::Collective::all_to_all && d > 0) {
      out.push_back({t - a2a, d, op.comm_bytes, k, op.name, &op});
      a2a += d;
    }
  }, recomputed);
  return out;
}

Job build_job(const JobSpec& spec, const Cluster& cluster) {
  detail::JobBuilder b(spec, cluster);
  return b.build();
}

}  // namespace tessel::engine
