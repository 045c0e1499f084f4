// The GPT's parameters as one rank holds them: logical names and full shapes (what a checkpoint and
// tools/torch_golden.py see), the tensor-parallel shard this rank keeps, and flat data/grad buffers.
//
// Names (L layers, h hidden, H heads, K kv heads, d head dim, f ffn, V vocab, S seq), stored [in, out]
// so a linear is y = x W + b:
//   embed.tok [V,h] (vocab rows sharded over tp)   embed.pos [S,h] (learned positions only)
//   layers.i.ln1.w/.b [h]   layers.i.attn.wq [h,H*d] wk,wv [h,K*d] (column-sharded, biases bq,bk,bv too)
//   layers.i.attn.wo [H*d,h] (row-sharded) bo [h]   layers.i.ln2.w/.b   layers.i.mlp.w1 [h,f] b1 [f]
//   (SwiGLU: + mlp.wg [h,f] bg [f])   layers.i.mlp.w2 [f,h] (row-sharded) b2 [h]   final_ln.w/.b [h]
//   head.w [V,h] (vocab rows sharded; only when embeddings are untied; tied models reuse embed.tok)
// RMSNorm has no .b; models without bias have no b* vectors.
// A mixture-of-experts layer (Model::is_moe_layer) has, in place of mlp.*: layers.i.moe.router [h,E]
// (replicated), the shared expert layers.i.moe.shared.w1/.wg [h,fs] (column-sharded) and .w2 [fs,h]
// (row-sharded) when the model has one, and per routed expert e layers.i.moe.expert.e.w1/.wg [h,fe]
// (column-sharded) and .w2 [fe,h] (row-sharded) over the expert tensor-parallel ranks (etp, in the experts'
// own store; whole with etp 1), held only by the expert-parallel rank that owns e (ParamSpec::expert;
// expert_owner()).
// Init (GPT-2, Radford et al. 2019): weights std 0.02, residual output projections (wo, w2) std
// 0.02/sqrt(2L); norms' weights 1; biases 0. Values from init_uniform(tensor_key(seed, name), flat index).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/model.hpp"

namespace tessel::rt {

enum class InitKind { uniform, ones, zeros };

struct ParamSpec {
  std::string name;
  std::int64_t rows = 1, cols = 1;  // full shape; vectors are [1, n]
  int shard_dim = -1;               // -1 replicated over tp, 0 rows split, 1 columns split
  InitKind init = InitKind::zeros;
  double stddev = 0;
  bool decay = false;               // AdamW weight decay applies to matrices only
  int expert = -1;                  // the routed expert this tensor belongs to; -1: not a routed expert's
  // false: state kept with the parameters (checkpointed, resharded by name) that no gradient trains: a MoE
  // router's selection bias, moved by its own rule after each step (Megatron keeps it as a buffer). The
  // optimizer still steps it with the rest, but its gradient stays zero, so AdamW leaves it bit for bit (no
  // decay); its zero gradient and Adam moments take 3 x 4 bytes per expert per MoE layer of state memory.
  bool trainable = true;
};

// The expert-parallel rank that holds routed expert e when `experts` are split over ep ranks in
// contiguous blocks (Megatron-Core: local experts [r E/ep, (r+1) E/ep) on ep rank r).
inline int expert_owner(int e, int experts, int ep) { return e / (experts / ep); }

struct Param {
  ParamSpec spec;
  std::int64_t rows = 1, cols = 1;  // local shard shape
  std::int64_t row0 = 0, col0 = 0;  // where the shard starts in the full tensor
  std::size_t offset = 0;           // into ParamStore::data/grad
  std::size_t size() const { return static_cast<std::size_t>(rows * cols); }
};

// Every parameter of the model, in a fixed order (the order of the flat buffers and of checkpoints).
std::vector<ParamSpec> gpt_param_specs(const Model& m);
// Parameters that a stage covering layers [l0, l1) needs; first/last say whether it holds the embedding or
// the final norm and head. Tied models put embed.tok on both.
std::vector<std::string> stage_param_names(const Model& m, int l0, int l1, bool first, bool last);

class ParamStore {
 public:
  ParamStore() = default;
  // Allocates the named parameters (subset of specs, kept in specs order), sharded tp ways at tp_rank, and
  // initialises them from the seed.
  ParamStore(const Model& m, const std::vector<std::string>& names, int tp, int tp_rank, std::uint64_t seed);

  bool has(const std::string& name) const { return index_.count(name) > 0; }
  Param& at(const std::string& name);
  const Param& at(const std::string& name) const;
  float* data(const Param& p) { return data_.data() + p.offset; }
  float* grad(const Param& p) { return grad_.data() + p.offset; }
  const float* data(const Param& p) const { return data_.data() + p.offset; }
  const float* grad(const Param& p) const { return grad_.data() + p.offset; }
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  std::vector<float>& flat_data() { return data_; }
  std::vector<float>& flat_grad() { return grad_; }
  void zero_grad();

 private:
  std::vector<Param> params_;
  std::map<std::string, std::size_t> index_;
  std::vector<float> data_, grad_;
};

}  // namespace tessel::rt
