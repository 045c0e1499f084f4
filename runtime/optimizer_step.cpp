#include "runtime/optimizer_step.hpp"

#include <algorithm>
#include <cmath>

#include "models/util/error.hpp"

namespace tessel::rt {

namespace kc = kernels::cpu;

namespace {
constexpr int kTiedTag = 1 << 30;  // above every pipeline tag ((mb * stages + stage) * 2 + dir)

template <class F>
void timed(Recorder& rec, trace::Stream s, const char* op, std::size_t bytes, F&& f) {
  const double t0 = rec.now_us();
  f();
  rec.record_comm(s, op, t0, rec.now_us(), static_cast<double>(bytes));
}
}  // namespace

DistributedOptimizer::DistributedOptimizer(const Model& m, const Layout& l, ParamStore& store, RankGroups& groups,
                                           Recorder& rec, const OptimizerConfig& cfg, int tied_peer, bool tied_is_first)
    : model_(m), layout_(l), store_(store), g_(groups), rec_(rec), cfg_(cfg), tied_peer_(tied_peer),
      tied_is_first_(tied_is_first) {
  const std::size_t n = store_.flat_data().size();
  if (layout_.zero_stage >= 1) {
    const std::size_t dp = static_cast<std::size_t>(layout_.dp);
    padded_ = (n + dp - 1) / dp * dp;
    const std::size_t shard = padded_ / dp;
    lo_ = shard * static_cast<std::size_t>(g_.at.dp);
    hi_ = lo_ + shard;
  } else {
    padded_ = n;
    lo_ = 0;
    hi_ = n;
  }
  m_.assign(hi_ - lo_, 0.0f);
  v_.assign(hi_ - lo_, 0.0f);
}

void DistributedOptimizer::sync_tied() {
  if (tied_peer_ < 0) return;
  Param& p = store_.at("embed.tok");
  float* g = store_.grad(p);
  std::vector<float> other(p.size());
  timed(rec_, trace::Stream::pp, "embedding_allreduce", p.size() * sizeof(float), [&] {
    g_.pp->send(g, p.size(), tied_peer_, kTiedTag);
    g_.pp->recv(other.data(), other.size(), tied_peer_, kTiedTag);
  });
  // first + last in that order on both ranks: bitwise equal copies.
  for (std::size_t i = 0; i < other.size(); ++i) g[i] = tied_is_first_ ? g[i] + other[i] : other[i] + g[i];
}

void DistributedOptimizer::sync_sequence_parallel() {
  if (!layout_.sequence_parallel || layout_.tp == 1) return;
  std::vector<float> packed;
  for (const auto& p : store_.params())
    if (p.spec.shard_dim == -1) packed.insert(packed.end(), store_.grad(p), store_.grad(p) + p.size());
  if (packed.empty()) return;
  timed(rec_, trace::Stream::tp, "tp_allreduce", packed.size() * sizeof(float),
        [&] { g_.tp->all_reduce(packed.data(), packed.size()); });
  std::size_t at = 0;
  for (const auto& p : store_.params())
    if (p.spec.shard_dim == -1) {
      std::copy(packed.begin() + at, packed.begin() + at + p.size(), store_.grad(p));
      at += p.size();
    }
}

void DistributedOptimizer::reduce_data_parallel() {
  auto& grad = store_.flat_grad();
  if (layout_.zero_stage == 0) {
    if (layout_.dp > 1)
      timed(rec_, trace::Stream::dp, "dp_allreduce", grad.size() * sizeof(float),
            [&] { g_.dp->all_reduce(grad.data(), grad.size()); });
    return;
  }
  std::vector<float> padded(padded_, 0.0f);
  std::copy(grad.begin(), grad.end(), padded.begin());
  shard_grad_.assign(hi_ - lo_, 0.0f);
  if (layout_.dp > 1)
    timed(rec_, trace::Stream::dp, "dp_reducescatter", padded.size() * sizeof(float),
          [&] { g_.dp->reduce_scatter(padded.data(), shard_grad_.data(), shard_grad_.size()); });
  else
    std::copy(padded.begin() + lo_, padded.begin() + hi_, shard_grad_.begin());
}

OptimizerReport DistributedOptimizer::norms() {
  const auto specs = gpt_param_specs(model_);
  std::vector<float> sq(specs.size(), 0.0f);
  const bool sharded = layout_.zero_stage >= 1;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (!store_.has(specs[i].name)) continue;
    const Param& p = store_.at(specs[i].name);
    if (p.spec.shard_dim == -1 && g_.at.tp != 0) continue;               // tp replicas
    if (p.spec.name == "embed.tok" && tied_peer_ >= 0 && !tied_is_first_) continue;  // tied copy
    if (!sharded && g_.at.dp != 0) continue;                              // dp replicas
    double s = 0;
    if (sharded) {
      const std::size_t a = std::max(p.offset, lo_), b = std::min(p.offset + p.size(), hi_);
      if (a < b) s = kc::sum_squares(shard_grad_.data() + (a - lo_), b - a);
    } else {
      s = kc::sum_squares(store_.grad(p), p.size());
    }
    sq[i] = static_cast<float>(s);
  }
  g_.world->all_reduce(sq.data(), sq.size());
  OptimizerReport r;
  double total = 0;
  for (float s : sq) {
    total += s;
    r.param_grad_norms.push_back(std::sqrt(static_cast<double>(s)));
  }
  r.grad_norm = std::sqrt(total);
  return r;
}

void DistributedOptimizer::update(float clip) {
  const bool sharded = layout_.zero_stage >= 1;
  float* grad_base = sharded ? shard_grad_.data() : store_.flat_grad().data();
  std::vector<float> g;
  for (const auto& p : store_.params()) {
    const std::size_t a = std::max(p.offset, lo_), b = std::min(p.offset + p.size(), hi_);
    if (a >= b) continue;
    g.assign(grad_base + (a - lo_), grad_base + (b - lo_));
    kc::scale(g.data(), g.size(), clip);
    kc::AdamW hp = cfg_.adamw;
    if (!p.spec.decay) hp.weight_decay = 0.0f;
    kc::adamw_step(store_.flat_data().data() + a, g.data(), m_.data() + (a - lo_), v_.data() + (a - lo_), b - a, hp,
                   step_ + 1);
  }
}

void DistributedOptimizer::gather_params() {
  if (layout_.zero_stage == 0 || layout_.dp == 1) return;
  auto& data = store_.flat_data();
  std::vector<float> mine(hi_ - lo_, 0.0f), all(padded_);
  for (std::size_t i = lo_; i < std::min(hi_, data.size()); ++i) mine[i - lo_] = data[i];
  timed(rec_, trace::Stream::dp, "dp_allgather", padded_ * sizeof(float),
        [&] { g_.dp->all_gather(mine.data(), all.data(), mine.size()); });
  std::copy(all.begin(), all.begin() + static_cast<long>(data.size()), data.begin());
}

OptimizerReport DistributedOptimizer::step() {
  sync_tied();
  sync_sequence_parallel();
  reduce_data_parallel();
  OptimizerReport r = norms();
  const double t0 = rec_.now_us();
  update(kc::clip_coefficient(r.grad_norm, cfg_.clip_norm));
  OpIdentity id;
  id.op = "optimizer";
  rec_.record(trace::Stream::compute, id, "optimizer", t0, rec_.now_us(), 0.0, 0.0);
  gather_params();
  store_.zero_grad();
  ++step_;
  return r;
}

}  // namespace tessel::rt
