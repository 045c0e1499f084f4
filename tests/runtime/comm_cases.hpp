// Collective checks shared by the thread and MPI communicator tests: every rank runs them on its Comm and
// compares with expectations computed here independently of the communicator.
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

#include "runtime/comm/comm.hpp"

namespace tessel::test {

// A value per (rank, index, salt) whose fp32 sums round differently in different orders, so a wrong
// reduction order shows up as a bit difference.
inline float value(int rank, std::size_t i, int salt = 0) {
  unsigned h = static_cast<unsigned>(rank) * 2654435761u ^ static_cast<unsigned>(i) * 40503u ^ salt * 97u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  return static_cast<float>(h % 20001u) * 1.37e-3f - 13.7f;
}

inline std::vector<float> inputs(int rank, std::size_t n, int salt = 0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value(rank, i, salt);
  return v;
}

// Expected all-reduce sum: left to right over ranks 0..n-1 in fp32, the order the Comm contract fixes.
inline float rank_order_sum(int n, std::size_t i, int salt = 0) {
  float acc = value(0, i, salt);
  for (int r = 1; r < n; ++r) acc += value(r, i, salt);
  return acc;
}

// Runs every collective once for each size on `comm`; CHECKs are bitwise (the contract is exact).
inline void check_all_collectives(rt::Comm& comm, const std::vector<std::size_t>& sizes) {
  const int n = comm.size(), r = comm.rank();
  for (std::size_t count : sizes) {
    CAPTURE(count);
    CAPTURE(n);
    // all_reduce sum and max: every element equals the rank-order fold of the inputs.
    auto a = inputs(r, count, 1);
    comm.all_reduce(a.data(), count, rt::ReduceOp::sum);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < count; ++i) bad += a[i] != rank_order_sum(n, i, 1);
    CHECK(bad == 0);
    auto m = inputs(r, count, 2);
    comm.all_reduce(m.data(), count, rt::ReduceOp::max);
    bad = 0;
    for (std::size_t i = 0; i < count; ++i) {
      float e = value(0, i, 2);
      for (int k = 1; k < n; ++k) e = std::max(e, value(k, i, 2));
      bad += m[i] != e;
    }
    CHECK(bad == 0);
    // all_gather: block k of the output is rank k's input.
    auto g_in = inputs(r, count, 3);
    std::vector<float> g_out(count * n, -1.0f);
    comm.all_gather(g_in.data(), g_out.data(), count);
    bad = 0;
    for (int k = 0; k < n; ++k)
      for (std::size_t i = 0; i < count; ++i) bad += g_out[k * count + i] != value(k, i, 3);
    CHECK(bad == 0);
    // reduce_scatter: rank r gets element j = r*count+i of the rank-order sum of the n*count inputs.
    auto rs_in = inputs(r, count * n, 4);
    std::vector<float> rs_out(count, -1.0f);
    comm.reduce_scatter(rs_in.data(), rs_out.data(), count);
    bad = 0;
    for (std::size_t i = 0; i < count; ++i) bad += rs_out[i] != rank_order_sum(n, r * count + i, 4);
    CHECK(bad == 0);
    // broadcast from the last rank: everybody ends with its input.
    int root = n - 1;
    auto b = inputs(r, count, 5);
    comm.broadcast(b.data(), count, root);
    bad = 0;
    for (std::size_t i = 0; i < count; ++i) bad += b[i] != value(root, i, 5);
    CHECK(bad == 0);
  }
  comm.barrier();
}

}  // namespace tessel::test
