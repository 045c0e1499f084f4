// The executed DAG the event engine plays: flat arrays indexed by task id (struct of arrays, successors and
// links in CSR form), built once by GraphBuilder and read-only while the Simulator runs. A stream's program
// order is an ordinary edge (each op depends on the previous op of its stream), so the engine needs no
// per-stream queues: a task starts the moment its last predecessor ends.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tessel::engine {

enum class TaskKind : std::uint8_t {
  fixed,  // runs for `work` seconds (compute, or communication that shares no modelled link)
  flow,   // moves `work` seconds' worth of data at full rate over shared links (NetworkModel)
};

struct TaskGraph {
  std::vector<double> work;              // seconds (fixed) or seconds at an uncontended rate (flow)
  std::vector<TaskKind> kind;
  std::vector<std::uint32_t> num_preds;
  std::vector<std::uint32_t> succ_begin;  // CSR, size n+1
  std::vector<std::uint32_t> succ;
  std::vector<std::uint32_t> link_begin;  // CSR, size n+1: links a flow uses
  std::vector<std::uint32_t> links;
  // Memory: bytes added on position mem_pos when the task starts, and when it ends (negative = released).
  std::vector<std::int32_t> mem_pos;      // -1: none
  std::vector<double> mem_at_start, mem_at_end;
  std::vector<double> link_capacity;     // per link, in units of one flow at full rate
  int num_positions = 0;
  // Compute slowed by overlapping communication: while a flow that uses a position's own links (NVLink
  // [0, P), NIC [P, 2P), as Cluster numbers them) runs, that position's compute ops progress at
  // 1 / (1 + overlap_slowdown) of their rate (communication kernels take SMs and memory bandwidth).
  std::vector<std::int32_t> compute_pos;  // position whose compute stream runs the task; -1: not compute
  int link_positions = 0;                 // P above; 0: no flow touches a position's compute
  double overlap_slowdown = 0;
  // Ranks sharing a host's cores (sim/engine/host_model.hpp): host_cores 0 is no host model. A compute op
  // occupies host_threads threads (its position's tp ranks), thread i of position p on core
  // thread_core[p * host_threads + i]; work[t] is its time alone on a core, work_busy[t] with every core busy
  // (compute tasks; empty without a host model).
  int host_cores = 0;
  int host_threads = 1;
  std::vector<double> work_busy;
  std::vector<int> thread_core;

  std::uint32_t size() const { return static_cast<std::uint32_t>(work.size()); }
  std::span<const std::uint32_t> successors(std::uint32_t t) const {
    return {succ.data() + succ_begin[t], succ.data() + succ_begin[t + 1]};
  }
  std::span<const std::uint32_t> links_of(std::uint32_t t) const {
    return {links.data() + link_begin[t], links.data() + link_begin[t + 1]};
  }
  std::size_t bytes_used() const;  // memory held by the arrays (for the linear-memory benchmark)
};

// Collects tasks and edges, then lays them out flat. Edges may be added in any order; duplicates are kept
// (harmless: a predecessor counted twice is also released twice).
class GraphBuilder {
 public:
  explicit GraphBuilder(int num_positions, std::vector<double> link_capacity = {});
  std::uint32_t add_fixed(double seconds);
  void compute_on(std::uint32_t task, int position);               // a fixed task on a compute stream
  void overlap(double slowdown, int link_positions);                // see TaskGraph::overlap_slowdown
  std::uint32_t add_flow(double seconds, std::span<const std::uint32_t> links);
  void edge(std::uint32_t from, std::uint32_t to);
  void memory(std::uint32_t task, int position, double at_start, double at_end);
  void reserve(std::size_t tasks, std::size_t edges);
  std::uint32_t size() const { return static_cast<std::uint32_t>(g_.work.size()); }
  double work(std::uint32_t t) const { return g_.work[t]; }
  TaskGraph finish();

 private:
  std::uint32_t add(double seconds, TaskKind k);
  TaskGraph g_;
  std::vector<std::uint32_t> from_, to_;
};

}  // namespace tessel::engine
