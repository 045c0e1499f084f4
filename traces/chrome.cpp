#include "traces/chrome.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "traces/event_reader.hpp"

#ifndef TESSEL_VERSION
#define TESSEL_VERSION "unknown"
#endif

namespace tessel::trace {

namespace {

// ---- writing ----

void put_escaped(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// Timestamps in µs with three decimals: nanosecond resolution, the precision Kineto writes.
void put_us(std::string& out, double v) {
  TESSEL_CHECK(std::isfinite(v), "non-finite time " << v);
  if (std::fabs(v) < 0.0005) v = 0;  // never print "-0.000"
  // %.3f of the largest double is 309 integer digits + sign + ".000": 320 bytes always suffice.
  char buf[320];
  const int n = std::snprintf(buf, sizeof buf, "%.3f", v);
  TESSEL_CHECK(n > 0 && static_cast<std::size_t>(n) < sizeof buf, "time " << v << " does not format");
  out.append(buf, static_cast<std::size_t>(n));
}

// Shortest text that reads back to the same double (std::to_chars), so flops/bytes/counters round-trip.
void put_num(std::string& out, double v) {
  TESSEL_CHECK(std::isfinite(v), "non-finite number " << v);
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void put_int(std::string& out, long long v) { out += std::to_string(v); }

const std::set<std::string>& reserved_args() {
  static const std::set<std::string> r = {"op", "stage", "chunk", "mb", "layers", "flops", "bytes"};
  return r;
}

// Times as printed: rounded to the nanosecond (put_us prints 3 decimals of a microsecond).
double ns_round(double us) { return std::round(us * 1e3) / 1e3; }

// Each event's tid: its stream's lane, or an overflow lane of that stream where it would overlap a slice of
// the lane without nesting in it (Perfetto draws only nested slices on one thread). Per (rank, stream), in
// order of start (the longer first at equal starts, so an enclosing slice comes before what it holds), an
// event takes the first lane whose open slices, the innermost last, end no later than it starts or enclose
// it. A slice with a flow (a send, a recv) nests with nothing: a flow binds to the innermost slice around
// its point, so a send inside a recv, or two of the same span, would take each other's arrows.
std::vector<int> lane_tids(const Trace& t) {
  std::vector<int> tid(t.events.size());
  std::map<std::pair<int, int>, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const OpEvent& e = t.events[i];
    tid[i] = static_cast<int>(e.stream);
    groups[{e.rank, static_cast<int>(e.stream)}].push_back(i);
  }
  const auto start = [&](std::size_t i) { return ns_round(t.events[i].start_us); };
  const auto end = [&](std::size_t i) { return ns_round(t.events[i].start_us + t.events[i].dur_us); };
  struct Open {
    double end;
    bool flow;
  };
  for (auto& [key, idx] : groups) {
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
      if (start(a) != start(b)) return start(a) < start(b);
      return end(a) > end(b);
    });
    struct Lane {
      std::vector<Open> stack;  // the slices still open, innermost last
      int flows = 0;            // how many of them carry a flow
    };
    std::vector<Lane> open;
    for (std::size_t i : idx) {
      const double b = start(i), e = std::max(b, end(i));
      const bool flow = t.events[i].flow_id >= 0;
      std::size_t lane = 0;
      for (; lane < open.size(); ++lane) {
        Lane& ln = open[lane];
        while (!ln.stack.empty() && ln.stack.back().end <= b) {
          ln.flows -= ln.stack.back().flow;
          ln.stack.pop_back();
        }
        if (ln.stack.empty()) break;
        if (ln.stack.back().end >= e && !flow && ln.flows == 0) break;
      }
      // Past kMaxLanes (never seen in practice) the last lane takes the rest, misnested but readable.
      lane = std::min<std::size_t>(lane, kMaxLanes - 1);
      if (lane == open.size()) open.emplace_back();
      open[lane].stack.push_back({e, flow});
      open[lane].flows += flow;
      tid[i] = key.second + kNumStreams * static_cast<int>(lane);
    }
  }
  return tid;
}

std::string lane_name(int tid) {
  std::string name = stream_name(static_cast<Stream>(tid % kNumStreams));
  if (tid >= kNumStreams) name += " #" + std::to_string(tid / kNumStreams + 1);
  return name;
}

void put_op_event(std::string& out, const OpEvent& e, int tid) {
  out += R"({"ph":"X","name":)";
  put_escaped(out, e.name.empty() ? e.op : e.name);
  out += R"(,"cat":)";
  put_escaped(out, is_comm(e) ? "comm" : "compute");
  out += R"(,"pid":)"; put_int(out, e.rank);
  out += R"(,"tid":)"; put_int(out, tid);
  // Start and end rounded to the printed nanosecond, the duration their difference: rounding start and
  // duration apart made back-to-back slices of a lane overlap by 1 ns, which viewers read as misnesting.
  const double start = ns_round(e.start_us), end = ns_round(e.start_us + e.dur_us);
  out += R"(,"ts":)"; put_us(out, start);
  out += R"(,"dur":)"; put_us(out, std::max(0.0, end - start));
  out += R"(,"args":{"op":)"; put_escaped(out, e.op);
  out += R"(,"stage":)"; put_int(out, e.stage);
  out += R"(,"chunk":)"; put_int(out, e.chunk);
  out += R"(,"mb":)"; put_int(out, e.mb);
  out += R"(,"layers":[)"; put_int(out, e.layer_begin); out += ','; put_int(out, e.layer_end);
  out += R"(],"flops":)"; put_num(out, e.flops);
  out += R"(,"bytes":)"; put_num(out, e.bytes);
  if (e.extra.is_object()) {
    for (auto it = e.extra.begin(); it != e.extra.end(); ++it) {
      TESSEL_CHECK(!reserved_args().count(it.key()), "OpEvent::extra repeats the contract key " << it.key());
      out += ',';
      put_escaped(out, it.key());
      out += ':';
      out += it.value().dump();
    }
  }
  out += "}}";
}

void put_meta(std::string& out, const char* what, int pid, int tid, bool thread, const std::string& value_key,
              const std::string& value) {
  out += R"({"ph":"M","name":")";
  out += what;
  out += R"(","pid":)"; put_int(out, pid);
  if (thread) { out += R"(,"tid":)"; put_int(out, tid); }
  out += R"(,"args":{")"; out += value_key; out += "\":";
  out += value;
  out += "}}";
}

void put_metadata(std::string& out, const Trace& t, const std::vector<int>& tids, std::vector<std::string>& lines) {
  std::set<int> ranks;
  std::set<std::pair<int, int>> lanes;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    ranks.insert(t.events[i].rank);
    lanes.insert({t.events[i].rank, tids[i]});
  }
  for (const auto& c : t.counters) ranks.insert(c.rank);
  for (const auto& [r, n] : t.process_names) ranks.insert(r);
  for (int r : ranks) {
    auto it = t.process_names.find(r);
    std::string name;
    put_escaped(name, it != t.process_names.end() ? it->second : "rank " + std::to_string(r));
    out.clear(); put_meta(out, "process_name", r, 0, false, "name", name); lines.push_back(out);
    out.clear(); put_meta(out, "process_sort_index", r, 0, false, "sort_index", std::to_string(r)); lines.push_back(out);
  }
  for (auto [r, s] : lanes) {
    std::string name;
    put_escaped(name, lane_name(s));
    // A stream's overflow lanes sort right after it.
    const int sort_index = (s % kNumStreams) * kMaxLanes + s / kNumStreams;
    out.clear(); put_meta(out, "thread_name", r, s, true, "name", name); lines.push_back(out);
    out.clear(); put_meta(out, "thread_sort_index", r, s, true, "sort_index", std::to_string(sort_index)); lines.push_back(out);
  }
}

// v1 flows: the sender (op "send", else the earliest event of the id) gets "s" at its slice's start, every
// other event of the id an "f" with "bp":"e" inside its own slice, no earlier than the "s" where the slice
// allows: a receiver posts its recv before the matching send starts, and Perfetto drops a flow whose end
// precedes its start. (A recv that ended before its send began, clocks of two ranks apart, keeps the "f" at
// its end: that arrow cannot be drawn.) Times rounded as the slices print them.
void put_flows(const Trace& t, const std::vector<int>& tids, std::vector<std::string>& lines) {
  std::map<std::int64_t, std::vector<std::size_t>> by_id;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    if (t.events[i].flow_id >= 0) by_id[t.events[i].flow_id].push_back(i);
  }
  for (auto& [id, idx] : by_id) {
    if (idx.size() < 2) continue;
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
      bool sa = t.events[a].op == "send", sb = t.events[b].op == "send";
      if (sa != sb) return sa;
      return t.events[a].start_us < t.events[b].start_us;
    });
    const double start = ns_round(t.events[idx[0]].start_us);
    for (std::size_t k = 0; k < idx.size(); ++k) {
      const OpEvent& e = t.events[idx[k]];
      std::string out = k == 0 ? R"({"ph":"s")" : R"({"ph":"f","bp":"e")";
      out += R"(,"name":"p2p","cat":"flow","id":)"; put_int(out, id);
      out += R"(,"pid":)"; put_int(out, e.rank);
      out += R"(,"tid":)"; put_int(out, tids[idx[k]]);
      const double b = ns_round(e.start_us), end = std::max(b, ns_round(e.start_us + e.dur_us));
      out += R"(,"ts":)"; put_us(out, k == 0 ? start : std::clamp(start, b, end));
      out += '}';
      lines.push_back(std::move(out));
    }
  }
}

void put_counter(std::string& out, const Counter& c) {
  out += R"({"ph":"C","name":)"; put_escaped(out, c.name);
  out += R"(,"pid":)"; put_int(out, c.rank);
  out += R"(,"ts":)"; put_us(out, c.ts_us);
  out += R"(,"args":{"value":)"; put_num(out, c.value);
  out += "}}";
}

}  // namespace

std::string to_chrome_json(const Trace& t) {
  nlohmann::json other = t.other_data.is_object() ? t.other_data : nlohmann::json::object();
  if (!other.contains("version")) other["version"] = std::string("tessel ") + TESSEL_VERSION;
  std::vector<std::string> lines;
  lines.reserve(t.events.size() + t.counters.size() + 64);
  std::string buf;
  const std::vector<int> tids = lane_tids(t);
  put_metadata(buf, t, tids, lines);
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    buf.clear();
    put_op_event(buf, t.events[i], tids[i]);
    lines.push_back(buf);
  }
  put_flows(t, tids, lines);
  for (const auto& c : t.counters) {
    buf.clear();
    put_counter(buf, c);
    lines.push_back(buf);
  }
  std::size_t total = 64;
  for (const auto& l : lines) total += l.size() + 2;
  std::string out;
  out.reserve(total + 4096);
  out += "{\"displayTimeUnit\":\"ms\",\"otherData\":";
  out += other.dump();
  out += ",\"traceEvents\":[\n";
  for (std::size_t i = 0; i < lines.size(); ++i) {
    out += lines[i];
    out += i + 1 < lines.size() ? ",\n" : "\n";
  }
  out += "]}\n";
  return out;
}

void write_chrome_trace(const Trace& t, const std::string& path) { write_file_atomic(path, to_chrome_json(t)); }

Trace read_chrome_trace(const std::string& path) { return parse_chrome_trace(read_trace_bytes(path), path); }

}  // namespace tessel::trace
