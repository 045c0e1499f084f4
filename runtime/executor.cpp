#include "runtime/executor.hpp"

#include <string>
#include <utility>

namespace tessel::rt {

// Unique within a step: (mb, to, dir) names one tensor of the step; 2 x stages x micro-batches tags a step.
int p2p_tag(const sched::Schedule& s, int dir, int to, int mb) { return (mb * s.num_stages + to) * 2 + dir; }

// The step's tags, offset by (step x replicas + replica) steps' worth of them.
std::int64_t p2p_flow(const sched::Schedule& s, const WalkPosition& at, int dir, int to, int mb) {
  const std::int64_t per_step = 2LL * s.num_stages * s.num_microbatches;
  const std::int64_t base = (static_cast<std::int64_t>(at.step) * at.replicas + at.replica) * per_step;
  return base + p2p_tag(s, dir, to, mb);
}

namespace {

// Host vectors over a host communicator (threads or MPI). Sends are buffered, so a rank never waits for
// its peer's receive (eager comm semantics, as the schedule validator checks them).
class CpuPipeline final : public PipelineBackend<std::vector<float>> {
 public:
  using Tensor = std::vector<float>;
  explicit CpuPipeline(const ExecutorContext& c) : c_(c) {}
  PipelineLosses losses() const { return {loss_, aux_}; }

  std::pair<int, int> stage_layers(int s) override {
    const StageConfig& cfg = stage(s).config();
    return {cfg.l0, cfg.l1};
  }
  double forward_flops(int s) override { return stage(s).forward_flops(); }

  void before_compute(const ComputeAction& a) override {
    if (c_.before_compute) c_.before_compute(a.stage, a.reads_weights(), a.makes_grads());
  }
  void begin_compute(const ComputeAction& a) override {
    c_.rec->context = a.id;
    t0_ = c_.rec->now_us();
  }
  void end_compute(const ComputeAction& a) override {
    c_.rec->record(trace::Stream::compute, c_.rec->context, a.name, t0_, c_.rec->now_us(), a.flops, 0.0);
    c_.rec->context = {};
  }
  void after_compute(const ComputeAction& a) override {
    if (c_.after_compute) c_.after_compute(a.stage, a.grads_done());
  }

  Tensor forward(int s, int mb, Tensor in) override {
    Stage& st = stage(s);
    const MicroBatch& d = c_.data(mb);
    Tensor out = st.forward(mb, std::move(in), d.tokens.data(), d.targets.data());
    if (st.config().last) loss_ += st.loss(mb);
    aux_ += st.aux_loss(mb);
    return out;
  }
  Tensor backward(int s, int mb, Tensor dout, bool full) override {
    Stage& st = stage(s);
    Tensor dx = st.backward_input(mb, std::move(dout), /*defer_weight=*/!full);
    if (full) st.backward_weight(mb);
    return dx;
  }
  void weight(int s, int mb) override { stage(s).backward_weight(mb); }

  void send(const P2pAction& p, Tensor t) override {
    begin_p2p(p);
    c_.pp->send(t.data(), t.size(), p.peer, p.tag);
    end_p2p(p, t.size());
  }
  Tensor recv(const P2pAction& p) override {
    begin_p2p(p);
    Tensor t(stage(p.stage).activation_elems());
    c_.pp->recv(t.data(), t.size(), p.peer, p.tag);
    end_p2p(p, t.size());
    return t;
  }

 private:
  Stage& stage(int s) { return *c_.stages->at(s); }
  void begin_p2p(const P2pAction& p) {
    c_.rec->context = p.id;
    t0_ = c_.rec->now_us();
  }
  void end_p2p(const P2pAction& p, std::size_t n) {
    c_.rec->record(trace::Stream::pp, c_.rec->context, p.name, t0_, c_.rec->now_us(), 0.0,
                   static_cast<double>(n * sizeof(float)), p.flow);
    c_.rec->context = {};
  }

  const ExecutorContext& c_;
  double t0_ = 0;
  double loss_ = 0, aux_ = 0;
};

}  // namespace

PipelineLosses run_pipeline(const ExecutorContext& ctx) {
  CpuPipeline b(ctx);
  walk_pipeline(*ctx.schedule, ctx.at, b);
  return b.losses();
}

}  // namespace tessel::rt
