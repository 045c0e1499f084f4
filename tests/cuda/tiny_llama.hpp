// The Llama-shaped variant of the tiny model that the GPU runtime tests train: tests/runtime's micro_llama
// at the tiny model's size. Rotary positions (no embed.pos), GQA (4 query heads on 2 kv heads, head_dim 16:
// one kv head per rank at tp 2), RMSNorm, SwiGLU, no biases, untied head. rope_theta 100 so that even the
// slowest pair (w_7 = 100^(-14/16) ~ 0.018) turns 0.55 rad by position 31 (seq 32): a missing or
// mispositioned rotation changes attention scores, not only in the fast pairs.
#pragma once

#include "models/model.hpp"

namespace tessel::test {

inline Model tiny_llama() {
  Model m = load_model("tiny");
  m.name = "tiny-llama";
  m.kv_heads = 2;
  m.activation = Activation::swiglu;
  m.norm = Norm::rmsnorm;
  m.position = PositionEmbedding::rotary;
  m.rope_theta = 100.0;
  m.tied_embeddings = false;
  m.bias = false;
  m.dropout = false;
  return m;
}

}  // namespace tessel::test
