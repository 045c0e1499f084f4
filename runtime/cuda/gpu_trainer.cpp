#include "runtime/cuda/gpu_trainer.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/nvtx.hpp"
#include "util/error.hpp"
#include "runtime/comm/self_comm.hpp"
#include "runtime/cuda/nccl_comm.hpp"
#include "runtime/cuda/staged_comm.hpp"
#include "runtime/trainer_checkpoint.hpp"

namespace tessel::rt::cuda {

namespace kg = kernels::cuda;

// The pipeline walk (runtime/executor.hpp) on device buffers: GpuStages, their kernels timed with CUDA
// events, sends and receives over the pp communicator (NCCL, or staged through the host).
class GpuTrainer::Pipeline final : public PipelineBackend<DBuf> {
 public:
  explicit Pipeline(GpuTrainer& t) : t_(t) {}

  std::pair<int, int> stage_layers(int st) override {
    const GpuStageConfig& c = stage(st).config();
    return {c.l0, c.l1};
  }
  double forward_flops(int st) override { return stage(st).forward_flops(); }

  void begin_compute(const ComputeAction& c) override {
    nvtx_.emplace(c.id.op.c_str());
    op_ = t_.dev_.begin_op(trace::Stream::compute, c.id, c.name, c.flops, 0.0);
  }
  void end_compute(const ComputeAction&) override {
    t_.dev_.end_op(op_);
    nvtx_.reset();
  }
  // ZeRO-2/3 are finer than the CPU backend's per-action hooks: the stage opens each group's windows as
  // it reaches it (GpuStage::ParamHooks): ZeRO-3 gathers one layer's values at a time, as FSDP does, and
  // a group's gradient lives from the first kernel writing it to the end of its micro-batch's part (B, or
  // W after I), as DeepSpeed's reduction buckets. The same micro-batch sums as the CPU's, in more pieces.
  // After a B or W nothing of the stage's may be left live (checked at the step's end).
  void after_compute(const ComputeAction& c) override {
    if (t_.params_->grouped() && c.grads_done()) t_.flush_grads(t_.stage_groups(c.stage));
  }

  DBuf forward(int st, int mb, DBuf in) override {
    return stage(st).forward(mb, in, static_cast<const std::int32_t*>(t_.tokens_[mb]->get()),
                             static_cast<const std::int32_t*>(t_.targets_[mb]->get()));
  }
  DBuf backward(int st, int mb, DBuf dout, bool full) override {
    return stage(st).backward(mb, dout, /*defer_weight=*/!full);
  }
  void weight(int st, int mb) override { stage(st).backward_weight(mb); }

  void send(const P2pAction& p, DBuf buf) override { transfer(p, std::move(buf)); }
  DBuf recv(const P2pAction& p) override {
    DBuf buf = t_.dev_.alloc_f32(stage(p.stage).activation_elems());
    if (t_.record_only_)  // synthesised input of the next op
      throw_if_failed(kg::fill_uniform(t_.dev_.compute(), f32(buf), stage(p.stage).activation_elems(),
                                       t_.opt_.seed + std::uint64_t(p.mb), 1.0f));
    transfer(p, buf);
    return buf;
  }

 private:
  GpuStage& stage(int st) { return *t_.stages_.at(st); }
  // On the comm stream after the compute that made (or last read) the buffer; --only-rank records it
  // without running it.
  void transfer(const P2pAction& p, DBuf buf) {
    const std::size_t n = stage(p.stage).activation_elems();
    t_.dev_.comm_waits_compute();
    const std::size_t id = t_.dev_.begin_op(trace::Stream::pp, p.id, p.name, 0.0, double(n) * sizeof(float), p.flow);
    if (!t_.record_only_) {
      if (p.send) t_.groups_.pp->send(f32(buf), n, p.peer, p.tag);
      else t_.groups_.pp->recv(f32(buf), n, p.peer, p.tag);
    }
    t_.dev_.end_op(id);
    if (t_.record_only_) return;  // (a synthesised input is on the compute stream already)
    // With overlap_p2p compute goes on past a send; the buffer stays until compute next waits for comm.
    if (p.send && t_.layout_.overlap_p2p) t_.dev_.comm_in_flight({buf});
    else t_.dev_.compute_waits_comm();
  }

  GpuTrainer& t_;
  std::optional<kg::NvtxRange> nvtx_;
  std::size_t op_ = 0;
};

GpuTrainer::GpuTrainer(CudaDevice& dev, const Model& m, const Layout& l, const GpuTrainOptions& opt, Comm* world,
                       Recorder::Clock::time_point t0)
    : dev_(dev), model_(m), layout_(l), opt_(opt), world_(world), record_only_(opt.only_rank >= 0) {
  check_runnable(m, l);
  if (record_only_) {
    world_rank_ = opt.only_rank;
    at_ = coords_of(opt.only_rank, l);
  } else if (world) {
    groups_ = make_groups(*world, l, m.moe.enabled());
    at_ = groups_.at;
    world_rank_ = world->rank();
    // The data-parallel group enqueues on the device's dp stream (CudaDevice::Lane::dp).
    if (auto* n = dynamic_cast<NcclComm*>(groups_.dp.get())) n->set_stream(dev.dp());
    else if (auto* d = dynamic_cast<DeviceStagedComm*>(groups_.dp.get())) d->set_stream(dev.dp());
    else TESSEL_CHECK(l.dp == 1, "the data-parallel communicator is neither NCCL nor device-staged: " << groups_.dp->backend());
  }
  rec_ = Recorder(world_rank_, t0, opt.record_trace);
  schedule_ = runtime_schedule(l, SendMode::rendezvous);
  data_ = opt.data_file.empty() ? TokenStream::synthetic(opt.seed, m.vocab) : TokenStream::from_file(opt.data_file, m.vocab);
  first_pp_ = schedule_.rank_of(0);
  last_pp_ = schedule_.rank_of(l.num_stages() - 1);
  // Every member of a pp group splits it (a collective), members of the pair or not.
  if (m.tied_embeddings && first_pp_ != last_pp_ && world && !record_only_) {
    const bool pair = at_.pp == first_pp_ || at_.pp == last_pp_;
    embed_ = groups_.pp->split(pair ? 0 : -1, at_.pp == first_pp_ ? 0 : 1);
  }
  // Routed experts in a store of their own (this rank's ep rank's), as the CPU trainer's.
  std::vector<std::string> names, expert_names;
  {
    std::map<std::string, int> expert_of;
    for (const ParamSpec& p : gpt_param_specs(m))
      if (p.expert >= 0) expert_of[p.name] = p.expert;
    for (const std::string& n : rank_param_names(m, l, schedule_, at_.pp)) {
      const auto e = expert_of.find(n);
      if (e == expert_of.end()) names.push_back(n);
      else if (expert_owner(e->second, m.moe.experts, l.ep) == at_.ep) expert_names.push_back(n);
    }
  }
  const bool bf16_gemms = opt.gemm == kernels::cuda::GemmType::bf16_fp32;
  params_ = std::make_unique<GpuParams>(dev, m, names, l.tp, at_.tp, l.zero_stage >= 1 ? l.dp : 1,
                                        l.zero_stage >= 1 ? at_.dp : 0, l.zero_stage, bf16_gemms, first_pp_ == at_.pp);
  if (record_only_) params_->synthesise(opt.seed);
  else params_->upload(ParamStore(m, names, l.tp, at_.tp, opt.seed));  // the CPU runtime's exact init
  if (m.moe.enabled()) {
    TESSEL_CHECK(l.zero_stage <= 1 && !record_only_,
                 "the CUDA runtime's experts run without ZeRO-2/3 and not under --only-rank (run_cuda checks)");
    // Each expert's FFN split over the etp ranks as the CPU runtime's store splits it (w1/wg columns, w2 rows);
    // under ZeRO-1 its moments (and, under bf16 GEMMs, its fp32 master values) sharded over the edp replicas,
    // as Megatron-Core's distributed optimizer shards expert states over the expert data-parallel group.
    const int zero_dp = l.zero_stage >= 1 ? l.expert_dp() : 1;
    experts_ = std::make_unique<GpuParams>(dev, m, expert_names, l.expert_tp(), at_.etp, zero_dp, zero_dp > 1 ? at_.edp : 0,
                                           l.zero_stage, bf16_gemms, false);
    experts_->upload(ParamStore(m, expert_names, l.expert_tp(), at_.etp, opt.seed));
  }
  loss_sum_ = dev.alloc_f32(1);
  const GpuTp tp{l.tp > 1 && !record_only_ ? groups_.tp.get() : nullptr, l.tp, at_.tp,
                 l.sequence_parallel && l.tp > 1, record_only_};
  dp_overlap_ = l.dp > 1 && !record_only_ && !params_->grouped() && l.overlap_grad_reduce;
  for (int st : schedule_.stages_of(at_.pp)) {
    const GpuEp ep{l.ep > 1 ? groups_.ep.get() : nullptr, l.ep, at_.ep, experts_.get(),
                   l.expert_tp() > 1 ? groups_.etp.get() : nullptr, l.expert_tp(), at_.etp};
    stages_[st] = std::make_unique<GpuStage>(dev, m, stage_config(m, l, schedule_, st), *params_, tp, opt.gemm,
                                             opt.attention_kernel, ep);
    stages_[st]->set_loss_sink(f32(loss_sum_));
    GpuStage::ParamHooks hooks;
    if (params_->zero_stage() == 3) {
      hooks.values = [this](const std::string& g, bool enter) { param_window(g, enter); };
      if (l.overlap_param_gather) hooks.prefetch = [this](const std::string& g) { prefetch_group(g); };
    } else if (params_->sharded() && l.overlap_param_gather && !record_only_) {  // ZeRO-1/2 (gather_params)
      hooks.values = [this](const std::string& g, bool enter) {
        if (enter) values_window(g);
      };
      hooks.prefetch = [this](const std::string& g) { values_prefetch(g); };
    }
    if (params_->grouped() || dp_overlap_)
      hooks.grads = [this](const std::string& g, bool enter, bool done) { grads_window(g, enter, done); };
    stages_[st]->set_param_hooks(std::move(hooks));
  }
  if (dp_overlap_) {  // each stage's windows close each of its buckets once per micro-batch
    bucket_expected_.assign(params_->buckets().size(), 0);
    bucket_closed_.assign(params_->buckets().size(), 0);
    for (const auto& [st, stage] : stages_) {
      const GpuStageConfig& c = stage->config();
      for (std::size_t b : params_->stage_buckets(c.l0, c.l1, st == 0, st == l.num_stages() - 1))
        bucket_expected_[b] += l.num_microbatches();
    }
  }
  const std::size_t T = std::size_t(l.micro_batch) * m.seq_len;
  for (int i = 0; i < l.num_microbatches(); ++i) {
    tokens_.push_back(dev.alloc(T * sizeof(std::int32_t)));
    targets_.push_back(dev.alloc(T * sizeof(std::int32_t)));
  }
}

// A step that failed part-way can leave communication in flight whose follow-up work refers to this trainer.
GpuTrainer::~GpuTrainer() { dev_.abandon_in_flight(); }

// Samples as the CPU trainer (trainer.hpp): dp rank d takes samples [d m b, (d + 1) m b) of its step, which
// starts at the samples consumed so far.
void GpuTrainer::load_batch(std::int64_t first_sample) {
  const int m = layout_.num_microbatches(), b = layout_.micro_batch, seq = model_.seq_len;
  const std::size_t T = std::size_t(b) * seq;
  for (int i = 0; i < m; ++i) {
    if (record_only_) {
      throw_if_failed(kg::fill_tokens(dev_.compute(), static_cast<std::int32_t*>(tokens_[i]->get()), T, opt_.seed + i, model_.vocab));
      throw_if_failed(kg::fill_tokens(dev_.compute(), static_cast<std::int32_t*>(targets_[i]->get()), T, opt_.seed + m + i, model_.vocab));
      continue;
    }
    std::vector<std::int32_t> tok(T), tgt(T);
    for (int k = 0; k < b; ++k) {
      const std::int64_t j = first_sample + std::int64_t(at_.dp) * m * b + std::int64_t(i) * b + k;
      data_.sample(j, seq, tok.data() + std::size_t(k) * seq, tgt.data() + std::size_t(k) * seq);
    }
    // On the compute stream, which reads them (plain cudaMemcpy would be on the legacy default stream, not
    // ordered with the non-blocking compute stream, and may return before a pageable transfer lands), and
    // finished before the host vectors die at the end of this iteration.
    const std::size_t bytes = T * sizeof(std::int32_t);
    cuda_ok(cudaMemcpyAsync(tokens_[i]->get(), tok.data(), bytes, cudaMemcpyHostToDevice, dev_.compute()), "tokens");
    cuda_ok(cudaMemcpyAsync(targets_[i]->get(), tgt.data(), bytes, cudaMemcpyHostToDevice, dev_.compute()), "targets");
    cuda_ok(cudaStreamSynchronize(dev_.compute()), "tokens");
  }
}

// The CPU optimizer's order (runtime/optimizer_step.cpp): tied-embedding pair sum, sequence-parallel tp sum
// of the replicated parameters, then the data-parallel sum (each micro-batch loss already carries
// 1 / (microbatches * dp)).
void GpuTrainer::reduce_gradients() {
  // Reductions still in flight complete (their shards are added to the accumulators) before anything reads them.
  dev_.compute_waits_all();
  TESSEL_CHECK(prefetched_.empty(), "ZeRO-3: a group was gathered ahead for a window that never opened");
  for (const auto& [g, x] : stale_values_)
    TESSEL_CHECK(!x.issued, "ZeRO-" << layout_.zero_stage << ": group " << params_->groups()[g].name
                                    << "'s values were gathered ahead for a window that never opened");
  reduce_expert_gradients();
  if (dp_overlap_) {  // every bucket was reduced beside the last micro-batch's backward
    for (std::size_t b = 0; b < bucket_closed_.size(); ++b) {
      TESSEL_CHECK(bucket_closed_[b] == bucket_expected_[b],
                   "data-parallel bucket " << params_->buckets()[b].name << " closed " << bucket_closed_[b]
                                           << " time(s) this step, " << bucket_expected_[b] << " expected");
      bucket_closed_[b] = 0;
    }
    sync_tied();
    sync_sequence_parallel();
    return;
  }
  if (params_->grouped()) {  // ZeRO-2/3: every group was reduce-scattered after its backward; sums on the shards
    for (std::size_t g = 0; g < params_->groups().size(); ++g) {
      TESSEL_CHECK(!params_->group_grad_live(g), "ZeRO-" << layout_.zero_stage << ": the gradient of group "
                   << params_->groups()[g].name << " was not reduce-scattered before the step");
      TESSEL_CHECK(!params_->gathered(g), "ZeRO-3: group " << params_->groups()[g].name << " is still gathered after the last action");
    }
    sync_tied();
    sync_sequence_parallel();
    return;
  }
  sync_tied();
  sync_sequence_parallel();
  if (layout_.dp == 1) return;
  if (params_->sharded()) {  // ZeRO-1: each dp rank receives the sum of its chunks only, group by group
    for (std::size_t b = 0; b < params_->buckets().size(); ++b) reduce_bucket(b);
    if (!record_only_) dev_.compute_waits_comm(CudaDevice::Lane::dp);
    return;
  }
  dev_.comm_waits_compute(CudaDevice::Lane::dp);
  const std::size_t id = dev_.begin_op(trace::Stream::dp, {"dp_allreduce", -1, -1, -1, -1, -1}, "dp_allreduce", 0.0,
                                       double(params_->count()) * sizeof(float));
  if (!record_only_) groups_.dp->all_reduce(params_->flat_grad(), params_->count());
  dev_.end_op(id);
  if (!record_only_) dev_.compute_waits_comm(CudaDevice::Lane::dp);
}

// The routed experts' gradients summed over their replicas, the expert data-parallel group (Megatron-Core's
// expert grads reduce over edp, not dp); one all-reduce of the experts' flat gradient on the comm stream.
void GpuTrainer::reduce_expert_gradients() {
  if (!experts_ || layout_.expert_dp() == 1 || experts_->count() == 0) return;
  if (experts_->sharded()) {  // ZeRO-1: each edp rank receives the sum of its chunks, group by group
    dev_.comm_waits_compute();
    for (const GpuZeroGroup& g : experts_->groups()) {
      const std::size_t id = dev_.begin_op(trace::Stream::dp, {"dp_reducescatter", -1, -1, -1, -1, -1}, "dp_reducescatter",
                                           0.0, double(g.chunk) * layout_.expert_dp() * sizeof(float));
      groups_.edp->reduce_scatter(experts_->flat_grad() + g.begin, experts_->shard_grad() + g.local, g.chunk);
      dev_.end_op(id);
    }
    dev_.compute_waits_comm();
    return;
  }
  dev_.comm_waits_compute();
  const std::size_t id = dev_.begin_op(trace::Stream::dp, {"dp_allreduce", -1, -1, -1, -1, -1}, "dp_allreduce", 0.0,
                                       double(experts_->count()) * sizeof(float));
  groups_.edp->all_reduce(experts_->flat_grad(), experts_->count());
  dev_.end_op(id);
  dev_.compute_waits_comm();
}

// ZeRO-1 over edp, after the step: each edp rank updated its chunks of the experts' values; every group's
// whole values come back from the others in the forms gather_params uses for the dense ones (fp32
// all-gather in place and the bf16 copy; Megatron's bf16 exchange; or a group-sized fp32 gather), on the
// comm stream and completed before the next forward (not overlapped with it).
void GpuTrainer::gather_expert_values() {
  if (!experts_ || !experts_->sharded()) return;
  const int edp = layout_.expert_dp();
  std::vector<std::pair<std::size_t, DBuf>> whole;
  dev_.comm_waits_compute();
  for (std::size_t gi = 0; gi < experts_->groups().size(); ++gi) {
    const GpuZeroGroup& g = experts_->groups()[gi];
    const std::size_t id = dev_.begin_op(trace::Stream::dp, {"dp_allgather", -1, -1, -1, -1, -1}, "dp_allgather", 0.0,
                                         experts_->exchange_bytes(gi));
    if (experts_->values_in_bf16(gi)) {
      experts_->exchange_values_bf16(gi, *groups_.edp, dev_.comm());
    } else if (!experts_->sharded_values()) {
      float* flat = experts_->flat_data() + g.begin;
      groups_.edp->all_gather(flat + g.chunk * std::size_t(at_.edp), flat, g.chunk);
    } else {
      DBuf w = dev_.alloc_f32(g.chunk * std::size_t(edp));
      groups_.edp->all_gather(experts_->shard_data() + g.local, f32(w), g.chunk);
      whole.emplace_back(gi, w);
    }
    dev_.end_op(id);
  }
  dev_.compute_waits_comm();
  KernelScope k(dev_, "optimizer", 0.0, 6.0 * double(experts_->padded()));
  for (const auto& [gi, w] : whole) experts_->gather_values(gi, f32(w), dev_.compute());
  if (!experts_->sharded_values())
    for (std::size_t gi = 0; gi < experts_->groups().size(); ++gi) experts_->refresh_half(dev_.compute(), gi);
}

// Both copies of the tied embedding end with the sum of the two stages' gradients.
// Under ZeRO-2/3 on this rank's run of it (the two copies form groups of one size: the same run).
void GpuTrainer::sync_tied() {
  if (!embed_) return;
  const auto runs = params_->grad_runs(shard_sums(), [](const GpuParam& p) { return p.spec.name == "embed.tok"; });
  if (runs.empty()) return;  // a rank whose chunk is all padding: so is its pair's
  const auto [g, n] = runs.front();
  dev_.comm_waits_compute();
  const std::size_t id = dev_.begin_op(trace::Stream::pp, {"embedding_allreduce", -1, -1, -1, -1, -1},
                                       "embedding_allreduce", 0.0, double(n) * sizeof(float));
  embed_->all_reduce(g, n);
  dev_.end_op(id);
  dev_.compute_waits_comm();
}

// Under sequence parallelism each tp rank's norm (and row-parallel bias, learned position) gradients cover
// its own tokens only: sum them over tp, as Megatron's allreduce of layernorm grads.
// One packed all-reduce, as the CPU optimizer (a collective per tensor would be ~4 per layer).
void GpuTrainer::sync_sequence_parallel() {
  if (!layout_.sequence_parallel || layout_.tp == 1 || record_only_) return;
  // Whole gradients, or under ZeRO-2/3 this rank's runs of them (tp peers' groups have equal sizes).
  const auto runs = params_->grad_runs(shard_sums(), [](const GpuParam& p) { return p.spec.shard_dim == -1; });
  std::size_t n = 0;
  for (const auto& r : runs) n += r.second;
  if (n == 0) return;
  DBuf packed = dev_.alloc_f32(n);
  const auto pack = [&](bool in) {
    std::size_t at = 0;
    for (const auto& [g, k] : runs) {
      cuda_ok(cudaMemcpyAsync(in ? f32(packed) + at : g, in ? g : f32(packed) + at, k * sizeof(float),
                              cudaMemcpyDeviceToDevice, dev_.compute()),
              "sequence-parallel gradients");
      at += k;
    }
  };
  pack(true);
  dev_.comm_waits_compute();
  const std::size_t id = dev_.begin_op(trace::Stream::tp, {"tp_allreduce", -1, -1, -1, -1, -1}, "tp_allreduce", 0.0,
                                       double(n) * sizeof(float));
  groups_.tp->all_reduce(f32(packed), n);
  dev_.end_op(id);
  dev_.compute_waits_comm();
  pack(false);
}

// Each tensor once in the world: dp rank 0 (replicas hold the same reduced gradients), tp rank 0 for the
// tp-replicated ones, the first stage's copy of a tied embedding held on two pipeline ranks.
bool GpuTrainer::counts_in_norm(const GpuParam& p) const {
  if (at_.dp != 0 && !params_->sharded()) return false;  // ZeRO-1: every dp rank counts its own shard
  if (p.spec.shard_dim == -1 && at_.tp != 0) return false;
  if (p.spec.name == "embed.tok" && model_.tied_embeddings && first_pp_ != last_pp_ && at_.pp != first_pp_) return false;
  return true;
}

// ZeRO-1/2 after the optimizer step: every dp rank updated its chunks of the values, and each group's
// whole values come back from the others, in one of three forms:
//  - fp32 GEMMs (the fp32 values whole on every rank): an fp32 all-gather in place, then the group's bf16 copy;
//  - bf16 GEMMs, values_in_bf16 (Megatron's distributed optimizer): a bf16 all-gather in place into the
//    copy the GEMMs read, and dp rank 0's broadcast of the group's fp32 run (its vectors);
//  - bf16 GEMMs otherwise (a group all read in fp32: the learned positions): an fp32 all-gather into a
//    group-sized buffer, which becomes the bf16 copy and the fp32 store (GpuParams::gather_values).
// With overlap_param_gather (Megatron's switch of that name) the exchanges wait for the next step's
// forward: a group's is issued when the window before it opens (GpuStage's prefetch, one group ahead) or
// at its own window, and compute waits for it there; only the windows opening a stage wait for a whole
// exchange (values_exchanges_exposed). Without, all are
// issued here and compute waits for them before the step ends. --only-rank records them and synthesises
// the peers' chunks. ZeRO-3 keeps its shard: the next step's gathers read it.
void GpuTrainer::gather_params() {
  if (params_->zero_stage() == 3) return;
  if (record_only_) {  // recorded, not run; the compute work of the real exchange is done
    for (std::size_t gi = 0; gi < params_->groups().size(); ++gi) {
      const GpuZeroGroup& g = params_->groups()[gi];
      const std::size_t span = g.chunk * std::size_t(layout_.dp);
      const std::size_t id = dev_.begin_op(trace::Stream::dp, {"dp_allgather", -1, -1, -1, -1, -1}, "dp_allgather", 0.0,
                                           params_->exchange_bytes(gi));
      dev_.end_op(id);
      if (params_->values_in_bf16(gi)) continue;  // the peers' chunks of the copy stay as synthesised
      if (!params_->sharded_values()) {           // fp32 GEMMs: the group's bf16 copy
        KernelScope k(dev_, "optimizer", 0.0, 6.0 * double(span));
        params_->refresh_half(dev_.compute(), gi);
        continue;
      }
      DBuf whole = dev_.alloc_f32(span);  // synthesised in place of the fp32 gather, then as the real run
      params_->synthesise_values(gi, f32(whole), opt_.seed, dev_.compute());
      KernelScope k(dev_, "optimizer", 0.0, 6.0 * double(span));
      params_->gather_values(gi, f32(whole), dev_.compute());
    }
    return;
  }
  for (std::size_t g = 0; g < params_->groups().size(); ++g) stale_values_.try_emplace(g);
  if (layout_.overlap_param_gather) return;
  for (auto& [g, x] : stale_values_) issue_values(g);
  dev_.compute_waits_comm(CudaDevice::Lane::dp);  // fenced: all of them before any compute work follows
  while (!stale_values_.empty()) finish_values(stale_values_.begin()->first);
}

// Group g's exchange (gather_params), queued on the dp stream after everything compute has queued (its
// optimizer step, and whatever last read the buffers it overwrites); compute does not wait for it yet.
void GpuTrainer::issue_values(std::size_t gi) {
  StaleValues& x = stale_values_.at(gi);
  TESSEL_CHECK(!x.issued, "ZeRO group " << params_->groups()[gi].name << ": its values exchange was issued twice");
  const GpuZeroGroup& g = params_->groups()[gi];
  const std::size_t span = g.chunk * std::size_t(layout_.dp);
  dev_.comm_waits_compute(CudaDevice::Lane::dp);
  const bool bf16 = params_->values_in_bf16(gi), in_place = !params_->sharded_values();
  const std::size_t id = dev_.begin_op(trace::Stream::dp, {"dp_allgather", -1, -1, -1, -1, -1}, "dp_allgather", 0.0,
                                       params_->exchange_bytes(gi));
  if (bf16) {
    params_->exchange_values_bf16(gi, *groups_.dp, dev_.dp());
  } else if (in_place) {
    float* flat = params_->flat_data() + g.begin;
    groups_.dp->all_gather(flat + g.chunk * std::size_t(at_.dp), flat, g.chunk);
  } else {
    x.whole = dev_.alloc_f32(span);  // allocated after the wait above: memory compute work may still have read
    groups_.dp->all_gather(params_->shard_data() + g.local, f32(x.whole), g.chunk);
  }
  dev_.end_op(id);
  x.ticket = dev_.comm_in_flight(x.whole ? std::vector<DBuf>{x.whole} : std::vector<DBuf>{}, {}, CudaDevice::Lane::dp);
  x.issued = true;
}

// Compute waits for group g's exchange (issuing it first if nobody has), then makes what the kernels read
// from it: the bf16 copy (fp32 GEMMs), or the copy and fp32 store from the gathered buffer.
void GpuTrainer::finish_values(std::size_t gi) {
  auto it = stale_values_.find(gi);
  if (it == stale_values_.end()) return;
  if (!it->second.issued) {  // nobody prefetched it: compute waits for the whole exchange
    ++values_exposed_;
    issue_values(gi);
  }
  StaleValues& x = it->second;
  dev_.compute_waits(x.ticket);
  const GpuZeroGroup& g = params_->groups()[gi];
  if (x.whole) {
    double fp32_read = 0;  // elements of the group's vectors and embeddings, copied to the fp32 store
    for (const GpuParam& p : params_->params())
      if (p.group == gi && params_->reads_fp32(p.spec)) fp32_read += double(p.size());
    KernelScope k(dev_, "optimizer", 0.0, 6.0 * double(g.chunk * layout_.dp) + 8.0 * fp32_read);
    params_->gather_values(gi, f32(x.whole), dev_.compute());
  } else if (!params_->sharded_values()) {
    KernelScope k(dev_, "optimizer", 0.0, 6.0 * double(g.chunk * layout_.dp));  // fp32 read, bf16 written
    params_->refresh_half(dev_.compute(), gi);
  }
  stale_values_.erase(it);
}

void GpuTrainer::values_window(const std::string& group) {
  const std::size_t g = params_->group_index(group);
  if (g != params_->groups().size()) finish_values(g);
}

void GpuTrainer::values_prefetch(const std::string& group) {
  const std::size_t g = params_->group_index(group);
  const auto it = stale_values_.find(g);
  if (it != stale_values_.end() && !it->second.issued) issue_values(g);
}

const std::vector<std::size_t>& GpuTrainer::stage_groups(int st) {
  auto it = stage_groups_.find(st);
  if (it == stage_groups_.end()) {
    const GpuStageConfig& c = stages_.at(st)->config();
    it = stage_groups_.emplace(st, params_->stage_groups(c.l0, c.l1, st == 0, st == layout_.num_stages() - 1)).first;
  }
  return it->second;
}

void GpuTrainer::flush_grads(const std::vector<std::size_t>& groups) {
  for (std::size_t g : groups)
    if (params_->group_grad_live(g)) flush_group(g);
}

// The tied-embedding and sequence-parallel gradient sums follow the data-parallel reduction where it ran
// during the backward, on what it produced: this rank's shards (ZeRO-2/3, and ZeRO-1 over dp), or the whole
// gradients. Sums commute, so either order gives the CPU optimizer's totals.
bool GpuTrainer::shard_sums() const { return params_->grouped() || (dp_overlap_ && params_->sharded()); }

// A stage's gradient window on one group (GpuStage::ParamHooks::grads): ZeRO-2/3's group buffers, or
// ZeRO-0/1's bucket count.
void GpuTrainer::grads_window(const std::string& group, bool enter, bool done) {
  if (dp_overlap_) {
    const std::size_t b = params_->bucket_index(group);
    if (b == params_->buckets().size() || enter || !done) return;
    TESSEL_CHECK(bucket_closed_[b] < bucket_expected_[b], "data-parallel bucket " << group << " closed more than "
                                                            << bucket_expected_[b] << " times in a step");
    if (++bucket_closed_[b] == bucket_expected_[b]) reduce_bucket(b);
    return;
  }
  const std::size_t g = params_->group_index(group);
  if (g == params_->groups().size()) return;
  if (enter) params_->begin_group_grad(g, dev_.compute());
  else if (done && params_->group_grad_live(g)) flush_group(g);
}

// ZeRO-3: a stage's window on one parameter group's values (GpuStage::ParamHooks::values). Groups this
// rank lacks (learned positions of a rotary model) are skipped.
void GpuTrainer::param_window(const std::string& group, bool enter) {
  const std::size_t g = params_->group_index(group);
  if (g == params_->groups().size()) return;
  if (!enter) {
    params_->release_group(g);
    return;
  }
  const auto ahead = prefetched_.find(g);
  if (ahead != prefetched_.end()) {  // gathered beside the compute before: wait for it here, then the bf16 copy
    dev_.compute_waits(ahead->second);
    prefetched_.erase(ahead);
    finish_group_gather(g);
  } else if (!params_->gathered(g)) {
    gather_group(g);
  }
}

// ZeRO-3: the next window's group, all-gathered on the dp stream while compute runs the current one
// (FSDP's forward and backward prefetch, one group ahead). Compute waits for it when the window opens.
void GpuTrainer::prefetch_group(const std::string& group) {
  const std::size_t gi = params_->group_index(group);
  if (record_only_ || gi == params_->groups().size() || params_->gathered(gi)) return;
  start_gather(gi);
  prefetched_[gi] = dev_.comm_in_flight({}, {}, CudaDevice::Lane::dp);  // the buffers are the group's own, held until release_group
}

// ZeRO-3: group g's buffers (this rank's chunk of the bf16 copy written on compute), then its gather queued
// on the dp stream after them; compute does not wait for it here.
void GpuTrainer::start_gather(std::size_t gi) {
  const GpuZeroGroup& g = params_->groups()[gi];
  {
    KernelScope k(dev_, "zero3_gather", 0.0, params_->values_in_bf16(gi) ? 6.0 * double(g.chunk) : 0.0);
    params_->prepare_gather(gi, dev_.compute());
  }
  dev_.comm_waits_compute(CudaDevice::Lane::dp);  // the new buffers may be memory that queued compute work still reads
  const std::size_t id = dev_.begin_op(trace::Stream::dp, {"dp_allgather", -1, -1, -1, -1, -1}, "dp_allgather", 0.0,
                                       params_->exchange_bytes(gi));
  params_->gather(gi, *groups_.dp, dev_.dp());
  dev_.end_op(id);
}

// ZeRO-3: group g's values from every dp rank's chunk (--only-rank: synthesised), waited for, then the
// bf16 copy where fp32 values were gathered.
void GpuTrainer::gather_group(std::size_t gi) {
  const GpuZeroGroup& g = params_->groups()[gi];
  if (record_only_) {
    const std::size_t id = dev_.begin_op(trace::Stream::dp, {"dp_allgather", -1, -1, -1, -1, -1}, "dp_allgather", 0.0,
                                         params_->exchange_bytes(gi));
    dev_.end_op(id);
    KernelScope k(dev_, "zero3_gather", 0.0, 14.0 * double(g.chunk) * layout_.dp);  // cleared, filled, converted
    params_->synthesise_group(gi, opt_.seed, dev_.compute());
    return;
  }
  start_gather(gi);
  dev_.compute_waits_comm(CudaDevice::Lane::dp);
  finish_group_gather(gi);
}

void GpuTrainer::finish_group_gather(std::size_t gi) {
  const double n = double(params_->groups()[gi].chunk) * layout_.dp;
  KernelScope k(dev_, "zero3_gather", 0.0, params_->values_in_bf16(gi) ? 0.0 : 6.0 * n);  // the bf16 copy of fp32 values
  params_->finish_gather(gi, dev_.compute());
}

// ZeRO-2/3: group g's gradient of this micro-batch, reduce-scattered over dp and added to this rank's
// sharded accumulator; the full gradient buffer goes (DeepSpeed's per-micro-batch reduction, as the CPU).
// The reduce-scatter overlaps the backward: compute does not wait for it here but when the next group's
// is issued (so one is in flight at a time, and its layer's backward hides it), or at the next fence. Then
// the shard is added on compute and the group's buffers go back to the allocator.
void GpuTrainer::flush_group(std::size_t gi) {
  const GpuZeroGroup& g = params_->groups()[gi];
  DBuf full = params_->take_group_grad(gi);
  DBuf mine = dev_.alloc_f32(g.chunk);
  float* acc = params_->shard_grad() + g.local;
  const auto accumulate = [this, acc, mine, n = g.chunk] {
    KernelScope k(dev_, "zero_accumulate", 0.0, 12.0 * double(n));
    throw_if_failed(kg::add(dev_.compute(), acc, f32(mine), acc, n));
  };
  if (record_only_) {  // nobody to reduce with: this rank's own slot stands in
    dev_.comm_waits_compute(CudaDevice::Lane::dp);  // recorded where the gradient is complete
    const std::size_t id = dev_.begin_op(trace::Stream::dp, {"dp_reducescatter", -1, -1, -1, -1, -1},
                                         "dp_reducescatter", 0.0, double(full->bytes()));
    dev_.end_op(id);
    cuda_ok(cudaMemcpyAsync(f32(mine), f32(full) + g.chunk * std::size_t(at_.dp), g.chunk * sizeof(float),
                            cudaMemcpyDeviceToDevice, dev_.compute()),
            "gradient shard");
    params_->group_grad_released();
    accumulate();
    return;
  }
  // The previous group's reduction completes first: compute has queued the layer it overlapped.
  if (grad_ticket_) dev_.compute_waits(*grad_ticket_);
  dev_.comm_waits_compute(CudaDevice::Lane::dp);  // full is complete; mine may be memory that queued compute work still reads
  const std::size_t id = dev_.begin_op(trace::Stream::dp, {"dp_reducescatter", -1, -1, -1, -1, -1}, "dp_reducescatter",
                                       0.0, double(full->bytes()));
  groups_.dp->reduce_scatter(f32(full), f32(mine), g.chunk);
  dev_.end_op(id);
  grad_ticket_ = dev_.comm_in_flight({full, mine}, [this, accumulate] {
    params_->group_grad_released();
    accumulate();
  }, CudaDevice::Lane::dp);
  if (!layout_.overlap_grad_reduce) dev_.compute_waits_comm(CudaDevice::Lane::dp);  // --no-overlap: completes here
}

// ZeRO-0/1: bucket b's gradient is complete for the step; reduce it over dp on the dp stream while the
// backward goes on: an all-reduce in place, or under ZeRO-1 a reduce-scatter into this rank's shard.
// Nothing writes the bucket again this step and both buffers persist, so compute waits for it only at
// the step's end (reduce_gradients), or at the next fence. --only-rank records it without running it.
void GpuTrainer::reduce_bucket(std::size_t bi) {
  const GpuZeroGroup& b = params_->buckets()[bi];
  float* grad = params_->flat_grad() + b.begin;
  dev_.comm_waits_compute(CudaDevice::Lane::dp);
  const bool scatter = params_->sharded();
  const std::size_t id = dev_.begin_op(trace::Stream::dp, {scatter ? "dp_reducescatter" : "dp_allreduce", -1, -1, -1, -1, -1},
                                       scatter ? "dp_reducescatter" : "dp_allreduce", 0.0,
                                       double(scatter ? b.chunk * std::size_t(layout_.dp) : b.chunk) * sizeof(float));
  if (!record_only_) {
    if (scatter) groups_.dp->reduce_scatter(grad, params_->shard_grad() + b.local, b.chunk);
    else groups_.dp->all_reduce(grad, b.end - b.begin);
  }
  dev_.end_op(id);
  if (!record_only_) dev_.comm_in_flight({}, {}, CudaDevice::Lane::dp);
}

Comm& GpuTrainer::host_world() {
  if (!host_world_) {
    if (world_ && !record_only_) host_world_ = std::make_unique<HostStagedComm>(*world_, dev_.comm());
    else host_world_ = std::make_unique<SelfComm>();
  }
  return *host_world_;
}

float GpuTrainer::world_sum(float v) {
  if (!world_ || record_only_ || world_->size() == 1) return v;
  host_world().all_reduce(&v, 1);
  return v;
}

double GpuTrainer::global_grad_norm() {
  double sq = 0;
  {
    // This rank's sum only: the wait for the others is communication.
    const auto counted = [this](const GpuParam& p) { return counts_in_norm(p); };
    std::size_t n = 0;
    for (const auto& run : params_->grad_runs(params_->sharded(), counted)) n += run.second;
    // An op where the simulator has one (Layout::counts_grad_norm).
    const bool op = layout_.counts_grad_norm(at_.dp);
    const std::size_t id = op ? dev_.begin_op(trace::Stream::compute, {"grad_norm", -1, -1, -1, -1, -1}, "grad_norm", 0.0,
                                              4.0 * double(n))
                              : 0;
    {
      KernelScope k(dev_, "grad_norm", 0.0, 4.0 * double(n));
      sq = params_->local_grad_sq(dev_.compute(), [this](const GpuParam& p) { return counts_in_norm(p); });
      // Each routed expert's slice once in the world: on its replica of edp rank 0, or under ZeRO-1 each edp
      // rank's own chunks.
      if (experts_ && (experts_->sharded() || at_.edp == 0))
        sq += experts_->local_grad_sq(dev_.compute(), [](const GpuParam&) { return true; });
    }
    if (op) dev_.end_op(id);
  }
  return std::sqrt(double(world_sum(static_cast<float>(sq))));
}

// The checkpoint's views of `host` (one entry per parameter, in params() order), which must outlive them.
std::vector<CheckpointTensor> GpuTrainer::checkpoint_views(std::vector<GpuParams::HostParamState>& host,
                                                           bool for_writing) const {
  std::vector<CheckpointTensor> ts;
  std::size_t i = 0;
  const auto add = [&](const GpuParams& store) {
    for (const GpuParam& p : store.params()) {
      GpuParams::HostParamState& h = host[i++];
      const bool owned = for_writing && checkpoint_owns(p.spec, at_, schedule_);
      ts.push_back({p.spec, p.rows, p.cols, p.row0, p.col0, owned, h.data.data(), h.exp_avg.data(), h.exp_avg_sq.data()});
    }
  };
  add(*params_);
  if (experts_) add(*experts_);  // each written by its edp rank 0 (checkpoint_owns)
  return ts;
}

std::vector<GpuParams::HostParamState> GpuTrainer::host_states() {
  while (!stale_values_.empty()) finish_values(stale_values_.begin()->first);  // the last step's values exchanged
  std::vector<GpuParams::HostParamState> host;
  params_->save_states(groups_.dp.get(), host);  // ZeRO: the whole values and moments from the dp shards
  if (experts_) {  // after the dense ones, in checkpoint_views' order
    std::vector<GpuParams::HostParamState> ex;
    experts_->save_states(groups_.edp.get(), ex);  // ZeRO-1: the whole moments from the edp shards
    for (auto& e : ex) host.push_back(std::move(e));
  }
  return host;
}

CheckpointIo GpuTrainer::save_checkpoint(const std::string& dir, std::uint64_t seed) {
  TESSEL_CHECK(!record_only_, "--only-rank runs do not write recovery checkpoints");
  const auto start = std::chrono::steady_clock::now();
  std::vector<GpuParams::HostParamState> host = host_states();
  CheckpointIo io;
  io.step = steps_;
  io.folder = write_checkpoint(dir, {steps_, consumed_samples_}, seed, opt_.data_file, model_, layout_, "cuda",
                               host_world(), checkpoint_views(host, true));
  io.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  io.bytes = step_folder_bytes(io.folder);
  return io;
}

CheckpointIo GpuTrainer::load_checkpoint(const std::string& dir, std::uint64_t seed) {
  TESSEL_CHECK(!record_only_, "--only-rank runs do not resume");
  const auto start = std::chrono::steady_clock::now();
  std::vector<GpuParams::HostParamState> host;
  for (const GpuParams* store : {params_.get(), experts_.get()})
    if (store)
      for (const GpuParam& p : store->params())
        host.push_back({std::vector<float>(p.size(), 0.0f), std::vector<float>(p.size(), 0.0f), std::vector<float>(p.size(), 0.0f)});
  const LoadedCheckpoint got = read_checkpoint(dir, seed, opt_.data_file, model_, host_world(), checkpoint_views(host, false));
  for (const auto& [g, x] : stale_values_) TESSEL_CHECK(!x.issued, "resuming with a values exchange in flight");
  stale_values_.clear();  // every value comes from the checkpoint
  const std::size_t dense = params_->params().size();
  if (experts_) {
    experts_->load_states(std::vector<GpuParams::HostParamState>(host.begin() + static_cast<long>(dense), host.end()));
    host.resize(dense);
  }
  params_->load_states(host);  // ZeRO: this rank keeps its chunks
  steps_ = got.at.step;
  consumed_samples_ = got.at.consumed_samples;
  CheckpointIo io{steps_, got.folder, 0, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
  io.bytes = step_folder_bytes(io.folder);
  return io;
}

StepStats GpuTrainer::step() {
  kg::NvtxRange r("train_step");
  const auto start = std::chrono::steady_clock::now();
  dev_.start_step(rec_);
  {
    // The simulator's zero_grad (it places it after the previous step's optimizer: the same place in the cycle).
    const std::size_t id = dev_.begin_op(trace::Stream::compute, {"zero_grad", -1, -1, -1, -1, -1}, "zero_grad", 0.0,
                                         double(params_->zero_grad_bytes()));
    {
      KernelScope k(dev_, "zero_grad", 0.0, double(params_->zero_grad_bytes()));
      params_->zero_grad(dev_.compute());
      if (experts_) experts_->zero_grad(dev_.compute());
    }
    dev_.end_op(id);
  }
  cuda_ok(cudaMemsetAsync(loss_sum_->get(), 0, sizeof(float), dev_.compute()), "loss");
  load_batch(consumed_samples_);
  Pipeline pipeline(*this);
  walk_pipeline(schedule_, {at_.pp, steps_, at_.tp + layout_.tp * at_.dp, layout_.tp * layout_.dp}, pipeline);
  reduce_gradients();
  StepStats st;
  st.step = steps_;
  st.grad_norm = global_grad_norm();
  const double coef = kernels::cpu::clip_coefficient(st.grad_norm, opt_.optimizer.clip_norm);
  const std::size_t id = dev_.begin_op(trace::Stream::compute, {"optimizer", -1, -1, -1, -1, -1}, "optimizer", 0.0,
                                       double(params_->count()) * 16);
  {
    // Values, gradients and moments read, values and moments written (and the bf16 copy, unsharded).
    KernelScope k(dev_, "optimizer", 0.0, double(params_->stepped_elements()) * (params_->sharded() ? 28.0 : 30.0));
    params_->adamw(dev_.compute(), opt_.optimizer.adamw, steps_ + 1, coef);
    if (experts_) experts_->adamw(dev_.compute(), opt_.optimizer.adamw, steps_ + 1, coef);
  }
  dev_.end_op(id);
  if (params_->sharded()) gather_params();
  gather_expert_values();
  if (model_.moe.router.selection_bias) {  // after the step, as the CPU trainer: the load summed over dp
    const auto dp_sum = [this](std::vector<float>& v) {
      if (layout_.dp == 1 || v.empty()) return;
      DBuf d = dev_.alloc_f32(v.size());
      cuda_ok(cudaMemcpyAsync(d->get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, dev_.compute()), "expert load");
      dev_.comm_waits_compute(CudaDevice::Lane::dp);
      groups_.dp->all_reduce(f32(d), v.size());
      dev_.compute_waits_comm(CudaDevice::Lane::dp);
      cuda_ok(cudaMemcpyAsync(v.data(), d->get(), v.size() * sizeof(float), cudaMemcpyDeviceToHost, dev_.compute()), "expert load");
      cuda_ok(cudaStreamSynchronize(dev_.compute()), "expert load");
    };
    for (auto& [_, stage] : stages_) stage->update_selection_bias(dp_sum, static_cast<float>(model_.moe.router.bias_update_rate));
  }
  // Loss: summed token losses of this rank's last-stage micro-batches, over T per micro-batch and m * dp.
  const bool counts = stages_.count(layout_.num_stages() - 1) && at_.tp == 0;
  float sum = 0;
  cuda_ok(cudaMemcpyAsync(&sum, loss_sum_->get(), sizeof(float), cudaMemcpyDeviceToHost, dev_.compute()), "loss");
  dev_.collect(rec_);  // waits for the device
  const double T = double(layout_.micro_batch) * model_.seq_len;
  st.loss = world_sum(counts ? static_cast<float>(sum / T / (layout_.num_microbatches() * layout_.dp)) : 0.0f);
  if (model_.moe.enabled()) {  // every rank its part (its tokens, its MoE layers), scaled as the CPU trainer's
    double aux = 0;
    for (auto& [_, stage] : stages_) aux += stage->take_aux_loss();
    st.aux_loss = world_sum(static_cast<float>(aux / (layout_.num_microbatches() * layout_.dp)));
  }
  ++steps_;
  consumed_samples_ += layout_.global_batch;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return st;
}

double GpuTrainer::step_flops() const {
  double f = 0;
  for (const auto& [s, g] : stages_) f += 3.0 * g->forward_flops() * layout_.num_microbatches();
  return f;
}

std::string GpuTrainer::process_name() const {
  std::string s;
  for (const auto& [stage, _] : stages_) {
    if (!s.empty()) s += ',';
    s += std::to_string(stage);
  }
  return "rank " + std::to_string(world_rank_) + " (stage " + s + ")";
}

}  // namespace tessel::rt::cuda
