#include "sim/engine/sim_trace.hpp"

#include <map>

namespace tessel::engine {

namespace {

constexpr double kUs = 1e6;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The stage's chunk and layer range on an event of that stage.
void set_stage(trace::OpEvent& e, const SimReport& r, int stage) {
  e.stage = stage;
  e.chunk = r.schedule.chunk_of(stage);
  e.layer_begin = r.layout.first_layer_of_stage(stage, r.model.layers);
  e.layer_end = e.layer_begin + r.workload.stages[static_cast<std::size_t>(stage)].layers;
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
    if (ti.op == OpKind::forward) e.flops = r.workload.stages[static_cast<std::size_t>(ti.stage)].flops_model / 3 / ti.pieces;
  }
  e.start_us = r.run.start[t] * kUs;
  e.dur_us = (r.run.end[t] - r.run.start[t]) * kUs;
  e.bytes = ti.bytes;
  return e;
}

const char* tp_op_name(cost::Collective c) {
  return c == cost::Collective::all_reduce ? "tp_allreduce" : c == cost::Collective::all_gather ? "tp_allgather" : "tp_reducescatter";
}

// TP collectives of one compute op, laid out at their offsets: the stage's edge collectives (embedding,
// cross-entropy, head) where the lowering put them, then each layer's in its op sequence. A recompute
// replays the layers only. `op` by value: out grows.
void add_tp_slices(const SimReport& r, const trace::OpEvent op, OpKind kind, trace::Trace& out) {
  const StageWork& st = r.workload.stages[static_cast<std::size_t>(op.stage)];
  const bool forward = kind != OpKind::backward && kind != OpKind::input_grad;
  const auto slice = [&](std::string name, cost::Collective c, double start, double dur, double bytes, int lb, int le) {
    trace::OpEvent e = op;
    e.stream = trace::Stream::tp;
    e.op = tp_op_name(c);
    e.name = std::move(name);
    e.start_us = start;
    e.dur_us = dur;
    e.flops = 0;
    e.bytes = bytes;
    e.layer_begin = lb;
    e.layer_end = le;
    out.events.push_back(std::move(e));
  };
  double t = op.start_us;
  if (kind != OpKind::recompute) {
    for (int k = 0; k < st.num_edges; ++k) {
      const EdgeCollective& c = st.edges[k];
      if (c.backward == forward) continue;
      slice(c.name, c.coll, op.start_us + c.at * kUs, c.seconds * kUs, c.bytes, op.layer_begin, op.layer_end);
    }
    t += (forward ? st.layers_at_f : st.layers_at_i) * kUs;
  }
  const auto& ops = r.workload.layer.ops;
  for (int l = op.layer_begin; l < op.layer_end; ++l)
    for (const auto& w : ops) {
      const double d = (forward ? w.t_f : w.t_i) * kUs;
      if (w.cls == OpClass::collective && d > 0) slice(w.name + " L" + std::to_string(l), w.coll, t, d, w.comm_bytes, l, l + 1);
      t += d;
    }
}

}  // namespace

trace::Trace to_trace(const SimReport& r, const System& sys, const TraceOptions& opt) {
  const Cluster c(r.layout, sys, r.fidelity);
  trace::Trace out;
  const bool tp = r.layout.tp > 1 && r.layout.zero_stage != 3;
  std::size_t tp_count = 0;
  if (tp) {
    std::size_t per_layer = 0;
    for (const auto& w : r.workload.layer.ops) per_layer += w.cls == OpClass::collective;
    for (const auto& ti : r.job.info)
      if (ti.op == OpKind::forward || ti.op == OpKind::backward || ti.op == OpKind::input_grad || ti.op == OpKind::recompute) {
        const StageWork& st = r.workload.stages[static_cast<std::size_t>(ti.stage)];
        tp_count += per_layer * static_cast<std::size_t>(st.layers) + static_cast<std::size_t>(st.num_edges);
      }
  }
  const bool with_tp = tp && tp_count <= opt.max_tp_slices;
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
    out.events.push_back(e);
    if (with_tp && ti.pieces == 1 &&
        (ti.op == OpKind::forward || ti.op == OpKind::backward || ti.op == OpKind::input_grad || ti.op == OpKind::recompute))
      add_tp_slices(r, out.events.back(), ti.op, out);
  }
  for (int p = 0; p < c.num_positions(); ++p) {
    std::string stages;
    for (int s = 0; s < r.schedule.num_stages; ++s)
      if (r.schedule.rank_of(s) == c.pp_of(p)) stages += (stages.empty() ? "" : ",") + std::to_string(s);
    out.process_names[c.global_rank(p)] = "rank " + std::to_string(c.global_rank(p)) + " (stage " + stages + ")";
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
  out.other_data["step_s"] = r.step_s;
  return out;
}

}  // namespace tessel::engine
