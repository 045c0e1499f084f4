// runtime/init.hpp: init_normal, the Gaussian tessel bench feeds the runtime's kernels (their time depends on
// the data: tanh GELU on a constant input runs 1.3-1.5x faster than on a layer's pre-activations).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>

#include "runtime/init.hpp"

using tessel::rt::init_normal;
using tessel::rt::tensor_key;

TEST_CASE("init_normal: a pure function of (key, index), different across indices and keys") {
  const std::uint64_t k = tensor_key(7, "bench"), k2 = tensor_key(8, "bench");
  CHECK(init_normal(k, 12345, 1.0) == init_normal(k, 12345, 1.0));
  CHECK(init_normal(k, 0, 1.0) != init_normal(k, 1, 1.0));
  CHECK(init_normal(k, 0, 1.0) != init_normal(k2, 0, 1.0));
  // The spread scales the same draw.
  CHECK(init_normal(k, 99, 0.32) == doctest::Approx(0.32 * init_normal(k, 99, 1.0)).epsilon(1e-6));
}

TEST_CASE("init_normal: the moments and tails of a standard normal") {
  const std::uint64_t k = tensor_key(1234, "bench.gelu");
  constexpr int n = 200000;
  const double sd = 0.32;
  double sum = 0, sq = 0;
  int beyond2 = 0, negative = 0, nonfinite = 0;
  for (int i = 0; i < n; ++i) {
    const double x = init_normal(k, i, sd);
    nonfinite += !std::isfinite(x);
    sum += x;
    sq += x * x;
    beyond2 += std::abs(x) > 2 * sd;
    negative += x < 0;
  }
  REQUIRE(nonfinite == 0);
  const double mean = sum / n, stddev = std::sqrt(sq / n - mean * mean);
  // Standard errors at n = 200,000: mean sd/447, stddev about sd/632, the 2-sigma share 0.047%,
  // the sign share 0.11%; each bound is about 5 of them (a constant or uniform input fails all but the mean).
  CHECK(std::abs(mean) < 0.011 * sd);
  CHECK(stddev == doctest::Approx(sd).epsilon(0.008));
  CHECK(static_cast<double>(beyond2) / n == doctest::Approx(0.0455).epsilon(0.05));
  CHECK(static_cast<double>(negative) / n == doctest::Approx(0.5).epsilon(0.011));
}
