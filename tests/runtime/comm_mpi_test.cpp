// MpiComm under mpirun (see comm_mpi_test.sh): the same collective checks as the thread backend, split,
// tagged send/recv, and the bits of a rank-order all_reduce equal to the thread backend's expectation.
// `comm_mpi_test --fail-rank R` instead makes rank R throw, to check that the job ends with a message
// naming R instead of hanging.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "runtime/comm/mpi_comm.hpp"
#include "tests/runtime/comm_cases.hpp"

using namespace tessel;
using namespace tessel::rt;

namespace {
Comm* g_comm = nullptr;
}

TEST_CASE("mpi collectives match the rank-order expectation") {
  test::check_all_collectives(*g_comm, {0, 1, 2, 7, 33, 1000, 65537});
}

TEST_CASE("mpi split and tagged send/recv") {
  Comm& w = *g_comm;
  int r = w.rank(), n = w.size();
  auto half = w.split(r % 2, r);
  REQUIRE(half);
  CHECK(half->rank() == r / 2);
  test::check_all_collectives(*half, {0, 3, 1001});
  // Ring: each rank sends 2 tagged messages to the next rank, receives them from the previous one in the
  // opposite tag order; tag matching must deliver each to the right buffer.
  int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int t = 0; t < 2; ++t) {
    auto m = test::inputs(r, 10 + t, t);
    w.send(m.data(), m.size(), next, t);
  }
  for (int t = 1; t >= 0; --t) {
    std::vector<float> got(10 + t);
    w.recv(got.data(), got.size(), prev, t);
    CHECK(got == test::inputs(prev, 10 + t, t));
  }
  w.barrier();
}

int main(int argc, char** argv) {
  int fail_rank = -1;
  if (argc == 3 && std::strcmp(argv[1], "--fail-rank") == 0) fail_rank = std::atoi(argv[2]);
  int result = 0;
  run_mpi([&](Comm& comm) {
    g_comm = &comm;
    if (fail_rank >= 0) {
      if (comm.rank() == fail_rank) throw std::runtime_error("injected failure");
      float x = 1;
      comm.all_reduce(&x, 1);  // never completes: the failed rank aborts the job
      return;
    }
    doctest::Context ctx;
    if (comm.rank() != 0) ctx.setOption("out", "/dev/null");  // one report, from rank 0
    result = ctx.run();
    // Every rank must agree that all passed: a failure anywhere fails the job.
    float bad = result != 0;
    comm.all_reduce(&bad, 1, ReduceOp::max);
    result = bad != 0;
  });
  return result;
}
