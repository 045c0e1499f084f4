#include "runtime/optimizer_step.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>

#include "util/error.hpp"

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
                                           Recorder& rec, const OptimizerConfig& cfg, int tied_peer, bool tied_is_first,
                                           ParamStore* experts)
    : model_(m), layout_(l), store_(store), g_{groups.world, groups.tp.get(), groups.pp.get(), groups.dp.get(), groups.at},
      rec_(rec), cfg_(cfg), tied_peer_(tied_peer), tied_is_first_(tied_is_first), sharded_(l.zero_stage >= 1) {
  init();
  if (!experts) return;
  // The experts' optimizer: edp plays dp; each etp rank holds its own slice of every expert tensor (none is
  // replicated over tp or etp), so no tp sync and every slice counts in the norm; no tied copies.
  TESSEL_CHECK(groups.edp, "a MoE model's optimizer needs the edp group");
  Layout el = l;
  el.dp = groups.edp->size();
  el.tp = 1;
  el.sequence_parallel = false;
  Groups eg{groups.world, nullptr, nullptr, groups.edp.get(), groups.at};
  eg.at.dp = groups.at.edp;
  eg.at.tp = 0;
  experts_.reset(new DistributedOptimizer(m, el, *experts, eg, rec, cfg));
}

DistributedOptimizer::DistributedOptimizer(const Model& m, const Layout& l, ParamStore& store, const Groups& groups,
                                           Recorder& rec, const OptimizerConfig& cfg)
    : model_(m), layout_(l), store_(store), g_(groups), rec_(rec), cfg_(cfg), tied_peer_(-1), tied_is_first_(false),
      sharded_(l.zero_stage >= 1) {
  init();
}

DistributedOptimizer::~DistributedOptimizer() = default;

void DistributedOptimizer::init() {
  const auto specs = gpt_param_specs(model_);
  for (std::size_t i = 0; i < specs.size(); ++i) spec_index_[specs[i].name] = i;
  const std::size_t n = store_.flat_data().size();
  const auto bytes = [](std::size_t elems) { return static_cast<std::int64_t>(elems * sizeof(float)); };
  if (!sharded_) {
    m_.assign(n, 0.0f);
    v_.assign(n, 0.0f);
    mem_ = {bytes(n), bytes(n), bytes(2 * n), 0};
  } else {
    part_ = ZeroPartition(store_, layout_.dp, g_.at.dp);
    const std::size_t k = part_.shard_size();
    m_.assign(k, 0.0f);
    v_.assign(k, 0.0f);
    shard_grad_.assign(k, 0.0f);
    gathered_.assign(part_.groups().size(), 0);
    pending_.assign(part_.groups().size(), 0);
    const int z = layout_.zero_stage;
    mem_ = {bytes(z >= 3 ? k : n), bytes(z >= 2 ? k : n), bytes(2 * k), 0};
    if (z >= 3) params_loaded();
  }
  mem_.peak = mem_.persistent();
}

StateMemory DistributedOptimizer::state_memory() const {
  StateMemory s = mem_;
  if (experts_) {
    const StateMemory e = experts_->state_memory();
    s.weights += e.weights;
    s.grads += e.grads;
    s.optimizer += e.optimizer;
    s.peak += e.peak;  // each one's peak over the step; their sum bounds the rank's
  }
  return s;
}

void DistributedOptimizer::track(std::int64_t delta) {
  live_ += delta;
  mem_.peak = std::max(mem_.peak, mem_.persistent() + live_);
}

template <class F>
void DistributedOptimizer::for_owned_params(F&& f) {
  const auto& groups = part_.groups();
  std::size_t gi = 0;
  for (Param& p : store_.params()) {
    while (gi < groups.size() && groups[gi].end <= p.offset) ++gi;
    const ZeroGroup& g = groups.at(gi);
    const std::size_t own0 = part_.owned_begin(g, part_.dp_rank()), own1 = part_.owned_end(g, part_.dp_rank());
    const std::size_t a = std::max(p.offset, own0), b = std::min(p.offset + p.size(), own1);
    if (a < b) f(p, a, b, g.local + (a - own0));
  }
}

void DistributedOptimizer::add_tied_peer(float* g, std::size_t n) {
  std::vector<float> other(n);
  timed(rec_, trace::Stream::pp, "embedding_allreduce", n * sizeof(float), [&] {
    g_.pp->send(g, n, tied_peer_, kTiedTag);
    g_.pp->recv(other.data(), n, tied_peer_, kTiedTag);
  });
  // first + last in that order on both ranks: bitwise equal copies.
  for (std::size_t i = 0; i < n; ++i) g[i] = tied_is_first_ ? g[i] + other[i] : other[i] + g[i];
}

void DistributedOptimizer::sync_tied() {
  if (tied_peer_ < 0) return;
  if (!sharded_) {
    Param& p = store_.at("embed.tok");
    add_tied_peer(store_.grad(p), p.size());
    return;
  }
  // Both copies of embed.tok form a group of the same size on both ranks: the same owned chunk.
  for_owned_params([&](Param& p, std::size_t a, std::size_t b, std::size_t local) {
    if (p.spec.name == "embed.tok") add_tied_peer(shard_grad_.data() + local, b - a);
  });
}

void DistributedOptimizer::sync_sequence_parallel() {
  if (!layout_.sequence_parallel || layout_.tp == 1) return;
  // The gradients of tp-replicated parameters (whole, or this rank's ZeRO runs of them: tp peers hold equally
  // sized shards, so the same runs), summed over tp in one packed all-reduce.
  std::vector<std::pair<float*, std::size_t>> runs;
  if (!sharded_) {
    for (const auto& p : store_.params())
      if (p.spec.shard_dim == -1) runs.emplace_back(store_.grad(p), p.size());
  } else {
    for_owned_params([&](Param& p, std::size_t a, std::size_t b, std::size_t local) {
      if (p.spec.shard_dim == -1) runs.emplace_back(shard_grad_.data() + local, b - a);
    });
  }
  std::vector<float> packed;
  for (const auto& [ptr, n] : runs) packed.insert(packed.end(), ptr, ptr + n);
  if (packed.empty()) return;
  timed(rec_, trace::Stream::tp, "tp_allreduce", packed.size() * sizeof(float),
        [&] { g_.tp->all_reduce(packed.data(), packed.size()); });
  std::size_t at = 0;
  for (const auto& [ptr, n] : runs) {
    std::copy(packed.begin() + static_cast<long>(at), packed.begin() + static_cast<long>(at + n), ptr);
    at += n;
  }
}

void DistributedOptimizer::flush_group(std::size_t gi) {
  const ZeroGroup& g = part_.groups()[gi];
  auto& grad = store_.flat_grad();
  const std::size_t n = g.end - g.begin, dp = static_cast<std::size_t>(part_.dp());
  std::vector<float> padded(g.chunk * dp, 0.0f), mine(g.chunk);
  std::copy(grad.begin() + static_cast<long>(g.begin), grad.begin() + static_cast<long>(g.end), padded.begin());
  if (dp > 1)
    timed(rec_, trace::Stream::dp, "dp_reducescatter", padded.size() * sizeof(float),
          [&] { g_.dp->reduce_scatter(padded.data(), mine.data(), g.chunk); });
  else
    std::copy(padded.begin(), padded.begin() + static_cast<long>(g.chunk), mine.begin());
  for (std::size_t i = 0; i < g.chunk; ++i) shard_grad_[g.local + i] += mine[i];
  std::fill(grad.begin() + static_cast<long>(g.begin), grad.begin() + static_cast<long>(g.begin + n), 0.0f);
  if (pending_[gi] && layout_.zero_stage >= 2) track(-static_cast<std::int64_t>(n * sizeof(float)));
  pending_[gi] = 0;
}

// Bytes a ZeRO-3 gather of group g adds beside this rank's own chunk.
std::int64_t DistributedOptimizer::gathered_bytes(const ZeroGroup& g) const {
  const std::size_t own = part_.owned_end(g, part_.dp_rank()) - part_.owned_begin(g, part_.dp_rank());
  return static_cast<std::int64_t>((g.end - g.begin - own) * sizeof(float));
}

void DistributedOptimizer::gather_group(std::size_t gi) {
  if (gathered_[gi]) return;
  const ZeroGroup& g = part_.groups()[gi];
  const std::size_t dp = static_cast<std::size_t>(part_.dp());
  std::vector<float> all(g.chunk * dp);
  if (dp > 1)
    timed(rec_, trace::Stream::dp, "dp_allgather", all.size() * sizeof(float),
          [&] { g_.dp->all_gather(shard_param_.data() + g.local, all.data(), g.chunk); });
  else
    std::copy(shard_param_.begin() + static_cast<long>(g.local), shard_param_.begin() + static_cast<long>(g.local + g.chunk),
              all.begin());
  std::copy(all.begin(), all.begin() + static_cast<long>(g.end - g.begin),
            store_.flat_data().begin() + static_cast<long>(g.begin));
  gathered_[gi] = 1;
  track(gathered_bytes(g));
}

void DistributedOptimizer::release_group(std::size_t gi) {
  if (!gathered_[gi]) return;
  const ZeroGroup& g = part_.groups()[gi];
  auto& data = store_.flat_data();
  std::fill(data.begin() + static_cast<long>(g.begin), data.begin() + static_cast<long>(g.end),
            std::numeric_limits<float>::quiet_NaN());
  gathered_[gi] = 0;
  track(-gathered_bytes(g));
}

// A stage's groups, looked up once per stage (the hooks run around every compute action).
const std::vector<std::size_t>& DistributedOptimizer::stage_groups(int l0, int l1, bool first, bool last) {
  const std::array<int, 4> key{l0, l1, first, last};
  auto it = stage_groups_.find(key);
  if (it == stage_groups_.end()) it = stage_groups_.emplace(key, part_.stage_groups(l0, l1, first, last)).first;
  return it->second;
}

void DistributedOptimizer::before_compute(int l0, int l1, bool first, bool last, bool reads_weights, bool makes_grads) {
  if (experts_) experts_->before_compute(l0, l1, first, last, reads_weights, makes_grads);
  if (!sharded_) return;
  for (std::size_t gi : stage_groups(l0, l1, first, last)) {
    if (layout_.zero_stage >= 3 && reads_weights) gather_group(gi);
    if (layout_.zero_stage >= 2 && makes_grads && !pending_[gi]) {
      pending_[gi] = 1;
      const ZeroGroup& g = part_.groups()[gi];
      track(static_cast<std::int64_t>((g.end - g.begin) * sizeof(float)));
    }
  }
}

void DistributedOptimizer::after_compute(int l0, int l1, bool first, bool last, bool grads_done) {
  if (experts_) experts_->after_compute(l0, l1, first, last, grads_done);
  if (!sharded_) return;
  for (std::size_t gi : stage_groups(l0, l1, first, last)) {
    if (layout_.zero_stage >= 3) release_group(gi);
    if (layout_.zero_stage >= 2 && grads_done) flush_group(gi);
  }
}

void DistributedOptimizer::add_squares(std::vector<float>& sq) {
  const auto& index = spec_index_;
  const auto counted = [&](const Param& p) {
    if (p.spec.shard_dim == -1 && g_.at.tp != 0) return false;                      // tp replicas
    if (p.spec.name == "embed.tok" && tied_peer_ >= 0 && !tied_is_first_) return false;  // tied copy
    return true;
  };
  const auto& observe = cfg_.observe_grads;
  if (sharded_) {
    for_owned_params([&](Param& p, std::size_t a, std::size_t b, std::size_t local) {
      if (!counted(p)) return;
      sq[index.at(p.spec.name)] += static_cast<float>(kc::sum_squares(shard_grad_.data() + local, b - a));
      if (observe) observe(step_, p, a - p.offset, b - p.offset, shard_grad_.data() + local);
    });
  } else if (g_.at.dp == 0) {  // dp replicas hold the same all-reduced gradient
    for (const Param& p : store_.params()) {
      if (!counted(p)) continue;
      sq[index.at(p.spec.name)] += static_cast<float>(kc::sum_squares(store_.grad(p), p.size()));
      if (observe) observe(step_, p, 0, p.size(), store_.grad(p));
    }
  }
}

void DistributedOptimizer::update(float clip) {
  std::vector<float> g;
  const auto apply = [&](const Param& p, float* param, const float* grad, float* m, float* v, std::size_t n) {
    g.assign(grad, grad + n);
    kc::scale(g.data(), g.size(), clip);
    kc::AdamW hp = cfg_.adamw;
    if (!p.spec.decay) hp.weight_decay = 0.0f;
    kc::adamw_step(param, g.data(), m, v, n, hp, step_ + 1);
  };
  if (!sharded_) {
    for (const Param& p : store_.params())
      apply(p, store_.flat_data().data() + p.offset, store_.flat_grad().data() + p.offset, m_.data() + p.offset,
            v_.data() + p.offset, p.size());
    return;
  }
  const bool zero3 = layout_.zero_stage >= 3;
  for_owned_params([&](Param& p, std::size_t a, std::size_t b, std::size_t local) {
    float* param = zero3 ? shard_param_.data() + local : store_.flat_data().data() + a;
    apply(p, param, shard_grad_.data() + local, m_.data() + local, v_.data() + local, b - a);
  });
}

void DistributedOptimizer::gather_params() {
  if (!sharded_ || layout_.zero_stage >= 3 || layout_.dp == 1) return;
  auto& data = store_.flat_data();
  for (const ZeroGroup& g : part_.groups()) {
    const std::size_t a = part_.owned_begin(g, part_.dp_rank()), b = part_.owned_end(g, part_.dp_rank());
    std::vector<float> mine(g.chunk, 0.0f), all(g.chunk * static_cast<std::size_t>(layout_.dp));
    std::copy(data.begin() + static_cast<long>(a), data.begin() + static_cast<long>(b), mine.begin());
    timed(rec_, trace::Stream::dp, "dp_allgather", all.size() * sizeof(float),
          [&] { g_.dp->all_gather(mine.data(), all.data(), g.chunk); });
    std::copy(all.begin(), all.begin() + static_cast<long>(g.end - g.begin), data.begin() + static_cast<long>(g.begin));
  }
}

void DistributedOptimizer::reduce() {
  if (!sharded_) {
    sync_tied();
    sync_sequence_parallel();
    auto& grad = store_.flat_grad();
    if (layout_.dp > 1)
      timed(rec_, trace::Stream::dp, "dp_allreduce", grad.size() * sizeof(float),
            [&] { g_.dp->all_reduce(grad.data(), grad.size()); });
  } else {
    if (layout_.zero_stage == 1)
      for (std::size_t gi = 0; gi < part_.groups().size(); ++gi) flush_group(gi);
    // ZeRO-2/3 reduced every group after its micro-batches' backward; nothing may be left behind.
    for (float x : store_.flat_grad())
      TESSEL_CHECK(x == 0.0f, "ZeRO-" << layout_.zero_stage << ": a gradient was not reduce-scattered before the step");
    sync_tied();
    sync_sequence_parallel();
  }
}

OptimizerReport DistributedOptimizer::step() {
  reduce();
  if (experts_) experts_->reduce();
  std::vector<float> sq(spec_index_.size(), 0.0f);
  // The norm's pass over the gradients, recorded where it counts them (Layout::counts_grad_norm) as the
  // simulator's grad_norm; the world reduction after it is a wait.
  const double n0 = rec_.now_us();
  add_squares(sq);
  if (experts_) experts_->add_squares(sq);
  if (layout_.counts_grad_norm(g_.at.dp)) {
    OpIdentity norm;
    norm.op = "grad_norm";
    rec_.record(trace::Stream::compute, norm, "grad_norm", n0, rec_.now_us(), 0.0, 0.0);
  }
  g_.world->all_reduce(sq.data(), sq.size());
  OptimizerReport r;
  double total = 0;
  for (float x : sq) {
    total += x;
    r.param_grad_norms.push_back(std::sqrt(static_cast<double>(x)));
  }
  r.grad_norm = std::sqrt(total);
  const float clip = kc::clip_coefficient(r.grad_norm, cfg_.clip_norm);
  const double t0 = rec_.now_us();
  update(clip);
  if (experts_) experts_->update(clip);
  OpIdentity id;
  id.op = "optimizer";
  rec_.record(trace::Stream::compute, id, "optimizer", t0, rec_.now_us(), 0.0, 0.0);
  // The updated parameters gathered (ZeRO), then the gradients cleared for the next step: one zero_grad op,
  // the experts' included, as the simulator has it.
  gather_params();
  if (experts_) experts_->gather_params();
  const double z0 = rec_.now_us();
  clear_grads();
  if (experts_) experts_->clear_grads();
  OpIdentity zero;
  zero.op = "zero_grad";
  rec_.record(trace::Stream::compute, zero, "zero_grad", z0, rec_.now_us(), 0.0, 0.0);
  ++step_;
  if (experts_) ++experts_->step_;
  return r;
}

void DistributedOptimizer::clear_grads() {
  store_.zero_grad();
  std::fill(shard_grad_.begin(), shard_grad_.end(), 0.0f);
}

void DistributedOptimizer::set_steps_done(int s) {
  step_ = s;
  if (experts_) experts_->step_ = s;
}

void DistributedOptimizer::expert_moments(std::vector<float>& m, std::vector<float>& v) {
  if (experts_) experts_->full_moments(m, v);
}

void DistributedOptimizer::load_expert_moments(const std::vector<float>& m, const std::vector<float>& v) {
  if (experts_) experts_->load_moments(m, v);
}

void DistributedOptimizer::full_moments(std::vector<float>& m, std::vector<float>& v) {
  const std::size_t n = store_.flat_data().size();
  if (!sharded_) {
    m = m_;
    v = v_;
    return;
  }
  for (auto* pair : {&m, &v}) {
    std::vector<float> all(part_.shard_size() * static_cast<std::size_t>(part_.dp()));
    g_.dp->all_gather((pair == &m ? m_ : v_).data(), all.data(), part_.shard_size());
    *pair = part_.unshard(all, n);
  }
}

void DistributedOptimizer::load_moments(const std::vector<float>& m, const std::vector<float>& v) {
  if (!sharded_) {
    m_ = m;
    v_ = v;
    return;
  }
  part_.for_owned([&](std::size_t a, std::size_t b, std::size_t local) {
    std::copy(m.begin() + static_cast<long>(a), m.begin() + static_cast<long>(b), m_.begin() + static_cast<long>(local));
    std::copy(v.begin() + static_cast<long>(a), v.begin() + static_cast<long>(b), v_.begin() + static_cast<long>(local));
  });
}

void DistributedOptimizer::materialize_params() {
  if (!sharded_ || layout_.zero_stage < 3) return;
  for (std::size_t gi = 0; gi < part_.groups().size(); ++gi) gather_group(gi);
}

void DistributedOptimizer::release_params() {
  if (!sharded_ || layout_.zero_stage < 3) return;
  for (std::size_t gi = 0; gi < part_.groups().size(); ++gi) release_group(gi);
}

void DistributedOptimizer::params_loaded() {
  if (!sharded_ || layout_.zero_stage < 3) return;
  shard_param_.assign(part_.shard_size(), 0.0f);
  const auto& data = store_.flat_data();
  part_.for_owned([&](std::size_t a, std::size_t b, std::size_t local) {
    std::copy(data.begin() + static_cast<long>(a), data.begin() + static_cast<long>(b),
              shard_param_.begin() + static_cast<long>(local));
  });
  // The shards hold the parameters now: the full buffer is released as a whole (groups cover it all).
  std::fill(store_.flat_data().begin(), store_.flat_data().end(), std::numeric_limits<float>::quiet_NaN());
  std::fill(gathered_.begin(), gathered_.end(), 0);
}

}  // namespace tessel::rt
