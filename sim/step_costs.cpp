#include "sim/step_costs.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "sim/cost/compute.hpp"
#include "util/error.hpp"

namespace tessel {

int grad_buckets(double params) { return std::max(1, static_cast<int>(std::ceil(params / kBucketParams))); }

void check_runnable(const Model& m, const Layout& l, const System& sys, int gpus) {
  if (gpus <= 0) gpus = l.gpus();
  check_layout(l, m, gpus);
  if (gpus > sys.max_gpus)
    throw InfeasibleLayout(std::to_string(gpus) + " GPUs exceed the system's max_gpus " + std::to_string(sys.max_gpus));
  if (sys.gpu.peak(l.precision) <= 0)
    throw InfeasibleLayout("precision " + to_string(l.precision) + " is not supported by " + sys.gpu.name);
  if (l.precision == Precision::fp8 && l.fp8_recipe == Fp8Recipe::mxfp8 && sys.gpu.arch != GpuArch::blackwell)
    throw InfeasibleLayout("fp8 recipe mxfp8 runs on Blackwell's block-scaled tensor cores only; " + sys.gpu.name +
                           " is not one (gpu.arch blackwell in a system file says it is)");
}

namespace {

RankSums sum_per_rank(const Workload& w) {
  const Layout& l = w.layout;
  RankSums r;
  for (auto* v : {&r.f, &r.i, &r.w, &r.params, &r.expert_params, &r.tp_f, &r.tp_b, &r.act, &r.extra_first, &r.extra_last, &r.sp_grad_params})
    v->assign(l.pp, 0.0);
  r.layers.assign(l.pp, 0);
  for (const auto& st : w.stages) {
    const int k = l.rank_of_stage(st.stage);
    r.layers[k] += st.layers;
    r.f[k] += st.f;
    r.i[k] += st.i;
    r.w[k] += st.w;
    r.params[k] += st.params;
    r.expert_params[k] += st.expert_params;
    r.sp_grad_params[k] += st.sp_grad_params;
    r.tp_f[k] += st.tp_comm_f;
    r.tp_b[k] += st.tp_comm_b;
    r.act[k] += st.act_bytes / l.vpp;  // average chunk's activations on this rank
    if (st.stage == 0) r.extra_first[k] += st.act_extra_bytes;
    else if (st.stage == l.num_stages() - 1) r.extra_last[k] += st.act_extra_bytes;
  }
  return r;
}

}  // namespace

StepCosts step_costs(const Model& m, const Layout& l, const System& sys, const LayerWork* layer) {
  StepCosts c;
  c.work = lower(m, l, sys, layer);
  c.ranks = sum_per_rank(c.work);
  const StepSync& sync = c.work.sync;
  c.p2p_s = c.work.p2p.seconds(sys);
  c.zero3_gather_s = sync.zero3_gather.seconds(sys);
  c.zero3_scatter_s = sync.zero3_scatter.seconds(sys);
  c.tied_s = sync.tied.seconds(sys);
  c.optimizer_shard = l.zero_stage >= 1 ? static_cast<double>(l.dp) * l.cp : 1.0;
  c.expert_optimizer_shard = l.zero_stage >= 1 ? static_cast<double>(l.expert_dp()) : 1.0;
  c.state = cost::state_bytes_per_param(l);
  c.expert_state = cost::expert_state_bytes_per_param(l);
  c.tail.resize(static_cast<std::size_t>(l.pp));
  for (std::size_t r = 0; r < c.tail.size(); ++r) {
    const double experts = c.ranks.expert_params[r], others = c.ranks.params[r] - experts;
    const double stepped = others / c.optimizer_shard + experts / c.expert_optimizer_shard;
    // The experts' reduction follows the others' on the same GPUs' links (one after the other).
    c.tail[r] = {sync.grad.seconds(sys, others) + sync.expert_grad.seconds(sys, experts),
                 sync.param_gather.seconds(sys, others) + sync.expert_param_gather.seconds(sys, experts),
                 cost::adamw_time(sys.gpu, stepped),
                 cost::grad_pass_time(sys.gpu, cost::grad_bytes(l) * stepped),
                 cost::grad_pass_time(sys.gpu, c.state.grads * others + c.expert_state.grads * experts)};
  }
  c.zero3_gather_bytes = cost::zero3_gather_bytes(m, l);
  c.recompute_transient_bytes = cost::recompute_transient_bytes(m, l);
  c.reserved_bytes = sys.memory_reserved_bytes;
  return c;
}

double StepCosts::state_bytes(int r) const {
  const auto k = static_cast<std::size_t>(r);
  const double experts = k < ranks.expert_params.size() ? ranks.expert_params[k] : 0.0;  // costs built by hand: none
  return (ranks.params[k] - experts) * state.total() + experts * expert_state.total();
}

}  // namespace tessel
