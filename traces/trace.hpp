// The trace data model shared by the simulator (simulated traces) and the runtime (measured traces).
// One OpEvent per op per rank, with the op's identity (op, stage, chunk, mb, layers) so two traces of the
// same layout align op by op. Written as Chrome trace JSON (traces/chrome.hpp): pid = rank, tid = stream.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessel::trace {

// Streams of one rank (tid in the Chrome trace). Communication of each parallel dimension has its own.
enum class Stream : std::uint8_t { compute = 0, tp = 1, pp = 2, dp = 3, cp = 4 };
constexpr int kNumStreams = 5;
const char* stream_name(Stream s);
// The inverse of stream_name; nullopt for any other name.
std::optional<Stream> stream_from_name(std::string_view name);

// Op kinds as written in args.op. Compute: forward, backward (full), input_grad, weight_grad, recompute,
// optimizer, embedding, loss. Communication: send, recv, the collective's name per group
// ("tp_allreduce", "tp_allgather", "tp_reducescatter", "dp_allreduce", "dp_reducescatter",
// "dp_allgather", "cp_exchange"), or any other string an importer finds.
struct OpEvent {
  int rank = 0;
  Stream stream = Stream::compute;
  std::string name;          // display name, e.g. "F s3 mb7"
  std::string op;            // op kind (see above)
  int stage = -1;            // -1 when not applicable
  int chunk = -1;
  int mb = -1;
  int layer_begin = -1;      // layers [layer_begin, layer_end) of the model this op covers
  int layer_end = -1;
  double start_us = 0;
  double dur_us = 0;
  double flops = 0;
  double bytes = 0;
  std::int64_t flow_id = -1;  // a send and its recv share one id (Chrome flow events)
  nlohmann::json extra;       // anything else worth keeping (importer args); null when empty
};

struct Counter {
  int rank = 0;
  std::string name;   // e.g. "memory_GiB"
  double ts_us = 0;
  double value = 0;
};

struct Trace {
  std::vector<OpEvent> events;
  std::vector<Counter> counters;
  std::map<int, std::string> process_names;  // rank -> "rank R (stage S)"
  nlohmann::json other_data = nlohmann::json::object();  // model, system, layout, schedule, tool version
};

// Coarse classes of op kinds, for colours (SVG) and for busy/communication accounting. An unknown kind is
// a collective when its name says so (allreduce, allgather, reducescatter, alltoall, broadcast, exchange,
// nccl, barrier), else other compute (e.g. an imported kernel category such as "gemm").
enum class OpClass : std::uint8_t { forward, backward, weight_grad, recompute, optimizer, p2p, collective, other };
OpClass op_class(std::string_view op);
// Communication: any op on a communication stream, or a send/recv/collective op kind on any stream.
bool is_comm(const OpEvent& e);

// Earliest start and latest end over all events (0 for an empty trace).
double trace_begin_us(const Trace& t);
double trace_end_us(const Trace& t);

}  // namespace tessel::trace
