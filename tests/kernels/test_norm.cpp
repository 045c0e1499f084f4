#include <doctest/doctest.h>

#include <cmath>

#include "kernels/cpu/norm.hpp"
#include "tests/kernels/fd.hpp"

using namespace tessel::kernels::cpu;
using namespace tessel::test;

TEST_CASE("layernorm forward: closed form for [1,2,3]") {
  // mean 2, biased variance 2/3, so y = (x - 2) / sqrt(2/3 + eps) * gamma + beta.
  float x[] = {1, 2, 3}, g[] = {1, 1, 2}, b[] = {0, 0.5f, 0}, y[3], mu, rs;
  const float eps = 1e-5f;
  layernorm_fwd(x, g, b, y, &mu, &rs, 1, 3, eps);
  const double r = 1.0 / std::sqrt(2.0 / 3.0 + eps);
  CHECK(mu == doctest::Approx(2.0).epsilon(1e-7));
  CHECK(rs == doctest::Approx(r).epsilon(1e-6));
  CHECK(y[0] == doctest::Approx(-r).epsilon(1e-6));
  CHECK(y[1] == doctest::Approx(0.5).epsilon(1e-6));
  CHECK(y[2] == doctest::Approx(2 * r).epsilon(1e-6));
}

TEST_CASE("rmsnorm forward: closed form for [3,4]") {
  // mean(x^2) = 12.5, y = x / sqrt(12.5 + eps) * gamma.
  float x[] = {3, 4}, g[] = {1, 2}, y[2], rs;
  rmsnorm_fwd(x, g, y, &rs, 1, 2, 0.0f);
  CHECK(y[0] == doctest::Approx(3 / std::sqrt(12.5)).epsilon(1e-6));
  CHECK(y[1] == doctest::Approx(8 / std::sqrt(12.5)).epsilon(1e-6));
}

TEST_CASE("layernorm backward matches finite differences for x, gamma and beta") {
  const int rows = 3, cols = 8;
  const float eps = 1e-5f;
  auto x = random_vec(rows * cols, 11), g = random_vec(cols, 12, 0.5f, 1.5f), b = random_vec(cols, 13);
  auto w = random_vec(rows * cols, 14);
  std::vector<float> y(rows * cols), mu(rows), rs(rows);
  auto loss = [&] {
    layernorm_fwd(x.data(), g.data(), b.data(), y.data(), mu.data(), rs.data(), rows, cols, eps);
    return weighted_sum(y, w);
  };
  loss();
  std::vector<float> dx(rows * cols), dg(cols, 0.0f), db(cols, 0.0f);
  layernorm_bwd(w.data(), x.data(), g.data(), mu.data(), rs.data(), dx.data(), dg.data(), db.data(), rows, cols);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(fd_close(dx[i], central_difference(x, i, kFdStep, loss)));
  for (int i = 0; i < cols; ++i) {
    CHECK(fd_close(dg[i], central_difference(g, i, kFdStep, loss)));
    CHECK(fd_close(db[i], central_difference(b, i, kFdStep, loss)));
  }
}

TEST_CASE("rmsnorm backward matches finite differences for x and gamma") {
  const int rows = 2, cols = 6;
  auto x = random_vec(rows * cols, 21), g = random_vec(cols, 22, 0.5f, 1.5f), w = random_vec(rows * cols, 23);
  std::vector<float> y(rows * cols), rs(rows);
  auto loss = [&] {
    rmsnorm_fwd(x.data(), g.data(), y.data(), rs.data(), rows, cols, 1e-6f);
    return weighted_sum(y, w);
  };
  loss();
  std::vector<float> dx(rows * cols), dg(cols, 0.0f);
  rmsnorm_bwd(w.data(), x.data(), g.data(), rs.data(), dx.data(), dg.data(), rows, cols);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(fd_close(dx[i], central_difference(x, i, kFdStep, loss)));
  for (int i = 0; i < cols; ++i) CHECK(fd_close(dg[i], central_difference(g, i, kFdStep, loss)));
}
