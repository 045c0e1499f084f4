// Chrome trace event JSON for Tessel traces, as Perfetto (ui.perfetto.dev) and chrome://tracing open it.
//
// Layout (the design's contract): pid = rank, with process_name "rank R (stage S)" and process_sort_index
// M events; tid = stream (0 compute, 1 tp, 2 pp, 3 dp, 4 cp) with thread_name and thread_sort_index;
// slices of one stream that overlap without nesting (a V schedule's send beside its recv, two transfers in
// flight) go to overflow lanes, tid = stream + kNumStreams * k (k = 1, 2, ...; thread_name "pp #2", ...),
// since Perfetto only draws nested slices on one thread; the reader maps them back to their stream;
// every op is an X event whose args are {op, stage, chunk, mb, layers: [b, e], flops, bytes} plus
// OpEvent::extra; each send/recv pair sharing a flow_id is joined by a v1 flow (s on the sender, f with
// "bp":"e" on the receiver, both at the slice start so they bind to the enclosing slice); counters are C
// events (one track per rank and counter); the top-level "otherData" holds Trace::other_data.
//
// Output is byte-identical for identical input: events keep their order, timestamps are printed with
// three decimals (nanoseconds, as Kineto does), other numbers in shortest round-trip form.
#pragma once

#include <string>

#include "traces/trace.hpp"

namespace tessel::trace {

// A trace with more ranks than this is not a trace of a real job (the largest published training runs use
// ~10^5 GPUs); a pid beyond it means the input is not what it claims to be.
constexpr int kMaxRanks = 1 << 20;
// Overflow lanes per stream a reader accepts (tid < kNumStreams * kMaxLanes).
constexpr int kMaxLanes = 256;

std::string to_chrome_json(const Trace& t);
// Writes through write_file_atomic; InputError naming the path when it cannot be written.
void write_chrome_trace(const Trace& t, const std::string& path);

// Reads a Tessel trace (plain or gzip; a bare array of events or {traceEvents, otherData}). InputError
// naming the file and the rule for: malformed JSON, a document that is not a Chrome trace, no op events
// (X events with args.op), a pid outside [0, kMaxRanks), a tid that is not a stream's lane, an X event without
// dur or with a negative one.
Trace read_chrome_trace(const std::string& path);
// The same from text already in memory; `origin` names it in messages.
Trace parse_chrome_trace(const std::string& text, const std::string& origin);

}  // namespace tessel::trace
