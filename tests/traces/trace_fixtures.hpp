// Small hand-made traces for the traces/ tests.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "traces/trace.hpp"

namespace tessel::test {

inline trace::OpEvent op(int rank, trace::Stream s, const std::string& kind, int stage, int mb, double start,
                         double dur) {
  trace::OpEvent e;
  e.rank = rank;
  e.stream = s;
  e.op = kind;
  e.name = kind + " s" + std::to_string(stage) + " mb" + std::to_string(mb);
  e.stage = stage;
  e.chunk = 0;
  e.mb = mb;
  e.layer_begin = stage * 2;
  e.layer_end = stage * 2 + 2;
  e.start_us = start;
  e.dur_us = dur;
  e.flops = 1.5e12;
  e.bytes = 3.0e6;
  return e;
}

// Two ranks, two stages, two micro-batches of a GPipe-like schedule: F takes 10 µs, B 20 µs, the
// activation send/recv 2 µs each on the pp stream (flow ids 1 and 2), and a memory counter per rank.
inline trace::Trace two_stage_trace() {
  using trace::Stream;
  trace::Trace t;
  auto& ev = t.events;
  ev.push_back(op(0, Stream::compute, "forward", 0, 0, 0, 10));
  ev.push_back(op(0, Stream::pp, "send", 0, 0, 10, 2));
  ev.push_back(op(0, Stream::compute, "forward", 0, 1, 10, 10));
  ev.push_back(op(0, Stream::pp, "send", 0, 1, 20, 2));
  ev.push_back(op(1, Stream::pp, "recv", 1, 0, 10, 2));
  ev.push_back(op(1, Stream::compute, "forward", 1, 0, 12, 10));
  ev.push_back(op(1, Stream::pp, "recv", 1, 1, 20, 2));
  ev.push_back(op(1, Stream::compute, "forward", 1, 1, 22, 10));
  ev.push_back(op(1, Stream::compute, "backward", 1, 0, 32, 20));
  ev.push_back(op(1, Stream::compute, "backward", 1, 1, 52, 20));
  ev.push_back(op(0, Stream::compute, "backward", 0, 0, 72, 20));
  ev.push_back(op(0, Stream::compute, "backward", 0, 1, 92, 20));
  ev[1].flow_id = 1;
  ev[4].flow_id = 1;
  ev[3].flow_id = 2;
  ev[6].flow_id = 2;
  ev[0].extra = nlohmann::json{{"note", "first"}};
  for (int r = 0; r < 2; ++r) {
    t.counters.push_back({r, "memory_GiB", 0, 1.0});
    t.counters.push_back({r, "memory_GiB", 20, 2.5});
    t.counters.push_back({r, "memory_GiB", 112, 1.0});
  }
  t.process_names[0] = "rank 0 (stage 0)";
  t.process_names[1] = "rank 1 (stage 1)";
  t.other_data = {{"model", {{"name", "tiny"}, {"layers", 4}}}, {"layout", {{"pp", 2}, {"tp", 1}}}, {"version", "test"}};
  return t;
}

// two_stage_trace as one training step of a run: each rank ends with its optimizer op (112..117 µs), and
// rank 0 then all-gathers parameters on the dp stream (117..120 µs), after the optimizer as ZeRO does.
// The step spans 0..120 µs.
inline trace::Trace one_step_trace() {
  using trace::Stream;
  trace::Trace t = two_stage_trace();
  for (int r = 0; r < 2; ++r) t.events.push_back(op(r, Stream::compute, "optimizer", -1, -1, 112, 5));
  t.events.push_back(op(0, Stream::dp, "dp_allgather", -1, -1, 117, 3));
  for (std::size_t i = t.events.size() - 3; i < t.events.size(); ++i) {
    t.events[i].chunk = t.events[i].layer_begin = t.events[i].layer_end = -1;  // whole-rank ops: no stage or layers
    t.events[i].name = t.events[i].op;
  }
  return t;
}

// A run of one_step_trace's step played once per factor: step k's times scaled by factors[k] (so its span is
// 120 * factors[k] µs), steps `gap_us` apart. Events by rank, then in time, as `tessel run` writes them.
inline trace::Trace multi_step_trace(const std::vector<double>& factors, double gap_us) {
  trace::Trace one = one_step_trace(), t = one;
  t.events.clear();
  t.counters.clear();
  double offset = 0;
  for (double f : factors) {
    const auto flow_base = static_cast<std::int64_t>(t.events.size());  // flow ids stay pairs, unique per step
    for (auto e : one.events) {
      e.start_us = offset + e.start_us * f;
      e.dur_us *= f;
      if (e.flow_id >= 0) e.flow_id += flow_base;
      t.events.push_back(e);
    }
    offset += 120 * f + gap_us;
  }
  std::stable_sort(t.events.begin(), t.events.end(), [](const trace::OpEvent& a, const trace::OpEvent& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.start_us < b.start_us;
  });
  return t;
}

inline std::string temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "tessel-traces-test";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

}  // namespace tessel::test

namespace tessel::test {

// A 1F1B pipeline (PipeDream-Flush) over p ranks and m micro-batches, played with fixed op times: F takes
// tf, B takes tb, each activation/gradient transfer tc on the pp stream; memory rises by one unit per
// forward in flight. Each stage runs p - s - 1 warm-up forwards, then alternates F and B, then drains.
inline trace::Trace one_f_one_b(int p, int m, double tf, double tb, double tc) {
  using trace::Stream;
  trace::Trace t;
  std::vector<std::vector<double>> f_end(p, std::vector<double>(m, -1)), b_end(p, std::vector<double>(m, -1));
  std::vector<std::vector<std::pair<char, int>>> order(p);
  for (int s = 0; s < p; ++s) {
    int warm = std::min(p - s - 1, m), nf = 0, nb = 0;
    for (; nf < warm; ++nf) order[s].push_back({'F', nf});
    while (nf < m) {
      order[s].push_back({'F', nf++});
      order[s].push_back({'B', nb++});
    }
    while (nb < m) order[s].push_back({'B', nb++});
  }
  std::vector<std::size_t> next(p, 0);
  std::vector<double> clock(p, 0), mem(p, 0);
  std::int64_t flow = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < order[s].size()) {
        auto [kind, mb] = order[s][next[s]];
        double ready = 0;
        if (kind == 'F' && s > 0) {
          if (f_end[s - 1][mb] < 0) break;
          ready = f_end[s - 1][mb] + tc;
        }
        if (kind == 'B' && s < p - 1) {
          if (b_end[s + 1][mb] < 0) break;
          ready = b_end[s + 1][mb] + tc;
        }
        double start = std::max(clock[s], ready);
        double dur = kind == 'F' ? tf : tb;
        t.events.push_back(op(s, Stream::compute, kind == 'F' ? "forward" : "backward", s, mb, start, dur));
        clock[s] = start + dur;
        (kind == 'F' ? f_end : b_end)[s][mb] = clock[s];
        mem[s] += kind == 'F' ? 1 : -1;
        t.counters.push_back({s, "memory_GiB", clock[s], mem[s]});
        int peer = kind == 'F' ? s + 1 : s - 1;
        if (peer >= 0 && peer < p) {
          auto send = op(s, Stream::pp, "send", s, mb, clock[s], tc);
          auto recv = op(peer, Stream::pp, "recv", peer, mb, clock[s], tc);
          send.flow_id = recv.flow_id = flow++;
          t.events.push_back(send);
          t.events.push_back(recv);
        }
        ++next[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s) t.process_names[s] = "rank " + std::to_string(s) + " (stage " + std::to_string(s) + ")";
  t.other_data = {{"model", {{"name", "tiny"}}}, {"layout", {{"pp", p}, {"mbs", 1}, {"m", m}}}, {"schedule", "1f1b"}};
  return t;
}

}  // namespace tessel::test
