#include "runtime/moe_layer.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/gemm.hpp"
#include "util/error.hpp"

namespace tessel::rt {

namespace kc = kernels::cpu;

std::vector<const Buf*> MoeActs::bufs() const {
  std::vector<const Buf*> v{&yl, &probs, &topi, &topw, &counts, &slot_out, &sh1, &sg1, &sact};
  for (const auto* group : {&xin, &h1, &g1, &act})
    for (const Buf& b : *group) v.push_back(&b);
  return v;
}

namespace {

constexpr int kTag = 17;  // the ep communicator carries nothing else

std::size_t idx(int r, int c, int cols) { return static_cast<std::size_t>(r) * cols + c; }

// y[R, out] = x[R, in] W[in, out]
void mm(const float* x, int R, int in, int out, const float* w, float* y, bool accumulate = false) {
  if (R > 0) kc::gemm(false, false, R, out, in, 1.0f, x, in, w, out, accumulate ? 1.0f : 0.0f, y, out);
}
// dx[R, in] (+)= dy[R, out] W^T
void mm_t(const float* dy, int R, int in, int out, const float* w, float* dx, bool accumulate) {
  if (R > 0) kc::gemm(false, true, R, in, out, 1.0f, dy, out, w, out, accumulate ? 1.0f : 0.0f, dx, in);
}

// Rows of `width` floats to every ep peer and back: `send` holds the rows for peer 0, then peer 1, ...
// (send_rows[p] each); the result holds the rows from peer 0, then peer 1, ... (recv_rows[p] each). Buffered
// sends first, then the receives in peer order: no pair can wait on the other.
std::vector<float> exchange(const ExpertParallel& ep, const std::vector<float>& send, const std::vector<int>& send_rows,
                            const std::vector<int>& recv_rows, int width) {
  const auto rows_before = [](const std::vector<int>& rows, int p) {
    return static_cast<std::size_t>(std::accumulate(rows.begin(), rows.begin() + p, 0));
  };
  const std::size_t w = static_cast<std::size_t>(width);
  std::vector<float> out(rows_before(recv_rows, ep.size) * w);
  for (int p = 0; p < ep.size; ++p) {
    const std::size_t at = rows_before(send_rows, p) * w, n = static_cast<std::size_t>(send_rows[p]) * w;
    if (p == ep.rank) {
      TESSEL_CHECK(send_rows[p] == recv_rows[p], "ep exchange: " << send_rows[p] << " rows to self, " << recv_rows[p] << " expected");
      std::copy(send.begin() + static_cast<long>(at), send.begin() + static_cast<long>(at + n),
                out.begin() + static_cast<long>(rows_before(recv_rows, p) * w));
    } else if (n > 0) {
      ep.comm->send(send.data() + at, n, p, kTag);
    }
  }
  for (int p = 0; p < ep.size; ++p) {
    const std::size_t n = static_cast<std::size_t>(recv_rows[p]) * w;
    if (p != ep.rank && n > 0) ep.comm->recv(out.data() + rows_before(recv_rows, p) * w, n, p, kTag);
  }
  return out;
}

// The all-to-all of the rows with its trace event (ep_alltoall on the tp stream, inside the layer's scope).
std::vector<float> all_to_all(const ExpertParallel& ep, const std::vector<float>& send, const std::vector<int>& send_rows,
                              const std::vector<int>& recv_rows, int width) {
  if (ep.size == 1) return send;
  const double t0 = ep.rec ? ep.rec->now_us() : 0.0;
  std::vector<float> out = exchange(ep, send, send_rows, recv_rows, width);
  if (ep.rec) ep.rec->record_comm(trace::Stream::tp, "ep_alltoall", t0, ep.rec->now_us(), double(send.size()) * sizeof(float));
  return out;
}

// Expert tensor parallelism: this rank's R rows of one expert into a block of etp x rmax rows, each etp rank's
// rows followed by zero rows up to rmax (an all-gather of equal parts); zero rows stay zero through the MLP
// and add nothing to its weight gradients.
Buf etp_gather(const ExpertParallel& ep, const float* rows, int R, int rmax, int h) {
  const std::size_t part = static_cast<std::size_t>(rmax) * h;
  std::vector<float> send(part, 0.0f);
  std::copy(rows, rows + static_cast<std::size_t>(R) * h, send.begin());
  Buf out = make_buf(part * static_cast<std::size_t>(ep.etp_size));
  const double t0 = ep.rec ? ep.rec->now_us() : 0.0;
  if (part > 0) ep.etp_comm->all_gather(send.data(), out->data(), part);
  if (ep.rec) ep.rec->record_comm(trace::Stream::tp, "tp_allgather", t0, ep.rec->now_us(), double(out->size()) * sizeof(float));
  return out;
}
// The block's partial sums (this rank's slice of the FFN) summed over the etp ranks, each keeping its own R rows.
std::vector<float> etp_reduce_scatter(const ExpertParallel& ep, const float* block, int R, int rmax, int h) {
  const std::size_t part = static_cast<std::size_t>(rmax) * h;
  std::vector<float> mine(part);
  const double t0 = ep.rec ? ep.rec->now_us() : 0.0;
  if (part > 0) ep.etp_comm->reduce_scatter(block, mine.data(), part);
  if (ep.rec)
    ep.rec->record_comm(trace::Stream::tp, "tp_reducescatter", t0, ep.rec->now_us(), double(part * ep.etp_size) * sizeof(float));
  mine.resize(static_cast<std::size_t>(R) * h);
  return mine;
}

// Received rows (peer-major: peer p's rows for local expert 0, 1, ...) -> one buffer per local expert
// (peer order inside), and back.
std::vector<Buf> to_experts(const std::vector<float>& rows, const std::vector<int>& got, int peers, int El, int width) {
  std::vector<Buf> out(static_cast<std::size_t>(El));
  for (int j = 0; j < El; ++j) {
    int n = 0;
    for (int p = 0; p < peers; ++p) n += got[static_cast<std::size_t>(p) * El + j];
    out[j] = make_buf(static_cast<std::size_t>(n) * width);
  }
  std::vector<std::size_t> fill(static_cast<std::size_t>(El), 0);
  std::size_t at = 0;
  for (int p = 0; p < peers; ++p)
    for (int j = 0; j < El; ++j) {
      const std::size_t n = static_cast<std::size_t>(got[static_cast<std::size_t>(p) * El + j]) * width;
      std::copy(rows.begin() + static_cast<long>(at), rows.begin() + static_cast<long>(at + n), out[j]->begin() + static_cast<long>(fill[j]));
      fill[j] += n;
      at += n;
    }
  return out;
}
std::vector<float> from_experts(const std::vector<std::vector<float>>& per_expert, const std::vector<int>& got, int peers,
                                int El, int width) {
  std::size_t total = 0;
  for (const auto& e : per_expert) total += e.size();
  std::vector<float> rows(total);
  std::vector<std::size_t> taken(static_cast<std::size_t>(El), 0);
  std::size_t at = 0;
  for (int p = 0; p < peers; ++p)
    for (int j = 0; j < El; ++j) {
      const std::size_t n = static_cast<std::size_t>(got[static_cast<std::size_t>(p) * El + j]) * width;
      std::copy(per_expert[j].begin() + static_cast<long>(taken[j]), per_expert[j].begin() + static_cast<long>(taken[j] + n),
                rows.begin() + static_cast<long>(at));
      taken[j] += n;
      at += n;
    }
  return rows;
}

}  // namespace

void moe_route(const LayerShape& s, const float* selection_bias, int Tl, float* p, float* topi, float* topw, float* counts) {
  const int E = s.experts, k = s.top_k;
  // Scores: a softmax over the E experts (max-subtracted), or each expert's sigmoid (DeepSeek-V3 Sec. 2.1.2,
  // Megatron-Core's --moe-router-score-function sigmoid).
  for (int t = 0; t < Tl; ++t) {
    float* r = p + idx(t, 0, E);
    if (s.sigmoid) {
      for (int e = 0; e < E; ++e) r[e] = 1.0f / (1.0f + std::exp(-r[e]));
      continue;
    }
    const float mx = *std::max_element(r, r + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += (r[e] = std::exp(r[e] - mx));
    for (int e = 0; e < E; ++e) r[e] = static_cast<float>(r[e] / sum);
  }
  // Top-k by score (ties: the lower expert). Group-limited routing (DeepSeek-V2 Sec. 2.1.3, V3 Sec. 2.1.2)
  // first keeps each token's group_top_k best groups, a group scored as Megatron-Core does: the sum of its
  // top_k / group_top_k best scores (V3: the best 2 of each group of 32); experts outside them are not chosen.
  // A selection bias (auxiliary-loss-free balancing) is added to the scores for both choices, not to the
  // chosen experts' weights.
  std::fill(counts, counts + E, 0.0f);
  const int G = s.groups, per_group = E / G, best_of_group = std::max(1, k / s.group_top_k);
  TESSEL_CHECK(G >= 1 && E % G == 0 && s.group_top_k >= 1 && s.group_top_k <= G, "router groups " << G << " / " << s.group_top_k);
  std::vector<int> ids(static_cast<std::size_t>(E)), gids(static_cast<std::size_t>(G));
  std::vector<float> gscore(static_cast<std::size_t>(G)), member(static_cast<std::size_t>(per_group));
  std::vector<char> allowed(static_cast<std::size_t>(E), 1);
  std::vector<float> biased(selection_bias ? static_cast<std::size_t>(E) : 0);
  for (int t = 0; t < Tl; ++t) {
    const float* r = p + idx(t, 0, E);  // the scores, which weight the chosen experts
    const float* c = r;                 // the keys that choose them
    if (selection_bias) {
      for (int e = 0; e < E; ++e) biased[e] = r[e] + selection_bias[e];
      c = biased.data();
    }
    if (G > 1) {
      for (int g = 0; g < G; ++g) {
        std::copy(c + g * per_group, c + (g + 1) * per_group, member.begin());
        std::partial_sort(member.begin(), member.begin() + best_of_group, member.end(), std::greater<>());
        gscore[g] = std::accumulate(member.begin(), member.begin() + best_of_group, 0.0f);
      }
      std::iota(gids.begin(), gids.end(), 0);
      std::partial_sort(gids.begin(), gids.begin() + s.group_top_k, gids.end(),
                        [&](int x, int z) { return gscore[x] > gscore[z] || (gscore[x] == gscore[z] && x < z); });
      std::fill(allowed.begin(), allowed.end(), 0);
      for (int j = 0; j < s.group_top_k; ++j) std::fill_n(allowed.begin() + gids[j] * per_group, per_group, 1);
    }
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int x, int z) {
      if (allowed[x] != allowed[z]) return allowed[x] > allowed[z];
      return c[x] > c[z] || (c[x] == c[z] && x < z);
    });
    float chosen = 0;
    for (int j = 0; j < k; ++j) chosen += r[ids[j]];
    for (int j = 0; j < k; ++j) {
      topi[idx(t, j, k)] = static_cast<float>(ids[j]);
      topw[idx(t, j, k)] = s.route_scale * (s.normalize_top_k ? r[ids[j]] / chosen : r[ids[j]]);
      counts[ids[j]] += 1.0f;
    }
  }
}

double moe_aux_loss(const LayerShape& s, const float* p, const float* counts, int Tl) {
  const int E = s.experts;
  double aux = 0;
  for (int e = 0; e < E; ++e) {
    double col = 0;
    for (int t = 0; t < Tl; ++t) col += p[idx(t, e, E)];
    aux += counts[e] * col;
  }
  return aux * double(s.aux_coef) * E / (double(s.top_k) * s.tokens * s.tokens);
}

void moe_dispatch_plan(const float* topi, int S, int experts, int ep, std::vector<int>& order, std::vector<int>& sent) {
  const int El = experts / ep;
  const auto expert_of = [&](int slot) { return static_cast<int>(topi[slot]); };
  order.resize(static_cast<std::size_t>(S));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int z) { return expert_of(x) < expert_of(z); });
  sent.assign(static_cast<std::size_t>(ep) * El, 0);
  for (int i = 0; i < S; ++i) {
    const int e = expert_of(order[i]);
    ++sent[static_cast<std::size_t>(expert_owner(e, experts, ep)) * El + e % El];
  }
}

void moe_router_grad(const LayerShape& s, const float* p, const float* topi, const float* counts, const float* dw, int Tl,
                     float* dz) {
  const int E = s.experts, k = s.top_k, T = s.tokens;
  const double aux_scale = double(s.loss_scale) * s.aux_coef * E / (double(k) * T * T);
  std::vector<double> dp(static_cast<std::size_t>(E));
  for (int t = 0; t < Tl; ++t) {
    const float* r = p + idx(t, 0, E);
    for (int e = 0; e < E; ++e) dp[e] = aux_scale * counts[e];
    double chosen = 0, dot = 0;
    for (int j = 0; j < k; ++j) chosen += r[static_cast<int>(topi[idx(t, j, k)])];
    for (int j = 0; j < k; ++j) dot += double(dw[idx(t, j, k)]) * r[static_cast<int>(topi[idx(t, j, k)])];
    for (int j = 0; j < k; ++j) {
      const int e = static_cast<int>(topi[idx(t, j, k)]);
      const double g = dw[idx(t, j, k)];
      dp[e] += s.normalize_top_k ? s.route_scale * (g - dot / chosen) / chosen : s.route_scale * g;
    }
    if (s.sigmoid) {
      for (int e = 0; e < E; ++e) dz[idx(t, e, E)] = static_cast<float>(double(r[e]) * (1.0 - r[e]) * dp[e]);
      continue;
    }
    double pd = 0;
    for (int e = 0; e < E; ++e) pd += r[e] * dp[e];
    for (int e = 0; e < E; ++e) dz[idx(t, e, E)] = static_cast<float>(r[e] * (dp[e] - pd));
  }
}

std::vector<int> moe_rows_per_peer(const std::vector<int>& table, int peers, int El) {
  std::vector<int> r(static_cast<std::size_t>(peers), 0);
  for (int p = 0; p < peers; ++p)
    for (int j = 0; j < El; ++j) r[p] += table[static_cast<std::size_t>(p) * El + j];
  return r;
}

float moe_forward(const LayerShape& s, const MoeWeights& w, const TensorParallel& tp, const ExpertParallel& ep,
                  const Buf& y_local, const Buf& y_full, float* out, MoeActs& a) {
  const int T = s.tokens, Tl = s.local_tokens, h = s.hidden, E = s.experts, k = s.top_k, fe = s.expert_ffn;
  const int El = E / ep.size, S = Tl * k;
  const bool swiglu = s.swiglu;
  TESSEL_CHECK(y_local->size() == static_cast<std::size_t>(Tl) * h, "MoE input has " << y_local->size() << " values");
  TESSEL_CHECK(!w.sw1.w || (y_full && y_full->size() == static_cast<std::size_t>(T) * h), "shared expert without all tokens");
  const float* y = y_local->data();
  a.yl = y_local;

  // Router: logits, then scores: a softmax over the E experts (max-subtracted), or each expert's sigmoid
  // (DeepSeek-V3 Sec. 2.1.2, Megatron-Core's --moe-router-score-function sigmoid).
  TESSEL_CHECK(!s.sigmoid || s.aux_coef == 0.0f, "the load-balancing loss is defined here for a softmax router only");
  a.probs = make_buf(static_cast<std::size_t>(Tl) * E);
  float* p = a.probs->data();
  mm(y, Tl, h, E, w.router.w, p);
  a.topi = make_buf(static_cast<std::size_t>(S));
  a.topw = make_buf(static_cast<std::size_t>(S));
  a.counts = make_buf(static_cast<std::size_t>(E));
  moe_route(s, w.bias.w, Tl, p, a.topi->data(), a.topw->data(), a.counts->data());
  // The micro-batch's counts over the SP shards: E values, not drawn by the simulator, so not in the trace.
  if (tp.size > 1) tp.comm->all_reduce(a.counts->data(), a.counts->size());
  const double aux = moe_aux_loss(s, p, a.counts->data(), Tl);

  // Dispatch: slots sorted by expert (then slot), rows to each expert's owner.
  moe_dispatch_plan(a.topi->data(), S, E, ep.size, a.order, a.sent);
  std::vector<float> rows(static_cast<std::size_t>(S) * h);
  for (int i = 0; i < S; ++i) {
    const int slot = a.order[i];
    std::copy(y + idx(slot / k, 0, h), y + idx(slot / k + 1, 0, h), rows.begin() + static_cast<long>(idx(i, 0, h)));
  }
  // The per-expert counts first (small), then the rows: one dispatch in the trace, as the simulator draws it.
  std::vector<int> ones(static_cast<std::size_t>(ep.size), 1);
  std::vector<float> sent_f(a.sent.begin(), a.sent.end());
  const double t0 = ep.rec ? ep.rec->now_us() : 0.0;
  const std::vector<float> got_f = ep.size == 1 ? sent_f : exchange(ep, sent_f, ones, ones, El);
  a.got.assign(got_f.begin(), got_f.end());
  const std::vector<int> send_rows = moe_rows_per_peer(a.sent, ep.size, El), recv_rows = moe_rows_per_peer(a.got, ep.size, El);
  a.xin = to_experts(ep.size == 1 ? rows : exchange(ep, rows, send_rows, recv_rows, h), a.got, ep.size, El, h);
  if (ep.rec && ep.size > 1)
    ep.rec->record_comm(trace::Stream::tp, "ep_alltoall", t0, ep.rec->now_us(), double(rows.size()) * sizeof(float));

  // Experts: each on its rows, or (etp > 1) on the etp ranks' rows gathered, with this rank's slice of its FFN.
  const int et = ep.etp_size, fl = fe / et;
  TESSEL_CHECK(fe % et == 0, "etp " << et << " does not divide the expert FFN " << fe);
  a.h1.assign(El, nullptr);
  a.g1.assign(El, nullptr);
  a.act.assign(El, nullptr);
  a.rows.assign(static_cast<std::size_t>(El), 0);
  for (int j = 0; j < El; ++j) a.rows[j] = static_cast<int>(a.xin[j]->size() / h);
  a.rmax = a.rows;
  if (et > 1) {
    const std::vector<float> mine(a.rows.begin(), a.rows.end());
    std::vector<float> all(mine.size() * static_cast<std::size_t>(et));
    ep.etp_comm->all_gather(mine.data(), all.data(), mine.size());
    for (int r = 0; r < et; ++r)
      for (int j = 0; j < El; ++j) a.rmax[j] = std::max(a.rmax[j], static_cast<int>(all[static_cast<std::size_t>(r) * El + j]));
  }
  std::vector<std::vector<float>> eout(static_cast<std::size_t>(El));
  for (int j = 0; j < El; ++j) {
    const int R = a.rows[j], Ra = et > 1 ? et * a.rmax[j] : R;  // Ra: the rows this rank's slice runs on
    if (et > 1) a.xin[j] = etp_gather(ep, a.xin[j]->data(), R, a.rmax[j], h);
    const std::size_t n = static_cast<std::size_t>(Ra) * fl;
    const ExpertWeights& x = w.local[j];
    a.h1[j] = make_buf(n);
    a.act[j] = make_buf(n);
    mm(a.xin[j]->data(), Ra, h, fl, x.w1.w, a.h1[j]->data());
    if (swiglu) {
      a.g1[j] = make_buf(n);
      mm(a.xin[j]->data(), Ra, h, fl, x.wg.w, a.g1[j]->data());
      kc::swiglu_fwd(a.g1[j]->data(), a.h1[j]->data(), a.act[j]->data(), n);
    } else {
      kc::gelu_fwd(a.h1[j]->data(), a.act[j]->data(), n);
    }
    eout[j].resize(static_cast<std::size_t>(Ra) * h);
    mm(a.act[j]->data(), Ra, fl, h, x.w2.w, eout[j].data());
    if (et > 1) eout[j] = etp_reduce_scatter(ep, eout[j].data(), R, a.rmax[j], h);
  }

  // Combine: back to the senders, in their dispatch order; weighted sum per token.
  const std::vector<float> back = all_to_all(ep, from_experts(eout, a.got, ep.size, El, h), recv_rows, send_rows, h);
  a.slot_out = make_buf(static_cast<std::size_t>(S) * h);
  for (int i = 0; i < S; ++i)
    std::copy(back.begin() + static_cast<long>(idx(i, 0, h)), back.begin() + static_cast<long>(idx(i + 1, 0, h)),
              a.slot_out->begin() + static_cast<long>(idx(a.order[i], 0, h)));
  std::fill(out, out + static_cast<std::size_t>(Tl) * h, 0.0f);
  for (int t = 0; t < Tl; ++t)
    for (int j = 0; j < k; ++j) {
      const float wt = (*a.topw)[idx(t, j, k)];
      const float* o = a.slot_out->data() + idx(t * k + j, 0, h);
      for (int c = 0; c < h; ++c) out[idx(t, c, h)] += wt * o[c];
    }

  // Shared expert over all tokens (tp-sharded columns), reduced back to this rank's tokens.
  if (w.sw1.w) {
    const int fs = s.shared_ffn;
    const std::size_t n = static_cast<std::size_t>(T) * fs;
    a.sh1 = make_buf(n);
    a.sact = make_buf(n);
    mm(y_full->data(), T, h, fs, w.sw1.w, a.sh1->data());
    if (swiglu) {
      a.sg1 = make_buf(n);
      mm(y_full->data(), T, h, fs, w.swg.w, a.sg1->data());
      kc::swiglu_fwd(a.sg1->data(), a.sh1->data(), a.sact->data(), n);
    } else {
      kc::gelu_fwd(a.sh1->data(), a.sact->data(), n);
    }
    std::vector<float> partial(static_cast<std::size_t>(T) * h), mine(static_cast<std::size_t>(Tl) * h);
    mm(a.sact->data(), T, fs, h, w.sw2.w, partial.data());
    reduce_tokens(s, tp, partial, mine.data());
    for (std::size_t i = 0; i < mine.size(); ++i) out[i] += mine[i];
  }
  return static_cast<float>(aux);
}

void moe_backward(const LayerShape& s, const MoeWeights& w, const TensorParallel& tp, const ExpertParallel& ep,
                  const MoeActs& a, const Buf& y_full, const float* dout, float* dy, std::vector<WeightGradJob>& jobs) {
  const int T = s.tokens, Tl = s.local_tokens, h = s.hidden, E = s.experts, k = s.top_k, fe = s.expert_ffn;
  const int El = E / ep.size, S = Tl * k;
  const bool swiglu = s.swiglu;
  const std::size_t nl = static_cast<std::size_t>(Tl) * h;
  std::fill(dy, dy + nl, 0.0f);

  // Shared expert: as the dense MLP's backward.
  if (w.sw1.w) {
    const int fs = s.shared_ffn;
    const std::size_t n = static_cast<std::size_t>(T) * fs;
    Buf dfull = make_buf(static_cast<std::size_t>(T) * h);
    gather_tokens(s, tp, dout, dfull->data());
    std::vector<float> dact(n);
    mm_t(dfull->data(), T, fs, h, w.sw2.w, dact.data(), false);
    jobs.push_back({a.sact, dfull, T, fs, h, w.sw2.g, nullptr, false});
    Buf dh = make_buf(n);
    std::vector<float> dyf(static_cast<std::size_t>(T) * h);
    if (swiglu) {
      Buf dg = make_buf(n);
      kc::swiglu_bwd(dact.data(), a.sg1->data(), a.sh1->data(), dg->data(), dh->data(), n);
      mm_t(dg->data(), T, h, fs, w.swg.w, dyf.data(), false);
      mm_t(dh->data(), T, h, fs, w.sw1.w, dyf.data(), true);
      jobs.push_back({y_full, dg, T, h, fs, w.swg.g, nullptr, false});
    } else {
      kc::gelu_bwd(dact.data(), a.sh1->data(), dh->data(), n);
      mm_t(dh->data(), T, h, fs, w.sw1.w, dyf.data(), false);
    }
    jobs.push_back({y_full, dh, T, h, fs, w.sw1.g, nullptr, false});
    reduce_tokens(s, tp, dyf, dy);
  }

  // Routed experts: each slot's output gradient (its weight times dout) to the expert's owner.
  std::vector<float> dw(static_cast<std::size_t>(S)), rows(static_cast<std::size_t>(S) * h);
  for (int slot = 0; slot < S; ++slot) {
    const float* g = dout + idx(slot / k, 0, h);
    const float* o = a.slot_out->data() + idx(slot, 0, h);
    double d = 0;
    for (int c = 0; c < h; ++c) d += double(g[c]) * o[c];
    dw[slot] = static_cast<float>(d);
  }
  for (int i = 0; i < S; ++i) {
    const int slot = a.order[i];
    const float wt = (*a.topw)[slot];
    const float* g = dout + idx(slot / k, 0, h);
    for (int c = 0; c < h; ++c) rows[idx(i, c, h)] = wt * g[c];
  }
  const std::vector<int> send_rows = moe_rows_per_peer(a.sent, ep.size, El), recv_rows = moe_rows_per_peer(a.got, ep.size, El);
  const std::vector<Buf> dexp = to_experts(all_to_all(ep, rows, send_rows, recv_rows, h), a.got, ep.size, El, h);
  // Each expert's backward on the rows its forward ran on: under etp > 1 the output gradients gathered from
  // the etp ranks as the inputs were, the input gradients (partial sums over this rank's FFN slice)
  // reduce-scattered back.
  const int et = ep.etp_size, fl = fe / et;
  std::vector<std::vector<float>> dxin(static_cast<std::size_t>(El));
  for (int j = 0; j < El; ++j) {
    const int R = a.rows[j], Ra = et > 1 ? et * a.rmax[j] : R;
    const std::size_t n = static_cast<std::size_t>(Ra) * fl;
    const ExpertWeights& x = w.local[j];
    const Buf dout_j = et > 1 ? etp_gather(ep, dexp[j]->data(), R, a.rmax[j], h) : dexp[j];
    std::vector<float> dact(n);
    mm_t(dout_j->data(), Ra, fl, h, x.w2.w, dact.data(), false);
    dxin[j].assign(static_cast<std::size_t>(Ra) * h, 0.0f);
    if (Ra > 0) jobs.push_back({a.act[j], dout_j, Ra, fl, h, x.w2.g, nullptr, false});
    Buf dh = make_buf(n);
    if (swiglu) {
      Buf dg = make_buf(n);
      kc::swiglu_bwd(dact.data(), a.g1[j]->data(), a.h1[j]->data(), dg->data(), dh->data(), n);
      mm_t(dg->data(), Ra, h, fl, x.wg.w, dxin[j].data(), false);
      mm_t(dh->data(), Ra, h, fl, x.w1.w, dxin[j].data(), true);
      if (Ra > 0) jobs.push_back({a.xin[j], dg, Ra, h, fl, x.wg.g, nullptr, false});
    } else {
      kc::gelu_bwd(dact.data(), a.h1[j]->data(), dh->data(), n);
      mm_t(dh->data(), Ra, h, fl, x.w1.w, dxin[j].data(), false);
    }
    if (Ra > 0) jobs.push_back({a.xin[j], dh, Ra, h, fl, x.w1.g, nullptr, false});
    if (et > 1) dxin[j] = etp_reduce_scatter(ep, dxin[j].data(), R, a.rmax[j], h);
  }
  const std::vector<float> back = all_to_all(ep, from_experts(dxin, a.got, ep.size, El, h), recv_rows, send_rows, h);
  for (int i = 0; i < S; ++i) {
    const int t = a.order[i] / k;
    for (int c = 0; c < h; ++c) dy[idx(t, c, h)] += back[idx(i, c, h)];
  }

  // Router: the chosen weights' gradients through the renormalisation, the load-balancing loss's, then the
  // softmax or the sigmoid; the router's input gradient and its weight gradient (a queued job). The choice
  // itself (top-k, groups) is piecewise constant: no gradient.
  Buf dz = make_buf(static_cast<std::size_t>(Tl) * E);
  moe_router_grad(s, a.probs->data(), a.topi->data(), a.counts->data(), dw.data(), Tl, dz->data());
  mm_t(dz->data(), Tl, h, E, w.router.w, dy, true);
  jobs.push_back({a.yl, dz, Tl, h, E, w.router.g, nullptr, false});
  // The micro-batch's load, counted here because the backward runs once per micro-batch whatever is recomputed.
  if (w.load)
    for (int e = 0; e < E; ++e) (*w.load)[e] += (*a.counts)[e];
}

void update_selection_bias(const MoeWeights& w, Comm* dp, float rate) {
  if (!w.bias.w) return;
  std::vector<float>& load = *w.load;
  if (dp) dp->all_reduce(load.data(), load.size());
  move_selection_bias(w.bias.w, load, rate);
  std::fill(load.begin(), load.end(), 0.0f);
}

void move_selection_bias(float* bias, const std::vector<float>& load, float rate) {
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / static_cast<double>(load.size());
  for (std::size_t e = 0; e < load.size(); ++e) {
    const double offset = mean - load[e];
    bias[e] += offset > 0 ? rate : offset < 0 ? -rate : 0.0f;
  }
}

}  // namespace tessel::rt
