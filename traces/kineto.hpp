// Import of PyTorch profiler (Kineto) traces: GPU kernels classified, per-step and per-category totals,
// and the NCCL collectives with their message size, group size and measured duration.
//
// Collectives are identified by the "Collective name" arg that Kineto copies from record_param_comms onto
// the NCCL kernel, never by parsing the kernel name: a newer NCCL kernel "can execute any operation ...
// with any algorithm and any protocol" (NCCL maintainer, NVIDIA/nccl#2196), and names changed from
// ncclKernel_* to ncclDevKernel_*. A kernel whose name starts with either prefix but carries no
// collective args (older traces) is counted in the nccl category, not in the collectives list.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "traces/trace.hpp"

namespace tessel::trace::kineto {

enum class Category : std::uint8_t { gemm, conv, attention, norm, elementwise, reduction, nccl, memcpy, memset, other };
constexpr int kNumCategories = 10;
const char* category_name(Category c);
// By kernel name (first matching rule wins; see kineto.cpp). `collective` is true when the kernel
// carries a "Collective name" arg.
Category classify_kernel(std::string_view name, bool collective);

// Bytes per element of a c10 ScalarType name as Kineto writes it in "dtype" ("Float", "BFloat16", ...);
// nullopt for a name we do not know.
std::optional<int> dtype_size(std::string_view dtype);

struct Kernel {
  std::string name;
  Category category = Category::other;
  int device = 0;             // pid of the GPU lane
  std::int64_t stream = 0;    // tid of the GPU lane
  double start_us = 0, dur_us = 0;
  int step = -1;              // index into KinetoTrace::steps; -1 when launched outside every step
};

struct Collective {
  std::string name;                 // "allreduce", "broadcast", "allgather", ... ("Collective name")
  std::string dtype;                // "Float", ...
  std::int64_t in_nelems = 0, out_nelems = 0;
  std::optional<double> bytes;      // in_nelems x dtype size; nullopt when the dtype is unknown
  int group_size = 0;
  std::string process_group;        // "Process Group Name"
  double start_us = 0, duration_us = 0;
  int step = -1;
  std::string kernel;               // the kernel's name, for people
};

struct Step {
  std::string name;                 // "ProfilerStep#4"
  double cpu_start_us = 0, cpu_dur_us = 0;   // the annotation on the host thread
  double gpu_begin_us = 0, gpu_end_us = 0;   // first kernel start, last kernel end of the step's launches
  std::array<double, kNumCategories> kernel_us{};
  std::size_t kernels = 0;
};

struct CategoryTotal {
  std::size_t count = 0;
  double total_us = 0;
};

struct KinetoTrace {
  std::string origin;
  std::optional<int> rank, world_size;        // from distributedInfo
  std::string device_name;                    // deviceProperties[0].name
  std::vector<Kernel> kernels;                // in trace order
  std::vector<Collective> collectives;        // in start order
  std::vector<Step> steps;                    // in start order
  std::array<CategoryTotal, kNumCategories> totals{};
  std::size_t unattributed_nccl_kernels = 0;  // NCCL kernels without collective args
  // Per device, over the whole trace: union of non-NCCL kernel time, and NCCL time not covered by it.
  double gpu_busy_us = 0, comm_us = 0, exposed_comm_us = 0;
  double span_us = 0;                         // first kernel start to last kernel end
  nlohmann::json top;                         // top-level keys other than traceEvents

  // Mean ProfilerStep duration on the host when steps exist, else the kernel span.
  double step_time_us() const;
  // How step_time_us() was found, for people: "3 ProfilerStep(s), the step time is their mean host duration"
  // or "no ProfilerStep annotations; the step time is the kernel span (...)".
  std::string step_time_rule() const;
};

// InputError naming the file for unreadable or non-Chrome input, or a trace without GPU kernels; the event
// reader's rules (event_reader.hpp: no repeated keys, pid and tid on X events, ts and dur within
// kMaxTraceTimeUs, no negative dur) hold, and a kernel or ProfilerStep needs its ts and dur.
KinetoTrace import_kineto(const std::string& path);
KinetoTrace parse_kineto(const std::string& text, const std::string& origin);

// True when the text's first 64 KiB show Kineto's marks (a top-level "schemaVersion", or events of
// category kernel / cpu_op / cuda_runtime), which Tessel's own traces never have.
bool sniff_kineto(const std::string& text);

// The kernels as a Trace for timelines: rank = distributedInfo rank (else 0), NCCL kernels on the dp
// stream, everything else on compute; op = category name.
Trace to_trace(const KinetoTrace& k);

}  // namespace tessel::trace::kineto
