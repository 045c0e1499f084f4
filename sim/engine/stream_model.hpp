// Fixed-length tasks: compute ops on a rank's compute stream, and communication whose links are not
// modelled (its time is what the cost model says). A stream runs one op at a time because the graph
// chains each op to the previous one of its stream; this model only keeps their end dates.
#pragma once

#include <functional>
#include <queue>

#include "sim/engine/resource_model.hpp"
#include "sim/engine/task_graph.hpp"

namespace tessel::engine {

class StreamModel final : public ResourceModel {
 public:
  explicit StreamModel(const TaskGraph& g);
  StreamModel(const StreamModel&) = delete;
  StreamModel& operator=(const StreamModel&) = delete;
  void start(std::uint32_t task, double now) override;
  std::optional<double> next_event(double now) override;
  void advance(double now, std::vector<std::uint32_t>& done) override;

 private:
  const TaskGraph& g_;
  std::priority_queue<TimedTask, std::vector<TimedTask>, std::greater<>> heap_;
};

}  // namespace tessel::engine
