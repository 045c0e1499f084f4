#include "sim/step_costs.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "sim/cost/compute.hpp"
#include "sim/cost/op.hpp"
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
  for (auto* v : {&r.f, &r.i, &r.w, &r.params, &r.expert_params, &r.wide_params, &r.tp_f, &r.tp_b, &r.act, &r.extra_first, &r.extra_last, &r.sp_grad_params})
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
    r.wide_params[k] += st.wide_params;
    r.sp_grad_params[k] += st.sp_grad_params;
    r.tp_f[k] += st.tp_comm_f;
    r.tp_b[k] += st.tp_comm_b;
    r.act[k] += st.act_bytes / l.vpp;  // average chunk's activations on this rank
    if (st.stage == 0) r.extra_first[k] += st.act_extra_bytes;
    else if (st.stage == l.num_stages() - 1) r.extra_last[k] += st.act_extra_bytes;
  }
  return r;
}

// Seconds a step spends casting an fp8 run's GEMM weights (RankTail::optimizer_s): `held` of them on the GPU,
// `stepped` of those its optimizer updates. Without fp8 primary weights, one cast of each held weight as the
// recipe casts a tensor (cost::fp8_cast). With them, the optimizer writes one fp8 byte per stepped weight and,
// where the tensor cores need a transposed copy, the gathered weights are read and the copy written (1 + 1
// bytes); MXFP8 gathers 16-bit values and quantizes them as the cast does.
// torchao's casts (fp8_weight_cast per_microbatch) are priced in the GEMMs (cost::price), but for FSDP2's float8
// all-gather: each gather casts the rank's shard first (read 2, write 1), once a micro-batch, twice under ZeRO-3
// (gathered again for the backward), after one amax pass over the shards a step (torchtitan's
// precompute_float8_dynamic_scale_for_fsdp).
double fp8_weight_cast_s(const Layout& l, const GpuSpec& gpu, double held, double stepped, int kernels) {
  if (l.precision != Precision::fp8 || held <= 0) return 0.0;
  if (l.fp8_weight_cast == Fp8WeightCast::per_microbatch) {
    if (!l.fp8_params()) return 0.0;
    const double gathers = static_cast<double>(l.num_microbatches()) * (l.zero_stage == 3 ? 2 : 1);
    return cost::memory_time(gpu, (3.0 * gathers + 2.0) * stepped, std::max(1, kernels) * static_cast<int>(gathers + 1));
  }
  // ZeRO-3 gathers the weights again for every micro-batch, so Transformer Engine casts them (or rebuilds the
  // transpose) every micro-batch.
  const int times = l.zero_stage == 3 ? l.num_microbatches() : 1;
  const cost::Fp8Cast cast = cost::fp8_cast(l.fp8_recipe, gpu);
  double bytes = 0;
  if (!l.fp8_params() || l.fp8_recipe == Fp8Recipe::mxfp8) bytes = cast.bytes * held * times;
  else bytes = stepped + (gpu.fp8_transposed_copy() ? 2.0 * held * times : 0.0);
  return cost::memory_time(gpu, bytes, std::max(1, kernels) * cast.kernels * times);
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
  c.state = cost::state_bytes_per_param(l, sys.gpu.arch);
  c.expert_state = cost::expert_state_bytes_per_param(l, sys.gpu.arch);
  c.tail.resize(static_cast<std::size_t>(l.pp));
  for (std::size_t r = 0; r < c.tail.size(); ++r) {
    const double experts = c.ranks.expert_params[r], others = c.ranks.params[r] - experts;
    const double stepped = others / c.optimizer_shard + experts / c.expert_optimizer_shard;
    const double gemm = c.gemm_params(static_cast<int>(r)), gemm_others = gemm - experts;
    const double cast_s = fp8_weight_cast_s(l, sys.gpu, gemm, gemm_others / c.optimizer_shard + experts / c.expert_optimizer_shard,
                                            4 * c.ranks.layers[r]);
    // The experts' reduction follows the others' on the same GPUs' links (one after the other).
    c.tail[r] = {sync.grad.seconds(sys, others) + sync.expert_grad.seconds(sys, experts),
                 sync.param_gather.seconds(sys, others) + sync.expert_param_gather.seconds(sys, experts),
                 cost::adamw_time(sys.gpu, stepped) + cast_s,
                 cost::grad_pass_time(sys.gpu, cost::grad_bytes(l) * stepped),
                 cost::grad_pass_time(sys.gpu, c.state.grads * others + c.expert_state.grads * experts)};
  }
  c.zero3_gather_bytes = cost::zero3_gather_bytes(m, l, sys.gpu.arch);
  c.recompute_transient_bytes = cost::recompute_transient_bytes(m, l);
  c.reserved_bytes = sys.memory_reserved_bytes;
  return c;
}

double StepCosts::gemm_params(int r) const {
  const auto k = static_cast<std::size_t>(r);
  // Costs built by hand may leave the breakdown out: every parameter is then priced as a wide one.
  if (k >= ranks.wide_params.size()) return 0.0;
  return std::max(0.0, ranks.params[k] - ranks.wide_params[k]);
}

namespace {

// Rank r's bytes of what `per` prices a parameter at: `per(bytes, true)` for a GEMM weight, `per(bytes, false)`
// for a wide one (StateBytes of the others, expert_state of the routed experts, which are GEMM weights). Costs
// built by hand may leave the wide breakdown out: every parameter is then priced as a wide one.
template <class Per>
double rank_bytes(const StepCosts& c, int r, Per per) {
  const auto k = static_cast<std::size_t>(r);
  const double experts = k < c.ranks.expert_params.size() ? c.ranks.expert_params[k] : 0.0;  // by hand: none
  const bool breakdown = k < c.ranks.wide_params.size();
  const double others = c.ranks.params[k] - experts, gemm = breakdown ? c.gemm_params(r) - experts : 0.0;
  return (others - gemm) * per(c.state, false) + gemm * per(c.state, true) + experts * per(c.expert_state, breakdown);
}

}  // namespace

double StepCosts::state_bytes(int r) const {
  return rank_bytes(*this, r, [](const cost::StateBytes& b, bool gemm) { return gemm ? b.gemm_total() : b.total(); });
}

double StepCosts::weight_bytes(int r) const {
  return rank_bytes(*this, r, [](const cost::StateBytes& b, bool gemm) { return gemm ? b.gemm_weights : b.weights; });
}

}  // namespace tessel
