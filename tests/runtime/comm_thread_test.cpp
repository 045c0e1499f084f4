// ThreadComm: every collective bitwise against independently computed expectations, sub-groups, randomized
// send/recv interleavings, and failures that must become CommError naming the rank within the timeout.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "util/error.hpp"
#include "runtime/comm/comm_bench.hpp"
#include "runtime/comm/thread_comm.hpp"
#include "tests/runtime/comm_cases.hpp"

using namespace tessel;
using namespace tessel::rt;

namespace {
const std::vector<std::size_t> kSizes = {0, 1, 2, 7, 33, 1000, 65537};
constexpr auto kShortTimeout = std::chrono::milliseconds(300);
}  // namespace

TEST_CASE("thread collectives match the rank-order expectation for every world and size") {
  for (int world : {1, 2, 3, 4, 5, 8}) {
    CAPTURE(world);
    run_threads(world, [](Comm& c) { test::check_all_collectives(c, kSizes); });
  }
}

TEST_CASE("a large all_reduce is bitwise identical across repeats") {
  // Expectation: the rank-order contract makes the result independent of thread timing, so two runs agree
  // bit for bit (and with test::rank_order_sum, checked above).
  const std::size_t n = 1 << 20;
  std::vector<float> first(n), second(n);
  for (auto* out : {&first, &second})
    run_threads(4, [&](Comm& c) {
      auto a = test::inputs(c.rank(), n, 9);
      c.all_reduce(a.data(), n);
      if (c.rank() == 2) *out = a;
    });
  CHECK(std::equal(first.begin(), first.end(), second.begin()));
}

TEST_CASE("split builds TP/DP sub-groups with MPI_Comm_split ordering") {
  // World 6 as tp=2 (consecutive ranks) x dp=3: tp group of world rank w is w/2, its rank w%2; the dp group
  // is w%2, its rank w/2. Collectives in each group only see that group's members.
  run_threads(6, [](Comm& w) {
    int r = w.rank();
    auto tp = w.split(r / 2, r % 2);
    auto dp = w.split(r % 2, r / 2);
    REQUIRE(tp);
    REQUIRE(dp);
    CHECK(tp->size() == 2);
    CHECK(tp->rank() == r % 2);
    CHECK(dp->size() == 3);
    CHECK(dp->rank() == r / 2);
    // all_reduce of the world rank over the tp group: (2*(r/2)) + (2*(r/2)+1) = 4*(r/2)+1.
    float x = static_cast<float>(r);
    tp->all_reduce(&x, 1);
    CHECK(x == static_cast<float>(4 * (r / 2) + 1));
    // over dp: (r%2) + (r%2+2) + (r%2+4) = 3*(r%2)+6.
    float y = static_cast<float>(r);
    dp->all_reduce(&y, 1);
    CHECK(y == static_cast<float>(3 * (r % 2) + 6));
    test::check_all_collectives(*tp, {0, 5, 1001});
    test::check_all_collectives(*dp, {0, 5, 1001});
    // Key reverses the order: rank 0 of the reversed group is the highest world rank; color -1 opts out.
    auto rev = w.split(r < 4 ? 0 : -1, -r);
    if (r < 4) {
      REQUIRE(rev);
      CHECK(rev->rank() == 3 - r);
    } else {
      CHECK(!rev);
    }
  });
}

TEST_CASE("send/recv is matched by (peer, tag) under randomized interleavings") {
  // Every rank sends one message per (peer, tag) for 3 tags in a shuffled order, then receives all of them
  // in another shuffled order. Payload = value(sender, i, salt=receiver*10+tag) with a size that depends on
  // the triple, so a mismatched match shows up as a wrong value or a size error.
  for (unsigned seed = 1; seed <= 20; ++seed) {
    run_threads(4, [seed](Comm& c) {
      int n = c.size(), r = c.rank();
      std::mt19937 rng(seed * 100 + r);
      std::vector<std::pair<int, int>> sends, recvs;
      for (int p = 0; p < n; ++p)
        for (int t = 0; t < 3; ++t) {
          sends.push_back({p, t});
          recvs.push_back({p, t});
        }
      std::shuffle(sends.begin(), sends.end(), rng);
      std::shuffle(recvs.begin(), recvs.end(), rng);
      auto len = [](int from, int to, int tag) { return static_cast<std::size_t>(1 + from * 31 + to * 7 + tag * 500); };
      for (auto [p, t] : sends) {
        auto msg = test::inputs(r, len(r, p, t), p * 10 + t);
        c.send(msg.data(), msg.size(), p, t);
        if (rng() % 3 == 0) std::this_thread::yield();
      }
      for (auto [p, t] : recvs) {
        std::vector<float> got(len(p, r, t));
        c.recv(got.data(), got.size(), p, t);
        CHECK(got == test::inputs(p, got.size(), r * 10 + t));
      }
    });
  }
}

TEST_CASE("messages with the same (peer, tag) arrive in send order") {
  run_threads(2, [](Comm& c) {
    if (c.rank() == 0)
      for (int i = 0; i < 100; ++i) {
        float v = static_cast<float>(i);
        c.send(&v, 1, 1, 7);
      }
    else
      for (int i = 0; i < 100; ++i) {
        float v = -1;
        c.recv(&v, 1, 0, 7);
        CHECK(v == static_cast<float>(i));
      }
  });
}

TEST_CASE("a rank that throws makes the others stop with CommError naming it") {
  // Rank 2 throws before the all_reduce the others wait in; run_threads rethrows rank 2's own error and the
  // others record CommError("rank 2 failed: ...") long before the 60 s default timeout.
  std::atomic<int> comm_errors{0};
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(run_threads(4, [&](Comm& c) {
    try {
      if (c.rank() == 2) throw InputError("bad shard on purpose");
      float x = 1;
      c.all_reduce(&x, 1);
    } catch (const CommError& e) {
      if (std::string(e.what()).find("rank 2 failed: bad shard on purpose") != std::string::npos) ++comm_errors;
      throw;
    }
  }), "bad shard on purpose", InputError);
  CHECK(comm_errors == 3);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("a rank that exits early is named by the ranks waiting for it") {
  // Rank 1 returns without joining the barrier; rank 0 waits in recv from rank 1, ranks 2, 3 in a barrier.
  std::atomic<int> named{0};
  CHECK_THROWS_AS(run_threads(4, [&](Comm& c) {
    try {
      if (c.rank() == 1) return;
      if (c.rank() == 0) {
        float x;
        c.recv(&x, 1, 1, 0);
      } else {
        c.barrier();
      }
    } catch (const CommError& e) {
      std::string w = e.what();
      if (w.find("rank 1") != std::string::npos && w.find("exited") != std::string::npos) ++named;
      throw;
    }
  }), CommError);
  CHECK(named >= 1);  // the first one named rank 1; the rest may report that first failure instead
}

TEST_CASE("a deadlock becomes a CommError after the timeout") {
  // Both ranks receive first: no message can ever arrive. With a 300 ms timeout the error names the peer.
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(run_threads(2, [](Comm& c) {
    float x;
    c.recv(&x, 1, 1 - c.rank(), 0);
  }, {kShortTimeout}), doctest::Contains("nothing arrived within 300 ms"), CommError);
  auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took >= kShortTimeout);
  CHECK(took < std::chrono::seconds(5));
}

TEST_CASE("mismatched collectives are reported, not executed") {
  CHECK_THROWS_WITH_AS(run_threads(2, [](Comm& c) {
    std::vector<float> v(8);
    if (c.rank() == 0) c.all_reduce(v.data(), 4);
    else c.all_gather(v.data(), v.data(), 4);
  }), doctest::Contains("collective mismatch"), CommError);
  CHECK_THROWS_WITH_AS(run_threads(2, [](Comm& c) {
    std::vector<float> v(8);
    c.all_reduce(v.data(), c.rank() == 0 ? 4 : 5);
  }), doctest::Contains("count=5"), CommError);
}

TEST_CASE("bench_collective rows follow the nccl-tests definitions") {
  // For all_gather on n=4 with count=1024 per rank: S = 1024*4*4 = 16384 bytes, algbw = S/t,
  // busbw = algbw * 3/4 (formulas.md). Times are positive and identical on all ranks (rank-averaged).
  run_threads(4, [](Comm& c) {
    auto rows = bench_collective(c, Collective::all_gather, {1024, 4096}, 1, 3);
    REQUIRE(rows.size() == 2);
    CHECK(rows[0].bytes == 16384);
    CHECK(rows[0].count == 1024);
    CHECK(rows[0].time_us > 0);
    constexpr double kRel = 1e-9;
    CHECK(rows[0].algbw_GBps == doctest::Approx(16384 / (rows[0].time_us * 1e-6) / 1e9).epsilon(kRel));
    CHECK(rows[0].busbw_GBps == doctest::Approx(rows[0].algbw_GBps * 0.75).epsilon(kRel));
    auto ar = bench_collective(c, Collective::all_reduce, {256}, 1, 2);
    CHECK(ar[0].bytes == 1024);
    CHECK(ar[0].busbw_GBps == doctest::Approx(ar[0].algbw_GBps * 1.5).epsilon(kRel));  // 2*(4-1)/4
    auto sr = bench_collective(c, Collective::send_recv, {100}, 0, 2);
    CHECK(sr[0].busbw_GBps == doctest::Approx(sr[0].algbw_GBps).epsilon(kRel));
  });
  CHECK_THROWS_AS(parse_collective("allreduce"), InputError);
  CHECK(parse_collective("reduce_scatter") == Collective::reduce_scatter);
}
