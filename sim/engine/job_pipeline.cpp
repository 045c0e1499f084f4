// build_job, part 1: each position walks its pipeline rank's lowered action list. Compute ops chain on the
// compute stream; a SEND/RECV pair is one transfer flow that starts when its producer ends (NCCL's send
// is posted right after the producing op, and a recv posted earlier never holds it: the schedule
// validator's "eager" model). The consumer waits for the transfer. Without --overlap-p2p-comm the sender's
// next op waits for it too (Megatron waits on the batch_isend_irecv requests before the next step), which
// is the steady-state exposure estimate.cpp counts; a rendezvous (the sender held until the receiver posts)
// is not modelled, because Megatron posts matching pairs together in the 1F1B steady state.
#include <algorithm>
#include <cmath>

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
  p2p_s_ = costs_.work.p2p.seconds(c.flat_system());
  tied_s_ = costs_.work.sync.tied.seconds(c.flat_system());
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
  std::size_t actions = s_.num_actions();
  g_.reserve(actions * static_cast<std::size_t>(c.replicas() * l_.cp) * 2, actions * static_cast<std::size_t>(c.replicas() * l_.cp) * 4);
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
  if (input && sc.recompute > 0 && !explicit_recompute_)
    compute_task(pos, OpKind::recompute, sc.recompute, a.stage, a.mb);
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
  std::uint32_t t = kNone;
  for (int k = 0; k < pieces; ++k) {
    t = compute_task(pos, op, secs / pieces, a.stage, a.mb);
    job_.info.back().piece = k;
    job_.info.back().pieces = pieces;
    if (ready) st_[static_cast<std::size_t>(pos)].grads.push_back({t, sc.params / pieces});
  }
  release(t, pos, a);
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
      const auto t = compute_task(pos, OpKind::forward, sc.f, a.stage, a.mb);
      g_.memory(t, pos, sc.act_bytes + sc.act_extra_bytes, 0);
      return;
    }
    case ActionType::B:
    case ActionType::I:
    case ActionType::W:
      emit_backward(pos, a, last_bwd_[r][static_cast<std::size_t>(a.stage)] == index);
      return;
    case ActionType::RECOMPUTE:
      compute_task(pos, OpKind::recompute, stage(a.stage).recompute, a.stage, a.mb);
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
    t = g_.add_flow(p2p_s_, scratch_links_);
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

Job build_job(const JobSpec& spec, const Cluster& cluster) {
  detail::JobBuilder b(spec, cluster);
  return b.build();
}

}  // namespace tessel::engine
