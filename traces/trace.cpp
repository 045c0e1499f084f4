#include "traces/trace.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace tessel::trace {

const char* stream_name(Stream s) {
  switch (s) {
    case Stream::compute: return "compute";
    case Stream::tp: return "tp";
    case Stream::pp: return "pp";
    case Stream::dp: return "dp";
    case Stream::cp: return "cp";
  }
  TESSEL_CHECK(false, "unknown stream " << static_cast<int>(s));
  return "";
}

std::optional<Stream> stream_from_name(std::string_view name) {
  for (int i = 0; i < kNumStreams; ++i) {
    auto s = static_cast<Stream>(i);
    if (name == stream_name(s)) return s;
  }
  return std::nullopt;
}

OpClass op_class(std::string_view op) {
  if (op == "forward" || op == "embedding" || op == "loss") return OpClass::forward;
  if (op == "backward" || op == "input_grad") return OpClass::backward;
  if (op == "weight_grad") return OpClass::weight_grad;
  if (op == "recompute") return OpClass::recompute;
  if (op == "optimizer") return OpClass::optimizer;
  if (op == "send" || op == "recv") return OpClass::p2p;
  for (std::string_view mark : {"allreduce", "all_reduce", "allgather", "all_gather", "reducescatter", "reduce_scatter",
                                "alltoall", "all_to_all", "broadcast", "exchange", "nccl", "barrier"}) {
    if (op.find(mark) != std::string_view::npos) return OpClass::collective;
  }
  return OpClass::other;
}

bool is_comm(const OpEvent& e) {
  auto c = op_class(e.op);
  return e.stream != Stream::compute || c == OpClass::p2p || c == OpClass::collective;
}

double trace_begin_us(const Trace& t) {
  if (t.events.empty()) return 0;
  double b = t.events.front().start_us;
  for (const auto& e : t.events) b = std::min(b, e.start_us);
  return b;
}

double trace_end_us(const Trace& t) {
  if (t.events.empty()) return 0;
  double b = t.events.front().start_us + t.events.front().dur_us;
  for (const auto& e : t.events) b = std::max(b, e.start_us + e.dur_us);
  return b;
}

}  // namespace tessel::trace
