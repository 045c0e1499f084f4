#include <doctest/doctest.h>

#include <barrier>
#include <cmath>
#include <thread>

#include "kernels/cpu/cross_entropy.hpp"
#include "tests/kernels/fd.hpp"

using namespace tessel::kernels::cpu;
using namespace tessel::test;

TEST_CASE("cross-entropy: uniform logits give log(V)") {
  // softmax of equal logits is 1/V everywhere: loss = log V.
  std::vector<float> z(2 * 8, 0.3f), loss(2), mx(2), sm(2);
  std::int32_t t[] = {0, 7};
  cross_entropy_fwd(z.data(), 2, 8, 0, t, loss.data(), mx.data(), sm.data(), nullptr);
  CHECK(loss[0] == doctest::Approx(std::log(8.0)).epsilon(1e-6));
  CHECK(loss[1] == doctest::Approx(std::log(8.0)).epsilon(1e-6));
}

TEST_CASE("cross-entropy backward matches finite differences") {
  const int R = 3, V = 7;
  auto z = random_vec(R * V, 71, -2, 2), w = random_vec(R, 72);
  std::int32_t t[] = {0, 3, 6};
  std::vector<float> loss(R), mx(R), sm(R), dz(R * V);
  auto f = [&] {
    cross_entropy_fwd(z.data(), R, V, 0, t, loss.data(), mx.data(), sm.data(), nullptr);
    return weighted_sum(loss, w);
  };
  f();
  cross_entropy_bwd(z.data(), R, V, 0, t, mx.data(), sm.data(), w.data(), dz.data());
  for (std::size_t i = 0; i < z.size(); ++i) CHECK(fd_close(dz[i], central_difference(z, i, kFdStep, f)));
}

TEST_CASE("vocab-parallel cross-entropy over two shards equals the unsharded result, forward and backward") {
  // Two shards [0,4) and [4,7) run on two threads; the hooks are a two-party all-reduce (exchange through
  // shared slots between barriers), as the tensor-parallel group would do it.
  const int R = 3, V = 7, split = 4;
  auto z = random_vec(R * V, 81, -2, 2);
  std::int32_t t[] = {1, 4, 6};
  std::vector<float> ref(R), mx(R), sm(R), dref(R * V), ones(R, 1.0f);
  cross_entropy_fwd(z.data(), R, V, 0, t, ref.data(), mx.data(), sm.data(), nullptr);
  cross_entropy_bwd(z.data(), R, V, 0, t, mx.data(), sm.data(), ones.data(), dref.data());

  std::barrier sync(2);
  std::vector<float> slot[2];
  auto reduce = [&](int me, float* x, std::size_t n, bool is_max) {
    slot[me].assign(x, x + n);
    sync.arrive_and_wait();
    for (std::size_t i = 0; i < n; ++i)
      x[i] = is_max ? std::max(slot[0][i], slot[1][i]) : slot[0][i] + slot[1][i];
    sync.arrive_and_wait();
  };
  std::vector<float> loss[2], dz[2];
  auto shard = [&](int me) {
    const int v0 = me == 0 ? 0 : split, vl = me == 0 ? split : V - split;
    std::vector<float> zl;
    for (int r = 0; r < R; ++r) zl.insert(zl.end(), z.begin() + r * V + v0, z.begin() + r * V + v0 + vl);
    VocabReduce hooks{[&](float* x, std::size_t n) { reduce(me, x, n, true); },
                      [&](float* x, std::size_t n) { reduce(me, x, n, false); }};
    std::vector<float> m(R), s(R);
    loss[me].resize(R);
    dz[me].resize(R * vl);
    cross_entropy_fwd(zl.data(), R, vl, v0, t, loss[me].data(), m.data(), s.data(), &hooks);
    cross_entropy_bwd(zl.data(), R, vl, v0, t, m.data(), s.data(), ones.data(), dz[me].data());
  };
  std::thread other(shard, 1);
  shard(0);
  other.join();
  // Same maths with sums split in two: equal to fp32 rounding, 1e-6 relative.
  for (int r = 0; r < R; ++r) {
    CHECK(loss[0][r] == doctest::Approx(ref[r]).epsilon(1e-6));
    CHECK(loss[1][r] == doctest::Approx(ref[r]).epsilon(1e-6));
    for (int j = 0; j < V; ++j) {
      const float got = j < split ? dz[0][r * split + j] : dz[1][r * (V - split) + j - split];
      CHECK(got == doctest::Approx(dref[r * V + j]).epsilon(1e-6).scale(1e-6));
    }
  }
}
