#include "runtime/params.hpp"

#include <algorithm>
#include <cmath>

#include "util/error.hpp"
#include "runtime/init.hpp"

namespace tessel::rt {
namespace {

constexpr double kInitStd = 0.02;  // GPT-2 / Megatron-LM --init-method-std default

ParamSpec matrix(std::string name, std::int64_t r, std::int64_t c, int shard, double std) {
  return {std::move(name), r, c, shard, InitKind::uniform, std, true};
}
ParamSpec vec(std::string name, std::int64_t n, int shard, InitKind k) {
  return {std::move(name), 1, n, shard, k, 0.0, false};
}

void add_norm(std::vector<ParamSpec>& v, const Model& m, const std::string& pfx) {
  v.push_back(vec(pfx + ".w", m.hidden, -1, InitKind::ones));
  if (m.norm == Norm::layernorm) v.push_back(vec(pfx + ".b", m.hidden, -1, InitKind::zeros));
}

void add_layer(std::vector<ParamSpec>& v, const Model& m, int i) {
  const std::string p = "layers." + std::to_string(i) + ".";
  const std::int64_t h = m.hidden, qd = std::int64_t(m.heads) * m.head_dim, kd = std::int64_t(m.kv_heads) * m.head_dim;
  const double out_std = kInitStd / std::sqrt(2.0 * m.layers);  // GPT-2 scaled residual init
  add_norm(v, m, p + "ln1");
  v.push_back(matrix(p + "attn.wq", h, qd, 1, kInitStd));
  v.push_back(matrix(p + "attn.wk", h, kd, 1, kInitStd));
  v.push_back(matrix(p + "attn.wv", h, kd, 1, kInitStd));
  if (m.has_qkv_bias()) {
    v.push_back(vec(p + "attn.bq", qd, 1, InitKind::zeros));
    v.push_back(vec(p + "attn.bk", kd, 1, InitKind::zeros));
    v.push_back(vec(p + "attn.bv", kd, 1, InitKind::zeros));
  }
  v.push_back(matrix(p + "attn.wo", qd, h, 0, out_std));
  if (m.has_out_bias()) v.push_back(vec(p + "attn.bo", h, -1, InitKind::zeros));
  add_norm(v, m, p + "ln2");
  if (m.is_moe_layer(i)) {
    const MoeSpec& e = m.moe;
    v.push_back(matrix(p + "moe.router", h, e.experts, -1, kInitStd));
    if (e.router.selection_bias) {
      v.push_back(vec(p + "moe.bias", e.experts, -1, InitKind::zeros));
      v.back().trainable = false;
    }
    if (e.shared_ffn > 0) {
      v.push_back(matrix(p + "moe.shared.w1", h, e.shared_ffn, 1, kInitStd));
      if (m.activation == Activation::swiglu) v.push_back(matrix(p + "moe.shared.wg", h, e.shared_ffn, 1, kInitStd));
      v.push_back(matrix(p + "moe.shared.w2", e.shared_ffn, h, 0, out_std));
    }
    for (int x = 0; x < e.experts; ++x) {
      const std::string q = p + "moe.expert." + std::to_string(x) + ".";
      // Split over etp as the dense MLP is over tp (the experts' store is built with etp in place of tp).
      v.push_back(matrix(q + "w1", h, e.expert_ffn, 1, kInitStd));
      if (m.activation == Activation::swiglu) v.push_back(matrix(q + "wg", h, e.expert_ffn, 1, kInitStd));
      v.push_back(matrix(q + "w2", e.expert_ffn, h, 0, out_std));
      for (auto it = v.end() - (m.activation == Activation::swiglu ? 3 : 2); it != v.end(); ++it) it->expert = x;
    }
    return;
  }
  v.push_back(matrix(p + "mlp.w1", h, m.ffn, 1, kInitStd));
  if (m.has_mlp_bias()) v.push_back(vec(p + "mlp.b1", m.ffn, 1, InitKind::zeros));
  if (m.activation == Activation::swiglu) {
    v.push_back(matrix(p + "mlp.wg", h, m.ffn, 1, kInitStd));
    if (m.has_mlp_bias()) v.push_back(vec(p + "mlp.bg", m.ffn, 1, InitKind::zeros));
  }
  v.push_back(matrix(p + "mlp.w2", m.ffn, h, 0, out_std));
  if (m.has_mlp_bias()) v.push_back(vec(p + "mlp.b2", h, -1, InitKind::zeros));
}

}  // namespace

std::vector<ParamSpec> gpt_param_specs(const Model& m) {
  std::vector<ParamSpec> v;
  v.push_back(matrix("embed.tok", m.vocab, m.hidden, 0, kInitStd));
  if (m.position == PositionEmbedding::learned) v.push_back(matrix("embed.pos", m.position_rows(), m.hidden, -1, kInitStd));
  for (int i = 0; i < m.layers; ++i) add_layer(v, m, i);
  add_norm(v, m, "final_ln");
  if (!m.tied_embeddings) v.push_back(matrix("head.w", m.vocab, m.hidden, 0, kInitStd));
  return v;
}

std::vector<std::string> stage_param_names(const Model& m, int l0, int l1, bool first, bool last) {
  std::vector<std::string> out;
  for (const auto& s : gpt_param_specs(m)) {
    const std::string& n = s.name;
    bool want = false;
    if (n.rfind("embed.", 0) == 0) want = first || (last && m.tied_embeddings && n == "embed.tok");
    else if (n.rfind("layers.", 0) == 0) {
      const int i = std::stoi(n.substr(7, n.find('.', 7) - 7));
      want = i >= l0 && i < l1;
    } else want = last;  // final_ln, head.w
    if (want) out.push_back(n);
  }
  return out;
}

ParamStore::ParamStore(const Model& m, const std::vector<std::string>& names, int tp, int tp_rank,
                       std::uint64_t seed) {
  std::size_t total = 0;
  for (const auto& s : gpt_param_specs(m)) {
    if (std::find(names.begin(), names.end(), s.name) == names.end()) continue;
    Param p;
    p.spec = s;
    p.rows = s.rows;
    p.cols = s.cols;
    if (s.shard_dim == 0) {
      TESSEL_CHECK(s.rows % tp == 0, "" << s.name << " rows " << s.rows << " not divisible by tp " << tp);
      p.rows = s.rows / tp;
      p.row0 = p.rows * tp_rank;
    } else if (s.shard_dim == 1) {
      TESSEL_CHECK(s.cols % tp == 0, "" << s.name << " cols " << s.cols << " not divisible by tp " << tp);
      p.cols = s.cols / tp;
      p.col0 = p.cols * tp_rank;
    }
    p.offset = total;
    total += p.size();
    index_[s.name] = params_.size();
    params_.push_back(p);
  }
  TESSEL_CHECK(params_.size() == names.size(), "unknown parameter name among " << names.size());
  data_.assign(total, 0.0f);
  grad_.assign(total, 0.0f);
  for (const auto& p : params_) {
    float* d = data(p);
    const std::uint64_t key = tensor_key(seed, p.spec.name);
    for (std::int64_t r = 0; r < p.rows; ++r)
      for (std::int64_t c = 0; c < p.cols; ++c) {
        const std::int64_t full = (p.row0 + r) * p.spec.cols + (p.col0 + c);
        float& x = d[r * p.cols + c];
        switch (p.spec.init) {
          case InitKind::uniform: x = init_uniform(key, full, p.spec.stddev); break;
          case InitKind::ones: x = 1.0f; break;
          case InitKind::zeros: x = 0.0f; break;
        }
      }
  }
}

Param& ParamStore::at(const std::string& name) {
  auto it = index_.find(name);
  TESSEL_CHECK(it != index_.end(), "no parameter " << name << " on this rank");
  return params_[it->second];
}
const Param& ParamStore::at(const std::string& name) const {
  auto it = index_.find(name);
  TESSEL_CHECK(it != index_.end(), "no parameter " << name << " on this rank");
  return params_[it->second];
}

void ParamStore::zero_grad() { std::fill(grad_.begin(), grad_.end(), 0.0f); }

}  // namespace tessel::rt
