// lower(): insert SEND/RECV between adjacent stages on different ranks.
#include <algorithm>
#include <string>

#include "models/util/error.hpp"
#include "sim/schedule/schedule.hpp"

namespace tessel::sched {

namespace {

bool is_backward(ActionType t) { return t == ActionType::B || t == ActionType::I; }

// The RECVs one compute needs before it starts, and the SENDs its outputs need after it ends.
void comm_of(const Schedule& s, const Action& a, std::vector<Action>& recvs, std::vector<Action>& sends) {
  if (a.type == ActionType::OVERLAP_F_B) {
    for (const auto& sub : a.sub) comm_of(s, sub, recvs, sends);
    return;
  }
  const int r = s.rank_of(a.stage), last = s.num_stages - 1;
  auto add = [&](std::vector<Action>& v, ActionType t, int peer_stage) {
    Action c = make(t, a.stage, a.mb);
    c.peer = s.rank_of(peer_stage);
    if (c.peer != r) v.push_back(c);
  };
  if (a.type == ActionType::F) {
    if (a.stage > 0) add(recvs, ActionType::RECV_F, a.stage - 1);
    if (a.stage < last) add(sends, ActionType::SEND_F, a.stage + 1);
  } else if (is_backward(a.type)) {
    if (a.stage < last) add(recvs, ActionType::RECV_B, a.stage + 1);
    if (a.stage > 0) add(sends, ActionType::SEND_B, a.stage - 1);
  }
}


// Position of a comm op in the Megatron order for this rank's parity (lower goes first).
int parity_rank(const Action& a, int rank) {
  const bool even = rank % 2 == 0;
  switch (a.type) {
    case ActionType::SEND_F: return even ? 0 : 1;
    case ActionType::RECV_F: return even ? 1 : 0;
    case ActionType::SEND_B: return even ? 2 : 3;
    default: return even ? 3 : 2;  // RECV_B
  }
}

bool has_part(const Action& a, bool forward) {
  if (a.type == ActionType::OVERLAP_F_B) return true;  // one F and one backward
  return forward ? a.type == ActionType::F : is_backward(a.type);
}

// early: a compute's RECV_F goes right after this rank's previous forward (its RECV_B after the previous
// backward), as Megatron posts the next input's recv together with the current output's send
// (send_forward_recv_forward); otherwise right before the compute.
Schedule lower_with(const Schedule& in, GapOrder order, bool early) {
  Schedule out = in;
  for (int r = 0; r < in.num_ranks; ++r) {
    const auto& src = in.ranks[r];
    std::vector<std::vector<Action>> gaps(src.size() + 1);  // gaps[i] runs just before src[i]
    int last_fwd = -1, last_bwd = -1;
    for (std::size_t i = 0; i < src.size(); ++i) {
      const Action& a = src[i];
      if (is_comm(a.type))
        throw InputError("lower: rank " + std::to_string(r) + " action " + std::to_string(i) + " '" + a.token() +
                         "': the schedule is already lowered (compute-only input required)");
      std::vector<Action> recvs, sends;
      comm_of(in, a, recvs, sends);
      for (const auto& rv : recvs) {
        const int prev = rv.type == ActionType::RECV_F ? last_fwd : last_bwd;
        gaps[early && prev >= 0 ? static_cast<std::size_t>(prev + 1) : i].push_back(rv);
      }
      gaps[i + 1].insert(gaps[i + 1].end(), sends.begin(), sends.end());
      if (has_part(a, true)) last_fwd = static_cast<int>(i);
      if (has_part(a, false)) last_bwd = static_cast<int>(i);
    }
    auto& dst = out.ranks[r];
    dst.clear();
    for (std::size_t i = 0; i <= src.size(); ++i) {
      auto& gap = gaps[i];
      // SendsFirst: a gap's sends come from src[i-1] and were pushed before any recv of a later op.
      std::stable_sort(gap.begin(), gap.end(), [&](const Action& x, const Action& y) {
        if (order == GapOrder::Parity) return parity_rank(x, r) < parity_rank(y, r);
        return is_send(x.type) && !is_send(y.type);
      });
      dst.insert(dst.end(), gap.begin(), gap.end());
      if (i < src.size()) dst.push_back(src[i]);
    }
  }
  return out;
}

}  // namespace

Schedule lower(const Schedule& in, GapOrder order) {
  if (order != GapOrder::Auto) return lower_with(in, order, false);
  // Candidates from most to least forgiving of the runtime; the first deadlock-free under blocking
  // rendezvous wins, then under batched; just-in-time sends-first is always eager-safe.
  const std::pair<GapOrder, bool> candidates[] = {
      {GapOrder::Parity, false}, {GapOrder::Parity, true}, {GapOrder::SendsFirst, true}, {GapOrder::SendsFirst, false}};
  for (CommModel model : {CommModel::Blocking, CommModel::Batched}) {
    ValidateOptions vo;
    vo.comm = model;
    vo.max_violations = 1;
    for (const auto& [o, early] : candidates) {
      Schedule cand = lower_with(in, o, early);
      if (validate(cand, vo).ok()) return cand;
    }
  }
  return lower_with(in, GapOrder::SendsFirst, false);
}

Schedule strip_comms(const Schedule& in) {
  Schedule out = in;
  for (auto& rank : out.ranks) std::erase_if(rank, [](const Action& a) { return is_comm(a.type); });
  return out;
}

}  // namespace tessel::sched
