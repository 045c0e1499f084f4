// Per-rank accounting after the run (outside the hot loop) and the JSON summary.
#include <algorithm>
#include <span>

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
    case OpKind::grad_norm: return "grad_norm";
    case OpKind::zero_grad: return "zero_grad";
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

// Total length of a union of intervals sorted by start.
double union_length(std::span<const Interval> v) {
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

// Length of (union of a) that lies outside (union of b): a sorted by start, of union length a_len; b's
// intervals disjoint and sorted.
double outside(std::span<const Interval> a, double a_len, std::span<const Interval> b) {
  std::vector<Interval> inter;
  for (const auto& [x, y] : a) {
    auto it = std::lower_bound(b.begin(), b.end(), Interval{x, x},
                               [](const Interval& p, const Interval& q) { return p.second < q.first; });
    for (; it != b.end() && it->first < y; ++it)
      if (std::min(y, it->second) > std::max(x, it->first)) inter.push_back({std::max(x, it->first), std::min(y, it->second)});
  }
  std::sort(inter.begin(), inter.end());
  return a_len - union_length(inter);
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
  const std::uint32_t n = job.graph.size();
  // Each position's compute and communication intervals, flat (two passes: count, then place), as a step of a
  // 2,048-GPU mixture of experts has millions of them.
  std::vector<std::size_t> compute_at(P + 1, 0), comm_at(P + 1, 0);
  const auto each_interval = [&](auto&& on_compute, auto&& on_comm) {
    for (std::uint32_t t = 0; t < n; ++t) {
      const TaskInfo& ti = job.info[t];
      const auto pos = static_cast<std::size_t>(ti.pos);
      if (ti.stream == trace::Stream::compute) {
        on_compute(pos, t);
      } else if (ti.group >= 0) {
        for (int m : job.groups[static_cast<std::size_t>(ti.group)]) on_comm(static_cast<std::size_t>(m), t);
      } else {
        on_comm(pos, t);
        if (ti.peer >= 0) on_comm(static_cast<std::size_t>(ti.peer), t);
      }
    }
  };
  each_interval([&](std::size_t p, std::uint32_t) { ++compute_at[p + 1]; }, [&](std::size_t p, std::uint32_t) { ++comm_at[p + 1]; });
  for (std::size_t p = 0; p < P; ++p) {
    compute_at[p + 1] += compute_at[p];
    comm_at[p + 1] += comm_at[p];
  }
  std::vector<Interval> compute(compute_at[P]), comm(comm_at[P]);
  {
    std::vector<std::size_t> ci(compute_at.begin(), compute_at.end() - 1), mi(comm_at.begin(), comm_at.end() - 1);
    each_interval([&](std::size_t p, std::uint32_t t) { compute[ci[p]++] = {run.start[t], run.end[t]}; },
                  [&](std::size_t p, std::uint32_t t) { comm[mi[p]++] = {run.start[t], run.end[t]}; });
  }
  std::vector<RankSummary> out(P);
  for (std::size_t p = 0; p < P; ++p) {
    RankSummary& k = out[p];
    k.pos = static_cast<int>(p);
    k.global_rank = c.global_rank(k.pos);
    k.pp = c.pp_of(k.pos);
    k.dp = c.dp_of(k.pos);
    k.cp = c.cp_of(k.pos);
    // A position's compute ops run one after another on its stream, in task order as the job builds them:
    // sorted already but checked (a linear pass), not assumed.
    const std::span<Interval> cs(compute.data() + compute_at[p], compute.data() + compute_at[p + 1]);
    if (!std::is_sorted(cs.begin(), cs.end())) std::sort(cs.begin(), cs.end());
    for (const auto& [b, e] : cs) k.busy_s += e - b;
    const std::span<Interval> ms(comm.data() + comm_at[p], comm.data() + comm_at[p + 1]);
    std::sort(ms.begin(), ms.end());
    k.comm_s = union_length(ms);
    k.exposed_comm_s = outside(ms, k.comm_s, cs);
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
