#include "sim/engine/simulator.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace tessel::engine {

Simulator::Simulator(const TaskGraph& g) : g_(g), streams_(g), network_(g) {}

void Simulator::memory_change(std::int32_t pos, double delta, double now, RunResult& r, bool timeline) {
  if (pos < 0 || delta == 0) return;
  double& h = held_[static_cast<std::size_t>(pos)];
  h += delta;
  if (h > r.peak_bytes[static_cast<std::size_t>(pos)]) {
    r.peak_bytes[static_cast<std::size_t>(pos)] = h;
    r.peak_time[static_cast<std::size_t>(pos)] = now;
  }
  if (timeline) r.memory.push_back({now, pos, h});
}

void Simulator::comm_on_positions(std::uint32_t flow, int delta, double now) {
  const auto P = static_cast<std::uint32_t>(g_.link_positions);
  for (std::uint32_t link : g_.links_of(flow)) {
    if (link >= 2 * P) continue;  // a pod's core link belongs to no position
    const std::uint32_t pos = link % P;
    if (stamp_[pos] == flow + 1) continue;  // the flow's NVLink and NIC of one position count once
    stamp_[pos] = flow + 1;
    streams_.comm_changed(static_cast<int>(pos), delta, now);
  }
  for (std::uint32_t link : g_.links_of(flow))
    if (link < 2 * P) stamp_[link % P] = 0;
}

void Simulator::begin(std::uint32_t t, double now, RunResult& r, bool timeline) {
  r.start[t] = now;
  ++r.events;
  memory_change(g_.mem_pos[t], g_.mem_at_start[t], now, r, timeline);
  if (g_.kind[t] == TaskKind::flow) {
    network_.start(t, now);
    if (!stamp_.empty()) comm_on_positions(t, +1, now);
  } else {
    streams_.start(t, now);
  }
}

void Simulator::finish(std::uint32_t t, double now, RunResult& r, bool timeline) {
  r.end[t] = now;
  ++r.events;
  memory_change(g_.mem_pos[t], g_.mem_at_end[t], now, r, timeline);
  if (g_.kind[t] == TaskKind::flow && !stamp_.empty()) comm_on_positions(t, -1, now);
  for (auto s : g_.successors(t))
    if (--waiting_[s] == 0) {
      r.released_by[s] = t;
      begin(s, now, r, timeline);
    }
}

RunResult Simulator::run(const RunOptions& opt) {
  const std::uint32_t n = g_.size();
  RunResult r;
  r.start.assign(n, -1.0);
  r.end.assign(n, -1.0);
  r.released_by.assign(n, RunResult::kNoTask);
  r.peak_bytes.assign(static_cast<std::size_t>(g_.num_positions), 0.0);
  r.peak_time.assign(static_cast<std::size_t>(g_.num_positions), 0.0);
  held_.assign(static_cast<std::size_t>(g_.num_positions), 0.0);
  waiting_ = g_.num_preds;
  if (g_.overlap_slowdown > 0 && g_.link_positions > 0) {
    stamp_.assign(static_cast<std::size_t>(g_.link_positions), 0);
  }
  done_.clear();
  done_.reserve(256);
  const bool tl = opt.memory_timeline;
  for (std::uint32_t t = 0; t < n; ++t)
    if (waiting_[t] == 0) begin(t, 0.0, r, tl);
  std::uint32_t finished = 0;
  double now = 0;
  for (;;) {
    const auto a = streams_.next_event(now), b = network_.next_event(now);
    if (!a && !b) break;
    now = std::min(a.value_or(b.value_or(0)), b.value_or(a.value_or(0)));
    done_.clear();
    streams_.advance(now, done_);
    network_.advance(now, done_);
    for (std::size_t i = 0; i < done_.size(); ++i) {
      finish(done_[i], now, r, tl);
      ++finished;
    }
  }
  TESSEL_CHECK(finished == n, finished << " of " << n << " tasks ended: the graph has a cycle (a deadlocked schedule)");
  r.makespan = now;
  r.events += network_.rate_updates();
  return r;
}

}  // namespace tessel::engine
