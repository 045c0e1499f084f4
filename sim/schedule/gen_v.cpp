// V-placement generators (exactly 2 stages per rank: chunk0 = stage r, chunk1 = stage 2p-1-r):
// PyTorch's handcrafted ZB-V (ScheduleZBVZeroBubble) and DeepSeek's DualPipeV (dualpipev.py).
// Step lists are those of reference/schedules.md; each step is one loop below.
#include <deque>
#include <string>

#include "util/error.hpp"
#include "sim/schedule/generators.hpp"

namespace tessel::sched::gen {

namespace {

void require_v2(const GenParams& p, const std::string& name) {
  if (p.vpp != 2)
    throw InputError("--vpp " + std::to_string(p.vpp) + ": " + name +
                     " is a V schedule and needs exactly 2 stages per rank (--vpp 2)");
}

// Per-rank counters for the two chunks and the FIFO of input grads awaiting their weight grad.
struct VRank {
  std::vector<Action>* out;
  int stage[2];
  int f[2] = {0, 0}, i[2] = {0, 0}, w[2] = {0, 0};
  std::deque<Action> pending_w;

  Action next(ActionType t, int c) {
    int& n = t == ActionType::F ? f[c] : (t == ActionType::W ? w[c] : i[c]);
    return make(t, stage[c], n++);
  }
  void F(int c) { out->push_back(next(ActionType::F, c)); }
  void I(int c) {
    Action a = next(ActionType::I, c);
    out->push_back(a);
    pending_w.push_back(make(ActionType::W, a.stage, a.mb));
  }
  void Wc(int c) { out->push_back(next(ActionType::W, c)); }
  void Bfull(int c) { out->push_back(next(ActionType::B, c)); }  // shares the I counter
  void Wfifo() {  // DualPipe WeightGradStore.pop(): the oldest pending input grad
    out->push_back(pending_w.front());
    pending_w.pop_front();
  }
  void overlap(int fc, int bc) {
    Action fa = next(ActionType::F, fc);
    Action ba = next(ActionType::B, bc);
    out->push_back(make_overlap(fa, ba));
  }
};

}  // namespace

// n' = max(2p-1, m); ops with mb >= m are dropped at the end (PyTorch replaces them with idles).
Schedule zbv(const GenParams& p) {
  require_v2(p, "zbv");
  const int pp = p.pp, m = p.microbatches, n = std::max(2 * pp - 1, m);
  Schedule s = empty_schedule("zbv", pp, 2, m, Placement::V);
  for (int r = 0; r < pp; ++r) {
    std::vector<Action> ops;
    VRank v{&ops, {r, 2 * pp - 1 - r}, {0, 0}, {0, 0}, {0, 0}, {}};
    for (int k = 0; k < 2 * (pp - r) - 1; ++k) v.F(0);
    for (int k = 0; k < r; ++k) { v.F(1); v.F(0); }
    for (int k = 0; k < pp - r; ++k) { v.F(1); v.I(1); v.Wc(1); }
    while (v.f[1] < v.f[0] || v.f[0] < n) {
      if (v.f[0] < n) v.F(0);
      v.I(0); v.Wc(0); v.F(1); v.I(1); v.Wc(1);
    }
    for (int k = 0; k < r; ++k) { v.I(0); v.I(1); }
    for (int k = 0; k < pp - r; ++k) { v.I(0); v.Wc(0); }
    while (v.w[1] < n) v.Wc(1);
    while (v.w[0] < n) v.Wc(0);
    auto& out = s.ranks[static_cast<std::size_t>(r)];
    for (const auto& a : ops)
      if (a.mb < m) out.push_back(a);
  }
  return s;
}

// DeepSeek dualpipev.py, R ranks, 2R stages; m >= 2R (its assert). Each W pops the oldest pending I.
Schedule dualpipev(const GenParams& p) {
  require_v2(p, "dualpipev");
  const int R = p.pp, m = p.microbatches;
  if (m < 2 * R)
    throw InputError("dualpipev: microbatches " + std::to_string(m) + " must be >= 2 * pp = " + std::to_string(2 * R) +
                     " (DeepSeek DualPipeV rule: every stage needs a micro-batch in flight)");
  Schedule s = empty_schedule("dualpipev", R, 2, m, Placement::V);
  for (int r = 0; r < R; ++r) {
    VRank v{&s.ranks[static_cast<std::size_t>(r)], {r, 2 * R - 1 - r}, {0, 0}, {0, 0}, {0, 0}, {}};
    for (int k = 0; k < 2 * (R - r - 1); ++k) v.F(0);                    // 1
    for (int k = 0; k < r + 1; ++k) { v.F(0); v.F(1); }                  // 2
    for (int k = 0; k < R - r - 1; ++k) { v.I(1); v.Wfifo(); v.F(1); }  // 3
    for (int k = 0; k < m - 2 * R + r + 1; ++k) {                        // 4
      if (k == 0 && r == R - 1) {
        v.F(0);
        v.Bfull(1);
      } else {
        v.overlap(0, 1);
      }
      v.overlap(1, 0);
    }
    for (int k = 0; k < R - r - 1; ++k) { v.Bfull(1); v.overlap(1, 0); }  // 5
    const int h = (r + 1) / 2;                                            // 6: switch to I from i = h
    for (int k = 0; k < r + 1; ++k) {
      const bool i1 = k > h || (k == h && r % 2 == 1);
      if (i1) v.I(1); else v.Bfull(1);
      if (k >= h) v.I(0); else v.Bfull(0);
    }
    for (int k = 0; k < R - r - 1; ++k) { v.Wfifo(); v.I(0); }  // 7
    for (int k = 0; k < r + 1; ++k) v.Wfifo();                  // 8
  }
  return s;
}

}  // namespace tessel::sched::gen
