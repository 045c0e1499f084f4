#include <doctest/doctest.h>

#include <cmath>

#include "kernels/cpu/attention.hpp"
#include "tests/kernels/fd.hpp"

using namespace tessel::kernels::cpu;
using namespace tessel::test;

TEST_CASE("attention: causal mask and uniform keys give the running mean of values") {
  // With q = 0 every score is 0, so row i averages v_0..v_i: out_i = (sum_{j<=i} v_j) / (i + 1).
  AttentionShape s{1, 4, 1, 1, 2};
  std::vector<float> q(8, 0.0f), k = random_vec(8, 51), v = random_vec(8, 52), o(8), p(16);
  attention_fwd(s, q.data(), 2, k.data(), 2, v.data(), 2, o.data(), 2, p.data());
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < 2; ++c) {
      double m = 0;
      for (int j = 0; j <= i; ++j) m += v[j * 2 + c];
      CHECK(o[i * 2 + c] == doctest::Approx(m / (i + 1)).epsilon(1e-6));
    }
  CHECK(p[0 * 4 + 1] == 0.0f);  // above the diagonal
}

TEST_CASE("attention backward (GQA, strided rows) matches finite differences") {
  // 2 sequences of 5 tokens, 4 query heads sharing 2 kv heads, d = 3; q/k/v are column blocks of one
  // [tokens, 4*3 + 2*3 + 2*3] matrix as the fused QKV GEMM would write them.
  AttentionShape s{2, 5, 4, 2, 3};
  const int T = 10, ld = 24;
  auto qkv = random_vec(T * ld, 61);
  auto w = random_vec(T * 12, 62);
  std::vector<float> out(T * 12), probs(2 * 4 * 25);
  auto loss = [&] {
    attention_fwd(s, qkv.data(), ld, qkv.data() + 12, ld, qkv.data() + 18, ld, out.data(), 12, probs.data());
    return weighted_sum(out, w);
  };
  loss();
  std::vector<float> d(T * ld, 7.0f);  // fill: the kernel must overwrite its blocks
  attention_bwd(s, qkv.data(), ld, qkv.data() + 12, ld, qkv.data() + 18, ld, probs.data(), w.data(), 12, d.data(), ld,
                d.data() + 12, ld, d.data() + 18, ld);
  for (std::size_t i = 0; i < qkv.size(); ++i) {
    CAPTURE(i);
    CHECK(fd_close(d[i], central_difference(qkv, i, kFdStep, loss)));
  }
}
