#include "runtime/gpt_stage.hpp"

#include <algorithm>
#include <set>

#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gemm.hpp"
#include "runtime/moe_layer.hpp"
#include "util/error.hpp"

namespace tessel::rt {

namespace kc = kernels::cpu;

Stage::Stage(const Model& m, const StageConfig& cfg, ParamStore& store, const TensorParallel& tp, Recorder& rec,
             ParamStore* experts, const ExpertParallel& ep)
    : model_(m), cfg_(cfg), store_(store), tp_(tp), ep_(ep), rec_(rec), shape_(layer_shape(m, cfg.micro_batch, tp)) {
  shape_.loss_scale = cfg.loss_scale;
  for (int l = cfg.l0; l < cfg.l1; ++l) layers_.push_back(layer_weights(store, l, experts, ep.size, ep.rank));
  const int n = cfg.l1 - cfg.l0;
  if (cfg.recompute != Recompute::full) {
    for (int i = 0; i < n; ++i) blocks_.push_back({i, i + 1, false});
  } else if (cfg.method == RecomputeMethod::uniform) {
    const int size = cfg.recompute_layers > 0 ? cfg.recompute_layers : 1;  // Megatron's default, 1
    for (int i = 0; i < n; i += size) blocks_.push_back({i, std::min(n, i + size), true});
  } else {
    const int k = cfg.recompute_layers > 0 ? std::min(cfg.recompute_layers, n) : n;
    for (int i = 0; i < n; ++i) blocks_.push_back({i, i + 1, i < k});
  }
}

double Stage::forward_flops() const {
  int moe = 0;
  for (const auto& w : layers_) moe += w.is_moe;
  return stage_forward_flops(shape_, cfg_.l1 - cfg_.l0, cfg_.last, model_.vocab, tp_.size, moe);
}

void Stage::hold(MbState& st, const Buf& b) {
  if (!b || st.counted.count(b.get())) return;
  st.counted[b.get()] = buf_bytes(b);
  rec_.hold(buf_bytes(b));
}

void Stage::hold_acts(MbState& st, const LayerActs& a) {
  for (const Buf* b : a.bufs()) hold(st, *b);
}

void Stage::release_all(MbState& st) {
  for (const auto& [buf, bytes] : st.counted) rec_.release(bytes);
  st.counted.clear();
}

// Vocab-parallel token lookup (partial per shard, summed over tp; reduce-scattered by token under SP),
// plus learned positions for this rank's tokens.
void Stage::embed_forward(MbState& st, float* x) {
  const Param& tok = store_.at("embed.tok");
  const int T = shape_.tokens, h = shape_.hidden;
  std::vector<float> full(static_cast<std::size_t>(T) * h);
  kc::embedding_fwd(store_.data(tok), static_cast<int>(tok.rows), static_cast<int>(tok.row0), h, st.tokens.data(), T,
                    full.data());
  if (tp_.sp) {
    tp_.reduce_scatter(full.data(), x, static_cast<std::size_t>(shape_.local_tokens) * h);
  } else {
    tp_.all_reduce(full.data(), full.size());
    std::copy(full.begin(), full.end(), x);
  }
  if (!store_.has("embed.pos")) return;
  const float* pos = store_.data(store_.at("embed.pos"));
  const int t0 = tp_.sp ? tp_.rank * shape_.local_tokens : 0;
  for (int r = 0; r < shape_.local_tokens; ++r) {
    const float* p = pos + static_cast<std::size_t>((t0 + r) % shape_.seq) * h;
    for (int c = 0; c < h; ++c) x[static_cast<std::size_t>(r) * h + c] += p[c];
  }
}

void Stage::embed_backward(MbState& st, const float* dx) {
  const int T = shape_.tokens, h = shape_.hidden;
  if (store_.has("embed.pos")) {
    float* gp = store_.grad(store_.at("embed.pos"));
    const int t0 = tp_.sp ? tp_.rank * shape_.local_tokens : 0;
    for (int r = 0; r < shape_.local_tokens; ++r) {
      float* g = gp + static_cast<std::size_t>((t0 + r) % shape_.seq) * h;
      for (int c = 0; c < h; ++c) g[c] += dx[static_cast<std::size_t>(r) * h + c];
    }
  }
  const Param& tok = store_.at("embed.tok");
  std::vector<float> full(static_cast<std::size_t>(T) * h);
  if (tp_.sp) tp_.all_gather(dx, full.data(), static_cast<std::size_t>(shape_.local_tokens) * h);
  else std::copy(dx, dx + full.size(), full.begin());
  kc::embedding_bwd(full.data(), static_cast<int>(tok.rows), static_cast<int>(tok.row0), h, st.tokens.data(), T,
                    store_.grad(tok));
}

void Stage::head_forward(MbState& st, const float* x) {
  const int T = shape_.tokens, Tl = shape_.local_tokens, h = shape_.hidden;
  const Param& w = store_.at(model_.tied_embeddings ? "embed.tok" : "head.w");
  const int Vl = static_cast<int>(w.rows);
  Weight g{store_.data(store_.at("final_ln.w")), store_.grad(store_.at("final_ln.w"))};
  Weight b;
  if (store_.has("final_ln.b")) b = {store_.data(store_.at("final_ln.b")), store_.grad(store_.at("final_ln.b"))};
  st.head_x = std::make_shared<std::vector<float>>(x, x + static_cast<std::size_t>(Tl) * h);
  st.head_mu = make_buf(Tl);
  st.head_rs = make_buf(Tl);
  std::vector<float> yl(static_cast<std::size_t>(Tl) * h);
  norm_forward(shape_, g, b, x, yl.data(), st.head_mu->data(), st.head_rs->data(), Tl);
  st.head_y = make_buf(static_cast<std::size_t>(T) * h);
  if (tp_.sp) tp_.all_gather(yl.data(), st.head_y->data(), yl.size());
  else std::copy(yl.begin(), yl.end(), st.head_y->begin());
  st.logits = make_buf(static_cast<std::size_t>(T) * Vl);
  kc::gemm(false, true, T, Vl, h, 1.0f, st.head_y->data(), h, store_.data(w), h, 0.0f, st.logits->data(), Vl);
  st.row_max = make_buf(T);
  st.row_sum = make_buf(T);
  std::vector<float> loss(T);
  const auto hooks = tp_.vocab_hooks();
  kc::cross_entropy_fwd(st.logits->data(), T, Vl, static_cast<int>(w.row0), st.targets.data(), loss.data(),
                        st.row_max->data(), st.row_sum->data(), tp_.size > 1 ? &hooks : nullptr);
  double s = 0;
  for (float l : loss) s += l;
  st.loss = static_cast<float>(s / T);
  for (const Buf* b : {&st.head_x, &st.head_mu, &st.head_rs, &st.head_y, &st.logits, &st.row_max, &st.row_sum})
    hold(st, *b);
}

std::vector<float> Stage::head_backward(MbState& st) {
  const int T = shape_.tokens, Tl = shape_.local_tokens, h = shape_.hidden;
  const Param& w = store_.at(model_.tied_embeddings ? "embed.tok" : "head.w");
  const int Vl = static_cast<int>(w.rows);
  // d(global loss)/d(token loss) = loss_scale / T: the mean over the micro-batch's tokens, scaled.
  std::vector<float> dloss(T, cfg_.loss_scale / static_cast<float>(T));
  Buf dlogits = make_buf(static_cast<std::size_t>(T) * Vl);
  kc::cross_entropy_bwd(st.logits->data(), T, Vl, static_cast<int>(w.row0), st.targets.data(), st.row_max->data(),
                        st.row_sum->data(), dloss.data(), dlogits->data());
  std::vector<float> dy(static_cast<std::size_t>(T) * h), dyl(static_cast<std::size_t>(Tl) * h);
  kc::gemm(false, false, T, h, Vl, 1.0f, dlogits->data(), Vl, store_.data(w), h, 0.0f, dy.data(), h);
  st.jobs.push_back({st.head_y, dlogits, T, h, Vl, store_.grad(w), nullptr, true});
  if (tp_.sp) {
    tp_.reduce_scatter(dy.data(), dyl.data(), dyl.size());
  } else {
    tp_.all_reduce(dy.data(), dy.size());
    dyl = dy;
  }
  Weight g{store_.data(store_.at("final_ln.w")), store_.grad(store_.at("final_ln.w"))};
  Weight b;
  if (store_.has("final_ln.b")) b = {store_.data(store_.at("final_ln.b")), store_.grad(store_.at("final_ln.b"))};
  std::vector<float> dx(dyl.size());
  norm_backward(shape_, g, b, dyl.data(), st.head_x->data(), st.head_mu->data(), st.head_rs->data(), dx.data(), Tl);
  return dx;
}

void Stage::run_blocks_forward(MbState& st, std::vector<float>& x) {
  st.acts.assign(layers_.size(), LayerActs{});
  st.block_inputs.assign(blocks_.size(), nullptr);
  std::vector<float> out(x.size());
  for (std::size_t bi = 0; bi < blocks_.size(); ++bi) {
    const Block& b = blocks_[bi];
    if (b.checkpointed) {
      st.block_inputs[bi] = std::make_shared<std::vector<float>>(x);
      hold(st, st.block_inputs[bi]);
    }
    for (int i = b.begin; i < b.end; ++i) {
      LayerActs* save = b.checkpointed ? nullptr : &st.acts[i];
      const LayerScope label(rec_.context, cfg_.l0 + i);
      st.aux_loss += layer_forward(shape_, layers_[i], tp_, ep_, x.data(), out.data(), save, cfg_.recompute == Recompute::none);
      if (save) hold_acts(st, *save);
      x.swap(out);
    }
  }
}

void Stage::block_backward(MbState& st, const Block& b, std::vector<float>& grad) {
  std::vector<LayerActs> recomputed;
  if (b.checkpointed) {
    // Re-run the block's forward from its saved input, keeping activations this time; they are counted
    // while the block's backward runs (Megatron holds one recomputed block the same way).
    std::vector<float> x = *st.block_inputs[&b - blocks_.data()], out(x.size());
    recomputed.resize(b.end - b.begin);
    for (int i = b.begin; i < b.end; ++i) {
      const LayerScope label(rec_.context, cfg_.l0 + i);
      layer_forward(shape_, layers_[i], tp_, ep_, x.data(), out.data(), &recomputed[i - b.begin], true);
      hold_acts(st, recomputed[i - b.begin]);
      x.swap(out);
    }
  }
  std::vector<float> dx(grad.size());
  for (int i = b.end - 1; i >= b.begin; --i) {
    const LayerActs& a = b.checkpointed ? recomputed[i - b.begin] : st.acts[i];
    const std::size_t jobs_before = st.jobs.size();
    const LayerScope label(rec_.context, cfg_.l0 + i);
    layer_backward(shape_, layers_[i], tp_, ep_, a, grad.data(), dx.data(), st.jobs);
    // Split I: the output gradients the W will read are new memory from now on (the inputs are saved
    // activations, already counted, or recomputed ones that the jobs now keep alive).
    if (st.defer_weight)
      for (std::size_t j = jobs_before; j < st.jobs.size(); ++j) {
        hold(st, st.jobs[j].x);
        hold(st, st.jobs[j].dy);
      }
    grad.swap(dx);
  }
  if (!b.checkpointed) return;
  // The recomputed activations go, except the inputs a split I's queued weight jobs still read.
  std::set<const void*> kept;
  if (st.defer_weight)
    for (const auto& j : st.jobs) kept.insert(j.x.get());
  for (const auto& a : recomputed)
    for (const Buf* buf : a.bufs()) {
      auto it = *buf ? st.counted.find(buf->get()) : st.counted.end();
      if (it == st.counted.end() || kept.count(it->first)) continue;
      rec_.release(it->second);
      st.counted.erase(it);
    }
}

std::vector<float> Stage::forward(int mb, std::vector<float> input, const std::int32_t* tokens,
                                  const std::int32_t* targets) {
  TESSEL_CHECK(mbs_.count(mb) == 0, "stage " << cfg_.stage << ": forward of micro-batch " << mb << " twice");
  MbState& st = mbs_[mb];
  const std::size_t n = activation_elems();
  if (cfg_.first) {
    st.tokens.assign(tokens, tokens + shape_.tokens);
    input.assign(n, 0.0f);
    embed_forward(st, input.data());
  }
  TESSEL_CHECK(input.size() == n, "stage " << cfg_.stage << " input has " << input.size() << " values, expected " << n);
  if (cfg_.last) st.targets.assign(targets, targets + shape_.tokens);
  run_blocks_forward(st, input);
  if (!cfg_.last) return input;
  head_forward(st, input.data());
  return {};
}

float Stage::loss(int mb) const {
  auto it = mbs_.find(mb);
  TESSEL_CHECK(it != mbs_.end() && cfg_.last, "no loss for micro-batch " << mb << " on stage " << cfg_.stage);
  return it->second.loss;
}

void Stage::update_selection_bias(Comm* dp, float rate) {
  for (const LayerWeights& w : layers_)
    if (w.is_moe) rt::update_selection_bias(w.moe, dp, rate);
}

float Stage::aux_loss(int mb) const {
  auto it = mbs_.find(mb);
  TESSEL_CHECK(it != mbs_.end(), "no load-balancing loss for micro-batch " << mb << " on stage " << cfg_.stage);
  return it->second.aux_loss;
}

std::vector<float> Stage::backward_input(int mb, std::vector<float> dout, bool defer_weight) {
  auto it = mbs_.find(mb);
  TESSEL_CHECK(it != mbs_.end(), "stage " << cfg_.stage << ": backward of micro-batch " << mb << " before its forward");
  MbState& st = it->second;
  st.defer_weight = defer_weight;
  std::vector<float> grad = cfg_.last ? head_backward(st) : std::move(dout);
  TESSEL_CHECK(grad.size() == activation_elems(), "stage " << cfg_.stage << " output gradient size " << grad.size());
  for (auto b = blocks_.rbegin(); b != blocks_.rend(); ++b) block_backward(st, *b, grad);
  if (cfg_.first) embed_backward(st, grad.data());
  // Everything the forward saved is released; with a split I the buffers of the queued weight jobs
  // (inputs and output gradients, each once) stay counted until W.
  release_all(st);
  st.acts.clear();
  st.block_inputs.clear();
  st.head_x = st.head_mu = st.head_rs = st.logits = st.row_max = st.row_sum = nullptr;
  st.head_y = nullptr;  // the head's job owns it now
  if (defer_weight)
    for (const auto& j : st.jobs) {
      hold(st, j.x);
      hold(st, j.dy);
    }
  if (cfg_.first) return {};
  return grad;
}

void Stage::backward_weight(int mb) {
  auto it = mbs_.find(mb);
  TESSEL_CHECK(it != mbs_.end(), "stage " << cfg_.stage << ": W of micro-batch " << mb << " before its I");
  for (const auto& j : it->second.jobs) run_weight_grad(j);
  release_all(it->second);
  mbs_.erase(it);
}

}  // namespace tessel::rt
