#include "sim/engine/stream_model.hpp"

#include <algorithm>
#include <limits>

#include "sim/engine/host_model.hpp"
#include "util/error.hpp"

namespace tessel::engine {

StreamModel::StreamModel(const TaskGraph& g) : g_(g) {
  std::vector<TimedTask> storage;
  storage.reserve(1024);
  heap_ = decltype(heap_)(std::greater<>(), std::move(storage));
  const bool overlap = g_.overlap_slowdown > 0 && g_.link_positions > 0;
  host_ = g_.host_cores > 0;
  if (overlap) slow_rate_ = 1.0 / (1.0 + g_.overlap_slowdown);
  if (overlap || host_) {
    running_.assign(static_cast<std::size_t>(g_.num_positions), Running{});
    comm_.assign(static_cast<std::size_t>(g_.num_positions), 0);
    version_.assign(g_.size(), 0);
  }
  if (host_) {
    TESSEL_CHECK(g_.thread_core.size() == static_cast<std::size_t>(g_.num_positions) * g_.host_threads,
                 "host model: " << g_.thread_core.size() << " thread cores for " << g_.num_positions << " positions of "
                                << g_.host_threads << " threads");
    core_load_.assign(static_cast<std::size_t>(g_.host_cores), 0);
  }
}

void StreamModel::schedule(Running& r, double now) {
  ++version_[r.task];
  const double left = r.rate > 0 ? r.remaining / r.rate : std::numeric_limits<double>::infinity();
  heap_.push({now + left, r.task, version_[r.task]});
}

// Progress per second of the op running on `position`: seconds of work per second (slowed by overlapping
// communication), or under a host model the fraction of the op per second its share of the cores gives: the
// share of its most crowded thread's core.
double StreamModel::rate_of(int position) const {
  const auto p = static_cast<std::size_t>(position);
  const double slow = comm_[p] > 0 ? slow_rate_ : 1.0;
  if (!host_) return slow;
  const std::uint32_t t = running_[p].task;
  int crowd = 1;
  for (int i = 0; i < g_.host_threads; ++i)
    crowd = std::max(crowd, core_load_[static_cast<std::size_t>(g_.thread_core[p * g_.host_threads + i])]);
  return slow * host_rate(g_.work[t], g_.work_busy[t], crowd, std::max(busy_cores_, 1), g_.host_cores);
}

void StreamModel::load_cores(int position, int delta) {
  for (int i = 0; i < g_.host_threads; ++i) {
    int& n = core_load_[static_cast<std::size_t>(g_.thread_core[static_cast<std::size_t>(position) * g_.host_threads + i])];
    if (delta > 0 && n++ == 0) ++busy_cores_;
    if (delta < 0 && --n == 0) --busy_cores_;
  }
}

void StreamModel::rerate(Running& r, double rate, double now) {
  r.remaining = std::max(0.0, r.remaining - (now - r.since) * r.rate);
  r.since = now;
  r.rate = rate;
  schedule(r, now);
}

void StreamModel::rerate_all(double now) {
  for (std::size_t p = 0; p < running_.size(); ++p)
    if (running_[p].task != UINT32_MAX) rerate(running_[p], rate_of(static_cast<int>(p)), now);
}

void StreamModel::start(std::uint32_t task, double now) {
  const std::int32_t pos = running_.empty() ? -1 : g_.compute_pos[task];
  if (pos < 0) {
    heap_.push({now + g_.work[task], task, version_.empty() ? 0u : version_[task]});
    return;
  }
  Running& r = running_[static_cast<std::size_t>(pos)];
  r = {task, host_ ? 1.0 : g_.work[task], 1.0, now};
  if (host_) {
    load_cores(pos, +1);
    rerate_all(now);  // the new op's rate too
    return;
  }
  r.rate = rate_of(pos);
  schedule(r, now);
}

void StreamModel::comm_changed(int position, int delta, double now) {
  if (running_.empty()) return;
  std::uint32_t& n = comm_[static_cast<std::size_t>(position)];
  n = delta > 0 ? n + 1 : n - 1;
  Running& r = running_[static_cast<std::size_t>(position)];
  if (r.task == UINT32_MAX) return;
  const double rate = rate_of(position);
  if (rate == r.rate) return;
  rerate(r, rate, now);
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
    if (pos < 0 || running_[static_cast<std::size_t>(pos)].task != e.task) continue;
    running_[static_cast<std::size_t>(pos)].task = UINT32_MAX;
    if (host_) {
      load_cores(pos, -1);
      rerate_all(now);
    }
  }
}

}  // namespace tessel::engine
