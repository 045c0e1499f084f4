#include "sim/engine/stream_model.hpp"

#include <algorithm>

namespace tessel::engine {

StreamModel::StreamModel(const TaskGraph& g) : g_(g) {
  std::vector<TimedTask> storage;
  storage.reserve(1024);
  heap_ = decltype(heap_)(std::greater<>(), std::move(storage));
  if (g_.overlap_slowdown > 0 && g_.link_positions > 0) {
    slow_rate_ = 1.0 / (1.0 + g_.overlap_slowdown);
    running_.assign(static_cast<std::size_t>(g_.num_positions), Running{});
    comm_.assign(static_cast<std::size_t>(g_.num_positions), 0);
    version_.assign(g_.size(), 0);
  }
}

void StreamModel::schedule(Running& r, double now) {
  ++version_[r.task];
  heap_.push({now + r.remaining / r.rate, r.task, version_[r.task]});
}

void StreamModel::start(std::uint32_t task, double now) {
  const std::int32_t pos = running_.empty() ? -1 : g_.compute_pos[task];
  if (pos < 0) {
    heap_.push({now + g_.work[task], task, version_.empty() ? 0u : version_[task]});
    return;
  }
  Running& r = running_[static_cast<std::size_t>(pos)];
  r = {task, g_.work[task], comm_[static_cast<std::size_t>(pos)] > 0 ? slow_rate_ : 1.0, now};
  schedule(r, now);
}

void StreamModel::comm_changed(int position, int delta, double now) {
  if (running_.empty()) return;
  std::uint32_t& n = comm_[static_cast<std::size_t>(position)];
  n = delta > 0 ? n + 1 : n - 1;
  Running& r = running_[static_cast<std::size_t>(position)];
  if (r.task == UINT32_MAX) return;
  const double rate = n > 0 ? slow_rate_ : 1.0;
  if (rate == r.rate) return;
  r.remaining = std::max(0.0, r.remaining - (now - r.since) * r.rate);
  r.since = now;
  r.rate = rate;
  schedule(r, now);
}

std::optional<double> StreamModel::next_event(double) {
  while (!heap_.empty() && !version_.empty() && heap_.top().version != version_[heap_.top().task]) heap_.pop();
  if (heap_.empty()) return std::nullopt;
  return heap_.top().t;
}

void StreamModel::advance(double now, std::vector<std::uint32_t>& done) {
  while (!heap_.empty() && heap_.top().t <= now) {
    const TimedTask e = heap_.top();
    heap_.pop();
    if (!version_.empty() && e.version != version_[e.task]) continue;  // rescheduled since
    done.push_back(e.task);
    const std::int32_t pos = running_.empty() ? -1 : g_.compute_pos[e.task];
    if (pos >= 0 && running_[static_cast<std::size_t>(pos)].task == e.task) running_[static_cast<std::size_t>(pos)].task = UINT32_MAX;
  }
}

}  // namespace tessel::engine
