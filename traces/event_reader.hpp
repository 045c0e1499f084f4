// Low-level reading of Chrome trace event JSON, shared by the Tessel trace reader (chrome.hpp) and the
// PyTorch profiler importer (kineto.hpp).
//
// Files may be gzip-compressed (detected by the magic bytes 1f 8b, not by the name). The JSON is parsed
// with a SAX handler that fills flat RawEvents: the op-identity args of the Tessel contract are read into
// typed fields without building a DOM per event, so a trace of hundreds of thousands of events reads in
// a fraction of a second. Other args keys are kept as JSON in RawEvent::extra.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace tessel::trace {

// Perfetto's trace_processor refuses inputs over 4 GB (a uint32 size check, google/perfetto#3537), so a
// larger trace could not be looked at anyway; we refuse it before inflating it into memory.
constexpr std::uint64_t kMaxTraceBytes = 4ull << 30;

// Timestamps and durations are microseconds. Profilers record int64 nanoseconds (libkineto prints ts and dur
// as ns / 1000 with three decimals), so no trace holds a time beyond 2^63 ns = 9223372036854775.807 us (the
// year 2262 as Unix epoch time; Kineto's epoch timestamps are about 1.8e15 us today, Tessel's traces start at
// 0). read_events refuses a ts outside [-kMaxTraceTimeUs, kMaxTraceTimeUs] and a dur outside
// [0, kMaxTraceTimeUs]: beyond them a number is not a time, and sums of it print hundreds of digits.
constexpr double kMaxTraceTimeUs = 9223372036854775.807;

// The file's bytes, inflated when gzip-compressed. InputError naming the file when it cannot be read,
// is a directory, is a corrupt gzip stream, or exceeds kMaxTraceBytes.
std::string read_trace_bytes(const std::string& path);

struct RawEvent {
  std::string ph, name, cat;
  std::int64_t pid = 0, tid = 0;
  bool has_pid = false, has_tid = false;
  bool pid_is_string = false, tid_is_string = false;  // strings are kept in pid_text / tid_text
  std::string pid_text, tid_text;
  double ts = 0, dur = 0;
  bool has_ts = false, has_dur = false;
  std::string id;  // flow id as text (a number or a hex string in the spec); empty when absent
  std::string bp;
  std::int64_t bind_id = -1;  // flows v2
  bool flow_in = false, flow_out = false;
  // args of the Tessel contract; has_op is false when args.op is absent.
  bool has_op = false;
  std::string op;
  int stage = -1, chunk = -1, mb = -1, layer_begin = -1, layer_end = -1;
  double flops = 0, bytes = 0;
  bool has_bytes = false;
  nlohmann::json extra;  // all other args keys; null when there are none
};

// Everything outside traceEvents (otherData, Kineto's schemaVersion, distributedInfo, ...).
struct TraceDocument {
  nlohmann::json top = nlohmann::json::object();
  bool bare_array = false;
  std::size_t event_count = 0;
};

using EventSink = std::function<void(RawEvent&& ev, std::size_t index)>;

// Parses `text` (named `origin` in messages) and calls `sink` for every element of traceEvents in order.
// InputError for malformed JSON (origin:line:col), a top level that is neither an array of events nor an
// object with a traceEvents array, an event that is not an object, a typed key of the wrong type, a key
// repeated in one object (JSON parsers keep the last one; the first value would be dropped without a word),
// an X event without pid or tid (both formats write them on every event: Tessel's writer, and libkineto's
// ChromeTraceLogger), or a ts / dur outside the bounds of kMaxTraceTimeUs (the message names traceEvents[i]
// and the key).
TraceDocument read_events(const std::string& text, const std::string& origin, const EventSink& sink);

}  // namespace tessel::trace
