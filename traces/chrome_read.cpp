// Reading Tessel traces back from Chrome trace JSON (the writer is chrome.cpp).
#include <algorithm>
#include <charconv>
#include <map>
#include <utility>

#include "util/error.hpp"
#include "traces/chrome.hpp"
#include "traces/event_reader.hpp"

namespace tessel::trace {

namespace {

struct FlowPoint {
  int rank, lane;  // lane: the tid (a stream, or one of its overflow lanes)
  double ts;
  std::int64_t id;
  bool bind_enclosing;  // "s", or "f" with "bp":"e": the slice around ts; else the next slice after ts
  std::size_t index;
};

// Flow ids are numbers or (hex) strings in the spec.
std::int64_t parse_flow_id(const std::string& text, const std::string& origin, std::size_t index) {
  std::int64_t v = 0;
  const char* b = text.data();
  const char* e = b + text.size();
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    b += 2;
    base = 16;
  }
  auto r = std::from_chars(b, e, v, base);
  if (r.ec != std::errc() || r.ptr != e || v < 0) {
    throw InputError(origin + ": traceEvents[" + std::to_string(index) + "]: flow id \"" + text +
                     "\" is not a non-negative integer (decimal or 0x hex)");
  }
  return v;
}

class TraceBuilder {
 public:
  explicit TraceBuilder(const std::string& origin) : origin_(origin) {}

  void add(RawEvent&& ev, std::size_t index) {
    if (ev.ph == "X") add_op(std::move(ev), index);
    else if (ev.ph == "M") add_meta(ev, index);
    else if (ev.ph == "C") add_counter(ev, index);
    else if (ev.ph == "s" || ev.ph == "t" || ev.ph == "f") add_flow(ev, index);
    if (ev.cat == "kernel" || ev.cat == "cpu_op" || ev.cat == "cuda_runtime") looks_like_kineto_ = true;
  }

  Trace finish(const TraceDocument& doc) {
    if (trace_.events.empty()) {
      std::string why = doc.event_count == 0 ? "the trace has no events"
                                             : "none of its " + std::to_string(doc.event_count) +
                                                   " events is an op (an X event with args.op)";
      if (looks_like_kineto_ || doc.top.contains("schemaVersion")) why += "; it looks like a PyTorch profiler trace";
      throw InputError(origin_ + ": empty trace: " + why);
    }
    if (doc.top.contains("otherData")) {
      if (!doc.top["otherData"].is_object()) throw InputError(origin_ + ": otherData must be a JSON object");
      trace_.other_data = doc.top["otherData"];
    }
    bind_flows();
    return std::move(trace_);
  }

 private:
  [[noreturn]] void fail(std::size_t index, const std::string& rule) const {
    throw InputError(origin_ + ": traceEvents[" + std::to_string(index) + "]: " + rule);
  }

  int rank_of(const RawEvent& ev, std::size_t index) const {
    if (ev.pid_is_string) fail(index, "pid \"" + ev.pid_text + "\" is not a rank (an integer)");
    if (ev.pid < 0 || ev.pid >= kMaxRanks) {
      fail(index, "pid " + std::to_string(ev.pid) + " is not a rank: must be in [0, " + std::to_string(kMaxRanks) + ")");
    }
    return static_cast<int>(ev.pid);
  }

  int lane_of(const RawEvent& ev, std::size_t index) const {
    if (ev.tid_is_string || ev.tid < 0 || ev.tid >= kNumStreams * kMaxLanes) {
      fail(index, "tid " + (ev.tid_is_string ? "\"" + ev.tid_text + "\"" : std::to_string(ev.tid)) +
                      " is not a stream: must be 0..4 (compute, tp, pp, dp, cp), or that plus 5k for overflow lane k < " +
                      std::to_string(kMaxLanes));
    }
    return static_cast<int>(ev.tid);
  }

  void add_op(RawEvent&& ev, std::size_t index) {
    if (!ev.has_op) {
      ++foreign_;
      return;
    }
    if (!ev.has_ts) fail(index, "X event without ts");
    // Perfetto drops an X event without dur; for an op it would silently lose time, so refuse it.
    if (!ev.has_dur) fail(index, "X event '" + ev.name + "' without dur");
    if (ev.dur < 0) fail(index, "X event '" + ev.name + "' has negative dur " + std::to_string(ev.dur));
    OpEvent e;
    e.rank = rank_of(ev, index);
    const int lane = lane_of(ev, index);
    e.stream = static_cast<Stream>(lane % kNumStreams);
    e.name = std::move(ev.name);
    e.op = std::move(ev.op);
    e.stage = ev.stage;
    e.chunk = ev.chunk;
    e.mb = ev.mb;
    e.layer_begin = ev.layer_begin;
    e.layer_end = ev.layer_end;
    e.start_us = ev.ts;
    e.dur_us = ev.dur;
    e.flops = ev.flops;
    e.bytes = ev.bytes;
    e.extra = std::move(ev.extra);
    if (ev.bind_id >= 0 && (ev.flow_in || ev.flow_out)) e.flow_id = ev.bind_id;  // flows v2
    trace_.events.push_back(std::move(e));
    lanes_.push_back(lane);
  }

  void add_meta(const RawEvent& ev, std::size_t index) {
    if (ev.name != "process_name" || !ev.extra.is_object() || !ev.extra.contains("name")) return;
    if (!ev.extra["name"].is_string()) fail(index, "process_name args.name must be a string");
    trace_.process_names[rank_of(ev, index)] = ev.extra["name"].get<std::string>();
  }

  // Perfetto makes one track per args key, named "<name> <key>"; the writer uses the key "value".
  void add_counter(const RawEvent& ev, std::size_t index) {
    int rank = rank_of(ev, index);
    if (!ev.has_ts) fail(index, "C event without ts");
    auto push = [&](const std::string& key, double v) {
      trace_.counters.push_back(Counter{rank, key == "value" ? ev.name : ev.name + " " + key, ev.ts, v});
    };
    if (ev.has_bytes) push("bytes", ev.bytes);
    if (!ev.extra.is_object()) return;
    for (auto it = ev.extra.begin(); it != ev.extra.end(); ++it) {
      if (!it.value().is_number()) fail(index, "counter args." + it.key() + " must be a number");
      push(it.key(), it.value().get<double>());
    }
  }

  void add_flow(const RawEvent& ev, std::size_t index) {
    if (ev.id.empty()) fail(index, "flow event without id");
    if (!ev.has_ts) fail(index, "flow event without ts");
    flows_.push_back(FlowPoint{rank_of(ev, index), lane_of(ev, index), ev.ts, parse_flow_id(ev.id, origin_, index),
                               ev.ph != "f" || ev.bp == "e", index});
  }

  void bind_flows() {
    if (flows_.empty()) return;
    // Per lane, the events in start order; the binding slice is found by binary search.
    std::map<std::pair<int, int>, std::vector<std::size_t>> lanes;
    for (std::size_t i = 0; i < trace_.events.size(); ++i) {
      const auto& e = trace_.events[i];
      lanes[{e.rank, lanes_[i]}].push_back(i);
    }
    auto start = [&](std::size_t i) { return trace_.events[i].start_us; };
    for (auto& [lane, idx] : lanes) {
      std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return start(a) < start(b); });
    }
    for (const auto& f : flows_) {
      auto it = lanes.find({f.rank, f.lane});
      if (it == lanes.end()) fail(f.index, "flow event on a lane without ops");
      const auto& idx = it->second;
      // Times are printed to the nanosecond: a flow the writer put at its slice's end may read back half
      // a nanosecond past ts + dur, summed in binary.
      constexpr double kHalfNs = 5e-4;
      auto after = std::upper_bound(idx.begin(), idx.end(), f.ts, [&](double ts, std::size_t i) { return ts < start(i); });
      std::size_t target;
      if (f.bind_enclosing) {
        if (after == idx.begin()) fail(f.index, "flow event at ts " + std::to_string(f.ts) + " is before every op on its lane");
        // The innermost slice around ts: the latest-starting one that has not ended (slices of a lane nest,
        // so a shorter one that started later and ended before ts is passed over).
        auto it = after;
        bool found = false;
        for (int k = 0; k < 64 && it != idx.begin() && !found; ++k) {
          const auto& e = trace_.events[*--it];
          found = f.ts <= e.start_us + e.dur_us + kHalfNs;
        }
        if (!found) fail(f.index, "flow event at ts " + std::to_string(f.ts) + " is not inside an op slice");
        target = *it;
      } else {
        if (after == idx.end()) fail(f.index, "flow end at ts " + std::to_string(f.ts) + " has no following op on its lane");
        target = *after;
      }
      trace_.events[target].flow_id = f.id;
    }
  }

  const std::string& origin_;
  Trace trace_;
  std::vector<FlowPoint> flows_;
  std::vector<int> lanes_;  // per event of trace_: its tid
  std::size_t foreign_ = 0;
  bool looks_like_kineto_ = false;
};

}  // namespace

Trace parse_chrome_trace(const std::string& text, const std::string& origin) {
  TraceBuilder b(origin);
  TraceDocument doc = read_events(text, origin, [&](RawEvent&& ev, std::size_t i) { b.add(std::move(ev), i); });
  return b.finish(doc);
}

}  // namespace tessel::trace
