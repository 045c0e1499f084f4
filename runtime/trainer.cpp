#include "runtime/trainer.hpp"

#include <chrono>
#include <mutex>
#include <sstream>

#include "kernels/cpu/gemm.hpp"
#include "runtime/comm/thread_comm.hpp"
#include "runtime/host_sched.hpp"
#include "util/error.hpp"

namespace tessel::rt {

void check_runnable(const Model& m, const Layout& l) {
  check_layout(l, m, l.gpus());
  check_position_embedding(m);
  // The runtime builds pre-LN blocks of two norms with learned or rotary positions (runtime/params.cpp); an
  // imported model of another block shape is counted by the cost model but not run.
  const auto unsupported = [&](const std::string& what) {
    throw InputError("model " + m.name + ": " + what + " is counted by the cost model but not implemented by the "
                     "runtime");
  };
  if (m.position == PositionEmbedding::alibi) unsupported("position alibi");
  if (m.layer_norms != 2) unsupported("layer_norms " + std::to_string(m.layer_norms) + " (the runtime has 2 per block)");
  if (m.embedding_norm) unsupported("embedding_norm");
  if (m.qk_norm) unsupported("qk_norm");
  if (m.head_bias && !m.tied_embeddings) unsupported("head_bias");
  if (l.cp != 1) throw InputError("--cp " + std::to_string(l.cp) + ": the CPU runtime has no context parallelism");
  if (m.heads % l.tp != 0 || m.kv_heads % l.tp != 0 || m.ffn % l.tp != 0 || m.vocab % l.tp != 0)
    throw InputError("--tp " + std::to_string(l.tp) + ": must divide heads " + std::to_string(m.heads) + ", kv heads " +
                     std::to_string(m.kv_heads) + ", ffn " + std::to_string(m.ffn) + " and vocab " + std::to_string(m.vocab));
  if (l.sequence_parallel && (l.micro_batch * m.seq_len) % l.tp != 0)
    throw InputError("--sp: micro-batch tokens " + std::to_string(l.micro_batch * m.seq_len) +
                     " must be divisible by tp " + std::to_string(l.tp));
  if (const std::string extra = m.beyond_dense(); !extra.empty() && !m.moe.enabled())
    unsupported(extra);
  if (m.moe.enabled()) {
    const MoeSpec& e = m.moe;
    // Name only what this runtime lacks: the experts themselves it runs.
    std::vector<std::string> lacks;
    if (m.mla.enabled()) lacks.push_back("multi-head latent attention");
    if (m.mtp_layers > 0) lacks.push_back("multi-token prediction (mtp_layers " + std::to_string(m.mtp_layers) + ")");
    if (m.sliding_window > 0 && m.sliding_window < m.seq_len) lacks.push_back("sliding-window attention");
    if (m.attention_sinks) lacks.push_back("attention sinks");
    if (!lacks.empty()) {
      std::string what;
      for (const auto& x : lacks) what += (what.empty() ? "" : ", ") + x;
      unsupported(what);
    }
    if (e.shared_gate) unsupported("moe.shared_gate");
    if (e.expert_bias) unsupported("moe.expert_bias");
    if (m.has_mlp_bias()) unsupported("MLP biases in a mixture of experts");
    if (e.router.score == RouterScore::sigmoid && e.router.aux_loss_coef != 0) {
      std::ostringstream coef;
      coef << e.router.aux_loss_coef;
      throw InputError("model " + m.name + ": moe.router.aux_loss_coef " + coef.str() +
                       " (Megatron --moe-aux-loss-coeff; HF aux_loss_alpha or router_aux_loss_coef) with a sigmoid router: the CPU runtime's "
                       "load-balancing loss is for softmax routers; set it to 0 to run (the selection bias, if the "
                       "model has one, balances the load)");
    }
    if (e.router.logit_bias) unsupported("moe.router.logit_bias");
    if (l.moe_skew != 1.0 || l.moe_capacity > 0)
      throw InputError("--moe-skew / --moe-capacity-factor: routing imbalance is a cost-model option; the runtime routes by "
                       "the router's choices (leave them out to run)");
    if (l.a2a_overlap)
      throw InputError("a2a-overlap (a layout word): the CPU runtime runs a forward and a backward one after the other "
                       "(the all-to-all overlap is a cost-model option here; leave it out to run)");
    if (l.deepep)
      throw InputError("deepep (a layout word): the CPU runtime dispatches with its own all-to-all over the ep group "
                       "(DeepEP is a cost-model option here; leave it out to run)");
  }
  for (int s = 0; s < l.num_stages(); ++s)
    if (l.layers_of_stage(s, m.layers) < 1)
      throw InfeasibleLayout("stage " + std::to_string(s) + " has no layer: " + std::to_string(m.layers) +
                             " layers over " + std::to_string(l.num_stages()) + " stages");
}

sched::Schedule runtime_schedule(const Layout& l, SendMode sends) {
  const sched::GenParams p = schedule_params(l);
  // One stage: F then B per micro-batch (1F1B with p = 1), as Megatron's forward_backward_no_pipelining,
  // so one micro-batch's activations are alive at a time, whatever --schedule names.
  sched::Schedule s = sched::generate(l.pp == 1 && l.vpp == 1 ? sched::Kind::one_f_one_b : l.schedule, p);
  for (int st = 0; st < s.num_stages; ++st)
    TESSEL_CHECK(s.rank_of(st) == l.rank_of_stage(st), "schedule " << sched::name(l.schedule) << " places stage " << st << " on rank "
                 << s.rank_of(st) << ", the layout on " << l.rank_of_stage(st));
  return sched::lower(s, sends == SendMode::eager ? sched::GapOrder::SendsFirst : sched::GapOrder::Auto);
}

std::vector<std::string> rank_param_names(const Model& m, const Layout& l, const sched::Schedule& s, int pp_rank) {
  const int S = l.num_stages();
  std::vector<std::string> names;
  for (int st : s.stages_of(pp_rank)) {
    const int l0 = l.first_layer_of_stage(st, m.layers);
    for (const auto& n : stage_param_names(m, l0, l0 + l.layers_of_stage(st, m.layers), st == 0, st == S - 1))
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  return names;
}

StageConfig stage_config(const Model& m, const Layout& l, const sched::Schedule& s, int stage) {
  StageConfig c;
  c.stage = stage;
  c.chunk = s.chunk_of(stage);
  c.l0 = l.first_layer_of_stage(stage, m.layers);
  c.l1 = c.l0 + l.layers_of_stage(stage, m.layers);
  c.first = stage == 0;
  c.last = stage == l.num_stages() - 1;
  c.micro_batch = l.micro_batch;
  c.loss_scale = 1.0f / static_cast<float>(l.num_microbatches() * l.dp);
  c.recompute = l.recompute;
  c.method = l.recompute_method;
  c.recompute_layers = l.recompute_layers;
  return c;
}

Trainer::Trainer(const Model& m, const Layout& l, const TrainOptions& opt, Comm& world, Recorder::Clock::time_point t0)
    : model_(m), layout_(l), opt_(opt) {
  check_runnable(m, l);
  groups_ = make_groups(world, l, m.moe.enabled());
  rec_ = Recorder(world.rank(), t0, opt.record_trace);
  schedule_ = runtime_schedule(l, SendMode::eager);
  data_ = opt.data_file.empty() ? TokenStream::synthetic(opt.seed, m.vocab) : TokenStream::from_file(opt.data_file, m.vocab);
  const int S = l.num_stages(), pp_rank = groups_.at.pp;
  // Routed experts live in their own store: this rank holds its ep rank's, its etp slice of each, replicated
  // over edp, not dp.
  std::vector<std::string> dense, experts;
  std::map<std::string, int> expert_of;
  for (const ParamSpec& p : gpt_param_specs(m))
    if (p.expert >= 0) expert_of[p.name] = p.expert;
  for (const std::string& n : rank_param_names(m, l, schedule_, pp_rank)) {
    auto e = expert_of.find(n);
    if (e == expert_of.end()) dense.push_back(n);
    else if (expert_owner(e->second, m.moe.experts, l.ep) == groups_.at.ep) experts.push_back(n);
  }
  store_ = ParamStore(m, dense, l.tp, groups_.at.tp, opt.seed);
  experts_ = ParamStore(m, experts, l.expert_tp(), groups_.at.etp, opt.seed);
  tp_ = {l.tp > 1 ? groups_.tp.get() : nullptr, l.tp, groups_.at.tp, l.sequence_parallel && l.tp > 1, &rec_};
  ep_ = {l.ep > 1 ? groups_.ep.get() : nullptr, l.ep, groups_.at.ep, &rec_,
         l.expert_tp() > 1 ? groups_.etp.get() : nullptr, l.expert_tp(), groups_.at.etp};
  ParamStore* ex = m.moe.enabled() ? &experts_ : nullptr;
  for (int s : schedule_.stages_of(pp_rank))
    stages_[s] = std::make_unique<Stage>(m, stage_config(m, l, schedule_, s), store_, tp_, rec_, ex, ep_);
  // Tied embeddings on two pipeline ranks: the first and last stages' ranks exchange embed.tok gradients.
  const int first_rank = schedule_.rank_of(0), last_rank = schedule_.rank_of(S - 1);
  int tied_peer = -1;
  if (m.tied_embeddings && first_rank != last_rank && (pp_rank == first_rank || pp_rank == last_rank))
    tied_peer = pp_rank == first_rank ? last_rank : first_rank;
  optimizer_ = std::make_unique<DistributedOptimizer>(m, l, store_, groups_, rec_, opt.optimizer, tied_peer,
                                                      pp_rank == first_rank, ex);
}

void Trainer::load_batch(std::int64_t first_sample) {
  const int m = layout_.num_microbatches(), b = layout_.micro_batch, seq = model_.seq_len;
  batch_.assign(m, MicroBatch{});
  for (int i = 0; i < m; ++i) {
    MicroBatch& mbt = batch_[i];
    mbt.tokens.resize(static_cast<std::size_t>(b) * seq);
    mbt.targets.resize(mbt.tokens.size());
    for (int k = 0; k < b; ++k) {
      const std::int64_t j = first_sample + static_cast<std::int64_t>(groups_.at.dp) * m * b + static_cast<std::int64_t>(i) * b + k;
      data_.sample(j, seq, mbt.tokens.data() + static_cast<std::size_t>(k) * seq, mbt.targets.data() + static_cast<std::size_t>(k) * seq);
    }
  }
}

StepStats Trainer::step() {
  // The step's time is the job's, not this rank's: every rank starts it together (Megatron's interval timer
  // starts with barrier=True) and reports the slowest rank's elapsed time (below).
  groups_.world->barrier();
  const auto start = std::chrono::steady_clock::now();
  const std::optional<ThreadSched> sched0 = thread_sched();
  const int k = optimizer_->steps_done();
  load_batch(consumed_samples_);
  ExecutorContext ctx;
  ctx.schedule = &schedule_;
  ctx.at = {groups_.at.pp, k, groups_.at.tp + layout_.tp * groups_.at.dp, layout_.tp * layout_.dp};
  ctx.pp = groups_.pp.get();
  ctx.stages = &stages_;
  ctx.data = [this](int mb) -> const MicroBatch& { return batch_.at(static_cast<std::size_t>(mb)); };
  ctx.rec = &rec_;
  if (layout_.zero_stage >= 1) {
    const auto cfg = [this](int s) -> const StageConfig& { return stages_.at(s)->config(); };
    ctx.before_compute = [this, cfg](int s, bool reads, bool makes) {
      const StageConfig& c = cfg(s);
      optimizer_->before_compute(c.l0, c.l1, c.first, c.last, reads, makes);
    };
    ctx.after_compute = [this, cfg](int s, bool done) {
      const StageConfig& c = cfg(s);
      optimizer_->after_compute(c.l0, c.l1, c.first, c.last, done);
    };
  }
  const PipelineLosses local = run_pipeline(ctx);
  // Loss: the last stage's tp rank 0 of each dp replica contributes its scaled micro-batch means. The
  // load-balancing loss: every rank its part (its tokens, its MoE layers), scaled alike.
  const bool counts = stages_.count(layout_.num_stages() - 1) && groups_.at.tp == 0;
  const double per_mb = layout_.num_microbatches() * layout_.dp;
  float losses[2] = {counts ? static_cast<float>(local.loss / per_mb) : 0.0f, static_cast<float>(local.aux_loss / per_mb)};
  groups_.world->all_reduce(losses, 2);
  const float loss = losses[0];
  const OptimizerReport r = optimizer_->step();
  if (model_.moe.router.selection_bias)
    for (auto& [_, stage] : stages_)
      stage->update_selection_bias(layout_.dp > 1 ? groups_.dp.get() : nullptr, static_cast<float>(model_.moe.router.bias_update_rate));
  consumed_samples_ += layout_.global_batch;
  StepStats st;
  st.step = k;
  st.loss = loss;
  st.aux_loss = losses[1];
  st.grad_norm = r.grad_norm;
  st.param_grad_norms = r.param_grad_norms;
  float seconds = std::chrono::duration<float>(std::chrono::steady_clock::now() - start).count();
  const std::optional<ThreadSched> sched1 = thread_sched();
  // [CPU seconds, run-queue seconds, ranks that counted], summed over the world.
  float sched[3] = {0, 0, 0};
  if (sched0 && sched1) {
    sched[0] = static_cast<float>(sched1->cpu_s - sched0->cpu_s);
    sched[1] = static_cast<float>(sched1->run_delay_s - sched0->run_delay_s);
    sched[2] = 1;
  }
  groups_.world->all_reduce(sched, 3);
  if (static_cast<int>(sched[2]) == groups_.world->size()) {
    st.cpu_s = sched[0];
    st.run_delay_s = sched[1];
  }
  groups_.world->all_reduce(&seconds, 1, ReduceOp::max);
  st.seconds = seconds;
  return st;
}

std::string Trainer::process_name() const {
  std::string s;
  for (const auto& [stage, _] : stages_) s += (s.empty() ? "" : ",") + std::to_string(stage);
  return "rank " + std::to_string(groups_.world->rank()) + " (stage " + s + ")";
}

ThreadRunResult train_threads(const Model& m, const Layout& l, const TrainOptions& opt, int steps) {
  check_runnable(m, l);
  kernels::cpu::gemm_set_single_thread();
  ThreadRunResult out;
  out.peak_activation_bytes.assign(static_cast<std::size_t>(l.gpus()), 0);
  out.state_memory.assign(static_cast<std::size_t>(l.gpus()), StateMemory{});
  std::mutex mu;
  const auto t0 = Recorder::Clock::now();
  run_threads(l.gpus(), [&](Comm& world) {
    Trainer t(m, l, opt, world, t0);
    std::vector<StepStats> mine;
    for (int i = 0; i < steps; ++i) mine.push_back(t.step());
    std::lock_guard<std::mutex> lk(mu);
    out.peak_activation_bytes[static_cast<std::size_t>(world.rank())] = t.recorder().peak_bytes();
    out.state_memory[static_cast<std::size_t>(world.rank())] = t.optimizer().state_memory();
    if (world.rank() == 0) out.steps = std::move(mine);
    auto& ev = t.recorder().events();
    out.trace.events.insert(out.trace.events.end(), ev.begin(), ev.end());
    out.trace.process_names[world.rank()] = t.process_name();
  });
  // Deterministic event order: by rank, then as recorded.
  std::stable_sort(out.trace.events.begin(), out.trace.events.end(),
                   [](const trace::OpEvent& a, const trace::OpEvent& b) { return a.rank < b.rank; });
  return out;
}

}  // namespace tessel::rt
