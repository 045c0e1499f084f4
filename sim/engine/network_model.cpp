#include "sim/engine/network_model.hpp"

#include <algorithm>
#include <limits>

#include "util/error.hpp"

namespace tessel::engine {

NetworkModel::NetworkModel(const TaskGraph& g) : g_(g) {
  const auto n = g.size();
  remaining_.assign(n, 0);
  rate_.assign(n, 0);
  since_.assign(n, 0);
  version_.assign(n, 0);
  mark_.assign(n, 0);
  on_link_.resize(g.link_capacity.size());
  for (auto& v : on_link_) v.reserve(8);
}

double NetworkModel::rate_of(std::uint32_t t) const {
  double r = 1.0;
  for (auto l : g_.links_of(t)) {
    const double load = static_cast<double>(on_link_[l].size());
    r = std::min(r, g_.link_capacity[l] / load);
  }
  return r;
}

void NetworkModel::settle(std::uint32_t t, double now) {
  remaining_[t] = std::max(0.0, remaining_[t] - rate_[t] * (now - since_[t]));
  since_[t] = now;
}

void NetworkModel::touch_links_of(std::uint32_t task, double now) {
  ++round_;
  for (auto l : g_.links_of(task))
    for (auto f : on_link_[l]) {
      if (mark_[f] == round_) continue;
      mark_[f] = round_;
      settle(f, now);
      const double r = rate_of(f);
      if (r == rate_[f]) continue;
      rate_[f] = r;
      ++version_[f];
      ++rate_updates_;
      heap_.push({now + remaining_[f] / r, f, version_[f]});
    }
}

void NetworkModel::start(std::uint32_t t, double now) {
  remaining_[t] = g_.work[t];
  since_[t] = now;
  rate_[t] = 0;  // forces a push in touch_links_of
  for (auto l : g_.links_of(t)) on_link_[l].push_back(t);
  touch_links_of(t, now);
}

void NetworkModel::drop_stale() {
  while (!heap_.empty() && heap_.top().version != version_[heap_.top().task]) heap_.pop();
}

std::optional<double> NetworkModel::next_event(double) {
  drop_stale();
  if (heap_.empty()) return std::nullopt;
  return heap_.top().t;
}

void NetworkModel::advance(double now, std::vector<std::uint32_t>& done) {
  const std::size_t first = done.size();
  for (drop_stale(); !heap_.empty() && heap_.top().t <= now; drop_stale()) {
    const auto t = heap_.top().task;
    heap_.pop();
    ++version_[t];  // retire: later entries of this flow are stale
    remaining_[t] = 0;
    rate_[t] = 0;
    for (auto l : g_.links_of(t)) {
      auto& v = on_link_[l];
      v.erase(std::find(v.begin(), v.end(), t));  // keeps order: deterministic
    }
    done.push_back(t);
  }
  // The survivors on the freed links speed up.
  for (std::size_t i = first; i < done.size(); ++i) touch_links_of(done[i], now);
}

}  // namespace tessel::engine
