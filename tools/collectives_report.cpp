#include "tools/collectives_report.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "sim/cost/comm.hpp"
#include "sim/validate.hpp"
#include "tools/format.hpp"

namespace tessel::cmd {

namespace {
// PyTorch's "Collective name" values (c10d) to the cost model's collectives.
std::optional<cost::Collective> kind_of(const std::string& name) {
  if (name == "allreduce" || name == "all_reduce") return cost::Collective::all_reduce;
  if (name == "allgather" || name == "all_gather" || name == "_allgather_base" || name == "allgather_into_tensor_coalesced")
    return cost::Collective::all_gather;
  if (name == "reduce_scatter" || name == "_reduce_scatter_base" || name == "reduce_scatter_tensor_coalesced")
    return cost::Collective::reduce_scatter;
  if (name == "all_to_all" || name == "alltoall" || name == "all_to_allv") return cost::Collective::all_to_all;
  if (name == "broadcast") return cost::Collective::broadcast;
  if (name == "send" || name == "recv") return cost::Collective::send_recv;
  return std::nullopt;
}
}  // namespace

System system_for_trace(const trace::kineto::KinetoTrace& k, const std::string& system_flag) {
  if (!system_flag.empty()) return load_system(system_flag);
  if (k.device_name.empty())
    throw InputError(k.origin + ": the trace names no GPU (deviceProperties); give --system");
  return load_system(system_for_gpu(k.device_name, k.origin));
}

std::vector<CollectiveRow> predict_collectives(const trace::kineto::KinetoTrace& k, const System& sys) {
  std::vector<CollectiveRow> rows;
  for (const auto& c : k.collectives) {
    CollectiveRow r;
    r.name = c.name;
    r.group_size = c.group_size;
    r.measured_us = c.duration_us;
    if (!c.bytes) {
      rows.push_back(r);
      continue;
    }
    const auto kind = kind_of(c.name);
    // nccl-tests' S: the gathered output for all-gather, the input elsewhere (formulas.md).
    const double elt = *c.bytes / std::max<std::int64_t>(1, c.in_nelems);
    r.bytes = kind == cost::Collective::all_gather ? elt * static_cast<double>(c.out_nelems) : *c.bytes;
    if (kind && c.group_size > 1) {
      r.predicted_us = 1e6 * cost::collective_time(sys, *kind, r.bytes, {c.group_size, 1}).seconds;
      const double t = c.duration_us * 1e-6;
      if (t > 0) r.busbw_measured_GBps = cost::bus_factor(*kind, c.group_size) * r.bytes / t / 1e9;
    }
    rows.push_back(r);
  }
  return rows;
}

Json collectives_json(const std::vector<CollectiveRow>& rows, const System& sys) {
  Json j;
  j["system"] = sys.name;
  j["rows"] = Json::array();
  for (const auto& r : rows)
    j["rows"].push_back({{"name", r.name}, {"bytes", r.bytes}, {"group_size", r.group_size},
                         {"measured_us", r.measured_us}, {"predicted_us", r.predicted_us},
                         {"busbw_measured_GBps", r.busbw_measured_GBps}});
  return j;
}

std::string collectives_table(const std::vector<CollectiveRow>& rows, const System& sys) {
  std::vector<std::vector<std::string>> t = {
      {"collective", "bytes", "ranks", "measured", "predicted (" + sys.name + ")", "measured busbw GB/s"}};
  for (const auto& r : rows)
    t.push_back({r.name, r.bytes > 0 ? fmt::fixed(r.bytes, 0) : "?", std::to_string(r.group_size),
                 fmt::fixed(r.measured_us, 1) + " us", r.predicted_us > 0 ? fmt::fixed(r.predicted_us, 1) + " us" : "-",
                 r.busbw_measured_GBps > 0 ? fmt::fixed(r.busbw_measured_GBps, 1) : "-"});
  return fmt::table(t);
}

}  // namespace tessel::cmd
