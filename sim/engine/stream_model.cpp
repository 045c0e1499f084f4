#include "sim/engine/stream_model.hpp"

namespace tessel::engine {

StreamModel::StreamModel(const TaskGraph& g) : g_(g) {
  std::vector<TimedTask> storage;
  storage.reserve(1024);
  heap_ = decltype(heap_)(std::greater<>(), std::move(storage));
}

void StreamModel::start(std::uint32_t task, double now) { heap_.push({now + g_.work[task], task, 0}); }

std::optional<double> StreamModel::next_event(double) {
  if (heap_.empty()) return std::nullopt;
  return heap_.top().t;
}

void StreamModel::advance(double now, std::vector<std::uint32_t>& done) {
  while (!heap_.empty() && heap_.top().t <= now) {
    done.push_back(heap_.top().task);
    heap_.pop();
  }
}

}  // namespace tessel::engine
