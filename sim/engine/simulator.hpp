// The event engine: a Simulator owns the clock, the task states and its resource models (StreamModel for
// fixed-length ops, NetworkModel for flows over shared links); no global state. run() plays a TaskGraph
// to the end: every task starts when its last predecessor ends; the clock jumps to the earliest next event
// of any model (SimGrid EngineImpl::solve). Memory deltas of tasks give a per-position memory timeline.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/engine/network_model.hpp"
#include "sim/engine/stream_model.hpp"
#include "sim/engine/task_graph.hpp"

namespace tessel::engine {

struct MemorySample {
  double t;
  std::int32_t position;
  double bytes;  // activation bytes held after the change
};

struct RunOptions {
  bool memory_timeline = false;  // keep every memory change (for traces and SVG); peaks are always kept
};

struct RunResult {
  std::vector<double> start, end;     // per task
  // Per task: the predecessor whose end started it (the last of them to end; kNoTask for a task with none).
  // A task starts the moment its last predecessor ends, so following these back from a task gives the
  // longest path to it with every task weighted by its played time: the critical path, at no extra pass.
  std::vector<std::uint32_t> released_by;
  static constexpr std::uint32_t kNoTask = 0xffffffffu;
  double makespan = 0;
  std::uint64_t events = 0;           // task starts + task ends + flow re-rates processed
  std::vector<double> peak_bytes;     // per position: highest activation bytes held
  std::vector<double> peak_time;      // when it was first reached
  std::vector<MemorySample> memory;   // RunOptions::memory_timeline only
};

class Simulator {
 public:
  explicit Simulator(const TaskGraph& g);
  Simulator(const Simulator&) = delete;
  Simulator& operator=(const Simulator&) = delete;

  /** @brief Plays the graph from time 0. InternalError if tasks remain that can never start (a cycle). */
  RunResult run(const RunOptions& opt = {});

 private:
  void begin(std::uint32_t t, double now, RunResult& r, bool timeline);
  void finish(std::uint32_t t, double now, RunResult& r, bool timeline);
  void memory_change(std::int32_t pos, double delta, double now, RunResult& r, bool timeline);
  void comm_on_positions(std::uint32_t flow, int delta, double now);  // overlap slowdown bookkeeping

  const TaskGraph& g_;
  StreamModel streams_;
  NetworkModel network_;
  std::vector<std::uint32_t> waiting_;  // predecessors not yet ended, per task
  std::vector<double> held_;            // activation bytes per position
  std::vector<std::uint32_t> done_;
  std::vector<std::uint32_t> stamp_;  // per position: last flow counted (a flow may list two links); empty: no slowdown
};

}  // namespace tessel::engine
