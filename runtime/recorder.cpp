#include "runtime/recorder.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace tessel::rt {

void Recorder::record(trace::Stream s, const OpIdentity& id, const std::string& name, double start_us,
                      double end_us, double flops, double bytes, std::int64_t flow_id) {
  if (!enabled_) return;
  trace::OpEvent e;
  e.rank = rank_;
  e.stream = s;
  e.name = name;
  e.op = id.op;
  e.stage = id.stage;
  e.chunk = id.chunk;
  e.mb = id.mb;
  e.layer_begin = id.layer_begin;
  e.layer_end = id.layer_end;
  e.start_us = start_us;
  e.dur_us = std::max(0.0, end_us - start_us);
  e.flops = flops;
  e.bytes = bytes;
  e.flow_id = flow_id;
  events_.push_back(std::move(e));
}

void Recorder::record_comm(trace::Stream s, const std::string& op, double start_us, double end_us, double bytes,
                           std::int64_t flow_id) {
  OpIdentity id = context;
  id.op = op;
  std::string name = op;
  if (id.stage >= 0) name += " s" + std::to_string(id.stage);
  if (id.mb >= 0) name += " mb" + std::to_string(id.mb);
  record(s, id, name, start_us, end_us, 0.0, bytes, flow_id);
}

void Recorder::hold(std::int64_t bytes) {
  held_ += bytes;
  peak_ = std::max(peak_, held_);
}

void Recorder::release(std::int64_t bytes) {
  held_ -= bytes;
  TESSEL_CHECK(held_ >= 0, "activation memory accounting went negative: " << held_);
}

}  // namespace tessel::rt
