// The contract every resource model of the engine follows (the two-phase model of SimGrid's
// kernel/resource/Model.hpp): the Simulator asks each model for the date of its next event, advances the
// clock to the earliest, then lets every model finish what ends at that date.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace tessel::engine {

class ResourceModel {
 public:
  virtual ~ResourceModel() = default;
  /** @brief A task becomes runnable at `now`; the model owns it until it reports it done. */
  virtual void start(std::uint32_t task, double now) = 0;
  /** @brief Date of this model's next completion, nullopt when it runs nothing. */
  virtual std::optional<double> next_event(double now) = 0;
  /** @brief Moves the model to `now` and appends the tasks that end there to `done` (in a fixed order). */
  virtual void advance(double now, std::vector<std::uint32_t>& done) = 0;
};

// Entry of an event heap: (date, task) ordered by date then task id, so equal dates pop in a fixed order.
struct TimedTask {
  double t;
  std::uint32_t task;
  std::uint32_t version;  // NetworkModel: stale entries are skipped
  bool operator>(const TimedTask& o) const { return t > o.t || (t == o.t && task > o.task); }
};

}  // namespace tessel::engine
