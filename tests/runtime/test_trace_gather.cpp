// gather_trace: every rank's events, counters and process names reach rank 0 intact over a Comm (the
// path `tessel run --trace` takes under mpirun; here over the thread backend, which has the same
// send/recv semantics).
#include <doctest/doctest.h>

#include <mutex>

#include "runtime/comm/thread_comm.hpp"
#include "runtime/trace_gather.hpp"

using namespace tessel;

namespace {

// Rank r's part: r + 1 events with every field set to a value derived from (r, i), one counter, a name.
trace::Trace part_of(int r) {
  trace::Trace t;
  for (int i = 0; i <= r; ++i) {
    trace::OpEvent e;
    e.rank = r;
    e.stream = i % 2 ? trace::Stream::pp : trace::Stream::tp;
    e.name = "F s" + std::to_string(r) + " mb" + std::to_string(i);
    e.op = i % 2 ? "send" : "tp_allreduce";
    e.stage = r;
    e.chunk = i;
    e.mb = 10 * r + i;
    e.layer_begin = r;
    e.layer_end = r + 2;
    e.start_us = 0.1 * r + 1e-7 * i;  // not representable in 3 decimals: must survive bit-exactly
    e.dur_us = 1.0 / 3.0;
    e.flops = 1e12 + r;
    e.bytes = 4096.0 * i;
    e.flow_id = r * 100 + i;
    if (i == 1) e.extra = {{"note", "x"}};
    t.events.push_back(e);
  }
  t.counters.push_back({r, "peak_activation_MiB", 0.0, 0.5 * r});
  t.process_names[r] = "rank " + std::to_string(r) + " (stage " + std::to_string(r) + ")";
  return t;
}

}  // namespace

TEST_CASE("encode/decode round-trips every field") {
  const trace::Trace t = part_of(3);
  const trace::Trace back = rt::decode_trace(rt::encode_trace(t));
  REQUIRE(back.events.size() == t.events.size());
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const auto &a = t.events[i], &b = back.events[i];
    CHECK(a.rank == b.rank);
    CHECK(a.stream == b.stream);
    CHECK(a.name == b.name);
    CHECK(a.op == b.op);
    CHECK((a.stage == b.stage && a.chunk == b.chunk && a.mb == b.mb && a.layer_begin == b.layer_begin &&
           a.layer_end == b.layer_end));
    CHECK((a.start_us == b.start_us && a.dur_us == b.dur_us && a.flops == b.flops && a.bytes == b.bytes));
    CHECK(a.flow_id == b.flow_id);
    CHECK(a.extra == b.extra);
  }
  CHECK(back.process_names == t.process_names);
  CHECK(back.counters.size() == 1u);
  // A truncated encoding is an error, not a short trace.
  std::string cut = rt::encode_trace(t);
  cut.resize(cut.size() - 3);
  CHECK_THROWS(rt::decode_trace(cut));
}

TEST_CASE("gather_trace: rank 0 gets all four ranks' parts in rank order, the others nothing") {
  // Expected on rank 0: 1 + 2 + 3 + 4 = 10 events, ranks non-decreasing, 4 counters and 4 names.
  std::mutex mu;
  trace::Trace at0;
  std::size_t others = 0;
  rt::run_threads(4, [&](rt::Comm& world) {
    trace::Trace g = rt::gather_trace(world, part_of(world.rank()));
    std::lock_guard<std::mutex> lk(mu);
    if (world.rank() == 0) at0 = std::move(g);
    else others += g.events.size() + g.process_names.size();
  });
  CHECK(others == 0u);
  REQUIRE(at0.events.size() == 10u);
  for (std::size_t i = 1; i < at0.events.size(); ++i) CHECK(at0.events[i - 1].rank <= at0.events[i].rank);
  CHECK(at0.events.back().name == "F s3 mb3");
  CHECK(at0.counters.size() == 4u);
  CHECK(at0.process_names.size() == 4u);
  CHECK(at0.process_names.at(2) == "rank 2 (stage 2)");
}
