#include "sim/estimate.hpp"

#include <algorithm>
#include <cmath>

#include "sim/schedule/generators.hpp"
#include "sim/step_costs.hpp"
#include "util/error.hpp"
#include "util/units.hpp"

namespace tessel {

double model_flops_per_step(const Workload& w) {
  double per_mb = 0;
  for (const auto& st : w.stages) per_mb += st.flops_model;
  // Every stage's flops are per TP shard and per CP rank: scale to the whole model replica.
  return per_mb * w.layout.tp * w.layout.cp * w.layout.num_microbatches() * w.layout.dp;
}

double pipeline_time(const Layout& l, const std::vector<double>& rf, const std::vector<double>& ri,
                     const std::vector<double>& rw) {
  const double m = l.num_microbatches();
  if (l.pp == 1) {
    double c = rf[0] + ri[0] + rw[0];
    return m * c;
  }
  return sched::makespan(l.schedule, l.microbatch_rule, sched::RankCosts{rf, ri, rw}, l.pp, l.vpp, m);
}

// The all-to-all overlap: the expert all-to-all seconds each rank hides in its F&B blocks (workload.hpp
// fb_block). DualPipeV: rank r holds stages r (chunk 0) and 2p-1-r (chunk 1); sim/schedule/gen_v.cpp's
// steady phase runs m - 2p + r + 1 rounds of F0&B1 and F1&B0 (the last rank's first round a plain F0, B1),
// then p - r - 1 more F1&B0 blocks, every backward whole. Megatron-Core's combined 1F1B (interleaved, or 1f1b
// with pp 1): each steady-state F and the B after it, counted by their chunks without building the schedule
// (gen::combined_block_counts, the generator's own table and warm-up). tests/sim/moe_test.cpp counts both in
// the generated schedules.
std::vector<double> a2a_hidden(const StepCosts& c, double m) {
  const Layout& l = c.work.layout;
  const int p = l.pp;
  std::vector<double> out(static_cast<std::size_t>(p), 0.0);
  if (!l.a2a_overlap) return out;
  if (l.schedule != sched::Kind::dualpipev) {
    const int v = l.vpp;
    const auto counts = sched::gen::combined_block_counts(l.schedule, schedule_params(l));
    for (int r = 0; r < p; ++r)
      for (int a = 0; a < v; ++a)
        for (int b = 0; b < v; ++b)
          if (const int n = counts[static_cast<std::size_t>(r)][static_cast<std::size_t>(a * v + b)]; n > 0)
            out[static_cast<std::size_t>(r)] +=
                n * fb_block(c.work.stages[static_cast<std::size_t>(a * p + r)], c.work.stages[static_cast<std::size_t>(b * p + r)],
                             true, true).hidden;
    return out;
  }
  for (int r = 0; r < p; ++r) {
    const StageWork& c0 = c.work.stages[static_cast<std::size_t>(r)];
    const StageWork& c1 = c.work.stages[static_cast<std::size_t>(2 * p - 1 - r)];
    const double rounds = m - 2 * p + r + 1;
    const double n01 = rounds - (r == p - 1 ? 1 : 0), n10 = rounds + (p - r - 1);
    out[static_cast<std::size_t>(r)] = n01 * fb_block(c0, c1, true, true).hidden + n10 * fb_block(c1, c0, true, true).hidden;
  }
  return out;
}

namespace {

// The pipeline's span: the schedule's closed form over the ranks' costs, plus the transfers the step waits
// on. Fill and drain cross p-1 boundaries each way, once per model chunk. In the steady state each 1F1B
// step exchanges one activation and one gradient with its neighbours; unless overlapped (--overlap-p2p-comm)
// the step waits for them (Megatron-LM's batched isend/irecv is followed by a wait).
double pipeline_span(Estimate& e, const StepCosts& c, const std::vector<double>& hidden) {
  const Layout& l = c.work.layout;
  const double mb = e.microbatches;
  const int p = l.pp;
  // The F&B blocks' hidden all-to-alls shorten each rank's work per micro-batch by its share, taken from its
  // forwards (the closed forms' F&B term, F + B, shrinks with it); the slowdown of the compute they overlap
  // is charged with the step's other overlaps (estimate() adds the busiest rank's).
  std::vector<double> f = c.ranks.f;
  for (std::size_t r = 0; r < f.size() && r < hidden.size(); ++r) f[r] -= hidden[r] / mb;
  double pipe = pipeline_time(l, f, c.ranks.i, c.ranks.w);
  if (p > 1) {
    // Total: the transfers on the step's path, fill and drain included, so exposed <= total.
    e.pp_comm_s = 2.0 * (mb + p - 1) * l.vpp * c.p2p_s;
    e.pp_exposed_s = 2.0 * (p - 1) * l.vpp * c.p2p_s;
    if (!l.overlap_p2p) e.pp_exposed_s += 2.0 * mb * l.vpp * c.p2p_s;
    else e.overlapped_comm_s += 2.0 * mb * l.vpp * c.p2p_s;
    pipe += e.pp_exposed_s;
  }
  return pipe;
}

// The busiest pipeline rank (the most work per step) sets the TP and CP rows and the compute row.
int busiest_rank(Estimate& e, const StepCosts& c, double overlap_slowdown, const std::vector<double>& hidden) {
  const Layout& l = c.work.layout;
  const RankSums& rs = c.ranks;
  const double mb = e.microbatches;
  int busiest = 0;
  double most = 0;
  for (int r = 0; r < l.pp; ++r) {
    // Less what it hides of its all-to-alls in F&B blocks (a2a_hidden).
    const double busy = mb * (rs.f[r] + rs.i[r] + rs.w[r]) - hidden[static_cast<std::size_t>(r)];
    if (r == 0 || busy > most) {
      busiest = r;
      most = busy;
    }
  }
  e.busy_s = most;
  // TP collectives block the compute stream (Megatron's default): all of their time is exposed. Under
  // tp_comm_overlap the stage times hold the part not hidden plus the GEMMs' slowdown (sim/workload.cpp
  // overlap_tp_comm): exposed counts both, all TP time the hidden part too.
  e.tp_exposed_s = mb * (rs.tp_f[busiest] + rs.tp_b[busiest]);
  e.cp_comm_s = 0;
  double tp_hidden = 0;
  for (const auto& st : c.work.stages)
    if (l.rank_of_stage(st.stage) == busiest)
      for (int k = 0; k < kLayerKinds; ++k) {
        // Each kind of layer hides its own TP collectives (a MoE model's dense layers their MLP's); a
        // recomputed layer's forward hides them once more.
        const int n = st.kind_layers[static_cast<std::size_t>(k)], r = st.kind_recomputed[static_cast<std::size_t>(k)];
        if (n == 0) continue;
        const LayerWork& kw = c.work.kind(k);
        e.cp_comm_s += mb * n * (kw.cp_comm_f + kw.cp_comm_b);
        e.cp_exposed_s += mb * n * (kw.t_cp_f + kw.t_cp_b);
        tp_hidden += mb * (n * (kw.tp_hidden_f + kw.tp_hidden_b) + (l.recompute == Recompute::full ? r * kw.tp_hidden_f : 0.0));
      }
  const double s = overlap_slowdown;
  e.tp_comm_s = e.tp_exposed_s - tp_hidden * s / (1.0 + s) + tp_hidden;
  // A MoE layer's all-to-alls (and etp gathers) block the compute stream as TP's do (Megatron-Core's default,
  // without the 1F1B all-to-all overlap): they ride in the layers' collectives above and are reported apart.
  for (const auto& st : c.work.stages)
    if (l.rank_of_stage(st.stage) == busiest) e.ep_comm_s += mb * (st.ep_f + st.ep_b);
  e.tp_comm_s -= e.ep_comm_s;
  e.tp_exposed_s -= e.ep_comm_s;
  e.ep_exposed_s = e.ep_comm_s - hidden[static_cast<std::size_t>(busiest)];  // DualPipeV's F&B blocks hide some
  e.compute_s = e.busy_s - e.tp_exposed_s - e.ep_exposed_s - e.cp_exposed_s;  // the layers' TP, EP and CP time is inside busy
  return busiest;
}

// Data-parallel gradient reduction and the distributed optimizer's parameter all-gather: the exposed tail
// after the pipeline, of the rank that ends last.
void data_parallel(Estimate& e, const StepCosts& c, int busiest, double overlap_slowdown) {
  const Layout& l = c.work.layout;
  const RankSums& rs = c.ranks;
  const int p = l.pp;
  double dp_tail = 0;
  for (int r = 0; r < p; ++r) {
    const double params = rs.params[r];
    double t_grad = c.tail[r].grad_s, t_param = c.tail[r].gather_s;
    double exposed_grad = t_grad, exposed_param = t_param;
    // ZeRO-2's reductions, one per micro-batch (StepSync::grad_reductions), queue on the data-parallel links
    // from the first backward on, behind the compute that follows (every later micro-batch's forward and
    // backward, and the last one's backward, as ZeRO-1's): what the queue cannot finish inside that window
    // is exposed.
    const double reductions = c.work.sync.grad_reductions;
    const double t_one = t_grad;
    t_grad *= reductions;
    exposed_grad = t_grad;
    if (l.overlap_grad_reduce && t_grad > 0) {
      // Buckets reduce while the last micro-batch's backward runs; the last bucket cannot overlap.
      const double buckets = grad_buckets(params);
      // Compute beside the reductions runs slowed by overlap_slowdown s, so it covers (1 + s) times its
      // own length; what overlaps is charged that slowdown below (overlap_slowdown_s), so an exposure of
      // C - W (1 + s) makes the step's added time C - W when the reductions (C) outlast the window (W).
      // The slowdown is charged for the busiest rank: where the tail comes from another rank, the step is
      // short by at most that rank's window times s.
      const double window = ((reductions - 1) * (rs.f[r] + rs.i[r] + rs.w[r]) + rs.i[r] + rs.w[r]) *
                            (1.0 + overlap_slowdown);
      exposed_grad = std::max(t_one / buckets, t_grad - window);
    }
    if (l.overlap_param_gather && t_param > 0) {
      const double buckets = grad_buckets(params);
      exposed_param = t_param / buckets;  // overlapped with the next step's first forward
    }
    // Rank r finishes its last backward (p-1-r) forward+backward slots before rank 0 does, in 1F1B order.
    const double end = exposed_grad + exposed_param - (p > 1 ? (rs.f[r] + rs.i[r] + rs.w[r]) * r / l.vpp : 0.0);
    // The tail may come from another rank than the busiest: total is the largest rank's, so exposed <= total.
    e.dp_comm_s = std::max(e.dp_comm_s, t_grad + t_param);
    if (r == busiest) e.overlapped_comm_s += (t_grad - exposed_grad) + (t_param - exposed_param);
    dp_tail = std::max(dp_tail, end);
  }
  e.dp_exposed_s = std::max(0.0, dp_tail);
}

// ZeRO-3 (DeepSpeed): every layer's weights are all-gathered for forward and again for backward, and its
// gradients reduce-scattered, per micro-batch. Two assumptions, chosen against the scaling of Narayanan et
// al. Table 2 (ZeRO-3 rows) and stated in docs/validation.md: the collectives run as flat rings limited by
// each GPU's own NIC (StepSync), and only the forward all-gathers are prefetched behind compute (backward,
// with activation recomputation, waits for its gathers and reductions).
void zero3(Estimate& e, const StepCosts& c) {
  const Layout& l = c.work.layout;
  if (l.zero_stage != 3 || l.dp * l.cp == 1) return;
  const double mb = e.microbatches;
  const double ag = c.zero3_gather_s, rsg = c.zero3_scatter_s;
  // Every layer a rank holds is gathered and reduced once per micro-batch: with vpp chunks that is the sum
  // over the rank's chunks. The rank holding the most layers stalls longest and sets the pace; each kind of
  // layer hides the next layer's gather behind its own forward.
  const auto most = std::max_element(c.ranks.layers.begin(), c.ranks.layers.end());
  const int rank = static_cast<int>(most - c.ranks.layers.begin()), layers = *most;
  double exposed = 0, hidden = 0;
  for (const auto& st : c.work.stages)
    if (l.rank_of_stage(st.stage) == rank)
      for (int k = 0; k < kLayerKinds; ++k) {
        const int n = st.kind_layers[static_cast<std::size_t>(k)];
        if (n == 0) continue;
        const double f_layer = c.work.kind(k).t_f + c.work.kind(k).t_tp_f;
        exposed += mb * n * (std::max(0.0, ag - f_layer) + ag + rsg);
        hidden += mb * n * std::min(ag, f_layer);
      }
  e.overlapped_comm_s += hidden;
  e.dp_comm_s += mb * layers * (2 * ag + rsg);
  e.dp_exposed_s += exposed;
}

// Throughput and FLOP rates from the step time.
void rates(Estimate& e, const StepCosts& c, const Model& m, int gpus, double peak) {
  const Layout& l = c.work.layout;
  const double mb = e.microbatches;
  const double tokens = static_cast<double>(l.global_batch) * m.seq_len;
  e.tokens_per_s = tokens / e.step_s;
  e.samples_per_s = l.global_batch / e.step_s;
  const double model_flops = model_flops_per_step(c.work);
  double hw_mb = 0;
  for (const auto& st : c.work.stages) hw_mb += st.flops_hw;
  const double hw_flops = hw_mb * l.tp * l.cp * mb * l.dp;
  // eq. 3: 4x forward of the layers (recompute assumed) + 3x the logit layer.
  double layers_fwd = 0;
  for (const auto& st : c.work.stages) layers_fwd += st.flops_layers_f * l.tp * l.cp;
  const double head_model = model_flops / (mb * l.dp) - 3 * layers_fwd;
  const double eq3_flops = (4 * layers_fwd + head_model) * mb * l.dp;
  e.model_tflops_per_gpu = model_flops / e.step_s / gpus / 1e12;
  e.hw_tflops_per_gpu = hw_flops / e.step_s / gpus / 1e12;
  e.tflops_eq3_per_gpu = eq3_flops / e.step_s / gpus / 1e12;
  e.mfu = model_flops / e.step_s / gpus / peak;
  // fwd + bwd = 3x the forward's attention core counted non-causal (windowed layers count their band as
  // computed: nothing to halve), over every layer of every micro-batch of the replicas.
  double attention_layers = 0;
  for (const auto& st : c.work.stages)
    for (int k = 0; k < kLayerKinds; ++k)
      attention_layers += st.kind_layers[static_cast<std::size_t>(k)] * c.work.kind(k).flops_attention_f;
  attention_layers += m.mtp_layers * c.work.kind(layer_kind(m, m.layers - 1)).flops_attention_f;
  const double attention_full = 3 * attention_layers * l.tp * l.cp * mb * l.dp;
  const double causal_flops = model_flops - attention_full / 2;
  e.model_tflops_per_gpu_causal = causal_flops / e.step_s / gpus / 1e12;
  e.mfu_causal = causal_flops / e.step_s / gpus / peak;
  e.hfu = hw_flops / e.step_s / gpus / peak;
}

// Memory per pipeline rank: the state the step costs give, and the activations the schedule keeps in flight.
void memory(Estimate& e, const StepCosts& c, double capacity, double min_headroom) {
  const Layout& l = c.work.layout;
  const RankSums& rs = c.ranks;
  const double mb = e.microbatches;
  const cost::StateBytes& sb = c.state;
  e.capacity_bytes = capacity;
  for (int r = 0; r < l.pp; ++r) {
    cost::MemoryBreakdown mbk;
    mbk.rank = r;
    // The routed experts' states are sharded over their own replicas (edp), the rest over dp x cp.
    const double experts = rs.expert_params[r], others = rs.params[r] - experts;
    e.expert_params.push_back(experts);
    e.rank_params.push_back(rs.params[r]);
    const cost::StateBytes& se = c.expert_state;
    mbk.weights_bytes = c.weight_bytes(r);  // an fp8 run's GEMM weights at their own bytes (cost::StateBytes)
    mbk.grads_bytes = others * sb.grads + experts * se.grads;
    mbk.optimizer_bytes = others * sb.optimizer + experts * se.optimizer;
    const double chunks = cost::inflight_chunks(l, r);
    mbk.activations_bytes = chunks * rs.act[r];
    // Embedding output stays alive per in-flight micro-batch. The logits live from the last stage's forward
    // to its input-grad backward (the simulator frees them there: engine/job_pipeline.cpp, release):
    // cost::last_stage_extras_alive counts the micro-batches at once.
    mbk.extras_bytes = rs.extra_first[r] * std::min<double>(chunks, mb) + rs.extra_last[r] * cost::last_stage_extras_alive(l);
    mbk.zero3_gather_bytes = c.zero3_gather_bytes;
    mbk.recompute_transient_bytes = c.recompute_transient_bytes;
    mbk.fragmentation_bytes = l.fragmentation * mbk.dynamic_bytes();
    mbk.reserved_bytes = c.reserved_bytes;
    e.memory.push_back(mbk);
    if (mbk.total() > e.peak_memory_bytes) {
      e.peak_memory_bytes = mbk.total();
      e.peak_rank = r;
    }
  }
  e.min_headroom_bytes = min_headroom;
  e.fits = e.peak_memory_bytes + min_headroom <= e.capacity_bytes;
}

}  // namespace

Estimate estimate(const Model& m, const Layout& l, const System& sys, int gpus, const LayerWork* layer) {
  if (gpus <= 0) gpus = l.gpus();
  check_runnable(m, l, sys, gpus);
  const StepCosts c = step_costs(m, l, sys, layer);
  Estimate e;
  e.layout = l;
  e.gpus = gpus;
  e.microbatches = l.num_microbatches();
  const std::vector<double> hidden = a2a_hidden(c, e.microbatches);
  const double pipe = pipeline_span(e, c, hidden);
  // What the busiest rank hides of its all-to-alls is neither its busy time nor exposed (busiest_rank).
  const int busiest = busiest_rank(e, c, sys.gpu.overlap_slowdown, hidden);
  e.overlapped_comm_s += hidden[static_cast<std::size_t>(busiest)];
  data_parallel(e, c, busiest, sys.gpu.overlap_slowdown);
  zero3(e, c);
  // Tied embeddings across the first and last stage: their gradients are all-reduced between the two.
  e.dp_comm_s += c.tied_s;
  e.dp_exposed_s += c.tied_s;
  // The largest rank's optimizer step, the gradient norm before it and the gradients' zeroing after it (one rank
  // has the most parameters of all three: they scale alike).
  for (const RankTail& t : c.tail)
    if (t.grad_norm_s + t.optimizer_s + t.zero_grad_s > e.grad_norm_s + e.optimizer_s + e.zero_grad_s)
      e.grad_norm_s = t.grad_norm_s, e.optimizer_s = t.optimizer_s, e.zero_grad_s = t.zero_grad_s;
  // SP: the replicated parameters' gradient all-reduce over tp, once a step, exposed (the slowest rank's).
  // (One call: a collective's time grows with its size.)
  const double sp_grad = c.work.sync.sp_grad.seconds(sys, *std::max_element(c.ranks.sp_grad_params.begin(), c.ranks.sp_grad_params.end()));
  e.tp_comm_s += sp_grad;
  e.tp_exposed_s += sp_grad;
  const double s_ov = sys.gpu.overlap_slowdown;
  e.overlap_slowdown_s = e.overlapped_comm_s * s_ov / (1.0 + s_ov);
  e.step_s = pipe + e.dp_exposed_s + sp_grad + e.grad_norm_s + e.optimizer_s + e.zero_grad_s + e.overlap_slowdown_s;
  // Idle time only, as `tessel simulate` reports it: the pipeline's span less the busiest rank's work and the
  // transfers it waits on (those are the PP row).
  e.pipeline_s = pipe;
  e.bubble_fraction = l.pp > 1 ? std::max(0.0, (pipe - e.busy_s - e.pp_exposed_s) / e.step_s) : 0.0;
  rates(e, c, m, gpus, sys.gpu.peak(l.precision));
  memory(e, c, sys.gpu.memory_bytes, sys.min_headroom_bytes);
  for (const auto& st : c.work.stages) {
    e.stage_f.push_back(st.f);
    e.stage_i.push_back(st.i);
    e.stage_w.push_back(st.w);
  }
  TESSEL_CHECK(std::isfinite(e.step_s) && e.step_s > 0, "step time " << e.step_s);
  return e;
}

}  // namespace tessel

namespace tessel {

Json estimate_to_json(const Estimate& e) {
  Json j;
  j["layout"] = layout_to_json(e.layout);
  j["gpus"] = e.gpus;
  j["microbatches"] = e.microbatches;
  j["step_s"] = e.step_s;
  j["tokens_per_s"] = e.tokens_per_s;
  j["samples_per_s"] = e.samples_per_s;
  j["tflops_per_gpu_eq3"] = e.tflops_eq3_per_gpu;
  j["model_tflops_per_gpu"] = e.model_tflops_per_gpu;
  j["hw_tflops_per_gpu"] = e.hw_tflops_per_gpu;
  j["mfu"] = e.mfu;
  j["mfu_causal"] = e.mfu_causal;
  j["model_tflops_per_gpu_causal"] = e.model_tflops_per_gpu_causal;
  j["flop_convention"] = "model FLOPs count attention full (non-causal), as Megatron-LM and PaLM; *_causal count half of QK^T and AV";
  j["hfu"] = e.hfu;
  j["bubble_fraction"] = e.bubble_fraction;
  j["compute_s"] = e.compute_s;
  j["comm"] = {{"tp_s", e.tp_comm_s}, {"tp_exposed_s", e.tp_exposed_s}, {"ep_s", e.ep_comm_s}, {"ep_exposed_s", e.ep_exposed_s},
               {"cp_s", e.cp_comm_s}, {"cp_exposed_s", e.cp_exposed_s},
               {"pp_s", e.pp_comm_s}, {"pp_exposed_s", e.pp_exposed_s}, {"dp_s", e.dp_comm_s},
               {"dp_exposed_s", e.dp_exposed_s}, {"overlapped_s", e.overlapped_comm_s},
               {"overlap_slowdown_s", e.overlap_slowdown_s}};
  j["optimizer_s"] = e.optimizer_s;
  j["grad_norm_s"] = e.grad_norm_s;
  j["zero_grad_s"] = e.zero_grad_s;
  Json mem = Json::array();
  for (const auto& m : e.memory)
    mem.push_back({{"rank", m.rank}, {"weights_GiB", m.weights_bytes / kGiB}, {"grads_GiB", m.grads_bytes / kGiB},
                   {"optimizer_GiB", m.optimizer_bytes / kGiB}, {"activations_GiB", m.activations_bytes / kGiB},
                   {"extras_GiB", m.extras_bytes / kGiB}, {"zero3_gather_GiB", m.zero3_gather_bytes / kGiB},
                   {"recompute_transient_GiB", m.recompute_transient_bytes / kGiB}, {"fragmentation_GiB", m.fragmentation_bytes / kGiB},
                   {"reserved_GiB", m.reserved_bytes / kGiB}, {"total_GiB", m.total() / kGiB}});
  j["memory_per_pipeline_rank"] = mem;
  j["peak_memory_GiB"] = e.peak_memory_bytes / kGiB;
  j["peak_rank"] = e.peak_rank;
  j["capacity_GiB"] = e.capacity_bytes / kGiB;
  j["min_headroom_GiB"] = e.min_headroom_bytes / kGiB;
  j["fits"] = e.fits;
  return j;
}

double stage_imbalance(const Estimate& e) {
  double slowest = 0, sum = 0;
  for (std::size_t s = 0; s < e.stage_f.size(); ++s) {
    const double t = e.stage_f[s] + e.stage_i[s] + e.stage_w[s];
    slowest = std::max(slowest, t);
    sum += t;
  }
  return sum > 0 ? slowest * static_cast<double>(e.stage_f.size()) / sum - 1 : 0.0;
}

}  // namespace tessel
