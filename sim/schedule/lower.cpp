// lower(): insert SEND/RECV between adjacent stages on different ranks.
//
// The default (GapOrder::Auto) orders every rank's comm ops by one global key, as ZB's
// reorder_communication does (Qi et al. 2024, zero-bubble repo passes.py; reference/schedules.md): a
// SEND and its RECV share the key (t, pair), where t is the time its producer ends in a unit-cost eager
// simulation of the compute-only schedule and pair names the transfer. Each op goes into the gap before
// the first compute of its rank that starts at or after t. Why this never deadlocks, under any of the
// three comm models: along any rank the keys of its comm ops increase, and a rendezvous joins two ops of
// the same key, so a wait-for cycle would have to come back to a smaller key. Blocking rendezvous has a
// path for every edge of batched and eager, so one lowering serves all three.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "util/error.hpp"
#include "sim/schedule/hb_graph.hpp"

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

void require_compute_only(const Schedule& in) {
  for (int r = 0; r < in.num_ranks; ++r)
    for (std::size_t i = 0; i < in.ranks[static_cast<std::size_t>(r)].size(); ++i)
      if (const Action& a = in.ranks[static_cast<std::size_t>(r)][i]; is_comm(a.type))
        throw InputError("lower: rank " + std::to_string(r) + " action " + std::to_string(i) + " '" + a.token() +
                         "': the schedule is already lowered (compute-only input required)");
}

// Just in time: each gap holds the sends of the compute before it and the recvs of the compute after it.
Schedule lower_local(const Schedule& in, GapOrder order) {
  Schedule out = in;
  for (int r = 0; r < in.num_ranks; ++r) {
    const auto& src = in.ranks[static_cast<std::size_t>(r)];
    auto& dst = out.ranks[static_cast<std::size_t>(r)];
    dst.clear();
    std::vector<Action> gap;  // sends of the previous compute
    for (const Action& a : src) {
      std::vector<Action> recvs, sends;
      comm_of(in, a, recvs, sends);
      gap.insert(gap.end(), recvs.begin(), recvs.end());  // sends were pushed first: SendsFirst as is
      if (order == GapOrder::Parity)
        std::stable_sort(gap.begin(), gap.end(),
                         [&](const Action& x, const Action& y) { return parity_rank(x, r) < parity_rank(y, r); });
      dst.insert(dst.end(), gap.begin(), gap.end());
      dst.push_back(a);
      gap = std::move(sends);
    }
    dst.insert(dst.end(), gap.begin(), gap.end());
  }
  return out;
}

// A transfer's identity, the same on both sides: (direction, producing stage, micro-batch).
using PairId = std::tuple<int, int, int>;
PairId pair_of(const Action& c) {
  switch (c.type) {
    case ActionType::SEND_F: return {0, c.stage, c.mb};
    case ActionType::RECV_F: return {0, c.stage - 1, c.mb};
    case ActionType::SEND_B: return {1, c.stage, c.mb};
    default: return {1, c.stage + 1, c.mb};  // RECV_B names the consuming stage
  }
}

struct Placed {
  double t;     // the producer's end time: the key shared by both sides
  PairId pair;
  std::size_t gap;  // inserted before the rank's compute number `gap`
  Action op;
};

// Requires a compute-only schedule that validate() accepts under eager comms.
Schedule lower_timed(const Schedule& in) {
  const SimResult sim = detail::simulate_valid(in, Costs{}, CommModel::Eager);
  const auto R = static_cast<std::size_t>(in.num_ranks);
  std::vector<std::vector<Placed>> placed(R);
  std::map<PairId, double> send_time;
  std::vector<std::vector<std::pair<std::size_t, Action>>> recvs_of(R);  // (consumer index, recv)
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t i = 0; i < in.ranks[r].size(); ++i) {
      std::vector<Action> recvs, sends;
      comm_of(in, in.ranks[r][i], recvs, sends);
      for (auto& sd : sends) {
        const double t = sim.times[r][i].end;
        send_time[pair_of(sd)] = t;
        placed[r].push_back({t, pair_of(sd), i + 1, sd});
      }
      for (auto& rv : recvs) recvs_of[r].push_back({i, rv});
    }
  for (std::size_t r = 0; r < R; ++r)
    for (auto& [consumer, rv] : recvs_of[r]) {
      const double t = send_time.at(pair_of(rv));
      // First compute that starts at or after the data exists; the consumer itself at the latest.
      std::size_t g = 0;
      while (g < consumer && sim.times[r][g].start < t) ++g;
      placed[r].push_back({t, pair_of(rv), g, rv});
    }
  Schedule out = in;
  for (std::size_t r = 0; r < R; ++r) {
    auto& ops = placed[r];
    std::sort(ops.begin(), ops.end(), [](const Placed& a, const Placed& b) {
      return std::tie(a.t, a.pair, a.op.type) < std::tie(b.t, b.pair, b.op.type);
    });
    auto& dst = out.ranks[r];
    dst.clear();
    std::size_t next = 0;
    for (std::size_t i = 0; i <= in.ranks[r].size(); ++i) {
      for (; next < ops.size() && ops[next].gap == i; ++next) dst.push_back(ops[next].op);
      if (i < in.ranks[r].size()) dst.push_back(in.ranks[r][i]);
    }
    // Gaps never decrease in key order (send gap = first compute starting at or after its producer's
    // end, which is the recvs' rule too), so every op was emitted.
    TESSEL_CHECK(next == ops.size(), "lower: rank " << r << " comm ops out of key order at " << ops[next].op.token());
  }
  return out;
}

}  // namespace

Schedule lower(const Schedule& in, GapOrder order) {
  require_compute_only(in);
  Schedule out;
  if (order != GapOrder::Auto) {
    out = lower_local(in, order);
  } else {
    ValidateOptions vo;
    vo.max_violations = 1;
    // An invalid compute order has no timing to derive keys from: lower it just in time and let
    // validate() report what is wrong with it.
    out = validate(in, vo).ok() ? lower_timed(in) : lower_local(in, GapOrder::SendsFirst);
  }
  TESSEL_CHECK(strip_comms(out).ranks == in.ranks, "lower changed the compute order of schedule " << in.generator);
  out.cells.clear();
  return out;
}

Schedule strip_comms(const Schedule& in) {
  Schedule out = in;
  for (auto& rank : out.ranks) std::erase_if(rank, [](const Action& a) { return is_comm(a.type) || is_wait_send(a.type); });
  out.cells.clear();
  return out;
}

}  // namespace tessel::sched
