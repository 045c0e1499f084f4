#include "runtime/executor.hpp"

#include <string>
#include <utility>

#include "util/error.hpp"

namespace tessel::rt {

using sched::Action;
using sched::ActionType;

namespace {

using Key = std::pair<int, int>;  // (stage, mb)

class Walker {
 public:
  explicit Walker(const ExecutorContext& c) : c_(c), s_(*c.schedule) {}

  double run() {
    for (const Action& a : s_.ranks.at(static_cast<std::size_t>(c_.pp_rank))) execute(a);
    TESSEL_CHECK(fwd_in_.empty() && bwd_in_.empty() && fwd_out_.empty() && bwd_out_.empty(),
                 "pipeline rank " << c_.pp_rank << " finished with undelivered tensors: the schedule is incomplete");
    return loss_;
  }

 private:
  Stage& stage(int s) {
    auto it = c_.stages->find(s);
    TESSEL_CHECK(it != c_.stages->end(), "stage " << s << " is not on pipeline rank " << c_.pp_rank);
    return *it->second;
  }
  static std::vector<float> take(std::map<Key, std::vector<float>>& m, Key k, const char* what) {
    auto it = m.find(k);
    TESSEL_CHECK(it != m.end(), "" << what << " for stage " << k.first << " mb " << k.second << " missing: the schedule ran an op before its input arrived");
    std::vector<float> v = std::move(it->second);
    m.erase(it);
    return v;
  }
  // Tag of a tensor travelling into stage `to` (dir 0 forward, 1 backward).
  int tag(int dir, int to, int mb) const { return (mb * s_.num_stages + to) * 2 + dir; }
  std::int64_t flow(int dir, int to, int mb) const {
    return c_.flow_base + (static_cast<std::int64_t>(mb) * s_.num_stages + to) * 2 + dir;
  }

  OpIdentity id_of(const char* op, int s, int mb) {
    const StageConfig& cfg = stage(s).config();
    return {op, s, s_.chunk_of(s), mb, cfg.l0, cfg.l1};
  }

  template <class F>
  void compute(const char* op, const std::string& letter, int s, int mb, double flops, F&& f) {
    const bool reads_weights = letter != "W", makes_grads = letter != "F", grads_done = letter == "B" || letter == "W";
    if (c_.before_compute) c_.before_compute(s, reads_weights, makes_grads);
    timed_compute(op, letter, s, mb, flops, std::forward<F>(f));
    if (c_.after_compute) c_.after_compute(s, grads_done);
  }

  template <class F>
  void timed_compute(const char* op, const std::string& letter, int s, int mb, double flops, F&& f) {
    c_.rec->context = id_of(op, s, mb);
    const double t0 = c_.rec->now_us();
    f();
    c_.rec->record(trace::Stream::compute, c_.rec->context, letter + " s" + std::to_string(s) + " mb" + std::to_string(mb),
                   t0, c_.rec->now_us(), flops, 0.0);
    c_.rec->context = {};
  }

  void forward(int s, int mb) {
    Stage& st = stage(s);
    compute("forward", "F", s, mb, st.forward_flops(), [&] {
      const MicroBatch& d = c_.data(mb);
      std::vector<float> in = s == 0 ? std::vector<float>{} : take(fwd_in_, {s, mb}, "forward input");
      std::vector<float> out = st.forward(mb, std::move(in), d.tokens.data(), d.targets.data());
      if (s == s_.num_stages - 1) loss_ += st.loss(mb);
      else if (s_.rank_of(s + 1) == c_.pp_rank) fwd_in_[{s + 1, mb}] = std::move(out);
      else fwd_out_[{s, mb}] = std::move(out);
    });
  }

  void backward_input(int s, int mb, bool full) {
    Stage& st = stage(s);
    const double flops = (full ? 2.0 : 1.0) * st.forward_flops();
    compute(full ? "backward" : "input_grad", full ? "B" : "I", s, mb, flops, [&] {
      std::vector<float> dout = s == s_.num_stages - 1 ? std::vector<float>{} : take(bwd_in_, {s, mb}, "output gradient");
      std::vector<float> dx = st.backward_input(mb, std::move(dout), /*defer_weight=*/!full);
      if (full) st.backward_weight(mb);
      if (s == 0) return;
      if (s_.rank_of(s - 1) == c_.pp_rank) bwd_in_[{s - 1, mb}] = std::move(dx);
      else bwd_out_[{s, mb}] = std::move(dx);
    });
  }

  void weight(int s, int mb) {
    Stage& st = stage(s);
    compute("weight_grad", "W", s, mb, st.forward_flops(), [&] { st.backward_weight(mb); });
  }

  void p2p(const Action& a) {
    const bool fwd = a.type == ActionType::SEND_F || a.type == ActionType::RECV_F;
    const int dir = fwd ? 0 : 1;
    const int s = a.stage, mb = a.mb;
    const bool send = sched::is_send(a.type);
    // SEND_x names the producing stage, RECV_x the consuming one (PyTorch _add_send_recv convention).
    const int to = send ? (fwd ? s + 1 : s - 1) : s;
    const int peer = a.peer >= 0 ? a.peer : s_.rank_of(send ? to : (fwd ? s - 1 : s + 1));
    c_.rec->context = id_of(send ? "send" : "recv", s, mb);
    const double t0 = c_.rec->now_us();
    std::size_t n = 0;
    if (send) {
      std::vector<float> v = take(fwd ? fwd_out_ : bwd_out_, {s, mb}, fwd ? "activation to send" : "gradient to send");
      n = v.size();
      c_.pp->send(v.data(), n, peer, tag(dir, to, mb));
    } else {
      std::vector<float> v(stage(s).activation_elems());
      n = v.size();
      c_.pp->recv(v.data(), n, peer, tag(dir, to, mb));
      (fwd ? fwd_in_ : bwd_in_)[{s, mb}] = std::move(v);
    }
    c_.rec->record(trace::Stream::pp, c_.rec->context, a.token(), t0, c_.rec->now_us(), 0.0,
                   static_cast<double>(n * sizeof(float)), flow(dir, to, mb));
    c_.rec->context = {};
  }

  void execute(const Action& a) {
    switch (a.type) {
      case ActionType::F: forward(a.stage, a.mb); break;
      case ActionType::B: backward_input(a.stage, a.mb, true); break;
      case ActionType::I: backward_input(a.stage, a.mb, false); break;
      case ActionType::W: weight(a.stage, a.mb); break;
      case ActionType::OVERLAP_F_B:
        for (const Action& sub : a.sub) execute(sub);
        break;
      case ActionType::SEND_F: case ActionType::RECV_F: case ActionType::SEND_B: case ActionType::RECV_B:
        p2p(a);
        break;
      case ActionType::RECOMPUTE: case ActionType::REDUCE_GRAD: case ActionType::OPTIMIZER_STEP:
      case ActionType::UNSHARD: case ActionType::RESHARD:
      case ActionType::WAIT_SEND_F: case ActionType::WAIT_SEND_B: case ActionType::WAIT_REDUCE_GRAD:  // sends are buffered
        break;
    }
  }

  const ExecutorContext& c_;
  const sched::Schedule& s_;
  std::map<Key, std::vector<float>> fwd_in_, bwd_in_, fwd_out_, bwd_out_;
  double loss_ = 0;
};

}  // namespace

double run_pipeline(const ExecutorContext& ctx) { return Walker(ctx).run(); }

}  // namespace tessel::rt
