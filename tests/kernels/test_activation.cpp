#include <doctest/doctest.h>

#include <cmath>

#include "kernels/cpu/activation.hpp"
#include "tests/kernels/fd.hpp"

using namespace tessel::kernels::cpu;
using namespace tessel::test;

TEST_CASE("gelu forward: closed form values") {
  // gelu(0) = 0; gelu(1) = 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.841192 (tanh form, PyTorch docs value).
  float x[] = {0, 1, -1}, y[3];
  gelu_fwd(x, y, 3);
  const double t = std::tanh(std::sqrt(2.0 / M_PI) * 1.044715);
  CHECK(y[0] == 0.0f);
  CHECK(y[1] == doctest::Approx(0.5 * (1 + t)).epsilon(1e-6));
  CHECK(y[2] == doctest::Approx(-0.5 * (1 - t)).epsilon(1e-6));
}

TEST_CASE("gelu backward matches finite differences") {
  auto x = random_vec(32, 31, -3, 3), w = random_vec(32, 32);
  std::vector<float> y(32), dx(32);
  auto loss = [&] { gelu_fwd(x.data(), y.data(), x.size()); return weighted_sum(y, w); };
  gelu_bwd(w.data(), x.data(), dx.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(fd_close(dx[i], central_difference(x, i, kFdStep, loss)));
}

TEST_CASE("swiglu forward and backward") {
  // silu(2) * 3 = 2 * sigmoid(2) * 3.
  float a = 2, u = 3, y;
  swiglu_fwd(&a, &u, &y, 1);
  CHECK(y == doctest::Approx(6.0 / (1.0 + std::exp(-2.0))).epsilon(1e-6));
  auto gate = random_vec(16, 41, -3, 3), up = random_vec(16, 42), w = random_vec(16, 43);
  std::vector<float> out(16), dg(16), du(16);
  auto loss = [&] { swiglu_fwd(gate.data(), up.data(), out.data(), 16); return weighted_sum(out, w); };
  swiglu_bwd(w.data(), gate.data(), up.data(), dg.data(), du.data(), 16);
  for (std::size_t i = 0; i < 16; ++i) {
    CHECK(fd_close(dg[i], central_difference(gate, i, kFdStep, loss)));
    CHECK(fd_close(du[i], central_difference(up, i, kFdStep, loss)));
  }
}
