#include "sim/engine/task_graph.hpp"

#include <cmath>

#include "util/error.hpp"

namespace tessel::engine {

std::size_t TaskGraph::bytes_used() const {
  return work.capacity() * sizeof(double) + kind.capacity() + num_preds.capacity() * 4 + succ_begin.capacity() * 4 +
         succ.capacity() * 4 + link_begin.capacity() * 4 + links.capacity() * 4 + mem_pos.capacity() * 4 +
         compute_pos.capacity() * 4 +
         (mem_at_start.capacity() + mem_at_end.capacity() + link_capacity.capacity()) * sizeof(double);
}

GraphBuilder::GraphBuilder(int num_positions, std::vector<double> link_capacity) {
  g_.num_positions = num_positions;
  g_.link_capacity = std::move(link_capacity);
  g_.link_begin.push_back(0);
}

void GraphBuilder::reserve(std::size_t tasks, std::size_t edges) {
  g_.work.reserve(tasks);
  g_.kind.reserve(tasks);
  g_.link_begin.reserve(tasks + 1);
  g_.mem_pos.reserve(tasks);
  g_.compute_pos.reserve(tasks);
  g_.mem_at_start.reserve(tasks);
  g_.mem_at_end.reserve(tasks);
  from_.reserve(edges);
  to_.reserve(edges);
}

void GraphBuilder::compute_on(std::uint32_t task, int position) {
  TESSEL_CHECK(g_.kind.at(task) == TaskKind::fixed && position >= 0 && position < g_.num_positions,
               "compute task " << task << " on position " << position);
  g_.compute_pos[task] = position;
}

void GraphBuilder::overlap(double slowdown, int link_positions) {
  TESSEL_CHECK(std::isfinite(slowdown) && slowdown >= 0 && link_positions >= 0, "overlap slowdown " << slowdown);
  g_.overlap_slowdown = slowdown;
  g_.link_positions = link_positions;
}

std::uint32_t GraphBuilder::add(double seconds, TaskKind k) {
  TESSEL_CHECK(std::isfinite(seconds) && seconds >= 0, "task duration " << seconds);
  g_.work.push_back(seconds);
  g_.kind.push_back(k);
  g_.mem_pos.push_back(-1);
  g_.compute_pos.push_back(-1);
  g_.mem_at_start.push_back(0);
  g_.mem_at_end.push_back(0);
  return static_cast<std::uint32_t>(g_.work.size() - 1);
}

std::uint32_t GraphBuilder::add_fixed(double seconds) {
  const auto t = add(seconds, TaskKind::fixed);
  g_.link_begin.push_back(static_cast<std::uint32_t>(g_.links.size()));
  return t;
}

std::uint32_t GraphBuilder::add_flow(double seconds, std::span<const std::uint32_t> links) {
  // A flow over no link, or of no size, cannot contend with anything: run it as a fixed-length task.
  const bool shared = !links.empty() && seconds > 0;
  const auto t = add(seconds, shared ? TaskKind::flow : TaskKind::fixed);
  if (shared)
    for (auto l : links) {
      TESSEL_CHECK(l < g_.link_capacity.size(), "link " << l << " of " << g_.link_capacity.size());
      g_.links.push_back(l);
    }
  g_.link_begin.push_back(static_cast<std::uint32_t>(g_.links.size()));
  return t;
}

void GraphBuilder::edge(std::uint32_t from, std::uint32_t to) {
  TESSEL_CHECK(from < size() && to < size() && from != to, "edge " << from << " -> " << to);
  from_.push_back(from);
  to_.push_back(to);
}

void GraphBuilder::memory(std::uint32_t task, int position, double at_start, double at_end) {
  TESSEL_CHECK(g_.mem_pos[task] == -1 || g_.mem_pos[task] == position, "task " << task << " on two positions");
  g_.mem_pos[task] = position;
  g_.mem_at_start[task] += at_start;
  g_.mem_at_end[task] += at_end;
}

TaskGraph GraphBuilder::finish() {
  const std::uint32_t n = size();
  g_.num_preds.assign(n, 0);
  g_.succ_begin.assign(n + 1, 0);
  for (std::size_t e = 0; e < from_.size(); ++e) {
    ++g_.succ_begin[from_[e] + 1];
    ++g_.num_preds[to_[e]];
  }
  for (std::uint32_t t = 0; t < n; ++t) g_.succ_begin[t + 1] += g_.succ_begin[t];
  g_.succ.assign(from_.size(), 0);
  std::vector<std::uint32_t> fill(g_.succ_begin.begin(), g_.succ_begin.end() - 1);
  // Counting sort keeps each task's successors in insertion order: deterministic release order.
  for (std::size_t e = 0; e < from_.size(); ++e) g_.succ[fill[from_[e]]++] = to_[e];
  from_.clear();
  from_.shrink_to_fit();
  to_.clear();
  to_.shrink_to_fit();
  return std::move(g_);
}

}  // namespace tessel::engine
