// Measured trace and activation-memory accounting of one rank.
//
// Ops carry the simulator's identity (op kind, stage, chunk, mb, layers) so a measured and a simulated
// trace of the same layout align op by op (traces/trace.hpp). Communication ops issued inside a compute op
// (tensor-parallel collectives) inherit its stage/chunk/mb from `context`, and inside one layer that layer
// alone as their layer range (the simulator draws them per layer).
// The memory tracker counts bytes of activations held for the backward (saved tensors, recomputation
// buffers while alive, pending weight-gradient inputs); its peak is what the cost model predicts.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "traces/trace.hpp"

namespace tessel::rt {

struct OpIdentity {
  std::string op;
  int stage = -1, chunk = -1, mb = -1, layer_begin = -1, layer_end = -1;
};

// While in scope, an op identity's layer range is one layer: the tensor-parallel collectives issued inside
// that layer carry it (the simulator draws them per layer); the stage's range comes back at the end.
class LayerScope {
 public:
  LayerScope(OpIdentity& id, int layer) : id_(id), begin_(id.layer_begin), end_(id.layer_end) {
    id_.layer_begin = layer;
    id_.layer_end = layer + 1;
  }
  ~LayerScope() {
    id_.layer_begin = begin_;
    id_.layer_end = end_;
  }
  LayerScope(const LayerScope&) = delete;
  LayerScope& operator=(const LayerScope&) = delete;

 private:
  OpIdentity& id_;
  int begin_, end_;
};

class Recorder {
 public:
  using Clock = std::chrono::steady_clock;
  Recorder() = default;
  Recorder(int rank, Clock::time_point t0, bool enabled) : rank_(rank), t0_(t0), enabled_(enabled) {}

  double now_us() const { return std::chrono::duration<double, std::micro>(Clock::now() - t0_).count(); }
  void record(trace::Stream s, const OpIdentity& id, const std::string& name, double start_us, double end_us,
              double flops, double bytes, std::int64_t flow_id = -1);
  // A communication op within the current compute context: op kind e.g. "tp_allreduce".
  void record_comm(trace::Stream s, const std::string& op, double start_us, double end_us, double bytes,
                   std::int64_t flow_id = -1);

  void hold(std::int64_t bytes);
  void release(std::int64_t bytes);
  std::int64_t held_bytes() const { return held_; }
  std::int64_t peak_bytes() const { return peak_; }
  void reset_peak() { peak_ = held_; }

  OpIdentity context;  // the compute op now running (for nested comm events)
  std::vector<trace::OpEvent>& events() { return events_; }
  bool enabled() const { return enabled_; }
  int rank() const { return rank_; }

 private:
  int rank_ = 0;
  Clock::time_point t0_ = Clock::now();
  bool enabled_ = false;
  std::vector<trace::OpEvent> events_;
  std::int64_t held_ = 0, peak_ = 0;
};

}  // namespace tessel::rt
