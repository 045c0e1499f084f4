// Per-rank accounting after the run (outside the hot loop) and the JSON summary.
#include <algorithm>

#include "sim/engine/simulate.hpp"
#include "util/units.hpp"

namespace tessel::engine {

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::forward: return "forward";
    case OpKind::backward: return "backward";
    case OpKind::input_grad: return "input_grad";
    case OpKind::weight_grad: return "weight_grad";
    case OpKind::recompute: return "recompute";
    case OpKind::overlap_f_b: return "overlap_f_b";
    case OpKind::transfer: return "send";
    case OpKind::dp_allreduce: return "dp_allreduce";
    case OpKind::dp_reducescatter: return "dp_reducescatter";
    case OpKind::dp_allgather: return "dp_allgather";
    case OpKind::tied_allreduce: return "embedding_allreduce";  // as the runtime records it
    case OpKind::tp_allreduce: return "tp_allreduce";
    case OpKind::zero3_allgather: return "dp_allgather";
    case OpKind::zero3_reducescatter: return "dp_reducescatter";
    case OpKind::optimizer: return "optimizer";
    case OpKind::ep_alltoall: return "ep_alltoall";
  }
  return "?";
}

namespace {

const char* short_name(OpKind k) {
  switch (k) {
    case OpKind::forward: return "F";
    case OpKind::backward: return "B";
    case OpKind::input_grad: return "I";
    case OpKind::weight_grad: return "W";
    case OpKind::recompute: return "R";
    case OpKind::overlap_f_b: return "F&B";
    default: return op_name(k);
  }
}

using Interval = std::pair<double, double>;

// Total length of a union of intervals (sorted in place).
double union_length(std::vector<Interval>& v) {
  std::sort(v.begin(), v.end());
  double total = 0, cur_b = 0, cur_e = -1;
  for (const auto& [b, e] : v) {
    if (b > cur_e) {
      if (cur_e > cur_b) total += cur_e - cur_b;
      cur_b = b;
      cur_e = e;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (cur_e > cur_b) total += cur_e - cur_b;
  return total;
}

// Length of (union of a) that lies outside (union of b); b's intervals are disjoint and sorted.
double outside(std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::vector<Interval> inter;
  for (const auto& [x, y] : a) {
    auto it = std::lower_bound(b.begin(), b.end(), Interval{x, x},
                               [](const Interval& p, const Interval& q) { return p.second < q.first; });
    for (; it != b.end() && it->first < y; ++it)
      if (std::min(y, it->second) > std::max(x, it->first)) inter.push_back({std::max(x, it->first), std::min(y, it->second)});
  }
  return union_length(a) - union_length(inter);
}

}  // namespace

std::string describe_task(const Job& job, std::uint32_t t, const Cluster& c) {
  const TaskInfo& ti = job.info[t];
  std::string s = short_name(ti.op);
  if (ti.stage >= 0) s += " s" + std::to_string(ti.stage);
  if (ti.mb >= 0) s += " mb" + std::to_string(ti.mb);
  if (ti.pieces > 1) s += " part " + std::to_string(ti.piece + 1) + "/" + std::to_string(ti.pieces);
  if (ti.peer >= 0) s += " -> rank " + std::to_string(c.global_rank(ti.peer));
  if (ti.group >= 0) s += " (" + std::to_string(job.groups[static_cast<std::size_t>(ti.group)].size()) + " positions)";
  return s;
}

std::vector<RankSummary> summarize_ranks(const Job& job, const RunResult& run, const Cluster& c, double step_s) {
  const auto P = static_cast<std::size_t>(c.num_positions());
  std::vector<std::vector<Interval>> compute(P), comm(P);
  for (std::uint32_t t = 0; t < job.graph.size(); ++t) {
    const TaskInfo& ti = job.info[t];
    const Interval iv{run.start[t], run.end[t]};
    if (ti.stream == trace::Stream::compute) {
      compute[static_cast<std::size_t>(ti.pos)].push_back(iv);
    } else if (ti.group >= 0) {
      for (int m : job.groups[static_cast<std::size_t>(ti.group)]) comm[static_cast<std::size_t>(m)].push_back(iv);
    } else {
      comm[static_cast<std::size_t>(ti.pos)].push_back(iv);
      if (ti.peer >= 0) comm[static_cast<std::size_t>(ti.peer)].push_back(iv);
    }
  }
  std::vector<RankSummary> out(P);
  for (std::size_t p = 0; p < P; ++p) {
    RankSummary& k = out[p];
    k.pos = static_cast<int>(p);
    k.global_rank = c.global_rank(k.pos);
    k.pp = c.pp_of(k.pos);
    k.dp = c.dp_of(k.pos);
    k.cp = c.cp_of(k.pos);
    std::sort(compute[p].begin(), compute[p].end());
    for (const auto& [b, e] : compute[p]) k.busy_s += e - b;
    std::vector<Interval> cm = comm[p];
    k.comm_s = union_length(cm);
    k.exposed_comm_s = outside(comm[p], compute[p]);
    k.bubble_s = std::max(0.0, step_s - k.busy_s - k.exposed_comm_s);
    k.peak_activation_bytes = run.peak_bytes[p];
    k.peak_bytes = job.static_bytes[p] + run.peak_bytes[p];
  }
  return out;
}

Json report_to_json(const SimReport& r) {
  Json j;
  j["model"] = r.model.name;
  j["system"] = r.system_name;
  j["layout"] = layout_to_json(r.layout);
  j["schedule"] = r.schedule.generator;
  j["fidelity"] = to_string(r.fidelity);
  j["gpus"] = r.gpus;
  j["positions"] = r.positions;
  j["microbatches"] = r.microbatches;
  j["step_s"] = r.step_s;
  j["tokens_per_s"] = r.tokens_per_s;
  j["model_tflops_per_gpu"] = r.model_tflops_per_gpu;
  j["mfu"] = r.mfu;
  j["events"] = r.events;
  j["tasks"] = r.tasks;
  j["peak_memory_GiB"] = r.peak_bytes / kGiB;
  j["peak_rank"] = r.peak_rank;
  j["capacity_GiB"] = r.capacity_bytes / kGiB;
  j["fits"] = r.fits;
  Json ranks = Json::array();
  for (const auto& k : r.ranks)
    ranks.push_back({{"rank", k.global_rank}, {"pp", k.pp}, {"dp", k.dp}, {"cp", k.cp}, {"busy_s", k.busy_s},
                     {"bubble_s", k.bubble_s}, {"comm_s", k.comm_s}, {"exposed_comm_s", k.exposed_comm_s},
                     {"peak_memory_GiB", k.peak_bytes / kGiB}, {"peak_activations_GiB", k.peak_activation_bytes / kGiB}});
  j["ranks"] = ranks;
  Json cp = Json::array();
  for (const auto& op : r.critical_path)
    cp.push_back({{"rank", op.global_rank}, {"op", op.what}, {"start_s", op.start_s}, {"end_s", op.end_s}});
  j["critical_path"] = cp;
  return j;
}

}  // namespace tessel::engine
