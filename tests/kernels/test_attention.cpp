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

// The flash kernels' statistic against the probabilities: p_ij = exp(s_ij - lse_i), so log p_ij + lse_i
// must give back the score q_i . k_j / sqrt(d) for every j <= i; with q = 0, lse_i = ln(i + 1) exactly.
TEST_CASE("attention: lse is the log-normaliser of the probabilities (GQA, two batches)") {
  const AttentionShape s{2, 5, 4, 2, 3};
  const int qd = s.hq * s.d, kd = s.hkv * s.d, T = s.batch * s.seq;
  const auto q = random_vec(std::size_t(T) * qd, 61), k = random_vec(std::size_t(T) * kd, 62);
  std::vector<float> p(std::size_t(s.batch) * s.hq * s.seq * s.seq), lse(std::size_t(s.batch) * s.hq * s.seq);
  attention_probs(s, q.data(), qd, k.data(), kd, p.data());
  attention_lse(s, q.data(), qd, k.data(), kd, lse.data());
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.hq; ++h)
      for (int i = 0; i < s.seq; ++i)
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int c = 0; c < s.d; ++c)
            dot += double(q[std::size_t(b * s.seq + i) * qd + h * s.d + c]) * k[std::size_t(b * s.seq + j) * kd + (h / 2) * s.d + c];
          const std::size_t row = (std::size_t(b) * s.hq + h) * s.seq + i;
          CHECK(std::log(double(p[row * s.seq + j])) + lse[row] == doctest::Approx(dot / std::sqrt(3.0)).epsilon(1e-5));
        }
  const std::vector<float> zeros(std::size_t(T) * qd, 0.0f);
  attention_lse(s, zeros.data(), qd, k.data(), kd, lse.data());
  for (int i = 0; i < s.seq; ++i) CHECK(lse[i] == doctest::Approx(std::log(i + 1.0)).epsilon(1e-6));
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
