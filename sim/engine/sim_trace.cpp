#include "sim/engine/sim_trace.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "util/units.hpp"

namespace tessel::engine {

namespace {

constexpr double kUs = 1e6;

// The stage's chunk and layer range on an event of that stage.
void set_stage(trace::OpEvent& e, const SimReport& r, int stage) {
  e.stage = stage;
  e.chunk = r.schedule.chunk_of(stage);
  e.layer_begin = r.layout.first_layer_of_stage(stage, r.model.layers);
  e.layer_end = e.layer_begin + r.costs.work.stages[static_cast<std::size_t>(stage)].layers;
}

trace::OpEvent base_event(const SimReport& r, const Cluster& c, std::uint32_t t, int pos) {
  const TaskInfo& ti = r.job.info[t];
  trace::OpEvent e;
  e.rank = c.global_rank(pos);
  e.stream = ti.stream;
  e.op = op_name(ti.op);
  e.name = describe_task(r.job, t, c);
  e.stage = ti.stage;
  e.mb = ti.mb;
  if (ti.stage >= 0) {
    set_stage(e, r, ti.stage);
    if (ti.op == OpKind::forward) {
      const double flops = r.costs.work.stages[static_cast<std::size_t>(ti.stage)].flops_model / 3;
      const double whole = r.job.ep_flows ? r.job.forward_compute[static_cast<std::size_t>(ti.stage)] : 0.0;
      e.flops = whole > 0 ? flops * r.job.graph.work[t] / whole : flops / ti.pieces;  // pieces of unequal work
    }
  }
  if (ti.op == OpKind::ep_alltoall && ti.layer >= 0) {  // named and placed as the runtime's event of the layer
    e.name = std::string(ti.what) + " L" + std::to_string(ti.layer);
    e.layer_begin = ti.layer;
    e.layer_end = ti.layer + 1;
  }
  e.start_us = r.run.start[t] * kUs;
  e.dur_us = (r.run.end[t] - r.run.start[t]) * kUs;
  e.bytes = ti.bytes;
  return e;
}

const char* tp_op_name(cost::Collective c) {
  switch (c) {
    case cost::Collective::all_reduce: return "tp_allreduce";
    case cost::Collective::all_gather: return "tp_allgather";
    case cost::Collective::reduce_scatter: return "tp_reducescatter";
    case cost::Collective::all_to_all: return "ep_alltoall";  // a MoE layer's dispatch / combine
    default: return "tp_collective";
  }
}

bool draws_tp(OpKind k) {
  return k == OpKind::forward || k == OpKind::backward || k == OpKind::input_grad || k == OpKind::recompute;
}

// One TP collective of a compute op, `at` µs after the op's start.
struct TpSlice {
  std::string name;
  cost::Collective coll;
  double at, dur, bytes;
  int layer_begin, layer_end;
};

// The TP collectives of a compute op of `stage`, at their offsets: the stage's edge collectives (embedding,
// cross-entropy, head) where the lowering put them, then each layer's in its op sequence. A recompute
// replays the forward of the layers it recomputes under full recompute (the first ones, Megatron's block
// method); selective recompute replays attention's core, which has no collective.
std::vector<TpSlice> tp_slices_of(const SimReport& r, int stage, OpKind kind) {
  std::vector<TpSlice> out;
  const StageWork& st = r.costs.work.stages[static_cast<std::size_t>(stage)];
  const int lb = r.layout.first_layer_of_stage(stage, r.model.layers);
  const bool forward = kind == OpKind::forward || kind == OpKind::recompute;
  // The all-to-alls the simulator played as flows of their own (Job::ep_flows) are events already, and the
  // op's compute pieces leave them out (a full recompute's too).
  const bool flows = r.job.ep_flows;
  int replayed = -1;  // all the stage's layers, after its edge work
  if (kind == OpKind::recompute) {
    if (r.layout.recompute != Recompute::full) return out;
    replayed = st.recomputed_layers;
  } else if (const StageEdges* edges = r.costs.work.edges_of(stage)) {
    for (int k = 0; k < edges->count; ++k) {
      const EdgeCollective& c = edges->edges[k];
      if (c.backward != forward) out.push_back({c.name, c.coll, c.at * kUs, c.seconds * kUs, c.bytes, lb, lb + st.layers});
    }
  }
  double flown = 0;  // the all-to-alls played as flows so far: not in the compute's offsets
  r.costs.work.walk_stage_ops(stage, forward, [&](int l, const cost::WorkOp& w, double at_s) {
    // Under tp_comm_overlap a collective lasts its hidden part longer than the compute stream waits for it:
    // a reduce-scatter runs beside the GEMM before it, an all-gather beside the GEMM after it.
    if (w.cls != OpClass::collective) return;
    const double d = (forward ? w.t_f : w.t_i) * kUs, hid = (forward ? w.hidden_f : w.hidden_i) * kUs;
    if (flows && w.coll == cost::Collective::all_to_all) {
      flown += d;
      return;
    }
    const double t = at_s * kUs - flown;  // the offset in the compute pieces, which leave the flows out
    const double at = w.coll == cost::Collective::reduce_scatter ? std::max(0.0, t - hid) : t;
    if (d + hid > 0) out.push_back({std::string(w.name) + " L" + std::to_string(l), w.coll, at, d + hid, w.comm_bytes, l, l + 1});
  }, replayed);
  return out;
}

// Draws the TP collectives of one op whose pieces (one task, or the parts the simulator cut it into: gradient
// buckets, ZeRO-3's layers, the gaps between its expert all-to-alls) are the tasks `pieces`, in order, each
// with the event it is drawn in: a collective at offset `at` of the op's compute falls in the task whose work
// covers it, at its share of that task's played length (a task slowed by overlapping communication
// stretches); one that would cross the end of its task (a gap may follow: ZeRO-3 waits for the next layer's
// gather) starts the next task, and none starts before the previous one ends.
void add_tp_slices(const SimReport& r, OpKind kind, const std::vector<std::pair<std::size_t, std::uint32_t>>& pieces,
                   trace::Trace& out) {
  const trace::OpEvent first = out.events[pieces[0].first];  // a copy: out grows
  std::vector<double> begin(pieces.size() + 1, 0.0);          // each task's work starts here, µs
  for (std::size_t j = 0; j < pieces.size(); ++j) begin[j + 1] = begin[j] + r.job.graph.work[pieces[j].second] * kUs;
  const auto played = [&](std::size_t j) {
    const std::uint32_t t = pieces[j].second;
    return std::pair{r.run.start[t] * kUs, (r.run.end[t] - r.run.start[t]) * kUs};
  };
  auto slices = tp_slices_of(r, first.stage, kind);
  std::stable_sort(slices.begin(), slices.end(), [](const TpSlice& a, const TpSlice& b) { return a.at < b.at; });
  double cursor = played(0).first;
  for (auto& s : slices) {
    std::size_t j = static_cast<std::size_t>(std::upper_bound(begin.begin() + 1, begin.end() - 1, s.at) - (begin.begin() + 1));
    const auto [at, dur] = played(j);
    const double work = begin[j + 1] - begin[j];
    double start = at + (work > 0 ? (s.at - begin[j]) * dur / work : 0.0);
    // A collective ending where its task ends (one just before an all-to-all cut) stays in it: the sums of
    // µs on either side round differently, so the end is compared with a margin of a few ulps.
    if (start + s.dur > (at + dur) * (1 + 1e-12) && j + 1 < pieces.size()) start = played(++j).first;
    start = std::max(start, cursor);
    cursor = start + s.dur;
    trace::OpEvent e = first;
    e.stream = trace::Stream::tp;
    e.op = tp_op_name(s.coll);
    e.name = std::move(s.name);
    e.start_us = start;
    e.dur_us = s.dur;
    e.flops = 0;
    e.bytes = s.bytes;
    e.layer_begin = s.layer_begin;
    e.layer_end = s.layer_end;
    out.events.push_back(std::move(e));
  }
}

}  // namespace

trace::Trace to_trace(const SimReport& r, const System& sys, const TraceOptions& opt) {
  const Cluster c(r.layout, sys, r.fidelity);
  trace::Trace out;
  const bool tp = r.layout.tp > 1 || r.layout.ep > 1;  // TP collectives, or a MoE layer's all-to-alls
  std::size_t tp_count = 0, fb_ops = 0;
  if (tp) {
    // The slices an op draws depend only on its stage and kind: count each pair once, exactly.
    std::map<std::pair<int, OpKind>, std::size_t> per_op;
    const TaskInfo* prev = nullptr;  // the last piece counted: an op's pieces between all-to-alls share one number
    for (const auto& ti : r.job.info) {
      fb_ops += ti.op == OpKind::overlap_f_b;
      if (!draws_tp(ti.op) || ti.piece != 0) continue;
      const bool same = prev && prev->pos == ti.pos && prev->stage == ti.stage && prev->mb == ti.mb && prev->op == ti.op;
      prev = &ti;
      if (same) continue;
      auto [it, fresh] = per_op.try_emplace({ti.stage, ti.op}, 0);
      if (fresh) it->second = tp_slices_of(r, ti.stage, ti.op).size();
      tp_count += it->second;
    }
  }
  const bool with_tp = tp && tp_count <= opt.max_tp_slices;
  std::map<std::tuple<int, int, int, int>, std::vector<std::pair<std::size_t, std::uint32_t>>> open_pieces;
  std::map<std::tuple<int, int, int, int, int>, std::size_t> joined;  // (pos, stage, mb, op, piece) -> event
  for (std::uint32_t t = 0; t < r.job.graph.size(); ++t) {
    const TaskInfo& ti = r.job.info[t];
    if (ti.group >= 0) {
      for (int m : r.job.groups[static_cast<std::size_t>(ti.group)]) out.events.push_back(base_event(r, c, t, m));
      continue;
    }
    trace::OpEvent e = base_event(r, c, t, ti.pos);
    if (ti.op == OpKind::transfer || ti.op == OpKind::tied_allreduce) {
      e.flow_id = ti.op == OpKind::transfer ? static_cast<std::int64_t>(t) : -1;
      trace::OpEvent recv = base_event(r, c, t, ti.peer);
      recv.op = ti.op == OpKind::transfer ? "recv" : e.op;
      recv.flow_id = e.flow_id;
      if (ti.op == OpKind::transfer && ti.peer_stage >= 0) {  // the consumer's action, as the runtime records it
        set_stage(recv, r, ti.peer_stage);
        recv.name = "recv s" + std::to_string(ti.peer_stage) + " mb" + std::to_string(ti.mb) + " <- rank " + std::to_string(e.rank);
      }
      out.events.push_back(e);
      out.events.push_back(recv);
      continue;
    }
    // An op cut at its expert all-to-alls is one event, as the runtime records it (the all-to-alls inside
    // its span on the tp stream): its pieces of one gradient bucket join the first one's event.
    std::size_t at = out.events.size();
    if (r.job.ep_flows && draws_tp(ti.op)) {
      auto [it, fresh] = joined.try_emplace({ti.pos, ti.stage, ti.mb, static_cast<int>(ti.op), ti.piece}, at);
      if (!fresh) {
        at = it->second;
        trace::OpEvent& j = out.events[at];
        j.dur_us = e.start_us + e.dur_us - j.start_us;
        j.flops += e.flops;
      }
    }
    if (at == out.events.size()) out.events.push_back(e);
    // The pieces of one op are tasks of its position in order (other positions' tasks between them).
    if (with_tp && draws_tp(ti.op)) open_pieces[{ti.pos, ti.stage, ti.mb, static_cast<int>(ti.op)}].emplace_back(at, t);
  }
  for (const auto& [key, pieces] : open_pieces) add_tp_slices(r, static_cast<OpKind>(std::get<3>(key)), pieces, out);
  for (int p = 0; p < c.num_positions(); ++p) {
    // Each stage of the rank with the model layers it holds ("-" for the embedding or head alone), so an
    // uneven split is visible where the timeline shows its effect.
    std::string stages, layers;
    for (int s = 0; s < r.schedule.num_stages; ++s) {
      if (r.schedule.rank_of(s) != c.pp_of(p)) continue;
      stages += (stages.empty() ? "" : ",") + std::to_string(s);
      const int first = r.layout.first_layer_of_stage(s, r.model.layers), n = r.layout.layers_of_stage(s, r.model.layers);
      layers += std::string(layers.empty() ? "" : ",") +
                (n == 0 ? "-" : std::to_string(first) + (n > 1 ? "-" + std::to_string(first + n - 1) : ""));
    }
    out.process_names[c.global_rank(p)] =
        "rank " + std::to_string(c.global_rank(p)) + " (stage " + stages + "; layers " + layers + ")";
    out.counters.push_back({c.global_rank(p), "memory_GiB", 0.0, r.job.static_bytes[static_cast<std::size_t>(p)] / kGiB});
  }
  for (const auto& m : r.run.memory)
    out.counters.push_back({c.global_rank(m.position), "memory_GiB", m.t * kUs,
                            (r.job.static_bytes[static_cast<std::size_t>(m.position)] + m.bytes) / kGiB});
  out.other_data["model"] = r.model.name;
  out.other_data["system"] = r.system_name;
  out.other_data["layout"] = layout_to_json(r.layout);
  out.other_data["schedule"] = r.schedule.generator;
  out.other_data["tool"] = std::string("tessel simulate ") + TESSEL_VERSION;
  out.other_data["fidelity"] = to_string(r.fidelity);
  out.other_data["tp_folded"] = "each rank stands for its " + std::to_string(r.layout.tp) + " tp ranks";
  if (tp && !with_tp)
    out.other_data["tp_slices"] = "left out: " + std::to_string(tp_count) + " > " + std::to_string(opt.max_tp_slices);
  else if (with_tp && fb_ops > 0)
    out.other_data["tp_slices"] = "not drawn inside the " + std::to_string(fb_ops) + " F&B ops (a forward and a backward overlapped)";
  out.other_data["step_s"] = r.step_s;
  // The distributed optimizer's parameter all-gathers past the first bucket run beside the next step's
  // forward (overlap_param_gather): the trace holds them, so it spans more than the step.
  std::size_t after = 0;
  for (const auto& e : out.events) after += e.op == "dp_allgather" && e.start_us + e.dur_us > r.step_s * kUs * (1 + 1e-12);
  if (after > 0)
    out.other_data["after_step"] = std::to_string(after) + " dp_allgather slices end after step_s: the next step's parameters, "
                                   "gathered beside its forward";
  return out;
}

}  // namespace tessel::engine
