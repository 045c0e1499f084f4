#include <doctest/doctest.h>

#include <cmath>

#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/optimizer.hpp"
#include "tests/kernels/fd.hpp"

using namespace tessel::kernels::cpu;
using namespace tessel::test;

TEST_CASE("embedding: a shard looks up its own tokens, zeros the rest, and scatters gradients back") {
  // Shard of tokens [2,4) of a 2-wide table: token 3 -> row 1, token 0 -> zeros.
  float table[] = {10, 11, 20, 21};
  std::int32_t tok[] = {3, 0, 3};
  float out[6];
  embedding_fwd(table, 2, 2, 2, tok, 3, out);
  CHECK(out[0] == 20); CHECK(out[1] == 21); CHECK(out[2] == 0); CHECK(out[3] == 0);
  float dout[] = {1, 2, 5, 5, 3, 4}, dt[4] = {0, 0, 0, 0};
  embedding_bwd(dout, 2, 2, 2, tok, 3, dt);
  // Token 3 appears twice: its row accumulates (1+3, 2+4); token 0 is not ours.
  CHECK(dt[0] == 0); CHECK(dt[2] == 4); CHECK(dt[3] == 6);
}

TEST_CASE("adamw: the first step moves each parameter by lr * sign(g) (bias-corrected), plus decay") {
  // Step 1: m = (1-b1) g, v = (1-b2) g^2, mhat = g, vhat = g^2: p -= lr * g / (|g| + eps) after p *= 1 - lr wd.
  float p[] = {1.0f, -2.0f}, g[] = {0.5f, -3.0f}, m[] = {0, 0}, v[] = {0, 0};
  AdamW hp{0.1f, 0.9f, 0.95f, 1e-8f, 0.01f};
  adamw_step(p, g, m, v, 2, hp, 1);
  CHECK(p[0] == doctest::Approx(1.0 * (1 - 0.001) - 0.1).epsilon(1e-6));
  CHECK(p[1] == doctest::Approx(-2.0 * (1 - 0.001) + 0.1).epsilon(1e-6));
  // Step 2 with the same gradient: mhat = g and vhat = g^2 again, so the same move.
  adamw_step(p, g, m, v, 2, hp, 2);
  CHECK(p[0] == doctest::Approx((0.899 * 0.999) - 0.1).epsilon(1e-6));
}

TEST_CASE("gradient clipping coefficient") {
  // Norm of (3, 4) is 5; clipping to 1 scales by 1 / (5 + 1e-6); below the limit nothing changes.
  float g[] = {3, 4};
  const double n = std::sqrt(sum_squares(g, 2));
  CHECK(n == 5.0);
  const float c = clip_coefficient(n, 1.0);
  scale(g, 2, c);
  CHECK(std::sqrt(sum_squares(g, 2)) == doctest::Approx(1.0).epsilon(1e-6));
  CHECK(clip_coefficient(0.5, 1.0) == 1.0f);
}
