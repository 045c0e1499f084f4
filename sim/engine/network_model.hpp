// Links with bandwidth shared among concurrent transfers (a fluid model, as SimGrid's network models).
// A flow is a point-to-point transfer or a whole collective; it uses a set of links (NVLink or NIC of each
// endpoint, the core above a pod when it leaves one) and needs `work` seconds at its uncontended rate,
// which the cost model (sim/cost/comm.hpp) gives. Sharing is proportional: on a link of capacity c carrying
// n flows each gets min(1, c/n) of its full rate, and a flow runs at the minimum over its links. Rates
// change only when a flow starts or ends, and only for the flows sharing a link with it; each flow's
// remaining work is brought up to date lazily, when its rate changes.
#pragma once

#include <functional>
#include <queue>

#include "sim/engine/resource_model.hpp"
#include "sim/engine/task_graph.hpp"

namespace tessel::engine {

class NetworkModel final : public ResourceModel {
 public:
  explicit NetworkModel(const TaskGraph& g);
  NetworkModel(const NetworkModel&) = delete;
  NetworkModel& operator=(const NetworkModel&) = delete;
  void start(std::uint32_t task, double now) override;
  std::optional<double> next_event(double now) override;
  void advance(double now, std::vector<std::uint32_t>& done) override;
  std::uint64_t rate_updates() const { return rate_updates_; }

 private:
  double rate_of(std::uint32_t task) const;
  void touch_links_of(std::uint32_t task, double now);  // re-rate every flow sharing a link with `task`
  void settle(std::uint32_t task, double now);          // bring remaining work to `now`
  void drop_stale();

  const TaskGraph& g_;
  std::vector<double> remaining_, rate_, since_;
  std::vector<std::uint32_t> version_;
  std::vector<std::vector<std::uint32_t>> on_link_;  // active flows per link
  std::vector<std::uint32_t> mark_;                   // last touch round per task (dedup)
  std::uint32_t round_ = 0;
  std::uint64_t rate_updates_ = 0;
  std::priority_queue<TimedTask, std::vector<TimedTask>, std::greater<>> heap_;
};

}  // namespace tessel::engine
