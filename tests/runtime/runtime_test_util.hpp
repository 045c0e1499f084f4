// Helpers for the runtime numerics tests: a micro GPT that still exercises every path (8 layers so pp 4 x
// vpp 2 has a layer per stage; 2 heads and even sizes so tp 2 splits heads, ffn and vocab), and layouts.
#pragma once

#include <cmath>
#include <string>

#include "models/model.hpp"
#include "runtime/trainer.hpp"
#include "sim/layout.hpp"

namespace tessel::test {

inline Model micro_gpt() {
  Model m;
  m.name = "micro";
  m.layers = 8;
  m.hidden = 16;
  m.heads = 2;
  m.kv_heads = 2;
  m.head_dim = 8;
  m.ffn = 32;
  m.vocab = 32;
  m.seq_len = 8;
  return m;
}

inline Layout layout(int tp, int pp, int dp, const std::string& schedule, int vpp, int gbs) {
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.vpp = vpp;
  l.schedule = schedule;
  l.micro_batch = 1;
  l.global_batch = gbs;
  l.precision = Precision::fp32;
  return l;
}

inline double rel_err(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

}  // namespace tessel::test
