// validate(): the invariants of reference/schedules.md, cheapest first. Later checks assume earlier ones
// hold (the deadlock graph needs matched send/recv), so they run only on a schedule that passed them.
#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <string>
#include <utility>

#include "sim/schedule/hb_graph.hpp"

namespace tessel::sched {

namespace {

using detail::OpIndex;
using detail::OpRef;
using detail::where;

struct Report {
  ValidationReport& out;
  std::size_t max;
  const Schedule& s;
  void add(const std::string& rule, const std::string& msg) {
    if (out.violations.size() < max) out.violations.push_back({rule, msg});
  }
  // A violation at one action: its rank and index, and where it is in the file it came from.
  void add_at(OpRef at, const std::string& rule, const std::string& msg) {
    if (out.violations.size() >= max) return;
    Violation v{rule, msg};
    v.rank = at.rank;
    v.index = at.pos;
    if (at.rank >= 0 && static_cast<std::size_t>(at.rank) < s.cells.size() &&
        at.pos >= 0 && static_cast<std::size_t>(at.pos) < s.cells[static_cast<std::size_t>(at.rank)].size()) {
      v.line = at.rank + 1;
      v.cell = s.cells[static_cast<std::size_t>(at.rank)][static_cast<std::size_t>(at.pos)];
    }
    out.violations.push_back(std::move(v));
  }
  bool full() const { return out.violations.size() >= max; }
};

std::string key(ActionType t, int stage, int mb) { return make(t, stage, mb).token(); }

// 1. Sizes, index ranges, placement (pytorch/torchtitan#774: ZBV run on loop placement).
void check_structure(const Schedule& s, Report& rep) {
  if (s.num_ranks < 1 || static_cast<int>(s.ranks.size()) != s.num_ranks)
    rep.add("structure", "schedule has " + std::to_string(s.ranks.size()) + " rank rows, expected num_ranks = " +
                             std::to_string(s.num_ranks));
  if (static_cast<int>(s.stage_to_rank.size()) != s.num_stages || s.num_stages < 1) {
    rep.add("structure", "stage_to_rank has " + std::to_string(s.stage_to_rank.size()) + " entries, expected " +
                             std::to_string(s.num_stages) + " stages");
    return;
  }
  for (int st = 0; st < s.num_stages; ++st)
    if (s.stage_to_rank[static_cast<std::size_t>(st)] < 0 || s.stage_to_rank[static_cast<std::size_t>(st)] >= s.num_ranks)
      rep.add("structure", "stage " + std::to_string(st) + " is placed on rank " +
                               std::to_string(s.stage_to_rank[static_cast<std::size_t>(st)]) + ", outside [0, " +
                               std::to_string(s.num_ranks) + ")");
  // Every rank runs its stages: a rank without actions is a blank or all-idle row (or a sidecar placing no
  // stage there), and its stages' work would be missing or on the wrong rank.
  for (int r = 0; r < static_cast<int>(s.ranks.size()); ++r)
    if (s.ranks[static_cast<std::size_t>(r)].empty())
      rep.add("structure", "rank " + std::to_string(r) + " has no actions (" +
                               (s.cells.empty() ? std::string("none is given for it") : "line " + std::to_string(r + 1) + " of the file is empty or holds only idle cells") + ")");
  auto check_one = [&](const Action& a, int r, int p) {
    const std::string at = "rank " + std::to_string(r) + " #" + std::to_string(p) + " '" + a.token() + "'" + detail::file_position(s, {r, p});
    if (a.stage < 0 || a.stage >= s.num_stages) return rep.add_at({r, p}, "structure", at + ": stage out of range [0, " + std::to_string(s.num_stages) + ")");
    if (s.rank_of(a.stage) != r)
      rep.add_at({r, p}, "structure", at + ": stage " + std::to_string(a.stage) + " belongs to rank " + std::to_string(s.rank_of(a.stage)) +
                               " under this placement (stage_to_rank must match where the stage runs)");
    const bool needs_mb = is_compute(a.type) || is_comm(a.type) || is_wait_send(a.type);
    if (needs_mb && (a.mb < 0 || a.mb >= s.num_microbatches))
      rep.add_at({r, p}, "structure", at + ": micro-batch out of range [0, " + std::to_string(s.num_microbatches) + ")");
    if (is_comm(a.type)) {
      const int peer_stage = (a.type == ActionType::SEND_F || a.type == ActionType::RECV_B) ? a.stage + 1 : a.stage - 1;
      if (peer_stage < 0 || peer_stage >= s.num_stages)
        rep.add_at({r, p}, "send-recv", at + ": no adjacent stage " + std::to_string(peer_stage) + " to communicate with");
      else if (s.rank_of(peer_stage) == r)
        rep.add_at({r, p}, "send-recv", at + ": stages " + std::to_string(a.stage) + " and " + std::to_string(peer_stage) +
                                 " share rank " + std::to_string(r) + "; same-rank edges pass tensors locally, no send/recv");
    }
  };
  for (int r = 0; r < static_cast<int>(s.ranks.size()); ++r)
    for (int p = 0; p < static_cast<int>(s.ranks[static_cast<std::size_t>(r)].size()); ++p) {
      const Action& a = s.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(p)];
      if (a.type == ActionType::OVERLAP_F_B)
        for (const auto& sub : a.sub) check_one(sub, r, p);
      else
        check_one(a, r, p);
    }
}

std::string refs(const Schedule& s, const std::vector<OpRef>& v) {
  std::string out;
  for (const auto& r : v) out += (out.empty() ? "" : ", ") + where(s, r);
  return out;
}

// 2. Completeness as multisets: per (stage, mb) one F and either one B or one I plus one W.
void check_completeness(const Schedule& s, const OpIndex& idx, Report& rep) {
  // Stops once the report is full: a sidecar may claim 2^24 micro-batches for a file that holds a few
  // actions, and every missing pair adds a violation, so this bounds the loop by the file's size.
  for (int st = 0; st < s.num_stages && !rep.full(); ++st)
    for (int i = 0; i < s.num_microbatches && !rep.full(); ++i) {
      const auto &f = idx.find(ActionType::F, st, i), &b = idx.find(ActionType::B, st, i),
                 &in = idx.find(ActionType::I, st, i), &w = idx.find(ActionType::W, st, i);
      for (auto [v, t] : {std::pair{&f, ActionType::F}, {&b, ActionType::B}, {&in, ActionType::I}, {&w, ActionType::W}})
        if (v->size() > 1) rep.add_at(v->at(1), "completeness", "duplicated action " + key(t, st, i) + " at " + refs(s, *v));
      if (f.empty()) rep.add("completeness", "missing forward " + key(ActionType::F, st, i));
      if (!w.empty() && in.empty()) rep.add_at(w[0], "completeness", "W without I: " + refs(s, w) + " has no " + key(ActionType::I, st, i));
      if (!in.empty() && w.empty()) rep.add_at(in[0], "completeness", "I without W: " + refs(s, in) + " has no " + key(ActionType::W, st, i));
      if (!b.empty() && !in.empty()) rep.add_at(b[0], "completeness", "both B and I for stage " + std::to_string(st) + " mb " + std::to_string(i) + ": " + refs(s, b) + " and " + refs(s, in));
      if (b.empty() && in.empty()) rep.add("completeness", "missing backward for stage " + std::to_string(st) + " mb " + std::to_string(i) + " (need " + key(ActionType::B, st, i) + " or " + key(ActionType::I, st, i) + " + " + key(ActionType::W, st, i) + ")");
    }
}

// REDUCE_GRAD and X_OPTIMIZER_STEP run once per stage and step (PyTorch adds one REDUCE_GRAD per stage after
// its last backward): a second one would reduce or apply the gradients twice. UNSHARD and RESHARD may repeat
// (FSDP reshards a stage between uses).
void check_once_per_stage(const Schedule& s, const OpIndex& idx, Report& rep) {
  std::map<std::pair<int, int>, std::vector<OpRef>> by_stage;  // (type, stage), over any micro-batch index
  for (const auto& [k, refs_] : idx.all()) {
    const auto t = static_cast<ActionType>(std::get<0>(k));
    if (t != ActionType::REDUCE_GRAD && t != ActionType::OPTIMIZER_STEP) continue;
    auto& v = by_stage[{std::get<0>(k), std::get<1>(k)}];
    v.insert(v.end(), refs_.begin(), refs_.end());
  }
  for (const auto& [k, v] : by_stage)
    if (v.size() > 1)
      rep.add_at(v[1], "completeness", "duplicated action " + make(static_cast<ActionType>(k.first), k.second).token() + " at " +
                                  refs(s, v) + " (once per stage and step)");
}

// 7. FSDP and gradient ops (reference/schedules.md invariant 7), on each rank in program order:
// - a stage with any UNSHARD or RESHARD has sharded parameters: it computes only between an UNSHARD and the
//   next RESHARD, never UNSHARDs twice in a row, and RESHARDs only what it unsharded (PyTorch's runtime
//   asserts the same: "unshard twice", "reshard without unshard");
// - REDUCE_GRAD of a stage follows every B and W of that stage (its gradients are complete only then), and
//   X_OPTIMIZER_STEP follows them and the stage's REDUCE_GRAD;
// - either every stage has a REDUCE_GRAD (an X_OPTIMIZER_STEP) or none does: a stage left out would never
//   reduce (apply) its gradients.
void check_fsdp(const Schedule& s, const OpIndex& idx, Report& rep) {
  std::vector<char> sharded(static_cast<std::size_t>(s.num_stages), 0);
  for (const auto& kv : idx.all()) {
    const auto t = static_cast<ActionType>(std::get<0>(kv.first));
    if (t == ActionType::UNSHARD || t == ActionType::RESHARD) sharded[static_cast<std::size_t>(std::get<1>(kv.first))] = 1;
  }
  for (int r = 0; r < s.num_ranks && !rep.full(); ++r) {
    std::map<int, int> unsharded_at;  // stage -> position of the UNSHARD in force
    std::vector<char> told(static_cast<std::size_t>(s.num_stages), 0);  // one sharded-compute report per stage
    const auto& acts = s.ranks[static_cast<std::size_t>(r)];
    for (int p = 0; p < static_cast<int>(acts.size()); ++p) {
      const Action& a = acts[static_cast<std::size_t>(p)];
      const std::string at = where(s, {r, p});
      if (a.type == ActionType::UNSHARD) {
        if (auto it = unsharded_at.find(a.stage); it != unsharded_at.end())
          rep.add_at({r, p}, "fsdp", at + " unshards stage " + std::to_string(a.stage) + " again; " + where(s, {r, it->second}) +
                              " already did, with no RESHARD between");
        unsharded_at[a.stage] = p;
      } else if (a.type == ActionType::RESHARD) {
        if (!unsharded_at.erase(a.stage))
          rep.add_at({r, p}, "fsdp", at + " reshards stage " + std::to_string(a.stage) + ", which is not unsharded here (RESHARD only after an UNSHARD)");
      } else if (is_compute(a.type)) {
        for (const auto& part : a.type == ActionType::OVERLAP_F_B ? a.sub : std::vector<Action>{a})
          if (sharded[static_cast<std::size_t>(part.stage)] && !unsharded_at.count(part.stage) &&
              !std::exchange(told[static_cast<std::size_t>(part.stage)], 1))
            rep.add_at({r, p}, "fsdp", at + " computes stage " + std::to_string(part.stage) +
                                " while its parameters are sharded (the stage has UNSHARD/RESHARD actions; compute needs an UNSHARD before it and no RESHARD between)");
      }
    }
  }
  for (const ActionType t : {ActionType::REDUCE_GRAD, ActionType::OPTIMIZER_STEP}) {
    std::vector<int> with, without;
    for (int st = 0; st < s.num_stages; ++st) (idx.find(t, st, -1).empty() ? without : with).push_back(st);
    if (!with.empty() && !without.empty())
      rep.add("fsdp", "stage " + std::to_string(without[0]) + (without.size() > 1 ? " (and " + std::to_string(without.size() - 1) + " more)" : "") +
                          " has no " + std::string(type_name(t)) + " while stage " + std::to_string(with[0]) + " has " +
                          make(t, with[0]).token() + (t == ActionType::REDUCE_GRAD ? ": its gradients would never be reduced" : ": its parameters would never be updated"));
    for (const int st : with) {
      const OpRef op = idx.find(t, st, -1)[0];
      std::vector<OpRef> before;  // what must precede it on its rank
      for (int mb = 0; mb < s.num_microbatches; ++mb)
        for (const ActionType g : {ActionType::B, ActionType::W})
          for (const OpRef& x : idx.find(g, st, mb)) before.push_back(x);
      if (t == ActionType::OPTIMIZER_STEP)
        for (const OpRef& x : idx.find(ActionType::REDUCE_GRAD, st, -1)) before.push_back(x);
      for (const OpRef& x : before)
        if (x.rank == op.rank && x.pos > op.pos) {
          rep.add_at(op, "fsdp", where(s, op) + " runs before " + where(s, x) + "; it must follow every " +
                              (t == ActionType::OPTIMIZER_STEP ? "B, W and the REDUCE_GRAD" : "B and W") + " of stage " +
                              std::to_string(st) + " (the stage's gradients are complete only then)");
          break;
        }
    }
  }
}

// X_RECOMPUTE of (stage, mb) re-creates the activations its backward needs: once, after its F (the local
// order check) and before the B or I that uses them on the same rank.
void check_recompute(const Schedule& s, const OpIndex& idx, Report& rep) {
  for (const auto& [k, refs_] : idx.all()) {
    if (static_cast<ActionType>(std::get<0>(k)) != ActionType::RECOMPUTE) continue;
    const int st = std::get<1>(k), mb = std::get<2>(k);
    if (refs_.size() > 1)
      rep.add_at(refs_[1], "completeness", "duplicated action " + key(ActionType::RECOMPUTE, st, mb) + " at " + refs(s, refs_));
    for (const ActionType t : {ActionType::B, ActionType::I})
      for (const OpRef& use : idx.find(t, st, mb))
        if (use.rank == refs_[0].rank && use.pos < refs_[0].pos)
          rep.add_at(refs_[0], "order", where(s, refs_[0]) + " recomputes after its backward " + where(s, use) +
                               " (a recompute re-creates the activations the backward needs, so it must come first)");
  }
}

// Every data dependency of every compute action (an OVERLAP_F_B's parts each), in program order:
// fn(rank, position, the consuming part, the dependency).
template <typename Fn>
void for_each_dep(const Schedule& s, const OpIndex& idx, Fn fn) {
  for (int r = 0; r < s.num_ranks; ++r)
    for (int p = 0; p < static_cast<int>(s.ranks[static_cast<std::size_t>(r)].size()); ++p) {
      const Action& a = s.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(p)];
      for (const auto& part : a.type == ActionType::OVERLAP_F_B ? a.sub : std::vector<Action>{a}) {
        if (!is_compute(part.type)) continue;
        for (const auto& d : detail::deps_of(s, idx, part)) fn(r, p, part, d);
      }
    }
}

// 3./4. Same-rank dependencies in program order (F < B/I < W per stage, F(s-1) < F(s) and B/I(s+1) <
// B/I(s) when both stages share a rank). Cross-rank order is the deadlock check's job.
void check_local_order(const Schedule& s, const OpIndex& idx, Report& rep) {
  for_each_dep(s, idx, [&](int r, int p, const Action& part, const detail::Dep& d) {
    if (d.cross_rank) return;
    const auto& prod = idx.find(d.producer_type, d.producer_stage, d.mb);
    if (prod.size() == 1 && prod[0].rank == r && prod[0].pos >= p)
      rep.add_at({r, p}, d.producer_stage == part.stage ? "order" : "causality",
                 where(s, {r, p}) + " runs before its input " + where(s, prod[0]) + " on the same rank");
  });
}

// 5. Each cross-rank dependency carried by exactly one SEND after the producer and one RECV before the
// consumer; every SEND/RECV belongs to such a dependency.
void check_send_recv(const Schedule& s, const OpIndex& idx, Report& rep) {
  std::map<std::tuple<int, int, int>, int> used;
  for_each_dep(s, idx, [&](int r, int p, const Action&, const detail::Dep& d) {
    if (!d.cross_rank) return;
    const auto& prod = idx.find(d.producer_type, d.producer_stage, d.mb);
    const auto& snd = idx.find(d.send_type, d.send_stage, d.mb);
    const auto& rcv = idx.find(d.recv_type, d.recv_stage, d.mb);
    used[{static_cast<int>(d.send_type), d.send_stage, d.mb}]++;
    used[{static_cast<int>(d.recv_type), d.recv_stage, d.mb}]++;
    const std::string need = where(s, {r, p});
    if (snd.size() != 1 || rcv.size() != 1) {
      rep.add_at({r, p}, "send-recv", need + " needs exactly one " + key(d.send_type, d.send_stage, d.mb) + " and one " +
                                          key(d.recv_type, d.recv_stage, d.mb) + "; found " + std::to_string(snd.size()) +
                                          " and " + std::to_string(rcv.size()));
      return;
    }
    if (prod.size() == 1 && (snd[0].rank != prod[0].rank || snd[0].pos < prod[0].pos))
      rep.add_at(snd[0], "send-recv", where(s, snd[0]) + " must follow its producer " + where(s, prod[0]) + " on the same rank");
    if (rcv[0].rank != r || rcv[0].pos > p)
      rep.add_at(rcv[0], "send-recv", where(s, rcv[0]) + " must precede its consumer " + need + " on the same rank");
  });
  for (const auto& [k, refs_] : idx.all()) {
    const auto t = static_cast<ActionType>(std::get<0>(k));
    if (is_comm(t) && !used.count(k))
      rep.add_at(refs_[0], "send-recv", where(s, refs_[0]) + " carries no dependency of this schedule (no matching compute)");
  }
}

// PyTorch 2.15's waits, on each rank in program order (its _validate_send_waits and the compute_comms
// loader's reduction check): every WAIT_SEND_x retires an earlier SEND_x of the same stage and micro-batch
// on the rank, each send once; every WAIT_REDUCE_GRAD follows a REDUCE_GRAD of its stage, with at most one
// reduction pending per rank. A schedule without any WAIT_SEND (the dialects before 2.15, and compute-only
// orders) leaves its sends unwaited; with one, every send needs its wait, and likewise for reductions.
void check_waits(const Schedule& s, const OpIndex& idx, Report& rep) {
  bool send_waits = false, reduce_waits = false;
  for (const auto& kv : idx.all()) {
    const auto t = static_cast<ActionType>(std::get<0>(kv.first));
    send_waits = send_waits || is_wait_send(t);
    reduce_waits = reduce_waits || t == ActionType::WAIT_REDUCE_GRAD;
  }
  if (!send_waits && !reduce_waits) return;
  for (int r = 0; r < s.num_ranks && !rep.full(); ++r) {
    std::map<std::tuple<int, int, int>, int> pending;  // (send type, stage, mb) -> position of the send
    std::optional<std::pair<int, int>> reducing;       // (stage, position) of the pending REDUCE_GRAD
    const auto& acts = s.ranks[static_cast<std::size_t>(r)];
    for (int p = 0; p < static_cast<int>(acts.size()); ++p) {
      const Action& a = acts[static_cast<std::size_t>(p)];
      if (send_waits && is_send(a.type)) {
        pending[{static_cast<int>(a.type), a.stage, a.mb}] = p;
      } else if (send_waits && is_wait_send(a.type)) {
        const auto it = pending.find({static_cast<int>(send_of_wait(a.type)), a.stage, a.mb});
        if (it == pending.end())
          rep.add_at({r, p}, "wait", where(s, {r, p}) + " waits for " + key(send_of_wait(a.type), a.stage, a.mb) +
                              ", which is not pending on rank " + std::to_string(r) + " (no earlier send, or waited already)");
        else
          pending.erase(it);
      } else if (reduce_waits && a.type == ActionType::REDUCE_GRAD) {
        if (reducing)
          rep.add_at({r, p}, "wait", where(s, {r, p}) + " starts a reduction while " + where(s, {r, reducing->second}) +
                              " is pending (one REDUCE_GRAD at a time per rank: wait for it first)");
        reducing = std::pair{a.stage, p};
      } else if (reduce_waits && a.type == ActionType::WAIT_REDUCE_GRAD) {
        if (!reducing || reducing->first != a.stage)
          rep.add_at({r, p}, "wait", where(s, {r, p}) + " has no pending REDUCE_GRAD of stage " + std::to_string(a.stage) +
                              (reducing ? " (stage " + std::to_string(reducing->first) + "'s is pending)" : ""));
        reducing.reset();
      }
    }
    for (const auto& [k, p] : pending)
      rep.add_at({r, p}, "wait", where(s, {r, p}) + " has no WAIT_SEND after it on rank " + std::to_string(r) +
                          " (with waits in the schedule, every send is retired by one)");
    if (reducing) rep.add_at({r, reducing->second}, "wait", where(s, {r, reducing->second}) + " has no WAIT_REDUCE_GRAD after it");
  }
}

std::vector<int> liveness(const Schedule& s, const OpIndex& idx, const std::optional<int>& limit, Report& rep) {
  std::vector<int> peak(static_cast<std::size_t>(s.num_ranks), 0);
  for (int r = 0; r < s.num_ranks; ++r) {
    int live = 0;
    bool reported = false;
    // Holds on each live activation: its backward (B, or W when split) and, when the forward's output is
    // sent and the send waited for, that wait: the sent tensor stays referenced until its send retires.
    std::map<std::pair<int, int>, int> holds;
    const auto release = [&](int stage, int mb) {
      const auto it = holds.find({stage, mb});
      if (it != holds.end() && --it->second == 0) {
        holds.erase(it);
        --live;
      }
    };
    for (int p = 0; p < static_cast<int>(s.ranks[static_cast<std::size_t>(r)].size()); ++p) {
      const Action& a = s.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(p)];
      std::vector<Action> parts = a.type == ActionType::OVERLAP_F_B ? a.sub : std::vector<Action>{a};
      // An activation lives from its F through its B, or through its W when split (inclusive intervals,
      // PyTorch analyze_pipeline_activation_liveness): count allocations before releases of one step.
      for (const auto& x : parts)
        if (x.type == ActionType::F) {
          ++live;
          holds[{x.stage, x.mb}] = 1 + (idx.find(ActionType::WAIT_SEND_F, x.stage, x.mb).empty() ? 0 : 1);
        }
      peak[static_cast<std::size_t>(r)] = std::max(peak[static_cast<std::size_t>(r)], live);
      if (limit && live > *limit && !reported) {
        rep.add_at({r, p}, "memory", "rank " + std::to_string(r) + " holds " + std::to_string(live) + " activations at " +
                              where(s, {r, p}) + ", over --mem-limit " + std::to_string(*limit));
        reported = true;
      }
      for (const auto& x : parts)
        if (x.type == ActionType::B || x.type == ActionType::W || x.type == ActionType::WAIT_SEND_F) release(x.stage, x.mb);
    }
  }
  return peak;
}

}  // namespace

ValidationReport validate(const Schedule& s, const ValidateOptions& opt) {
  ValidationReport out;
  Report rep{out, opt.max_violations, s};
  // Each early return leaves later checks unrun: out.checked says which phase was the last.
  out.checked = "structure";
  check_structure(s, rep);
  if (!out.ok()) return out;
  const OpIndex idx(s);
  out.checked = "completeness";
  check_completeness(s, idx, rep);
  check_once_per_stage(s, idx, rep);
  check_recompute(s, idx, rep);
  if (!out.ok()) return out;
  out.checked = "order";
  check_fsdp(s, idx, rep);
  check_local_order(s, idx, rep);
  const bool lowered = std::any_of(idx.all().begin(), idx.all().end(),
                                   [](const auto& kv) { return is_comm(static_cast<ActionType>(std::get<0>(kv.first))); });
  if (lowered) check_send_recv(s, idx, rep);
  check_waits(s, idx, rep);
  out.peak_inflight = liveness(s, idx, opt.mem_limit, rep);
  if (std::any_of(out.violations.begin(), out.violations.end(), [](const Violation& v) { return v.rule != "memory"; }))
    return out;
  out.checked = "all";
  const auto g = detail::build_hb_graph(s, idx, opt.comm, Costs{});
  if (auto cycle = detail::find_cycle(g)) {
    std::string msg = std::string("deadlock under ") + comm_model_name(opt.comm) + " comms: cycle ";
    for (std::size_t i = 0; i < cycle->size(); ++i) msg += (i ? " -> " : "") + where(s, (*cycle)[i]);
    msg += " -> back to the first (each must happen before the next)";
    rep.add_at((*cycle)[0], "deadlock", msg);
  }
  return out;
}

}  // namespace tessel::sched
