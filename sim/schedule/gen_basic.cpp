// Loop-placement generators: GPipe, 1F1B, Megatron interleaved 1F1B, LoopedBFS, ZB1P.
// Op orders follow reference/schedules.md (sources cited per function); no idle slots are emitted:
// a rank waits for its inputs, which the lock-step idles of PyTorch's IR only approximate.
#include <algorithm>
#include <deque>
#include <string>

#include "util/error.hpp"
#include "sim/schedule/generators.hpp"
#include "sim/schedule/registry.hpp"

namespace tessel::sched::gen {

namespace {

// Megatron-Core runs its combined 1F1B without pipelining (combined_1f1b_schedule_for_no_pipelining) or
// interleaved; plain 1F1B over pp > 1 stages is not combined (its arguments check asks for a virtual pipeline).
void require_combinable(const GenParams& p, const std::string& name) {
  if (p.combined && p.pp > 1 && p.vpp == 1)
    throw InputError(name + " with pp " + std::to_string(p.pp) + " and the all-to-all overlap (combined 1F1B): "
                     "Megatron-Core combines F and B only without pipelining (pp 1) or interleaved (vpp > 1)");
}

void require_single_stage(const GenParams& p, const std::string& name) {
  if (p.vpp != 1)
    throw InputError("--vpp " + std::to_string(p.vpp) + ": " + name +
                     " is a single-stage schedule and needs exactly 1 stage per rank (--vpp 1)");
}

}  // namespace

Schedule empty_schedule(const std::string& name, int pp, int vpp, int m, Placement placement) {
  Schedule s;
  s.generator = name;
  s.num_ranks = pp;
  s.num_stages = pp * vpp;
  s.num_microbatches = m;
  s.stage_to_rank = stage_to_rank(pp, pp * vpp, placement);
  s.ranks.assign(static_cast<std::size_t>(pp), {});
  return s;
}

// PyTorch ScheduleGPipe: all forwards, then all backwards. Works for m < p (PR pytorch/pytorch#144702).
Schedule gpipe(const GenParams& p) {
  require_single_stage(p, "gpipe");
  Schedule s = empty_schedule("gpipe", p.pp, 1, p.microbatches, Placement::Loop);
  for (int r = 0; r < p.pp; ++r) {
    RankBuilder b{&s.ranks[static_cast<std::size_t>(r)]};
    for (int i = 0; i < p.microbatches; ++i) b.add(ActionType::F, r, i);
    for (int i = 0; i < p.microbatches; ++i) b.add(ActionType::B, r, i);
  }
  return s;
}

// PipeDream-Flush: warmup w = min(m, p - s - 1) forwards, then (F, B) pairs, then the remaining Bs.
// Megatron clamps warmup to m, so m < p is accepted (PyTorch's ValueError guards a runtime hang,
// pytorch/torchtitan#775, not an impossible order; validate() proves this order deadlock-free).
Schedule one_f_one_b(const GenParams& p) {
  require_single_stage(p, "1f1b");
  const int m = p.microbatches;
  require_combinable(p, "1f1b");
  Schedule s = empty_schedule("1f1b", p.pp, 1, m, Placement::Loop);
  for (int r = 0; r < p.pp; ++r) {
    RankBuilder b{&s.ranks[static_cast<std::size_t>(r)]};
    // Combined (pp 1; Megatron-Core's combined_1f1b_schedule_for_no_pipelining): F0, then F(i+1)&B(i), then
    // the last B.
    const int w = std::min(m, p.pp - r - 1 + (p.combined ? 1 : 0));
    for (int i = 0; i < w; ++i) b.add(ActionType::F, r, i);
    for (int i = 0; i < m - w; ++i) {
      if (p.combined) {
        b.add_fb(r, w + i, r, i);
        continue;
      }
      b.add(ActionType::F, r, w + i);
      b.add(ActionType::B, r, i);
    }
    for (int i = m - w; i < m; ++i) b.add(ActionType::B, r, i);
  }
  return s;
}

// Megatron forward_backward_pipelining_with_interleaving. Schedule table (get_schedule_table): per group
// of g micro-batches, for each chunk k, for each mb of the group: (mb, k). Backward uses chunk v-1-k.
// Warmup (get_pp_rank_microbatches): min(m v, 2(p-1-r) + (v-1) g). Constraints: p <= g <= m and
// not 0 < m mod g < p (Megatron model_parallel_config / schedules.py).
// PyTorch's ScheduleInterleaved1F1B (torch/distributed/pipelining/schedules.py, _get_1f1b_rank_ops with
// multiply_factor 2) is the same table and warm-up with g = m / rounds, rounds = max(1, m // p), m a multiple
// of rounds: its forward stage of step t is ((t // g) % v) p + r, its micro-batch the stage's own counter,
// which is the table's (t // (g v)) g + t % g; it allows g < p (m < p), where chunks wait for the pipe to wrap.
namespace {

// The interleaved order's pieces, shared by the generator and combined_block_counts: the group size g
// (validated), the schedule table of (mb, chunk) per virtual micro-batch, and rank r's warm-up forwards.
int interleaved_group(const GenParams& p) {
  const int m = p.microbatches, pp = p.pp;
  int g = p.group_size.value_or(pp);
  if (p.rule == MicrobatchRule::torch) {
    const int rounds = std::max(1, m / pp);
    if (m % rounds != 0)
      throw InputError("interleaved (PyTorch's rule): microbatches " + std::to_string(m) +
                       " must be a multiple of the number of rounds max(1, m // pp) = " + std::to_string(rounds) +
                       " (ScheduleInterleaved1F1B)");
    g = m / rounds;
  } else if (g < pp || g > m) {
    throw InputError("interleaved: micro-batch group size " + std::to_string(g) + " (default --pp) must lie in [pp=" +
                     std::to_string(pp) + ", microbatches=" + std::to_string(m) +
                     "] (Megatron microbatch_group_size_per_vp_stage)");
  }
  if (m % g != 0 && m % g < pp)
    throw InputError("interleaved: microbatches " + std::to_string(m) + " mod group size " + std::to_string(g) +
                     " = " + std::to_string(m % g) + " lies in (0, pp=" + std::to_string(pp) +
                     "): the last group would leave dependency bubbles (Megatron rule)");
  return g;
}

std::vector<std::pair<int, int>> interleaved_table(int m, int v, int g) {
  std::vector<std::pair<int, int>> table;  // (mb, chunk) per virtual micro-batch
  table.reserve(static_cast<std::size_t>(m) * v);
  for (int start = 0; start < m; start += g) {
    const int size = std::min(g, m - start);
    for (int k = 0; k < v; ++k)
      for (int i = start; i < start + size; ++i) table.emplace_back(i, k);
  }
  return table;
}

int interleaved_warmup(const GenParams& p, int g, int r) {
  const int total = p.microbatches * p.vpp;
  // v == 1 is plain 1F1B in Megatron (forward_backward_pipelining_without_interleaving); PyTorch's class
  // keeps its interleaved warm-up (_get_warmup_ops) whatever the stages per rank.
  const bool one_f_one_b = p.vpp == 1 && p.rule == MicrobatchRule::megatron;
  const int warm = one_f_one_b ? p.pp - 1 - r : 2 * (p.pp - 1 - r) + (p.vpp - 1) * g;
  // Combined 1F1B warms up with one forward more, so that no block pairs a micro-batch's forward with its own
  // backward (the last rank's last chunk would; Megatron-Core schedules.py: "one extra micro-batch forward
  // step before the 1f1b stages").
  return std::min(total, warm + (p.combined ? 1 : 0));
}

}  // namespace

Schedule interleaved(const GenParams& p) {
  const int m = p.microbatches, v = p.vpp, pp = p.pp;
  const int g = interleaved_group(p);
  require_combinable(p, "interleaved");
  const auto table = interleaved_table(m, v, g);
  const int total = m * v;
  Schedule s = empty_schedule("interleaved", pp, v, m, Placement::Loop);
  s.rule = p.rule;
  for (int r = 0; r < pp; ++r) {
    RankBuilder b{&s.ranks[static_cast<std::size_t>(r)]};
    const int warm = interleaved_warmup(p, g, r);
    auto fwd = [&](int j) { b.add(ActionType::F, table[static_cast<std::size_t>(j)].second * pp + r,
                                  table[static_cast<std::size_t>(j)].first); };
    auto bwd = [&](int j) { b.add(ActionType::B, (v - 1 - table[static_cast<std::size_t>(j)].second) * pp + r,
                                  table[static_cast<std::size_t>(j)].first); };
    for (int j = 0; j < warm; ++j) fwd(j);
    for (int j = 0; j < total - warm; ++j) {
      if (p.combined) {  // Megatron-Core's combined 1F1B: the steady state's F and B as one block
        const auto& f = table[static_cast<std::size_t>(warm + j)];
        const auto& k = table[static_cast<std::size_t>(j)];
        b.add_fb(f.second * pp + r, f.first, (v - 1 - k.second) * pp + r, k.first);
        continue;
      }
      fwd(warm + j);
      bwd(j);
    }
    for (int j = total - warm; j < total; ++j) bwd(j);
  }
  return s;
}

std::vector<std::vector<int>> combined_block_counts(Kind k, const GenParams& p) {
  const int pp = p.pp, v = p.vpp, m = p.microbatches;
  std::vector<std::vector<int>> out(static_cast<std::size_t>(pp), std::vector<int>(static_cast<std::size_t>(v) * v, 0));
  if (!p.combined) return out;
  if (k == Kind::one_f_one_b) {  // pp 1: F(i+1)&B(i) for i < m - 1
    require_combinable(p, "1f1b");
    out[0][0] = std::max(0, m - 1);
    return out;
  }
  TESSEL_CHECK(k == Kind::interleaved, "combined 1F1B is the 1f1b and interleaved orders only");
  const int g = interleaved_group(p);
  require_combinable(p, "interleaved");
  const auto table = interleaved_table(m, v, g);
  const int total = m * v;
  for (int r = 0; r < pp; ++r) {
    const int warm = interleaved_warmup(p, g, r);
    auto& c = out[static_cast<std::size_t>(r)];
    for (int j = 0; j < total - warm; ++j)
      ++c[static_cast<std::size_t>(table[static_cast<std::size_t>(warm + j)].second * v +
                                   (v - 1 - table[static_cast<std::size_t>(j)].second))];
  }
  return out;
}

// PyTorch ScheduleLoopedBFS: every mb through each local stage ascending, then backwards for each local
// stage descending with mb m-1 .. 0.
Schedule looped_bfs(const GenParams& p) {
  const int m = p.microbatches;
  Schedule s = empty_schedule("looped-bfs", p.pp, p.vpp, m, Placement::Loop);
  for (int r = 0; r < p.pp; ++r) {
    RankBuilder b{&s.ranks[static_cast<std::size_t>(r)]};
    const auto local = s.stages_of(r);
    for (int st : local)
      for (int i = 0; i < m; ++i) b.add(ActionType::F, st, i);
    for (auto it = local.rbegin(); it != local.rend(); ++it)
      for (int i = m - 1; i >= 0; --i) b.add(ActionType::B, *it, i);
  }
  return s;
}

// PyTorch ScheduleInterleavedZeroBubble (_get_1f1b_rank_ops with multiply factor 1):
// rounds = max(1, m // p), g = m / rounds (m % rounds == 0 required); warmup = min(v m, (v-1) g + p-1-r);
// forward stage of step t: ((t // g) % v) p + r; backward stage of step t: (v-1-((t-warmup) // g) % v) p + r;
// after the k-th I (k >= r) a W for the oldest pending I; remaining Ws at the end.
Schedule zb1p(const GenParams& p) {
  const int m = p.microbatches, v = p.vpp, pp = p.pp;
  const int rounds = std::max(1, m / pp);
  if (m % rounds != 0)
    throw InputError("zb1p: microbatches " + std::to_string(m) + " must be divisible by the number of rounds max(1, m // pp) = " +
                     std::to_string(rounds) + " (PyTorch ScheduleInterleavedZeroBubble rule)");
  const int g = m / rounds, total = m * v;
  Schedule s = empty_schedule("zb1p", pp, v, m, Placement::Loop);
  for (int r = 0; r < pp; ++r) {
    RankBuilder b{&s.ranks[static_cast<std::size_t>(r)]};
    const int warm = std::min(total, (v - 1) * g + (pp - 1 - r));
    std::vector<int> fcount(static_cast<std::size_t>(s.num_stages), 0), icount = fcount;
    std::deque<std::pair<int, int>> pending_w;  // (stage, mb) FIFO
    auto fwd = [&](int t) {
      const int st = ((t / g) % v) * pp + r;
      b.add(ActionType::F, st, fcount[static_cast<std::size_t>(st)]++);
    };
    int k = 0;  // index of the I being issued
    auto bwd = [&](int t) {
      const int st = (v - 1 - ((t - warm) / g) % v) * pp + r;
      const int mb = icount[static_cast<std::size_t>(st)]++;
      b.add(ActionType::I, st, mb);
      pending_w.emplace_back(st, mb);
      if (k++ >= r) {
        b.add(ActionType::W, pending_w.front().first, pending_w.front().second);
        pending_w.pop_front();
      }
    };
    for (int t = 0; t < warm; ++t) fwd(t);
    for (int t = warm; t < total; ++t) {
      fwd(t);
      bwd(t);
    }
    for (int t = total; t < total + warm; ++t) bwd(t);
    for (const auto& [st, mb] : pending_w) b.add(ActionType::W, st, mb);
  }
  return s;
}

}  // namespace tessel::sched::gen
