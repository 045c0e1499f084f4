// Chrome trace JSON: write, read back, determinism, gzip, bad input, reading speed.
#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>

#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "tests/traces/trace_fixtures.hpp"
#include "traces/chrome.hpp"

using namespace tessel;
using namespace tessel::trace;

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

void write_gzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, text.data(), static_cast<unsigned>(text.size())) == static_cast<int>(text.size()));
  gzclose(f);
}

std::string error_of(const std::string& text) {
  try {
    parse_chrome_trace(text, "t.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("round trip keeps every field, the flows and the counters") {
  Trace t = test::two_stage_trace();
  std::string path = test::temp_path("roundtrip.json");
  write_chrome_trace(t, path);
  Trace r = read_chrome_trace(path);
  REQUIRE(r.events.size() == t.events.size());
  // Times are written with 3 decimals (1 ns); the fixture's times are whole µs, so they come back exactly.
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const auto& a = t.events[i];
    const auto& b = r.events[i];
    CHECK(a.rank == b.rank);
    CHECK(a.stream == b.stream);
    CHECK(a.name == b.name);
    CHECK(a.op == b.op);
    CHECK(a.stage == b.stage);
    CHECK(a.chunk == b.chunk);
    CHECK(a.mb == b.mb);
    CHECK(a.layer_begin == b.layer_begin);
    CHECK(a.layer_end == b.layer_end);
    CHECK(a.start_us == b.start_us);
    CHECK(a.dur_us == b.dur_us);
    CHECK(a.flops == b.flops);
    CHECK(a.bytes == b.bytes);
    CHECK(a.flow_id == b.flow_id);
    CHECK(a.extra == b.extra);
  }
  CHECK(r.counters.size() == t.counters.size());
  CHECK(r.counters[1].name == "memory_GiB");
  CHECK(r.counters[1].value == 2.5);
  CHECK(r.process_names == t.process_names);
  CHECK(r.other_data == t.other_data);
}

TEST_CASE("the same trace gives the same bytes, and the layout follows the contract") {
  Trace t = test::two_stage_trace();
  std::string a = to_chrome_json(t), b = to_chrome_json(t);
  CHECK(a == b);
  auto j = nlohmann::json::parse(a);
  REQUIRE(j.contains("otherData"));
  CHECK(j["otherData"]["layout"]["pp"] == 2);
  int flows_s = 0, flows_f = 0, thread_names = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "s") ++flows_s;
    if (e["ph"] == "f") {
      ++flows_f;
      CHECK(e["bp"] == "e");
    }
    if (e["ph"] == "M" && e["name"] == "thread_name") ++thread_names;
    if (e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == 1) CHECK(e["args"]["name"] == "rank 1 (stage 1)");
  }
  // Two send/recv pairs -> two s and two f; lanes with events: rank 0 {compute, pp}, rank 1 {compute, pp}.
  CHECK(flows_s == 2);
  CHECK(flows_f == 2);
  CHECK(thread_names == 4);
  // A version is added when the trace has none.
  t.other_data.erase("version");
  CHECK(nlohmann::json::parse(to_chrome_json(t))["otherData"]["version"].get<std::string>().rfind("tessel ", 0) == 0);
}

// A receiver posts its recv before the matching send starts (the CPU runtime's traces: most of them). The
// flow's end must not precede its start, else Perfetto drops the arrow (flow_end_without_start); it sits
// inside the recv slice, at the send's start when the recv began earlier.
TEST_CASE("a flow ends no earlier than it starts, inside the receiving slice") {
  Trace t;
  OpEvent send, recv, late;
  send.rank = 0, send.stream = Stream::pp, send.op = "send", send.name = "send", send.start_us = 100, send.dur_us = 5;
  recv.rank = 1, recv.stream = Stream::pp, recv.op = "recv", recv.name = "recv", recv.start_us = 40, recv.dur_us = 80;
  late = recv;
  late.start_us = 130;  // posted after the send began: its own start
  send.flow_id = recv.flow_id = 7;
  OpEvent send2 = send;
  send2.flow_id = late.flow_id = 8;
  t.events = {send, recv, send2, late};
  std::map<std::int64_t, double> s_ts;
  std::vector<std::pair<std::int64_t, double>> f_ts;
  const auto doc = nlohmann::json::parse(to_chrome_json(t));
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "s") s_ts[e["id"].get<std::int64_t>()] = e["ts"].get<double>();
    if (e["ph"] == "f") f_ts.emplace_back(e["id"].get<std::int64_t>(), e["ts"].get<double>());
  }
  REQUIRE(f_ts.size() == 2);
  for (const auto& f : f_ts) {
    CAPTURE(f.first);
    CHECK(s_ts.at(f.first) == doctest::Approx(100));
    CHECK(f.second == doctest::Approx(f.first == 7 ? 100 : 130));
  }
}

// Back-to-back slices stay back to back at the printed nanosecond: start 0.6 ns, 999.8 ns long, ends where
// the next begins (1000.4 ns). Rounded apart, ts 0.001 + dur 1.000 would end 1 ns into the next slice.
TEST_CASE("printed slices of one lane do not overlap by rounding") {
  Trace t;
  OpEvent a;
  a.rank = 0, a.stream = Stream::compute, a.op = "forward", a.name = "F", a.start_us = 0.0006, a.dur_us = 0.9998;
  OpEvent b = a;
  b.start_us = 1.0004;
  t.events = {a, b};
  const auto doc = nlohmann::json::parse(to_chrome_json(t));
  std::vector<std::pair<double, double>> x;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "X") x.emplace_back(e["ts"].get<double>(), e["dur"].get<double>());
  REQUIRE(x.size() == 2);
  CHECK(x[0].first + x[0].second <= x[1].first + 1e-9);
  CHECK(x[0].second == doctest::Approx(0.999));
}

// A V schedule's rank sends and receives at once on its pp stream: slices that overlap without nesting.
// Perfetto draws only nested slices on one thread, so they go to an overflow lane, and read back as pp.
// Slices with a flow nest with nothing (a flow binds to the innermost slice around its point): a send of
// the same span as another, or inside a longer slice, takes a lane of its own.
TEST_CASE("overlapping slices of one stream go to overflow lanes that nest and read back as their stream") {
  Trace t;
  OpEvent send, twin, recv, wait, inner, late;
  send.rank = 0, send.stream = Stream::pp, send.op = "send", send.name = "send", send.start_us = 10, send.dur_us = 20;
  twin = send, twin.name = "twin";                                                             // [10, 30) too
  recv = send, recv.op = "recv", recv.name = "recv", recv.start_us = 20, recv.dur_us = 30;    // [20, 50): partial
  wait = send, wait.op = "wait", wait.name = "wait", wait.start_us = 60, wait.dur_us = 30;    // [60, 90), no flow
  inner = wait, inner.name = "inner", inner.start_us = 65, inner.dur_us = 5;                 // in wait, no flow
  late = send, late.name = "late", late.start_us = 70, late.dur_us = 10;                      // in wait, a flow
  send.flow_id = 3, recv.flow_id = 4, late.flow_id = 5, twin.flow_id = 6;
  t.events = {recv, send, twin, wait, inner, late};
  for (std::int64_t id : {3, 4, 5, 6}) {  // each flow's other end on rank 1, one after another
    OpEvent peer = recv;
    peer.rank = 1, peer.name = "peer" + std::to_string(id), peer.start_us = 100.0 + 10.0 * static_cast<double>(id);
    peer.dur_us = 5, peer.flow_id = id;
    t.events.push_back(peer);
  }
  const auto doc = nlohmann::json::parse(to_chrome_json(t));
  std::map<std::string, int> tid_of;
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> slices;
  std::map<std::pair<int, int>, std::string> lane_names;
  std::vector<std::pair<int, int>> flow_lanes;
  for (const auto& e : doc["traceEvents"]) {
    const std::pair<int, int> lane{e["pid"].get<int>(), e.value("tid", -1)};
    if (e["ph"] == "X") {
      tid_of[e["name"].get<std::string>() + "@" + std::to_string(lane.first)] = lane.second;
      slices[lane].emplace_back(e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>());
    }
    if (e["ph"] == "M" && e["name"] == "thread_name") lane_names[lane] = e["args"]["name"].get<std::string>();
    if (e["ph"] == "s" || e["ph"] == "f") flow_lanes.push_back(lane);
  }
  // The earliest slice keeps the stream's lane; its twin and the partially overlapping recv go to overflow
  // lanes; slices without flows nest; a flow slice inside one does not.
  CHECK(tid_of.at("send@0") == 2);
  CHECK(tid_of.at("twin@0") == 2 + kNumStreams);
  CHECK(tid_of.at("recv@0") == 2 + 2 * kNumStreams);
  CHECK(tid_of.at("wait@0") == 2);
  CHECK(tid_of.at("inner@0") == 2);
  CHECK(tid_of.at("late@0") == 2 + kNumStreams);
  CHECK(tid_of.at("peer3@1") == 2);
  CHECK(lane_names.at({0, 2}) == "pp");
  CHECK(lane_names.at({0, 2 + kNumStreams}) == "pp #2");
  CHECK(lane_names.at({0, 2 + 2 * kNumStreams}) == "pp #3");
  // Every lane nests: two slices are disjoint or one holds the other.
  for (const auto& lane_slices : slices) {
    const auto& xs = lane_slices.second;
    for (std::size_t a = 0; a < xs.size(); ++a)
      for (std::size_t b = a + 1; b < xs.size(); ++b) {
        const auto x = xs[a], y = xs[b];
        const bool disjoint = x.second <= y.first || y.second <= x.first;
        const bool nested = (x.first <= y.first && y.second <= x.second) || (y.first <= x.first && x.second <= y.second);
        CAPTURE(lane_slices.first.second);
        CHECK((disjoint || nested));
      }
  }
  // Flow points sit on the lanes of their slices: send's on pp, twin's and late's on pp #2, recv's on pp #3.
  for (const auto& l : flow_lanes) CHECK(lane_names.count(l) == 1);
  CHECK(std::count(flow_lanes.begin(), flow_lanes.end(), std::pair<int, int>{0, 2}) == 1);
  CHECK(std::count(flow_lanes.begin(), flow_lanes.end(), std::pair<int, int>{0, 2 + kNumStreams}) == 2);
  // Read back, the overflow lane is the pp stream again.
  Trace r = parse_chrome_trace(to_chrome_json(t), "lanes.json");
  REQUIRE(r.events.size() == t.events.size());
  for (std::size_t i = 0; i < r.events.size(); ++i) {
    CAPTURE(t.events[i].name);
    CHECK(r.events[i].stream == Stream::pp);
    CHECK(r.events[i].name == t.events[i].name);
    CHECK(r.events[i].flow_id == t.events[i].flow_id);  // every flow binds to its own slice
  }
}

// Flows bind to the slice they sit in on their own lane: an overflow lane's, the innermost of nested ones,
// and one at its slice's very end (ts + dur summed in binary falls half a nanosecond short of the printed
// end: 418003.110 + 8.643 < 418011.753).
TEST_CASE("flows bind on their lane: overflow lanes, nested slices, a slice's end") {
  Trace t;
  OpEvent send, recv, peer_recv, peer_send;
  send.rank = 0, send.stream = Stream::pp, send.op = "send", send.name = "send", send.start_us = 10, send.dur_us = 20;
  recv = send, recv.op = "recv", recv.name = "recv", recv.start_us = 20, recv.dur_us = 30;  // overflow lane
  peer_recv = recv, peer_recv.rank = 1, peer_recv.start_us = 0, peer_recv.dur_us = 100;
  peer_send = send, peer_send.rank = 1, peer_send.start_us = 15, peer_send.dur_us = 3;      // nested in peer_recv
  send.flow_id = peer_recv.flow_id = 3;
  recv.flow_id = peer_send.flow_id = 4;
  t.events = {send, recv, peer_recv, peer_send};
  Trace r = parse_chrome_trace(to_chrome_json(t), "flows.json");
  REQUIRE(r.events.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    CAPTURE(t.events[i].name);
    CHECK(r.events[i].flow_id == t.events[i].flow_id);
  }
  // peer_recv's flow end sits at the send's start (10), before peer_send began: it binds to the outer
  // slice; a flow end at 19, after peer_send ended, too (not "outside every slice").
  const std::string ok = R"(,"args":{"op":"recv"}})";
  const std::string outer = R"({"ph":"X","name":"outer","pid":1,"tid":2,"ts":0,"dur":100)" + ok;
  const std::string inner = R"({"ph":"X","name":"inner","pid":1,"tid":2,"ts":15,"dur":3)" + ok;
  const std::string sender = R"({"ph":"X","name":"s","pid":0,"tid":2,"ts":19,"dur":1,"args":{"op":"send"}})";
  const Trace nested = parse_chrome_trace("[" + outer + "," + inner + "," + sender +
                                              R"(,{"ph":"s","id":9,"name":"p2p","cat":"flow","pid":0,"tid":2,"ts":19})"
                                              R"(,{"ph":"f","bp":"e","id":9,"name":"p2p","cat":"flow","pid":1,"tid":2,"ts":19}])",
                                          "nested.json");
  CHECK(nested.events[0].flow_id == 9);
  CHECK(nested.events[1].flow_id == -1);
  const std::string edge = R"([{"ph":"X","name":"r","pid":2,"tid":2,"ts":418003.110,"dur":8.643,"args":{"op":"recv"}},)"
                           R"({"ph":"X","name":"s","pid":0,"tid":2,"ts":418011.753,"dur":1,"args":{"op":"send"}},)"
                           R"({"ph":"s","id":1,"name":"p2p","cat":"flow","pid":0,"tid":2,"ts":418011.753},)"
                           R"({"ph":"f","bp":"e","id":1,"name":"p2p","cat":"flow","pid":2,"tid":2,"ts":418011.753}])";
  CHECK(parse_chrome_trace(edge, "edge.json").events[0].flow_id == 1);
}

TEST_CASE("gzip-compressed traces and bare arrays are read") {
  Trace t = test::two_stage_trace();
  std::string path = test::temp_path("trace.json.gz");
  write_gzip(path, to_chrome_json(t));
  CHECK(read_chrome_trace(path).events.size() == t.events.size());
  // The name does not decide: a gzip file named .json is read as gzip too.
  std::string plain_name = test::temp_path("gz-named-plain.json");
  write_gzip(plain_name, to_chrome_json(t));
  CHECK(read_chrome_trace(plain_name).events.size() == t.events.size());

  auto j = nlohmann::json::parse(to_chrome_json(t));
  Trace bare = parse_chrome_trace(j["traceEvents"].dump(), "bare.json");
  CHECK(bare.events.size() == t.events.size());
  CHECK(bare.other_data.empty());
}

TEST_CASE("bad input is refused with the file and the rule") {
  CHECK(error_of("hello").find("t.json:1:1: malformed JSON") != std::string::npos);
  CHECK(error_of("").find("malformed JSON") != std::string::npos);
  CHECK(error_of("[]").find("empty trace: the trace has no events") != std::string::npos);
  CHECK(error_of(R"({"traceEvents":[]})").find("empty trace") != std::string::npos);
  CHECK(error_of(R"({"foo":1})").find("not a Chrome trace: the top-level object has no traceEvents array (keys: foo)") != std::string::npos);
  CHECK(error_of("42").find("not a Chrome trace") != std::string::npos);
  CHECK(error_of(R"({"traceEvents":{}})").find("traceEvents must be an array") != std::string::npos);
  CHECK(error_of("[1,2]").find("traceEvents[0]: each event must be a JSON object") != std::string::npos);
  // Events that are not ops (no args.op): a foreign Chrome trace.
  CHECK(error_of(R"([{"ph":"X","name":"a","pid":0,"tid":0,"ts":0,"dur":1}])").find("none of its 1 events is an op") != std::string::npos);
  // A Kineto-looking trace is named as such.
  CHECK(error_of(R"({"schemaVersion":1,"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":0,"dur":1}]})")
            .find("looks like a PyTorch profiler trace") != std::string::npos);
  const std::string ok = R"("args":{"op":"forward"})";
  CHECK(error_of(R"([{"ph":"X","name":"a","pid":10000000,"tid":0,"ts":0,"dur":1,)" + ok + "}]")
            .find("traceEvents[0]: pid 10000000 is not a rank: must be in [0, 1048576)") != std::string::npos);
  CHECK(error_of(R"([{"ph":"X","name":"a","pid":0,"tid":1280,"ts":0,"dur":1,)" + ok + "}]").find("tid 1280 is not a stream") != std::string::npos);
  CHECK(error_of(R"([{"ph":"X","name":"a","pid":0,"tid":0,"ts":0,)" + ok + "}]").find("without dur") != std::string::npos);
  CHECK(error_of(R"([{"ph":"X","name":"a","pid":0,"tid":0,"ts":0,"dur":-3,)" + ok + "}]").find("negative dur") != std::string::npos);
  CHECK(error_of(R"([{"ph":"X","name":"a","pid":0,"tid":0,"ts":"0","dur":1,)" + ok + "}]").find("traceEvents[0]: ts must be a number, got string") != std::string::npos);
  CHECK(error_of(R"([{"ph":"X","name":"a","pid":0,"tid":0,"ts":0,"dur":1,"args":{"op":"forward","stage":"x"}}])")
            .find("args.stage must be an integer") != std::string::npos);
  CHECK(error_of(R"([{"ph":"X","name":"a","pid":0,"tid":0,"ts":0,"dur":1,"args":{"op":"forward","layers":[1]}}])")
            .find("args.layers must be [begin, end]") != std::string::npos);
}

TEST_CASE("files: missing, corrupt gzip, unwritable output") {
  CHECK_THROWS_WITH_AS(read_chrome_trace("/nonexistent/x.json"), doctest::Contains("/nonexistent/x.json: cannot open"), InputError);
  std::string path = test::temp_path("corrupt.json.gz");
  write_text(path, std::string("\x1f\x8b\x08\x00garbage-not-deflate", 24));
  CHECK_THROWS_WITH_AS(read_chrome_trace(path), doctest::Contains("corrupt or truncated gzip"), InputError);
  CHECK_THROWS_AS(write_chrome_trace(test::two_stage_trace(), "/nonexistent-dir/out.json"), InputError);
}

TEST_CASE("a large trace reads back whole") {
  // 300,000 ops on 64 ranks round-trip through the SAX reader. Its speed is measured by
  // tests/bench/trace_read_bench.cpp (a benchmark, not a timed test).
  Trace t;
  for (int i = 0; i < 300000; ++i) {
    t.events.push_back(test::op(i % 64, Stream::compute, i % 2 ? "forward" : "backward", i % 8, i / 64, i * 1.5, 1.0));
  }
  const std::string text = to_chrome_json(t);
  const Trace r = parse_chrome_trace(text, "big.json");
  REQUIRE(r.events.size() == t.events.size());
  CHECK(r.events.back().start_us == doctest::Approx(t.events.back().start_us));
  CHECK(r.events.back().rank == t.events.back().rank);
}
