// compare_traces: alignment by identity, errors, per-rank stats, ops in one trace only, otherData diffs.
#include <doctest/doctest.h>

#include "tests/traces/trace_fixtures.hpp"
#include "traces/compare.hpp"

using namespace tessel;
using namespace tessel::trace;

namespace {

constexpr double kTol = 1e-9;

// B differs from A (two_stage_trace) by: rank 0 backward mb1 20 -> 30 µs, rank 1 backward mb1 20 -> 22 µs,
// no rank 1 forward mb1, an extra optimizer op on rank 0 (112..117), and layout.pp 2 -> 4.
Trace modified(const Trace& a) {
  Trace b = a;
  b.events[11].dur_us = 30;
  b.events[9].dur_us = 22;
  b.events.erase(b.events.begin() + 7);
  b.events.push_back(test::op(0, Stream::compute, "optimizer", 0, -1, 112, 5));
  b.other_data["layout"]["pp"] = 4;
  return b;
}

const OpKindStats& kind(const Comparison& c, const std::string& op) {
  for (const auto& k : c.kinds) {
    if (k.op == op) return k;
  }
  FAIL("no op kind " << op);
  return c.kinds.front();
}

}  // namespace

TEST_CASE("percentile by nearest rank") {
  // Nearest rank: the ceil(p * n)-th smallest. n = 4: p50 -> 2nd, p90 -> ceil(3.6) = 4th.
  CHECK(percentile({50, 0, 10, 0}, 0.5) == 0);
  CHECK(percentile({50, 0, 10, 0}, 0.9) == 50);
  CHECK(percentile({7}, 0.9) == 7);
}

TEST_CASE("identical traces: zero error everywhere") {
  Trace a = test::two_stage_trace();
  Comparison c = compare_traces(a, a);
  CHECK(c.matched == a.events.size());
  CHECK(c.step_error_pct == 0);
  CHECK(c.unmatched_a.empty());
  CHECK(c.unmatched_b.empty());
  CHECK(c.meta_diffs.empty());
}

TEST_CASE("differences are found, measured and attributed") {
  Trace a = test::two_stage_trace();
  Trace b = modified(a);
  Comparison c = compare_traces(a, b);
  // A spans 0..112 µs; B's last op, rank 0 backward mb1, ends at 92 + 30 = 122 µs.
  CHECK(c.step_a_us == doctest::Approx(112).epsilon(kTol));
  CHECK(c.step_b_us == doctest::Approx(122).epsilon(kTol));
  // (122 - 112) / 112 = 8.928571...%
  CHECK(c.step_error_pct == doctest::Approx(10.0 / 112 * 100).epsilon(kTol));
  // 12 ops in A, 11 of them in B (rank 1 forward mb1 removed).
  CHECK(c.matched == 11);
  REQUIRE(c.unmatched_a.size() == 1);
  CHECK(a.events[c.unmatched_a[0]].op == "forward");
  REQUIRE(c.only_in_b.size() == 1);
  CHECK(c.only_in_b[0].op == "optimizer");
  // Backward errors: 0, +10% (22 vs 20), 0, +50% (30 vs 20) -> median (2nd of 4) 0, p90 (4th) 50.
  const auto& bw = kind(c, "backward");
  CHECK(bw.matched == 4);
  CHECK(bw.median_error_pct == doctest::Approx(0));
  CHECK(bw.p90_abs_error_pct == doctest::Approx(50));
  CHECK(bw.total_a_us == doctest::Approx(80));
  CHECK(bw.total_b_us == doctest::Approx(92));
  CHECK(kind(c, "forward").matched == 3);
  // The largest contributor: rank 0 backward mb1, +10 µs.
  REQUIRE(!c.top.empty());
  CHECK(a.events[c.top[0].a].rank == 0);
  CHECK(a.events[c.top[0].a].mb == 1);
  CHECK(c.top[0].delta_us == doctest::Approx(10));
  REQUIRE(c.meta_diffs.size() == 1);
  CHECK(c.meta_diffs[0].path == "/layout/pp");
  CHECK(c.meta_diffs[0].a == "2");
  CHECK(c.meta_diffs[0].b == "4");
  auto j = to_json(c, a, b);
  CHECK(j["step_us"]["b"] == 122.0);
  CHECK(j["only_in"]["b"][0]["op"] == "optimizer");
}

TEST_CASE("per-rank busy, bubble and exposed communication") {
  Trace a = test::two_stage_trace();
  auto rs = rank_stats(a);
  REQUIRE(rs.size() == 2);
  // Rank 0 computes F 0-10, F 10-20, B 72-92, B 92-112: busy 60 of the 112 µs step. Its sends run 10-12
  // (under F mb1) and 20-22 (nothing computes): comm 4, exposed 2. Idle: 112 - 60 - 2 = 50 (simulate's bubble).
  CHECK(rs[0].busy_us == doctest::Approx(60));
  CHECK(rs[0].bubble_us == doctest::Approx(50));
  CHECK(rs[0].comm_us == doctest::Approx(4));
  CHECK(rs[0].exposed_comm_us == doctest::Approx(2));
  // Rank 1 computes 12-22, 22-32, 32-52, 52-72 = 60; its recvs 10-12 and 20-22: 10-12 exposed, 20-22 under F.
  CHECK(rs[1].busy_us == doctest::Approx(60));
  CHECK(rs[1].exposed_comm_us == doctest::Approx(2));
}

TEST_CASE("repeated identities align in order") {
  Trace a;
  a.events.push_back(test::op(0, Stream::tp, "tp_allreduce", 0, 0, 0, 1));
  a.events.push_back(test::op(0, Stream::tp, "tp_allreduce", 0, 0, 5, 2));
  Trace b = a;
  b.events[1].dur_us = 4;
  Comparison c = compare_traces(a, b);
  CHECK(c.matched == 2);
  // First pair 1 vs 1 (0%), second 2 vs 4 (+100%): median (1st of 2) 0, p90 (2nd) 100.
  CHECK(kind(c, "tp_allreduce").p90_abs_error_pct == doctest::Approx(100));
}

namespace {

// A simulated-like trace whose ranks are 0 and 2 (two_stage_trace's rank 1 renamed 2, as the simulator
// keeps one rank per tp group of a tp2 layout), and a measured-like one with ranks 0..3: ranks 0 and 2 as
// A's, rank 2's backward mb1 20 -> 25 µs (busy 60 -> 65), and ranks 1 and 3 computing at half the durations
// of ranks 0 and 2 (busy 30 each).
std::pair<Trace, Trace> folded_and_full() {
  Trace a = test::two_stage_trace();
  for (auto& e : a.events) e.rank = e.rank == 1 ? 2 : e.rank;
  a.process_names = {{0, "rank 0 (stage 0)"}, {2, "rank 2 (stage 1)"}};
  a.other_data["tp_folded"] = "each rank stands for its 2 tp ranks";
  Trace b = a;
  b.other_data.erase("tp_folded");
  for (const auto& e : a.events) {
    if (e.stream != Stream::compute) continue;
    auto peer = e;
    peer.rank = e.rank + 1;
    peer.dur_us = e.dur_us / 2;
    b.events.push_back(peer);
  }
  for (auto& e : b.events) {
    if (e.rank == 2 && e.op == "backward" && e.mb == 1) e.dur_us = 25;
  }
  return {a, b};
}

}  // namespace

TEST_CASE("per-rank statistics pair by rank id; ranks without a counterpart are listed") {
  const auto traces = folded_and_full();  // no structured binding: CHECK's lambdas cannot take one (clang 14)
  const Trace& a = traces.first;
  const Trace& b = traces.second;
  Comparison c = compare_traces(a, b);
  REQUIRE(c.ranks_b.size() == 4);
  CHECK(c.ranks_only_in_b == std::vector<int>{1, 3});
  CHECK(c.ranks_only_in_a.empty());
  CHECK(c.ranks_b[2].rank == 2);
  CHECK(c.ranks_b[2].busy_us == doctest::Approx(65));  // 12-22, 22-32, 32-52, 52-77
  CHECK(c.ranks_b[1].busy_us == doctest::Approx(30));  // 0-5, 10-15, 72-82, 92-102
  auto j = to_json(c, a, b);
  CHECK(j["ranks"]["only_in_b"] == nlohmann::json::array({1, 3}));
  CHECK(j["ranks"]["only_in_a"] == nlohmann::json::array());
  // Swapped: A holds the ranks B lacks.
  CHECK(compare_traces(b, a).ranks_only_in_a == std::vector<int>{1, 3});
}

namespace {

// A data-parallel collective as both sides record it: no stage, chunk, micro-batch or layers.
OpEvent dp_op(int rank, const std::string& kind, double start, double dur, double bytes) {
  OpEvent e = test::op(rank, Stream::dp, kind, -1, -1, start, dur);
  e.name = kind;
  e.chunk = e.layer_begin = e.layer_end = -1;
  e.bytes = bytes;
  return e;
}

}  // namespace

TEST_CASE("dp collectives split differently by the two sides are merged per rank, then paired") {
  // A (simulated): rank 0 reduces its gradients in one dp_reducescatter of 1000 bytes, 40 µs. B (measured):
  // three per-group ones of 600, 100 and 300 bytes taking 10, 5 and 15 µs: 1000 bytes, 30 µs in all, so the
  // merged pair is 40 -> 30 µs, -25%. Pairing one to one instead gave 40 -> 10 µs (-75%) and two ops "only
  // in B". Rank 0's dp_allgather is one op on both sides (50 -> 60 µs, +20%) and stays one to one; so do
  // rank 1's two dp_allreduce each side (20 -> 22 and 30 -> 27 µs).
  Trace a, b;
  a.events = {dp_op(0, "dp_reducescatter", 0, 40, 1000), dp_op(0, "dp_allgather", 100, 50, 1000),
              dp_op(1, "dp_allreduce", 0, 20, 500), dp_op(1, "dp_allreduce", 50, 30, 500)};
  b.events = {dp_op(0, "dp_reducescatter", 0, 10, 600), dp_op(0, "dp_reducescatter", 12, 5, 100),
              dp_op(0, "dp_reducescatter", 20, 15, 300), dp_op(0, "dp_allgather", 100, 60, 1000),
              dp_op(1, "dp_allreduce", 0, 22, 500), dp_op(1, "dp_allreduce", 50, 27, 500)};
  Comparison c = compare_traces(a, b);
  CHECK(c.unmatched_a.empty());
  CHECK(c.unmatched_b.empty());
  CHECK(c.matched == 4);  // the merged reduce-scatter, the all-gather, the two all-reduces
  const OpKindStats& rs = kind(c, "dp_reducescatter");
  CHECK(rs.matched == 1);
  CHECK(rs.total_a_us == doctest::Approx(40).epsilon(kTol));
  CHECK(rs.total_b_us == doctest::Approx(30).epsilon(kTol));
  CHECK(rs.median_error_pct == doctest::Approx(-25).epsilon(kTol));
  CHECK(kind(c, "dp_allgather").median_error_pct == doctest::Approx(20).epsilon(kTol));
  CHECK(kind(c, "dp_allreduce").matched == 2);
  REQUIRE(c.merged.size() == 1);
  CHECK(c.merged[0].rank == 0);
  CHECK(c.merged[0].op == "dp_reducescatter");
  CHECK(c.merged[0].ops_a == 1);
  CHECK(c.merged[0].ops_b == 3);
  CHECK(c.merged[0].bytes_a == doctest::Approx(1000).epsilon(kTol));
  CHECK(c.merged[0].bytes_b == doctest::Approx(1000).epsilon(kTol));
  // The largest difference is the merged pair's -10 µs, shown with both sides' sums.
  REQUIRE(!c.top.empty());
  CHECK(c.top.front().a_us == doctest::Approx(40).epsilon(kTol));
  CHECK(c.top.front().b_us == doctest::Approx(30).epsilon(kTol));
  const nlohmann::json j = to_json(c, a, b);
  CHECK(j["merged_collectives"].size() == 1);
  CHECK(j["merged_collectives"][0]["ops_b"] == 3);
  CHECK(j["top_contributors"][0]["b_us"].get<double>() == doctest::Approx(30).epsilon(kTol));

  // Counts that agree keep exact pairing: nothing merged, each of B's reduce-scatters with its own.
  Trace a3 = b;
  c = compare_traces(a3, b);
  CHECK(c.merged.empty());
  CHECK(kind(c, "dp_reducescatter").matched == 3);
  // A kind on one side only is not merged: it is "only in B".
  Trace a_none = a;
  a_none.events.erase(a_none.events.begin());
  c = compare_traces(a_none, b);
  CHECK(c.merged.empty());
  CHECK(c.unmatched_b.size() == 3);
}
