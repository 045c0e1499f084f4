#include "traces/kineto.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <unordered_map>

#include "util/error.hpp"
#include "util/json_reader.hpp"
#include "traces/chrome.hpp"
#include "traces/event_reader.hpp"
#include "traces/intervals.hpp"

namespace tessel::trace::kineto {

const char* category_name(Category c) {
  static const char* names[kNumCategories] = {"gemm", "conv", "attention", "norm", "elementwise",
                                              "reduction", "nccl", "memcpy", "memset", "other"};
  return names[static_cast<int>(c)];
}

namespace {

bool has_any(const std::string& s, std::initializer_list<const char*> needles) {
  for (const char* n : needles) {
    if (s.find(n) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

// Substring rules on the lower-cased kernel name, checked in this order because names overlap:
// cuDNN convolutions are "implicit_gemm" / fprop / dgrad / wgrad kernels, so conv is tested before gemm;
// an unfused softmax is the attention core in a transformer, so it counts as attention.
Category classify_kernel(std::string_view name, bool collective) {
  std::string s(name);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (collective || s.rfind("nccl", 0) == 0 || has_any(s, {"ncclkernel", "nccldevkernel"})) return Category::nccl;
  if (has_any(s, {"flash", "fmha", "attention", "attn", "sdpa", "softmax"})) return Category::attention;
  if (has_any(s, {"conv", "implicit_gemm", "fprop", "dgrad", "wgrad", "scudnn"})) return Category::conv;
  if (has_any(s, {"gemm", "matmul", "cublas", "cutlass", "gemv"})) return Category::gemm;
  if (has_any(s, {"norm", "bn_fw", "bn_bw"})) return Category::norm;
  if (has_any(s, {"reduce", "reduction"})) return Category::reduction;
  if (has_any(s, {"elementwise", "multi_tensor_apply", "fill", "copy", "cat", "nchwtonhwc", "nhwctonchw"}))
    return Category::elementwise;
  return Category::other;
}

// c10 ScalarType names (c10/core/ScalarType.h) and their sizes in bytes.
std::optional<int> dtype_size(std::string_view d) {
  static const std::map<std::string_view, int> sizes = {
      {"Float", 4},   {"Double", 8},   {"Half", 2},          {"BFloat16", 2},       {"Int", 4},
      {"Long", 8},    {"Short", 2},    {"Char", 1},          {"Byte", 1},           {"Bool", 1},
      {"ComplexHalf", 4}, {"ComplexFloat", 8}, {"ComplexDouble", 16}, {"Float8_e4m3fn", 1},
      {"Float8_e5m2", 1}, {"Float8_e4m3fnuz", 1}, {"Float8_e5m2fnuz", 1}, {"UInt16", 2}, {"UInt32", 4}, {"UInt64", 8}};
  auto it = sizes.find(d);
  if (it == sizes.end()) return std::nullopt;
  return it->second;
}

double KinetoTrace::step_time_us() const {
  if (steps.empty()) return span_us;
  double total = 0;
  for (const auto& s : steps) total += s.cpu_dur_us;
  return total / static_cast<double>(steps.size());
}

std::string KinetoTrace::step_time_rule() const {
  if (steps.empty())
    return "no ProfilerStep annotations; the step time is the kernel span (first kernel start to last kernel end)";
  return std::to_string(steps.size()) + " ProfilerStep(s), the step time is their mean host duration";
}

namespace {

std::int64_t int_arg(const nlohmann::json& args, const char* key, std::int64_t fallback) {
  if (!args.is_object()) return fallback;
  auto it = args.find(key);
  if (it == args.end() || !it->is_number_integer()) return fallback;
  return it->get<std::int64_t>();
}

std::string str_arg(const nlohmann::json& args, const char* key) {
  if (!args.is_object()) return {};
  auto it = args.find(key);
  if (it == args.end() || !it->is_string()) return {};
  return it->get<std::string>();
}

class Importer {
 public:
  explicit Importer(KinetoTrace& out) : k_(out) {}

  void add(RawEvent&& ev, std::size_t index) {
    if (ev.ph != "X") return;
    const bool gpu = ev.cat == "kernel" || ev.cat == "gpu_memcpy" || ev.cat == "gpu_memset";
    const bool step = (ev.cat == "cpu_op" || ev.cat == "user_annotation") && ev.name.rfind("ProfilerStep#", 0) == 0;
    // libkineto writes ts and dur on every X event (output_json.cpp); without them a kernel or a step would
    // count as 0 us at time 0.
    if ((gpu || step) && (!ev.has_ts || !ev.has_dur))
      throw InputError(k_.origin + ": traceEvents[" + std::to_string(index) + "]: " + ev.cat + " event '" + ev.name +
                       "' without " + (ev.has_ts ? "dur" : "ts"));
    if (gpu) {
      add_gpu(std::move(ev));
    } else if (ev.cat == "cuda_runtime" || ev.cat == "cuda_driver") {
      std::int64_t corr = int_arg(ev.extra, "correlation", -1);
      if (corr >= 0) launch_ts_[corr] = ev.ts;
    } else if (step) {
      Step s;
      s.name = ev.name;
      s.cpu_start_us = ev.ts;
      s.cpu_dur_us = ev.dur;
      k_.steps.push_back(std::move(s));
    }
  }

  void finish() {
    if (k_.kernels.empty()) throw InputError(k_.origin + ": no GPU kernels (events of category kernel, gpu_memcpy or gpu_memset)");
    std::sort(k_.steps.begin(), k_.steps.end(), [](const Step& a, const Step& b) { return a.cpu_start_us < b.cpu_start_us; });
    assign_steps();
    std::stable_sort(k_.collectives.begin(), k_.collectives.end(),
                     [](const Collective& a, const Collective& b) { return a.start_us < b.start_us; });
    summarise();
    read_top();
  }

 private:
  void add_gpu(RawEvent&& ev) {
    Kernel kn;
    std::string coll = str_arg(ev.extra, "Collective name");
    kn.category = ev.cat == "gpu_memcpy" ? Category::memcpy
                  : ev.cat == "gpu_memset" ? Category::memset
                                           : classify_kernel(ev.name, !coll.empty());
    kn.name = std::move(ev.name);
    kn.device = ev.pid_is_string ? 0 : static_cast<int>(ev.pid);
    kn.stream = ev.tid_is_string ? 0 : ev.tid;
    kn.start_us = ev.ts;
    kn.dur_us = ev.dur;
    correlation_.push_back(int_arg(ev.extra, "correlation", -1));
    if (!coll.empty()) {
      Collective c;
      c.name = coll;
      c.dtype = str_arg(ev.extra, "dtype");
      c.in_nelems = int_arg(ev.extra, "In msg nelems", 0);
      c.out_nelems = int_arg(ev.extra, "Out msg nelems", 0);
      if (auto sz = dtype_size(c.dtype)) c.bytes = static_cast<double>(c.in_nelems) * *sz;
      c.group_size = static_cast<int>(int_arg(ev.extra, "Group size", 0));
      c.process_group = str_arg(ev.extra, "Process Group Name");
      c.start_us = kn.start_us;
      c.duration_us = kn.dur_us;
      c.kernel = kn.name;
      collective_kernel_.push_back(k_.kernels.size());
      k_.collectives.push_back(std::move(c));
    } else if (kn.category == Category::nccl) {
      ++k_.unattributed_nccl_kernels;
    }
    k_.kernels.push_back(std::move(kn));
  }

  // A kernel belongs to the step during which the host launched it (the cuda_runtime event with the same
  // correlation id); GPU work of step N often runs after the host has entered step N+1.
  int step_at(double host_ts) const {
    auto it = std::upper_bound(k_.steps.begin(), k_.steps.end(), host_ts,
                               [](double t, const Step& s) { return t < s.cpu_start_us; });
    if (it == k_.steps.begin()) return -1;
    --it;
    if (host_ts > it->cpu_start_us + it->cpu_dur_us) return -1;
    return static_cast<int>(it - k_.steps.begin());
  }

  void assign_steps() {
    if (k_.steps.empty()) return;
    for (std::size_t i = 0; i < k_.kernels.size(); ++i) {
      auto& kn = k_.kernels[i];
      auto it = launch_ts_.find(correlation_[i]);
      kn.step = step_at(it != launch_ts_.end() ? it->second : kn.start_us);
      if (kn.step < 0) continue;
      Step& s = k_.steps[static_cast<std::size_t>(kn.step)];
      if (s.kernels == 0 || kn.start_us < s.gpu_begin_us) s.gpu_begin_us = kn.start_us;
      s.gpu_end_us = std::max(s.gpu_end_us, kn.start_us + kn.dur_us);
      s.kernel_us[static_cast<int>(kn.category)] += kn.dur_us;
      ++s.kernels;
    }
    for (std::size_t c = 0; c < k_.collectives.size(); ++c) k_.collectives[c].step = k_.kernels[collective_kernel_[c]].step;
  }

  void summarise() {
    std::map<int, std::pair<std::vector<Span>, std::vector<Span>>> per_device;  // compute, comm
    double begin = k_.kernels.front().start_us, end = begin;
    for (const auto& kn : k_.kernels) {
      auto& t = k_.totals[static_cast<int>(kn.category)];
      ++t.count;
      t.total_us += kn.dur_us;
      Span s{kn.start_us, kn.start_us + kn.dur_us};
      auto& dev = per_device[kn.device];
      (kn.category == Category::nccl ? dev.second : dev.first).push_back(s);
      begin = std::min(begin, s.first);
      end = std::max(end, s.second);
    }
    k_.span_us = end - begin;
    for (auto& [d, lanes] : per_device) {
      k_.gpu_busy_us += union_length(lanes.first);
      k_.comm_us += union_length(lanes.second);
      k_.exposed_comm_us += uncovered_length(lanes.second, lanes.first);
    }
  }

  void read_top() {
    const auto& top = k_.top;
    if (auto it = top.find("distributedInfo"); it != top.end() && it->is_object()) {
      // Range-checked before narrowing: a profiler of a real job has fewer than kMaxRanks ranks, and an
      // out-of-range value would otherwise wrap into a plausible-looking rank.
      auto read_rank = [&](const char* key, std::int64_t min, std::int64_t max) -> std::optional<int> {
        if (!it->contains(key) || !(*it)[key].is_number_integer()) return std::nullopt;
        const nlohmann::json& v = (*it)[key];
        if (v.is_number_unsigned() ? v.get<std::uint64_t>() > static_cast<std::uint64_t>(max)
                                   : (v.get<std::int64_t>() < min || v.get<std::int64_t>() > max))
          throw InputError(k_.origin + ": distributedInfo." + key + ": value " + json_brief(v) + " must be in [" +
                           std::to_string(min) + ", " + std::to_string(max) + "]");
        return static_cast<int>(v.get<std::int64_t>());
      };
      k_.world_size = read_rank("world_size", 1, kMaxRanks);
      k_.rank = read_rank("rank", 0, k_.world_size.value_or(kMaxRanks) - 1);
    }
    if (auto it = top.find("deviceProperties"); it != top.end() && it->is_array() && !it->empty()) {
      k_.device_name = str_arg((*it)[0], "name");
    }
  }

  KinetoTrace& k_;
  std::unordered_map<std::int64_t, double> launch_ts_;
  std::vector<std::int64_t> correlation_;      // per kernel
  std::vector<std::size_t> collective_kernel_;  // per collective, its kernel index
};

}  // namespace

KinetoTrace parse_kineto(const std::string& text, const std::string& origin) {
  KinetoTrace k;
  k.origin = origin;
  Importer imp(k);
  TraceDocument doc = read_events(text, origin, [&](RawEvent&& ev, std::size_t i) { imp.add(std::move(ev), i); });
  k.top = std::move(doc.top);
  imp.finish();
  return k;
}

KinetoTrace import_kineto(const std::string& path) { return parse_kineto(read_trace_bytes(path), path); }

bool sniff_kineto(const std::string& text) {
  std::string_view head(text.data(), std::min<std::size_t>(text.size(), 64 * 1024));
  for (const char* mark : {"\"schemaVersion\"", "\"cat\": \"kernel\"", "\"cat\":\"kernel\"", "\"cat\": \"cpu_op\"",
                           "\"cat\":\"cpu_op\"", "\"cat\": \"cuda_runtime\"", "\"cat\":\"cuda_runtime\""}) {
    if (head.find(mark) != std::string_view::npos) return true;
  }
  return false;
}

Trace to_trace(const KinetoTrace& k) {
  Trace t;
  int rank = k.rank.value_or(0);
  t.process_names[rank] = "rank " + std::to_string(rank) + (k.device_name.empty() ? "" : " (" + k.device_name + ")");
  t.events.reserve(k.kernels.size());
  for (const auto& kn : k.kernels) {
    OpEvent e;
    e.rank = rank;
    e.stream = kn.category == Category::nccl ? Stream::dp : Stream::compute;
    e.name = kn.name;
    e.op = category_name(kn.category);
    e.start_us = kn.start_us;
    e.dur_us = kn.dur_us;
    t.events.push_back(std::move(e));
  }
  t.other_data = nlohmann::json{{"source", "pytorch profiler"}, {"file", k.origin}};
  return t;
}

}  // namespace tessel::trace::kineto
