#include "runtime/cuda/gpu_trainer.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/nvtx.hpp"
#include "models/util/error.hpp"

namespace tessel::rt::cuda {

namespace kg = kernels::cuda;
using sched::Action;
using sched::ActionType;

namespace {
void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw kg::DeviceError(std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace

// runtime/executor.cpp's walk, on device buffers: the same actions in the same order.
struct GpuTrainer::Walker {
  using Key = std::pair<int, int>;
  GpuTrainer& t;
  const sched::Schedule& s;
  int pp_rank;
  std::map<Key, DBuf> fwd_in, bwd_in, fwd_out, bwd_out;

  GpuStage& stage(int st) {
    auto it = t.stages_.find(st);
    TESSEL_CHECK(it != t.stages_.end(), "stage " << st << " is not on pipeline rank " << pp_rank);
    return *it->second;
  }
  static DBuf take(std::map<Key, DBuf>& m, Key k, const char* what) {
    auto it = m.find(k);
    TESSEL_CHECK(it != m.end(), "" << what << " for stage " << k.first << " mb " << k.second << " missing");
    DBuf v = std::move(it->second);
    m.erase(it);
    return v;
  }
  OpIdentity id_of(const char* op, int st, int mb) {
    const GpuStageConfig& c = stage(st).config();
    return {op, st, s.chunk_of(st), mb, c.l0, c.l1};
  }
  template <class F>
  void compute(const char* op, const char* letter, int st, int mb, double flops, F&& f) {
    kg::NvtxRange r(op);
    const std::size_t id = t.dev_.begin_op(trace::Stream::compute, id_of(op, st, mb),
                                           std::string(letter) + " s" + std::to_string(st) + " mb" + std::to_string(mb), flops, 0.0);
    f();
    t.dev_.end_op(id);
  }
  void forward(int st, int mb) {
    GpuStage& g = stage(st);
    compute("forward", "F", st, mb, g.forward_flops(), [&] {
      DBuf in = st == 0 ? nullptr : take(fwd_in, {st, mb}, "forward input");
      DBuf out = g.forward(mb, in, static_cast<const std::int32_t*>(t.tokens_[mb]->get()),
                           static_cast<const std::int32_t*>(t.targets_[mb]->get()));
      if (st == s.num_stages - 1) return;
      if (s.rank_of(st + 1) == pp_rank) fwd_in[{st + 1, mb}] = out;
      else fwd_out[{st, mb}] = out;
    });
  }
  void backward(int st, int mb, bool full) {
    GpuStage& g = stage(st);
    compute(full ? "backward" : "input_grad", full ? "B" : "I", st, mb, 2.0 * g.forward_flops(), [&] {
      DBuf dout = st == s.num_stages - 1 ? nullptr : take(bwd_in, {st, mb}, "output gradient");
      DBuf dx = g.backward(mb, dout);
      if (st == 0) return;
      if (s.rank_of(st - 1) == pp_rank) bwd_in[{st - 1, mb}] = dx;
      else bwd_out[{st, mb}] = dx;
    });
  }
  void p2p(const Action& a) {
    const bool fwd = a.type == ActionType::SEND_F || a.type == ActionType::RECV_F, send = sched::is_send(a.type);
    const int st = a.stage, mb = a.mb, dir = fwd ? 0 : 1, to = send ? (fwd ? st + 1 : st - 1) : st;
    const int peer = a.peer >= 0 ? a.peer : s.rank_of(send ? to : (fwd ? st - 1 : st + 1));
    const std::size_t n = stage(st).activation_elems();
    const std::int64_t flow = (std::int64_t(t.steps_) * s.num_stages * s.num_microbatches * 2) +
                              (std::int64_t(mb) * s.num_stages + to) * 2 + dir;
    DBuf buf = send ? take(fwd ? fwd_out : bwd_out, {st, mb}, "tensor to send") : t.dev_.alloc_f32(n);
    if (!send && t.record_only_)  // synthesised input of the next op
      throw_if_failed(kg::fill_uniform(t.dev_.compute(), f32(buf), n, t.opt_.seed + std::uint64_t(mb), 1.0f));
    t.dev_.comm_waits_compute();
    const std::size_t id = t.dev_.begin_op(trace::Stream::pp, id_of(send ? "send" : "recv", st, mb), a.token(), 0.0,
                                           double(n) * sizeof(float), flow);
    if (!t.record_only_) {
      if (send) t.groups_.pp->send(f32(buf), n, peer, 0);
      else t.groups_.pp->recv(f32(buf), n, peer, 0);
    }
    t.dev_.end_op(id);
    if (!t.record_only_) t.dev_.compute_waits_comm();
    if (!send) (fwd ? fwd_in : bwd_in)[{st, mb}] = buf;
  }
  void execute(const Action& a) {
    switch (a.type) {
      case ActionType::F: forward(a.stage, a.mb); break;
      case ActionType::B: backward(a.stage, a.mb, true); break;
      case ActionType::I: backward(a.stage, a.mb, false); break;
      case ActionType::W: compute("weight_grad", "W", a.stage, a.mb, 0.0, [] {}); break;  // done inside I
      case ActionType::OVERLAP_F_B:
        for (const Action& sub : a.sub) execute(sub);
        break;
      case ActionType::SEND_F: case ActionType::RECV_F: case ActionType::SEND_B: case ActionType::RECV_B: p2p(a); break;
      default: break;  // REDUCE_GRAD, OPTIMIZER_STEP, UNSHARD, RESHARD, RECOMPUTE: the trainer's step does these
    }
  }
  void run() {
    for (const Action& a : s.ranks.at(std::size_t(pp_rank))) execute(a);
    // Under --only-rank nobody receives what this rank sends, and that is fine; otherwise all was delivered.
    TESSEL_CHECK(fwd_in.empty() && bwd_in.empty(), "pipeline rank " << pp_rank << " finished with undelivered tensors");
  }
};

GpuTrainer::GpuTrainer(CudaDevice& dev, const Model& m, const Layout& l, const GpuTrainOptions& opt, Comm* world,
                       Recorder::Clock::time_point t0)
    : dev_(dev), model_(m), layout_(l), opt_(opt), world_(world), record_only_(opt.only_rank >= 0) {
  check_runnable(m, l);
  if (record_only_) {
    world_rank_ = opt.only_rank;
    at_ = coords_of(opt.only_rank, l);
  } else if (world) {
    groups_ = make_groups(*world, l);
    at_ = groups_.at;
    world_rank_ = world->rank();
  }
  rec_ = Recorder(world_rank_, t0, opt.record_trace);
  schedule_ = runtime_schedule(l);
  data_ = TokenStream::synthetic(opt.seed, m.vocab);
  const std::vector<std::string> names = rank_param_names(m, l, schedule_, at_.pp);
  params_ = std::make_unique<GpuParams>(dev, m, names, l.tp, at_.tp);
  if (record_only_) params_->synthesise(opt.seed);
  else params_->upload(ParamStore(m, names, l.tp, at_.tp, opt.seed));  // the CPU runtime's exact init
  loss_sum_ = dev.alloc_f32(1);
  const GpuTp tp{l.tp > 1 && !record_only_ ? groups_.tp.get() : nullptr, l.tp, at_.tp,
                 l.sequence_parallel && l.tp > 1, record_only_};
  for (int st : schedule_.stages_of(at_.pp)) {
    stages_[st] = std::make_unique<GpuStage>(dev, m, stage_config(m, l, schedule_, st), *params_, tp, opt.gemm);
    stages_[st]->set_loss_sink(f32(loss_sum_));
  }
  const std::size_t T = std::size_t(l.micro_batch) * m.seq_len;
  for (int i = 0; i < l.num_microbatches(); ++i) {
    tokens_.push_back(dev.alloc(T * sizeof(std::int32_t)));
    targets_.push_back(dev.alloc(T * sizeof(std::int32_t)));
  }
}

GpuTrainer::~GpuTrainer() = default;

// Samples as the CPU trainer (trainer.hpp): dp rank d takes samples [d m b, (d + 1) m b) of its step.
void GpuTrainer::load_batch(int step) {
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
      const std::int64_t j = std::int64_t(step) * layout_.global_batch + std::int64_t(at_.dp) * m * b + std::int64_t(i) * b + k;
      data_.sample(j, seq, tok.data() + std::size_t(k) * seq, tgt.data() + std::size_t(k) * seq);
    }
    // Synchronous copies: the host vectors die at the end of this iteration.
    cuda_ok(cudaMemcpy(tokens_[i]->get(), tok.data(), T * sizeof(std::int32_t), cudaMemcpyHostToDevice), "tokens");
    cuda_ok(cudaMemcpy(targets_[i]->get(), tgt.data(), T * sizeof(std::int32_t), cudaMemcpyHostToDevice), "targets");
  }
}

// Data-parallel sum of the gradients (each micro-batch loss already carries 1 / (microbatches * dp)).
void GpuTrainer::reduce_gradients() {
  if (layout_.dp == 1) return;
  dev_.comm_waits_compute();
  const std::size_t id = dev_.begin_op(trace::Stream::dp, {"dp_allreduce", -1, -1, -1, -1, -1}, "dp_allreduce", 0.0,
                                       double(params_->count()) * sizeof(float));
  if (!record_only_) groups_.dp->all_reduce(params_->flat_grad(), params_->count());
  dev_.end_op(id);
  if (!record_only_) dev_.compute_waits_comm();
}

// sqrt of the sum over ranks of squared gradients, each tensor counted once: tp-replicated ones on tp rank
// 0, every tensor on dp rank 0 only (replicas hold the same reduced gradients).
double GpuTrainer::global_grad_norm() {
  double sq = at_.dp == 0 ? params_->local_grad_sq(dev_.compute(), at_.tp == 0) : 0.0;
  if (world_ && !record_only_ && world_->size() > 1) {
    DBuf d = dev_.alloc_f32(1);
    float v = static_cast<float>(sq);
    cuda_ok(cudaMemcpy(f32(d), &v, sizeof(float), cudaMemcpyHostToDevice), "grad norm");
    world_->all_reduce(f32(d), 1);
    world_->barrier();
    cuda_ok(cudaMemcpy(&v, f32(d), sizeof(float), cudaMemcpyDeviceToHost), "grad norm");
    sq = v;
  }
  return std::sqrt(sq);
}

StepStats GpuTrainer::step() {
  kg::NvtxRange r("train_step");
  const auto start = std::chrono::steady_clock::now();
  dev_.start_step(rec_);
  params_->zero_grad(dev_.compute());
  cuda_ok(cudaMemsetAsync(loss_sum_->get(), 0, sizeof(float), dev_.compute()), "loss");
  load_batch(steps_);
  Walker w{*this, schedule_, at_.pp, {}, {}, {}, {}};
  w.run();
  reduce_gradients();
  StepStats st;
  st.step = steps_;
  st.grad_norm = global_grad_norm();
  const double coef = kernels::cpu::clip_coefficient(st.grad_norm, opt_.optimizer.clip_norm);
  const std::size_t id = dev_.begin_op(trace::Stream::compute, {"optimizer", -1, -1, -1, -1, -1}, "optimizer", 0.0,
                                       double(params_->count()) * 16);
  params_->adamw(dev_.compute(), opt_.optimizer.adamw, steps_ + 1, coef);
  dev_.end_op(id);
  // Loss: summed token losses of this rank's last-stage micro-batches, over T per micro-batch and m * dp.
  const bool counts = stages_.count(layout_.num_stages() - 1) && at_.tp == 0;
  float sum = 0;
  cuda_ok(cudaMemcpyAsync(&sum, loss_sum_->get(), sizeof(float), cudaMemcpyDeviceToHost, dev_.compute()), "loss");
  dev_.collect(rec_);  // waits for the device
  const double T = double(layout_.micro_batch) * model_.seq_len;
  float loss = counts ? static_cast<float>(sum / T / (layout_.num_microbatches() * layout_.dp)) : 0.0f;
  if (world_ && !record_only_ && world_->size() > 1) {
    cuda_ok(cudaMemcpy(loss_sum_->get(), &loss, sizeof(float), cudaMemcpyHostToDevice), "loss");
    world_->all_reduce(f32(loss_sum_), 1);
    world_->barrier();
    cuda_ok(cudaMemcpy(&loss, loss_sum_->get(), sizeof(float), cudaMemcpyDeviceToHost), "loss");
  }
  st.loss = loss;
  ++steps_;
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
  for (const auto& [stage, _] : stages_) s += (s.empty() ? "" : ",") + std::to_string(stage);
  return "rank " + std::to_string(world_rank_) + " (stage " + s + ")";
}

}  // namespace tessel::rt::cuda
