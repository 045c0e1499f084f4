// Fixed-length tasks: compute ops on a rank's compute stream, and communication whose links are not
// modelled (its time is what the cost model says). A stream runs one op at a time because the graph
// chains each op to the previous one of its stream; this model keeps their end dates. A compute op runs
// slower while communication that uses its position's links is in flight (TaskGraph::overlap_slowdown):
// the Simulator says when a position becomes busy or quiet, and the running op's remaining work is
// settled at that date and rescheduled at the new rate (stale heap entries are skipped by version).
// With a host model (TaskGraph::host_cores > 0) every running compute op is re-rated whenever one starts or
// ends, because they share the host's cores (rate_of below; sim/engine/host_model.hpp).
#pragma once

#include <functional>
#include <cstdint>
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
  // A flow on `position`'s links started (+1) or ended (-1) at `now`; its compute op runs slowed while any does.
  void comm_changed(int position, int delta, double now);

 private:
  struct Running {
    std::uint32_t task = UINT32_MAX;
    double remaining = 0, rate = 1, since = 0;  // work left (seconds; a fraction of the op under a host model)
  };
  void schedule(Running& r, double now);
  double rate_of(int position) const;
  void rerate(Running& r, double rate, double now);
  void rerate_all(double now);  // host model: the busy threads changed
  void load_cores(int position, int delta);  // host model: position's threads start (+1) or stop (-1) computing
  const TaskGraph& g_;
  double slow_rate_ = 1;
  bool host_ = false;
  std::vector<int> core_load_;     // host model: threads computing on each core now
  int busy_cores_ = 0;             // host model: cores with at least one
  std::vector<Running> running_;   // per position: its compute op now
  std::vector<std::uint32_t> comm_;  // per position: flows on its links now
  std::vector<std::uint32_t> version_;
  std::priority_queue<TimedTask, std::vector<TimedTask>, std::greater<>> heap_;
};

}  // namespace tessel::engine
