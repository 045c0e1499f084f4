// Gathers every rank's measured trace to rank 0 over a Comm, so that `tessel run --trace` under mpirun
// writes one trace with all ranks, as the thread backend does. Events travel as a flat byte encoding
// (fixed-width fields and length-prefixed strings) packed into the float buffers the Comm moves: a
// CPU-to-CPU copy between processes of one build, so no byte-order or padding conversion is needed.
#pragma once

#include <string>

#include "runtime/comm/comm.hpp"
#include "runtime/recorder.hpp"
#include "traces/trace.hpp"

namespace tessel::rt {

// Bytes of one trace's events, counters and process names, and back (round-trips every field).
std::string encode_trace(const trace::Trace& t);
trace::Trace decode_trace(const std::string& bytes);

// Collective over `world`: every rank calls it with its own part. Rank 0 returns the parts merged (events
// and counters in rank order, then in recorded order; other_data from rank 0's part); other ranks return
// an empty Trace.
trace::Trace gather_trace(Comm& world, const trace::Trace& local);

// One time origin for every process's trace, collective over `world`, called as every rank leaves a
// barrier. Processes on one host read one monotonic clock (steady_clock is CLOCK_MONOTONIC on Linux), so
// there rank 0's reading becomes every rank's origin exactly; when the ranks span hosts (told apart by a
// hash of the host name) each keeps its own reading at the barrier's exit, off by that exit's skew, which
// under load (ranks outnumbering cores, a sanitizer) reaches milliseconds.
Recorder::Clock::time_point shared_origin(Comm& world);

}  // namespace tessel::rt
