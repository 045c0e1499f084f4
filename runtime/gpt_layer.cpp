#include "runtime/gpt_layer.hpp"

#include <algorithm>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/rope.hpp"
#include "runtime/moe_layer.hpp"
#include "util/error.hpp"

namespace tessel::rt {

namespace kc = kernels::cpu;

Buf make_buf(std::size_t n) { return std::make_shared<std::vector<float>>(n, 0.0f); }
std::int64_t buf_bytes(const Buf& b) { return b ? static_cast<std::int64_t>(b->size() * sizeof(float)) : 0; }

void check_position_embedding(const Model& m) {
  // Rotate-half pairs element j with j + head_dim/2 (kernels/cpu/rope.hpp): an odd head has no partner.
  if (m.position == PositionEmbedding::rotary && m.head_dim % 2 != 0)
    throw InputError("model " + m.name + ": head_dim " + std::to_string(m.head_dim) +
                     " must be even for rotary position embeddings");
  if (m.position == PositionEmbedding::rotary && !(m.rope_theta > 0))
    throw InputError("model " + m.name + ": rope_theta " + std::to_string(m.rope_theta) + " must be positive");
}

std::vector<const Buf*> LayerActs::bufs() const {
  std::vector<const Buf*> out{&x, &mu1, &rs1, &y1, &q, &k, &v, &probs, &attn, &x2, &mu2, &rs2, &y2, &h1, &g1, &act};
  if (moe)
    for (const Buf* b : moe->bufs()) out.push_back(b);
  return out;
}

std::int64_t LayerActs::bytes() const {
  std::int64_t s = 0;
  for (const Buf* b : bufs()) s += buf_bytes(*b);
  return s;
}

void run_weight_grad(const WeightGradJob& j) {
  if (j.transposed)
    kc::gemm(true, false, j.out, j.in, j.rows, 1.0f, j.dy->data(), j.out, j.x->data(), j.in, 1.0f, j.dw, j.in);
  else
    kc::gemm(true, false, j.in, j.out, j.rows, 1.0f, j.x->data(), j.in, j.dy->data(), j.out, 1.0f, j.dw, j.out);
  if (j.db)
    for (int r = 0; r < j.rows; ++r)
      for (int c = 0; c < j.out; ++c) j.db[c] += (*j.dy)[static_cast<std::size_t>(r) * j.out + c];
}

namespace {

Weight weight_of(ParamStore& s, const std::string& name) {
  if (!s.has(name)) return {};
  Param& p = s.at(name);
  return {s.data(p), s.grad(p)};
}

// y[T,out] = x[T,in] W[in,out] + b
void linear(const float* x, int T, int in, int out, const Weight& w, const Weight& b, float* y) {
  kc::gemm(false, false, T, out, in, 1.0f, x, in, w.w, out, 0.0f, y, out);
  if (b.w)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < out; ++c) y[static_cast<std::size_t>(t) * out + c] += b.w[c];
}

// dx[T,in] (+)= dy[T,out] W^T
void linear_dx(const float* dy, int T, int in, int out, const Weight& w, float* dx, bool accumulate) {
  kc::gemm(false, true, T, in, out, 1.0f, dy, out, w.w, out, accumulate ? 1.0f : 0.0f, dx, in);
}

void add_colsum(const float* dy, int rows, int cols, float* db) {
  if (!db) return;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) db[c] += dy[static_cast<std::size_t>(r) * cols + c];
}

kc::AttentionShape attn_shape(const LayerShape& s) { return {s.batch, s.seq, s.heads, s.kv_heads, s.head_dim}; }

}  // namespace

void gather_tokens(const LayerShape& s, const TensorParallel& tp, const float* local, float* full) {
  if (tp.sp) tp.all_gather(local, full, static_cast<std::size_t>(s.local_tokens) * s.hidden);
  else std::copy(local, local + static_cast<std::size_t>(s.tokens) * s.hidden, full);
}

void reduce_tokens(const LayerShape& s, const TensorParallel& tp, std::vector<float>& partial, float* local) {
  if (tp.sp) {
    tp.reduce_scatter(partial.data(), local, static_cast<std::size_t>(s.local_tokens) * s.hidden);
  } else {
    tp.all_reduce(partial.data(), partial.size());
    std::copy(partial.begin(), partial.end(), local);
  }
}

void norm_forward(const LayerShape& s, const Weight& g, const Weight& b, const float* x, float* y, float* mu, float* rs,
                  int rows) {
  if (s.layernorm) kc::layernorm_fwd(x, g.w, b.w, y, mu, rs, rows, s.hidden, s.eps);
  else kc::rmsnorm_fwd(x, g.w, y, rs, rows, s.hidden, s.eps);
}

void norm_backward(const LayerShape& s, const Weight& g, const Weight& b, const float* dy, const float* x,
                   const float* mu, const float* rs, float* dx, int rows) {
  if (s.layernorm) kc::layernorm_bwd(dy, x, g.w, mu, rs, dx, g.g, b.g, rows, s.hidden);
  else kc::rmsnorm_bwd(dy, x, g.w, rs, dx, g.g, rows, s.hidden);
}

LayerWeights layer_weights(ParamStore& st, int layer, ParamStore* experts, int ep, int ep_rank) {
  const std::string p = "layers." + std::to_string(layer) + ".";
  LayerWeights w;
  w.ln1w = weight_of(st, p + "ln1.w");  w.ln1b = weight_of(st, p + "ln1.b");
  w.wq = weight_of(st, p + "attn.wq");  w.wk = weight_of(st, p + "attn.wk");  w.wv = weight_of(st, p + "attn.wv");
  w.bq = weight_of(st, p + "attn.bq");  w.bk = weight_of(st, p + "attn.bk");  w.bv = weight_of(st, p + "attn.bv");
  w.wo = weight_of(st, p + "attn.wo");  w.bo = weight_of(st, p + "attn.bo");
  w.ln2w = weight_of(st, p + "ln2.w");  w.ln2b = weight_of(st, p + "ln2.b");
  w.w1 = weight_of(st, p + "mlp.w1");   w.b1 = weight_of(st, p + "mlp.b1");
  w.wg = weight_of(st, p + "mlp.wg");   w.bg = weight_of(st, p + "mlp.bg");
  w.w2 = weight_of(st, p + "mlp.w2");   w.b2 = weight_of(st, p + "mlp.b2");
  w.moe.router = weight_of(st, p + "moe.router");
  w.is_moe = w.moe.router.w != nullptr;
  TESSEL_CHECK(w.wq.w && w.wo.w && (w.is_moe || (w.w1.w && w.w2.w)) && w.ln1w.w, "layer " << layer << " not on this rank");
  if (!w.is_moe) return w;
  TESSEL_CHECK(experts, "layer " << layer << " is a MoE layer: its experts' store is missing");
  w.moe.bias = weight_of(st, p + "moe.bias");
  if (w.moe.bias.w) w.moe.load = std::make_shared<std::vector<float>>(st.at(p + "moe.bias").size(), 0.0f);
  w.moe.sw1 = weight_of(st, p + "moe.shared.w1");
  w.moe.swg = weight_of(st, p + "moe.shared.wg");
  w.moe.sw2 = weight_of(st, p + "moe.shared.w2");
  const int E = static_cast<int>(st.at(p + "moe.router").spec.cols), El = E / ep;
  w.moe.first = ep_rank * El;
  for (int j = 0; j < El; ++j) {
    const std::string q = p + "moe.expert." + std::to_string(w.moe.first + j) + ".";
    w.moe.local.push_back({weight_of(*experts, q + "w1"), weight_of(*experts, q + "wg"), weight_of(*experts, q + "w2")});
    TESSEL_CHECK(w.moe.local.back().w1.w && w.moe.local.back().w2.w, "expert " << q << " not on this rank");
  }
  return w;
}

LayerShape layer_shape(const Model& m, int micro_batch, const TensorParallel& tp) {
  LayerShape s;
  s.batch = micro_batch;
  s.seq = m.seq_len;
  s.tokens = micro_batch * m.seq_len;
  TESSEL_CHECK(!tp.sp || s.tokens % tp.size == 0, "tokens " << s.tokens << " not divisible by tp " << tp.size);
  s.local_tokens = tp.sp ? s.tokens / tp.size : s.tokens;
  s.hidden = m.hidden;
  s.heads = m.heads / tp.size;
  s.kv_heads = m.kv_heads / tp.size;
  s.head_dim = m.head_dim;
  s.ffn = m.ffn / tp.size;
  s.swiglu = m.activation == Activation::swiglu;
  s.layernorm = m.norm == Norm::layernorm;
  if (m.position == PositionEmbedding::rotary)
    s.rope = std::make_shared<const kc::RopeTable>(kc::rope_table(m.seq_len, m.head_dim, m.rope_theta));
  if (m.moe.enabled()) {
    s.experts = m.moe.experts;
    s.top_k = m.moe.top_k;
    s.expert_ffn = m.moe.expert_ffn;
    TESSEL_CHECK(m.moe.shared_ffn % tp.size == 0, "shared_ffn " << m.moe.shared_ffn << " not divisible by tp " << tp.size);
    s.shared_ffn = m.moe.shared_ffn / tp.size;
    s.sigmoid = m.moe.router.score == RouterScore::sigmoid;
    s.groups = m.moe.router.groups;
    s.group_top_k = m.moe.router.group_top_k;
    s.normalize_top_k = m.moe.router.normalize_top_k;
    s.route_scale = static_cast<float>(m.moe.router.scale);
    s.aux_coef = static_cast<float>(m.moe.router.aux_loss_coef);
  }
  return s;
}

double stage_forward_flops(const LayerShape& s, int layers, bool last, std::int64_t vocab, int tp, int moe_layers) {
  const double T = s.tokens, h = s.hidden, qd = double(s.heads) * s.head_dim, kd = double(s.kv_heads) * s.head_dim;
  const double mats = s.swiglu ? 3 : 2;
  const double attn_gemm = 2 * T * (h * (qd + 2 * kd) + qd * h);
  const double dense_mlp = 2 * T * h * double(s.ffn) * mats;
  // A MoE layer: the router over this rank's tokens, the shared expert's shard over all, and the routed
  // experts at the balanced load (each rank's experts receive as many rows as it dispatches, Tl k).
  const double moe_mlp = 2 * double(s.local_tokens) * h * (s.experts + double(s.top_k) * s.expert_ffn * mats) +
                         2 * T * h * double(s.shared_ffn) * mats;
  const double attn = 4.0 * s.batch * s.heads * double(s.seq) * s.seq * s.head_dim;
  return (attn_gemm + attn) * layers + dense_mlp * (layers - moe_layers) + moe_mlp * moe_layers +
         (last ? 2 * T * h * (double(vocab) / tp) : 0.0);
}

float layer_forward(const LayerShape& s, const LayerWeights& w, const TensorParallel& tp, const ExpertParallel& ep,
                    const float* x, float* out, LayerActs* save, bool keep_probs) {
  const int T = s.tokens, Tl = s.local_tokens, h = s.hidden;
  const int qd = s.heads * s.head_dim, kd = s.kv_heads * s.head_dim, f = s.ffn;
  const std::size_t nl = static_cast<std::size_t>(Tl) * h;
  LayerActs a;
  a.x = std::make_shared<std::vector<float>>(x, x + nl);
  a.mu1 = make_buf(Tl); a.rs1 = make_buf(Tl);
  std::vector<float> yl(nl);
  norm_forward(s, w.ln1w, w.ln1b, x, yl.data(), a.mu1->data(), a.rs1->data(), Tl);
  a.y1 = make_buf(static_cast<std::size_t>(T) * h);
  gather_tokens(s, tp, yl.data(), a.y1->data());
  a.q = make_buf(static_cast<std::size_t>(T) * qd); a.k = make_buf(static_cast<std::size_t>(T) * kd);
  a.v = make_buf(static_cast<std::size_t>(T) * kd);
  linear(a.y1->data(), T, h, qd, w.wq, w.bq, a.q->data());
  linear(a.y1->data(), T, h, kd, w.wk, w.bk, a.k->data());
  linear(a.y1->data(), T, h, kd, w.wv, w.bv, a.v->data());
  // Rotary: every rank holds all T tokens here (the SP all-gather came before the GEMMs), so row t is at
  // position t % seq, and this rank's heads are whole heads (tp splits by head).
  if (s.rope) {
    kc::rope_fwd(*s.rope, a.q->data(), T, s.heads, qd);
    kc::rope_fwd(*s.rope, a.k->data(), T, s.kv_heads, kd);
  }
  a.probs = make_buf(static_cast<std::size_t>(s.batch) * s.heads * s.seq * s.seq);
  a.attn = make_buf(static_cast<std::size_t>(T) * qd);
  kc::attention_fwd(attn_shape(s), a.q->data(), qd, a.k->data(), kd, a.v->data(), kd, a.attn->data(), qd, a.probs->data());
  if (!keep_probs) a.probs.reset();  // selective recomputation (Korthikanti et al. 2022 section 5)

  std::vector<float> partial(static_cast<std::size_t>(T) * h);
  kc::gemm(false, false, T, h, qd, 1.0f, a.attn->data(), qd, w.wo.w, h, 0.0f, partial.data(), h);
  a.x2 = make_buf(nl);
  reduce_tokens(s, tp, partial, a.x2->data());
  for (std::size_t i = 0; i < nl; ++i) (*a.x2)[i] += x[i] + (w.bo.w ? w.bo.w[i % h] : 0.0f);

  a.mu2 = make_buf(Tl); a.rs2 = make_buf(Tl);
  norm_forward(s, w.ln2w, w.ln2b, a.x2->data(), yl.data(), a.mu2->data(), a.rs2->data(), Tl);
  if (w.is_moe) {
    // The router and the routed experts take this rank's tokens; only a shared expert (column-parallel) needs
    // them all, so under SP the all-gather runs for it alone. Without SP the two are one buffer.
    a.moe = std::make_shared<MoeActs>();
    Buf local = std::make_shared<std::vector<float>>(std::move(yl));
    if (!tp.sp) {
      a.y2 = local;
    } else if (w.moe.sw1.w) {
      a.y2 = make_buf(static_cast<std::size_t>(T) * h);
      gather_tokens(s, tp, local->data(), a.y2->data());
    }
    const float aux = moe_forward(s, w.moe, tp, ep, local, a.y2, out, *a.moe);
    for (std::size_t i = 0; i < nl; ++i) out[i] += (*a.x2)[i];
    if (save) *save = std::move(a);
    return aux;
  }
  a.y2 = make_buf(static_cast<std::size_t>(T) * h);
  gather_tokens(s, tp, yl.data(), a.y2->data());
  const std::size_t nf = static_cast<std::size_t>(T) * f;
  a.h1 = make_buf(nf); a.act = make_buf(nf);
  linear(a.y2->data(), T, h, f, w.w1, w.b1, a.h1->data());
  if (s.swiglu) {
    a.g1 = make_buf(nf);
    linear(a.y2->data(), T, h, f, w.wg, w.bg, a.g1->data());
    kc::swiglu_fwd(a.g1->data(), a.h1->data(), a.act->data(), nf);
  } else {
    kc::gelu_fwd(a.h1->data(), a.act->data(), nf);
  }
  kc::gemm(false, false, T, h, f, 1.0f, a.act->data(), f, w.w2.w, h, 0.0f, partial.data(), h);
  reduce_tokens(s, tp, partial, out);
  for (std::size_t i = 0; i < nl; ++i) out[i] += (*a.x2)[i] + (w.b2.w ? w.b2.w[i % h] : 0.0f);
  if (save) *save = std::move(a);
  return 0.0f;
}

void layer_backward(const LayerShape& s, const LayerWeights& w, const TensorParallel& tp, const ExpertParallel& ep,
                    const LayerActs& a, const float* dout, float* dx, std::vector<WeightGradJob>& jobs) {
  const int T = s.tokens, Tl = s.local_tokens, h = s.hidden;
  const int qd = s.heads * s.head_dim, kd = s.kv_heads * s.head_dim, f = s.ffn;
  const std::size_t nl = static_cast<std::size_t>(Tl) * h, nf = static_cast<std::size_t>(T) * f;
  TESSEL_CHECK(a.x && (a.act || a.moe), "layer backward without saved activations");
  std::vector<float> dy2l(nl), dx2(nl);
  if (w.is_moe) {
    moe_backward(s, w.moe, tp, ep, *a.moe, a.y2, dout, dy2l.data(), jobs);
  } else {
    // MLP: row-parallel w2 (its bias sees this rank's tokens: a partial sum under SP), activation, w1/wg.
    add_colsum(dout, Tl, h, w.b2.g);
    Buf dmf = make_buf(static_cast<std::size_t>(T) * h);
    gather_tokens(s, tp, dout, dmf->data());
    std::vector<float> dact(nf);
    linear_dx(dmf->data(), T, f, h, w.w2, dact.data(), false);
    jobs.push_back({a.act, dmf, T, f, h, w.w2.g, nullptr, false});
    Buf dh1 = make_buf(nf);
    std::vector<float> dy2(static_cast<std::size_t>(T) * h);
    if (s.swiglu) {
      Buf dg = make_buf(nf);
      kc::swiglu_bwd(dact.data(), a.g1->data(), a.h1->data(), dg->data(), dh1->data(), nf);
      linear_dx(dg->data(), T, h, f, w.wg, dy2.data(), false);
      linear_dx(dh1->data(), T, h, f, w.w1, dy2.data(), true);
      jobs.push_back({a.y2, dg, T, h, f, w.wg.g, w.bg.g, false});
    } else {
      kc::gelu_bwd(dact.data(), a.h1->data(), dh1->data(), nf);
      linear_dx(dh1->data(), T, h, f, w.w1, dy2.data(), false);
    }
    jobs.push_back({a.y2, dh1, T, h, f, w.w1.g, w.b1.g, false});
    reduce_tokens(s, tp, dy2, dy2l.data());
  }
  norm_backward(s, w.ln2w, w.ln2b, dy2l.data(), a.x2->data(), a.mu2->data(), a.rs2->data(), dx2.data(), Tl);
  for (std::size_t i = 0; i < nl; ++i) dx2[i] += dout[i];

  // Attention: row-parallel wo, the attention core, column-parallel q/k/v.
  add_colsum(dx2.data(), Tl, h, w.bo.g);
  Buf dpf = make_buf(static_cast<std::size_t>(T) * h);
  gather_tokens(s, tp, dx2.data(), dpf->data());
  std::vector<float> da(static_cast<std::size_t>(T) * qd);
  linear_dx(dpf->data(), T, qd, h, w.wo, da.data(), false);
  jobs.push_back({a.attn, dpf, T, qd, h, w.wo.g, nullptr, false});
  std::vector<float> probs_again;
  const float* probs = a.probs ? a.probs->data() : nullptr;
  if (!probs) {
    probs_again.resize(static_cast<std::size_t>(s.batch) * s.heads * s.seq * s.seq);
    kc::attention_probs(attn_shape(s), a.q->data(), qd, a.k->data(), kd, probs_again.data());
    probs = probs_again.data();
  }
  Buf dq = make_buf(static_cast<std::size_t>(T) * qd), dk = make_buf(static_cast<std::size_t>(T) * kd),
      dv = make_buf(static_cast<std::size_t>(T) * kd);
  kc::attention_bwd(attn_shape(s), a.q->data(), qd, a.k->data(), kd, a.v->data(), kd, probs, da.data(), qd,
                    dq->data(), qd, dk->data(), kd, dv->data(), kd);
  // Back through the rotation: d(pre-rotation q) = R^T dq (R orthogonal), before the q/k GEMM gradients.
  if (s.rope) {
    kc::rope_bwd(*s.rope, dq->data(), T, s.heads, qd);
    kc::rope_bwd(*s.rope, dk->data(), T, s.kv_heads, kd);
  }
  std::vector<float> dy1(static_cast<std::size_t>(T) * h);
  linear_dx(dq->data(), T, h, qd, w.wq, dy1.data(), false);
  linear_dx(dk->data(), T, h, kd, w.wk, dy1.data(), true);
  linear_dx(dv->data(), T, h, kd, w.wv, dy1.data(), true);
  jobs.push_back({a.y1, dq, T, h, qd, w.wq.g, w.bq.g, false});
  jobs.push_back({a.y1, dk, T, h, kd, w.wk.g, w.bk.g, false});
  jobs.push_back({a.y1, dv, T, h, kd, w.wv.g, w.bv.g, false});
  std::vector<float> dy1l(nl);
  reduce_tokens(s, tp, dy1, dy1l.data());
  norm_backward(s, w.ln1w, w.ln1b, dy1l.data(), a.x->data(), a.mu1->data(), a.rs1->data(), dx, Tl);
  for (std::size_t i = 0; i < nl; ++i) dx[i] += dx2[i];
}

}  // namespace tessel::rt
