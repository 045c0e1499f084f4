#include <doctest/doctest.h>

#include <cmath>

#include "kernels/cpu/rope.hpp"
#include "tests/kernels/fd.hpp"

using namespace tessel::kernels::cpu;
using namespace tessel::test;

namespace {
// One rotation in fp32: each output is a*c - b*s, two roundings of O(1) products: a few ulp (1.2e-7).
constexpr double kRotTol = 1e-6;
}  // namespace

TEST_CASE("rope table: inv_freq_j = theta^(-2j/d), angle = position * inv_freq") {
  // d = 8, theta = 10000: inv_freq_1 = 10000^(-2/8) = 0.1, so position 3 turns pair 1 by 0.3 rad;
  // pair 0 has inv_freq 1: position 5 turns it by 5 rad.
  const RopeTable t = rope_table(6, 8, 10000.0);
  CHECK(t.cos[3 * 4 + 1] == doctest::Approx(std::cos(0.3)).epsilon(kRotTol));
  CHECK(t.sin[3 * 4 + 1] == doctest::Approx(std::sin(0.3)).epsilon(kRotTol));
  CHECK(t.sin[5 * 4 + 0] == doctest::Approx(std::sin(5.0)).epsilon(kRotTol));
}

TEST_CASE("rope: each (j, j + d/2) pair keeps its norm, position 0 is the identity, other columns untouched") {
  // 2 sequences of 6 tokens, 3 heads of d = 8 in rows of stride 30 (6 spare columns). A rotation is
  // orthogonal: |(y_j, y_{j+4})| = |(x_j, x_{j+4})|. At position 0 cos = 1 and sin = 0 exactly, so the
  // rows t = 0 and t = 6 come back bit for bit; the spare columns are never written.
  const int seq = 6, rows = 12, heads = 3, d = 8, ld = 30;
  const RopeTable t = rope_table(seq, d, 10000.0);
  const auto x = random_vec(rows * ld, 71);
  auto y = x;
  rope_fwd(t, y.data(), rows, heads, ld);
  int moved = 0;
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h)
      for (int j = 0; j < d / 2; ++j) {
        const int a = r * ld + h * d + j, b = a + d / 2;
        const double nx = std::hypot(x[a], x[b]), ny = std::hypot(y[a], y[b]);
        CHECK(std::abs(ny - nx) <= kRotTol * (1 + nx));
        if (r % seq == 0) {
          CHECK(y[a] == x[a]);
          CHECK(y[b] == x[b]);
        }
        moved += std::abs(y[a] - x[a]) > 1e-3;
      }
    for (int c = heads * d; c < ld; ++c) CHECK(y[r * ld + c] == x[r * ld + c]);
  }
  // Positions 1..5 of 2 sequences x 3 heads x 4 pairs = 120 elements; sin(p w_j) > 1e-3 for all of them
  // (smallest angle: p = 1, w_3 = 10000^(-6/8) = 1e-3 rad), so nearly all must move.
  CHECK(moved > 100);
}

TEST_CASE("rope: q . k after rotation depends only on the position difference") {
  // (R(a) q) . (R(b) k) = q . R(b - a) k (R(a)^T R(b) = R(b - a)). Put the same q and k at every position of
  // one sequence of 16 (one head, d = 8, theta 100 so every pair turns visibly), rotate, and compare the dot
  // products of pairs (a, b) with the same b - a against the closed form q . R(b - a) k, in double.
  const int seq = 16, d = 8;
  const RopeTable t = rope_table(seq, d, 100.0);
  const auto q1 = random_vec(d, 81), k1 = random_vec(d, 82);
  std::vector<float> q(seq * d), k(seq * d);
  for (int p = 0; p < seq; ++p)
    for (int c = 0; c < d; ++c) q[p * d + c] = q1[c], k[p * d + c] = k1[c];
  rope_fwd(t, q.data(), seq, 1, d);
  rope_fwd(t, k.data(), seq, 1, d);
  auto dot = [&](const std::vector<float>& u, int a, const std::vector<float>& v, int b) {
    double s = 0;
    for (int c = 0; c < d; ++c) s += static_cast<double>(u[a * d + c]) * v[b * d + c];
    return s;
  };
  std::vector<float> q0(q1.begin(), q1.end());  // q unrotated (position 0 row)
  double spread = 0;
  for (int delta : {0, 3, 7}) {
    const double want = dot(q0, 0, k, delta);  // q . R(delta) k
    spread = std::max(spread, std::abs(want - dot(q0, 0, k, 0)));
    for (int a : {0, 2, 5, 8}) {
      CAPTURE(delta);
      CAPTURE(a);
      CHECK(std::abs(dot(q, a, k, a + delta) - want) < 1e-5);
    }
  }
  // The check above must be able to fail: the dot product does change with the difference.
  CHECK(spread > 1e-2);
}

TEST_CASE("rope backward equals finite differences and inverts the forward") {
  // L(x) = sum(w * rope_fwd(x)); dL/dx = R^T w = rope_bwd(w). Since R is orthogonal, rope_bwd(rope_fwd(x)) = x
  // up to two rotations' rounding.
  const int seq = 5, rows = 10, heads = 2, d = 6, ld = 14;
  const RopeTable t = rope_table(seq, d, 10000.0);
  auto x = random_vec(rows * ld, 91);
  const auto w = random_vec(rows * ld, 92);
  auto loss = [&] {
    auto y = x;
    rope_fwd(t, y.data(), rows, heads, ld);
    double s = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < heads * d; ++c) s += static_cast<double>(y[r * ld + c]) * w[r * ld + c];
    return s;
  };
  auto g = w;
  rope_bwd(t, g.data(), rows, heads, ld);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < heads * d; ++c) {
      CAPTURE(r);
      CAPTURE(c);
      CHECK(fd_close(g[r * ld + c], central_difference(x, r * ld + c, kFdStep, loss)));
    }
  auto y = x;
  rope_fwd(t, y.data(), rows, heads, ld);
  rope_bwd(t, y.data(), rows, heads, ld);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::abs(y[i] - x[i]) < 2 * kRotTol);
}
