#include "sim/system.hpp"

#include <algorithm>
#include <charconv>
#include <string_view>
#include <utility>

#include "util/suggest.hpp"

#include "util/units.hpp"

namespace tessel {

const std::vector<std::pair<std::string_view, std::string_view>>& tessel_system_presets();
const std::vector<std::pair<std::string_view, std::string_view>>& tessel_attention_curves();

namespace {
constexpr double kGB = 1e9;
constexpr double kTera = 1e12;
constexpr double kUs = 1e-6;
// Names of the kinds in file keys and messages, in CostKind order.
constexpr const char* kKindNames[kCostKinds] = {"gemm", "attention", "memory", "norm", "activation", "softmax",
                                                "cross_entropy", "embedding", "optimizer", "glue", "comm"};
// The collectives of node.collectives, in cost::Collective order.
constexpr const char* kCollectiveNames[6] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                             "send_recv"};
// A measured rate is a measurement of something that ran: above 0, below any machine's (1e6 GB/s, 1e6 GFLOP/s).
constexpr double kMinRate = 1e-6, kMaxRate = 1e6;
// A GEMM class or a contention factor outside [0.1, 20] is no measured ratio of this cost model's times.
constexpr double kMinFactor = 0.1, kMaxFactor = 20;

// gpu.kernels.optimizer's "params" and "by_params_GBps": both or neither, as many rates as sizes (at least
// 2: one size is the "GBps" rate), the sizes strictly ascending.
void parse_optimizer_sizes(JsonObject& r, GpuSpec& g) {
  if (!r.has("params") && !r.has("by_params_GBps")) return;
  if (!r.has("params")) r.fail("by_params_GBps", "needs \"params\", the parameter counts its rates were measured at");
  g.optimizer_params = r.number_array("params", 1, 1e15);
  if (!r.has("by_params_GBps")) r.fail("params", "needs \"by_params_GBps\", the rate at each of its sizes");
  g.optimizer_Bps = r.number_array("by_params_GBps", kMinRate, kMaxRate);
  if (g.optimizer_params.size() < 2 || g.optimizer_Bps.size() != g.optimizer_params.size())
    r.fail("by_params_GBps", "must hold one rate per entry of \"params\" (" + std::to_string(g.optimizer_params.size()) +
                             "), at least 2");
  for (std::size_t i = 1; i < g.optimizer_params.size(); ++i)
    if (!(g.optimizer_params[i] > g.optimizer_params[i - 1])) r.fail("params", "must be strictly ascending");
  for (double& b : g.optimizer_Bps) b *= kGB;
}

// gpu.efficiency.attention_curve: {"source", "seq": [ascending lengths], "reference_head_dim",
// "fwd_TFLOPs": {"<head dim>": [a rate per length], ...}, "bwd_TFLOPs": {...}, and optionally the shape
// measured: "measured_at": {"tokens", "hidden", "fwd_causal", "bwd_causal"}}; the reference head dim must be
// listed in both directions.
AttentionCurve parse_attention_curve(JsonObject c) {
  AttentionCurve a;
  a.source = c.opt_string("source").value_or("");
  if (c.has("measured_at")) {
    JsonObject m = c.object("measured_at");
    a.tokens = m.number("tokens", 1, 1e9);
    a.hidden = m.number("hidden", 1, 1e6);
    a.causal = {m.boolean("fwd_causal"), m.boolean("bwd_causal")};
    m.finish();
  }
  a.seq = c.number_array("seq", 1, 1e8);
  if (a.seq.empty()) c.fail("seq", "must list at least one sequence length");
  for (std::size_t i = 1; i < a.seq.size(); ++i)
    if (!(a.seq[i] > a.seq[i - 1])) c.fail("seq", "must be strictly ascending");
  a.reference_head_dim = static_cast<double>(c.integer("reference_head_dim", 1, 4096));
  const char* keys[2] = {"fwd_TFLOPs", "bwd_TFLOPs"};
  for (int d = 0; d < 2; ++d) {
    const Json& raw = c.raw(keys[d]);
    if (!raw.is_object() || raw.empty())
      c.fail(keys[d], "must be an object of head dim -> one rate (TFLOP/s) per entry of \"seq\"");
    JsonObject r(raw, c.where(), c.key_path(keys[d]));
    std::vector<std::pair<double, std::vector<double>>> rows;
    for (const auto& [k, v] : raw.items()) {
      int hd = 0;
      const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), hd);
      if (ec != std::errc() || end != k.data() + k.size() || hd < 1 || hd > 4096)
        r.fail(k, "the key must be a head dim, an integer from 1 to 4096");
      std::vector<double> rates = r.number_array(k, 1e-3, 1e5);
      if (rates.size() != a.seq.size())
        r.fail(k, "must hold one rate per entry of \"seq\" (" + std::to_string(a.seq.size()) + "), not " +
                      std::to_string(rates.size()));
      for (double& x : rates) x *= kTera;
      rows.emplace_back(hd, std::move(rates));
    }
    r.finish();
    std::sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    bool has_ref = false;
    for (auto& [hd, rates] : rows) {
      has_ref = has_ref || hd == a.reference_head_dim;
      a.head_dim[d].push_back(hd);
      a.rate[d].push_back(std::move(rates));
    }
    if (!has_ref)
      c.fail(keys[d], "must list the reference head dim (" + std::to_string(static_cast<int>(a.reference_head_dim)) + ")");
  }
  c.finish();
  return a;
}

// gpu.efficiency.attention_curve written out, or the name of a built-in one (sim/curves/<name>.json): one
// published curve serves every preset of that GPU family from one file.
AttentionCurve attention_curve_entry(JsonObject& e) {
  const Json& raw = e.raw("attention_curve");
  if (!raw.is_string()) return parse_attention_curve(e.object("attention_curve"));
  const std::string name = raw.get<std::string>();
  std::vector<std::string> known;
  for (const auto& [n, text] : tessel_attention_curves()) {
    if (n == name) {
      const std::string where = "attention curve " + name;
      const Json curve = parse_json_text(std::string(text), where);
      return parse_attention_curve(JsonObject(curve, where));
    }
    known.emplace_back(n);
  }
  std::string list;
  for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
  e.fail("attention_curve", "\"" + name + "\" names no built-in curve (known: " + list + ")" + did_you_mean(name, known));
}

Json attention_curve_to_json(const AttentionCurve& a) {
  Json j;
  if (!a.source.empty()) j["source"] = a.source;
  j["seq"] = a.seq;
  j["reference_head_dim"] = static_cast<int>(a.reference_head_dim);
  if (a.tokens > 0)
    j["measured_at"] = {{"tokens", a.tokens}, {"hidden", a.hidden}, {"fwd_causal", a.causal[0]}, {"bwd_causal", a.causal[1]}};
  const char* keys[2] = {"fwd_TFLOPs", "bwd_TFLOPs"};
  for (int d = 0; d < 2; ++d) {
    Json rows = Json::object();
    for (std::size_t h = 0; h < a.head_dim[d].size(); ++h) {
      Json r = Json::array();
      for (double x : a.rate[d][h]) r.push_back(x / kTera);
      rows[std::to_string(static_cast<int>(a.head_dim[d][h]))] = r;
    }
    j[keys[d]] = rows;
  }
  return j;
}

// gpu.kernels: {"norm": {"fwd_GBps", "bwd_GBps"}, ..., "optimizer": {"GBps"}, "attention": {"fwd_GFLOPs",
// "bwd_GFLOPs"}, "gemm_dgrad", "gemm_wgrad"}, every key optional.
void parse_kernels(JsonObject k, GpuSpec& g) {
  for (int i = idx(CostKind::memory); i <= idx(CostKind::glue); ++i) {
    if (!k.has(kKindNames[i])) continue;
    JsonObject r = k.object(kKindNames[i]);
    DirRate& d = g.kernel_Bps[static_cast<std::size_t>(i)];
    if (i == idx(CostKind::optimizer)) {
      d.fwd = r.number("GBps", kMinRate, kMaxRate) * kGB;
      parse_optimizer_sizes(r, g);
    } else {
      d.fwd = r.opt_number("fwd_GBps", kMinRate, kMaxRate).value_or(0) * kGB;
      d.bwd = r.opt_number("bwd_GBps", kMinRate, kMaxRate).value_or(0) * kGB;
    }
    r.finish();
  }
  if (k.has("attention")) {
    JsonObject a = k.object("attention");
    g.attention_flops.fwd = a.number("fwd_GFLOPs", kMinRate, kMaxRate) * 1e9;
    g.attention_flops.bwd = a.number("bwd_GFLOPs", kMinRate, kMaxRate) * 1e9;
    a.finish();
  }
  g.gemm_dgrad_factor = k.opt_number("gemm_dgrad", kMinFactor, kMaxFactor).value_or(1.0);
  g.gemm_wgrad_factor = k.opt_number("gemm_wgrad", kMinFactor, kMaxFactor).value_or(1.0);
  k.finish();
}

Json kernels_to_json(const GpuSpec& g) {
  Json k = Json::object();
  for (int i = idx(CostKind::memory); i <= idx(CostKind::glue); ++i) {
    const DirRate& d = g.kernel_Bps[static_cast<std::size_t>(i)];
    if (i == idx(CostKind::optimizer)) {
      if (d.fwd > 0) k[kKindNames[i]] = {{"GBps", d.fwd / kGB}};
      if (d.fwd > 0 && !g.optimizer_params.empty()) {
        Json rates = Json::array();
        for (double b : g.optimizer_Bps) rates.push_back(b / kGB);
        k[kKindNames[i]]["params"] = g.optimizer_params;
        k[kKindNames[i]]["by_params_GBps"] = rates;
      }
      continue;
    }
    Json r = Json::object();
    if (d.fwd > 0) r["fwd_GBps"] = d.fwd / kGB;
    if (d.bwd > 0) r["bwd_GBps"] = d.bwd / kGB;
    if (!r.empty()) k[kKindNames[i]] = r;
  }
  Json a = Json::object();
  if (g.attention_flops.fwd > 0) a["fwd_GFLOPs"] = g.attention_flops.fwd / 1e9;
  if (g.attention_flops.bwd > 0) a["bwd_GFLOPs"] = g.attention_flops.bwd / 1e9;
  if (!a.empty()) k["attention"] = a;
  if (g.gemm_dgrad_factor != 1) k["gemm_dgrad"] = g.gemm_dgrad_factor;
  if (g.gemm_wgrad_factor != 1) k["gemm_wgrad"] = g.gemm_wgrad_factor;
  return k;
}

// node.collectives: {"all_reduce": {"latency_us", "GBps", optional "large_from_MB" with "large_GBps"}, ...}.
void parse_collectives(JsonObject c, NodeSpec& n) {
  for (int i = 0; i < 6; ++i) {
    if (!c.has(kCollectiveNames[i])) continue;
    JsonObject l = c.object(kCollectiveNames[i]);
    LinkRate& r = n.collective[static_cast<std::size_t>(i)];
    r = {l.number("latency_us", 0, 1e6) * kUs, l.number("GBps", kMinRate, kMaxRate) * kGB};
    const auto from = l.opt_number("large_from_MB", 1e-6, 1e9);
    const auto large = l.opt_number("large_GBps", kMinRate, kMaxRate);
    if (from.has_value() != large.has_value())
      l.fail(from ? "large_from_MB" : "large_GBps", "large_from_MB and large_GBps come together (the bytes past one "
             "message size move at the second rate)");
    if (from) {
      r.large_bytes = *from * 1e6;
      r.large_bw_Bps = *large * kGB;
    }
    l.finish();
  }
  c.finish();
}

// host: {"cores": N, "contention": {"gemm": x, ...}} (contention keys optional, 1 when absent).
void parse_host(JsonObject h, HostSpec& host) {
  host.cores = static_cast<int>(h.integer("cores", 1, 1 << 16));
  if (h.has("contention")) {
    JsonObject c = h.object("contention");
    for (int i = 0; i < kCostKinds; ++i)
      host.contention[static_cast<std::size_t>(i)] = c.opt_number(kKindNames[i], kMinFactor, kMaxFactor).value_or(1.0);
    c.finish();
  }
  h.finish();
}

constexpr double kHour = 3600.0;

// "reliability": {"gpu_mtbf_hours", "node_mtbf_hours" (at least one), "restart_overhead_s", "source"}.
ReliabilitySpec parse_reliability(JsonObject r) {
  r.ignore("source");
  ReliabilitySpec out;
  out.gpu_mtbf_s = r.opt_number("gpu_mtbf_hours", 1e-3, 1e9).value_or(0.0) * kHour;
  out.node_mtbf_s = r.opt_number("node_mtbf_hours", 1e-3, 1e9).value_or(0.0) * kHour;
  if (out.gpu_mtbf_s == 0 && out.node_mtbf_s == 0)
    r.fail("gpu_mtbf_hours", "needs gpu_mtbf_hours or node_mtbf_hours (or both): a failure model needs a rate");
  out.restart_overhead_s = r.number("restart_overhead_s", 0, 1e7);
  r.finish();
  return out;
}

// "storage": {"node_write_GBps", "node_read_GBps", "aggregate_GBps" (optional), "d2h_GBps", "async", "source"}.
StorageSpec parse_storage(JsonObject st) {
  st.ignore("source");
  StorageSpec out;
  out.node_write_bw = st.number("node_write_GBps", 1e-6, 1e7) * kGB;
  out.node_read_bw = st.number("node_read_GBps", 1e-6, 1e7) * kGB;
  out.aggregate_bw = st.opt_number("aggregate_GBps", 1e-6, 1e9).value_or(0.0) * kGB;
  out.d2h_bw = st.number("d2h_GBps", 1e-6, 1e7) * kGB;
  out.async = st.boolean("async");
  st.finish();
  return out;
}
}  // namespace

const char* to_string(CostKind k) { return kKindNames[idx(k)]; }

bool GpuSpec::kind_rates() const {
  for (const DirRate& d : kernel_Bps)
    if (d.fwd > 0 || d.bwd > 0) return true;
  return false;
}

System parse_system(const Json& j, const std::string& where) {
  JsonObject o(j, where);
  System s;
  s.name = o.string("name");
  o.ignore("source");
  o.ignore("notes");
  s.max_gpus = static_cast<int>(o.opt_integer("max_gpus", 1, 1 << 22).value_or(1 << 20));
  s.memory_reserved_bytes = o.number("memory_reserved_GiB", 0, 1e4) * kGiB;
  s.min_headroom_bytes = o.opt_number("min_headroom_GiB", 0, 1e4).value_or(0) * kGiB;
  {
    JsonObject g = o.object("gpu");
    s.gpu.name = g.string("name");
    if (g.has("arch")) {
      const std::string a = g.choice("arch", {"ampere", "hopper", "blackwell", "other"});
      s.gpu.arch = a == "ampere" ? GpuArch::ampere : a == "hopper" ? GpuArch::hopper : a == "blackwell" ? GpuArch::blackwell : GpuArch::other;
    }
    JsonObject pk = g.object("peak_tflops");
    s.gpu.peak_flops[static_cast<int>(Precision::bf16)] = pk.number("bf16", 0, 1e5) * kTera;
    s.gpu.peak_flops[static_cast<int>(Precision::fp16)] = pk.number("fp16", 0, 1e5) * kTera;
    s.gpu.peak_flops[static_cast<int>(Precision::fp8)] = pk.number("fp8", 0, 1e5) * kTera;
    s.gpu.peak_flops[static_cast<int>(Precision::fp32)] = pk.number("fp32", 0, 1e5) * kTera;
    s.gpu.tf32_flops = pk.number("tf32", 0, 1e5) * kTera;
    pk.finish();
    if (s.gpu.peak(Precision::bf16) <= 0 && s.gpu.peak(Precision::fp32) <= 0)
      g.fail("peak_tflops", "needs a positive bf16 or fp32 peak");
    s.gpu.memory_bytes = g.number("memory_GiB", 1e-3, 1e5) * kGiB;
    s.gpu.memory_bw_Bps = g.number("memory_GBps", 1e-3, 1e6) * kGB;
    s.gpu.sms = static_cast<int>(g.integer("sms", 1, 100000));
    JsonObject e = g.object("efficiency");
    s.gpu.gemm_efficiency = e.number("gemm", 0.01, 1.0);
    s.gpu.gemm_efficiency_fp8 = e.opt_number("gemm_fp8", 0.01, 1.0).value_or(0.0);
    s.gpu.gemm_k_overhead = e.number("gemm_k_overhead", 0, 1e5);
    s.gpu.attention_efficiency = e.number("attention", 0.01, 1.0);
    // Memory efficiencies down to 0.001: a CPU runtime's scalar loops run some 100x below the copy rate of
    // the datasheet bandwidth both share (docs/calibration.md).
    s.gpu.memory_efficiency = e.number("memory", kMinMemoryEfficiency, 1.0);
    s.gpu.gemm_memory_efficiency = e.opt_number("gemm_memory", kMinMemoryEfficiency, 1.0).value_or(0.0);
    s.gpu.kernel_overhead_s = e.number("kernel_overhead_us", 0, 1e5) * kUs;
    s.gpu.overlap_slowdown = e.opt_number("overlap_slowdown", 0.0, 4.0).value_or(0.0);
    s.gpu.gemm_fp32_out = e.opt_number("gemm_fp32_out", 1.0, 4.0).value_or(1.0);
    s.gpu.attention_fa2 = e.opt_number("attention_fa2", 0.05, 2.0).value_or(1.0);
    if (e.has("attention_curve")) s.gpu.attention_curve = attention_curve_entry(e);
    if (e.has("gemm_tiles")) {
      const Json& t = e.raw("gemm_tiles");
      if (!t.is_array() || t.empty()) e.fail("gemm_tiles", "must be a non-empty array of [m, n] pairs");
      s.gpu.gemm_tiles.clear();
      for (const auto& p : t) {
        if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || !p[1].is_number_integer() ||
            p[0].get<std::int64_t>() < 8 || p[1].get<std::int64_t>() < 8 || p[0].get<std::int64_t>() > 1024 ||
            p[1].get<std::int64_t>() > 1024)
          e.fail("gemm_tiles", "entry " + json_brief(p) + " must be [m, n] with 8 <= m, n <= 1024");
        s.gpu.gemm_tiles.push_back({p[0].get<int>(), p[1].get<int>()});
      }
    } else {
      e.ignore("gemm_tiles");
    }
    e.finish();
    if (g.has("kernels")) parse_kernels(g.object("kernels"), s.gpu);
    g.finish();
  }
  {
    JsonObject n = o.object("node");
    s.node.gpus_per_node = static_cast<int>(n.integer("gpus_per_node", 1, 1024));
    s.node.intra_bw_Bps = n.number("intra_GBps", 1e-3, 1e6) * kGB;
    s.node.intra_latency_s = n.number("intra_latency_us", 0, 1e6) * kUs;
    s.node.intra_efficiency = n.number("intra_efficiency", 0.01, 1.0);
    if (n.has("collectives")) parse_collectives(n.object("collectives"), s.node);
    n.finish();
  }
  {
    JsonObject w = o.object("network");
    s.net.nic_bw_Bps = w.number("nic_GBps", 1e-3, 1e6) * kGB;
    s.net.latency_s = w.number("latency_us", 0, 1e6) * kUs;
    s.net.efficiency = w.number("efficiency", 0.01, 1.0);
    s.net.pod_gpus = static_cast<int>(w.opt_integer("pod_gpus", 0, 1 << 24).value_or(0));
    s.net.oversubscription = w.opt_number("oversubscription", 1.0, 1000.0).value_or(1.0);
    w.finish();
  }
  if (o.has("host")) parse_host(o.object("host"), s.host);
  if (o.has("reliability")) s.reliability = parse_reliability(o.object("reliability"));
  if (o.has("storage")) s.storage = parse_storage(o.object("storage"));
  for (const char* key : {"error_band", "moe_error_band"}) {
    if (!o.has(key)) continue;
    JsonObject b = o.object(key);
    ErrorBand e;
    e.hardware_class = b.string("class");
    e.step_pct = b.number("step_pct", 0, 1e4);
    e.rows = static_cast<int>(b.integer("rows", 1, 1 << 20));
    e.basis = b.string("basis");
    e.rows_of = b.opt_string("rows_of").value_or("");
    b.finish();
    (std::string(key) == "error_band" ? s.error_band : s.moe_error_band) = e;
  }
  o.finish();
  return s;
}

Json error_band_to_json(const std::optional<ErrorBand>& b) {
  if (!b) return nullptr;
  Json j = {{"class", b->hardware_class}, {"step_pct", b->step_pct}, {"rows", b->rows}, {"basis", b->basis}};
  if (!b->rows_of.empty()) j["rows_of"] = b->rows_of;
  return j;
}

Json system_to_json(const System& s) {
  Json g;
  g["name"] = s.gpu.name;
  if (s.gpu.arch != GpuArch::other) {
    const GpuArch a = s.gpu.arch;
    g["arch"] = a == GpuArch::ampere ? "ampere" : a == GpuArch::hopper ? "hopper" : "blackwell";
  }
  g["peak_tflops"] = {{"bf16", s.gpu.peak(Precision::bf16) / kTera}, {"fp16", s.gpu.peak(Precision::fp16) / kTera},
                      {"fp8", s.gpu.peak(Precision::fp8) / kTera}, {"fp32", s.gpu.peak(Precision::fp32) / kTera},
                      {"tf32", s.gpu.tf32_flops / kTera}};
  g["memory_GiB"] = s.gpu.memory_bytes / kGiB;
  g["memory_GBps"] = s.gpu.memory_bw_Bps / kGB;
  g["sms"] = s.gpu.sms;
  Json tiles = Json::array();
  for (const auto& t : s.gpu.gemm_tiles) tiles.push_back({t.m, t.n});
  g["efficiency"] = {{"gemm", s.gpu.gemm_efficiency}, {"gemm_k_overhead", s.gpu.gemm_k_overhead},
                     {"attention", s.gpu.attention_efficiency}, {"memory", s.gpu.memory_efficiency},
                     {"kernel_overhead_us", s.gpu.kernel_overhead_s / kUs}, {"gemm_tiles", tiles},
                     {"overlap_slowdown", s.gpu.overlap_slowdown}};
  if (s.gpu.gemm_efficiency_fp8 > 0) g["efficiency"]["gemm_fp8"] = s.gpu.gemm_efficiency_fp8;
  if (s.gpu.gemm_memory_efficiency > 0) g["efficiency"]["gemm_memory"] = s.gpu.gemm_memory_efficiency;
  if (s.gpu.gemm_fp32_out != 1) g["efficiency"]["gemm_fp32_out"] = s.gpu.gemm_fp32_out;
  if (s.gpu.attention_fa2 != 1) g["efficiency"]["attention_fa2"] = s.gpu.attention_fa2;
  if (!s.gpu.attention_curve.empty()) g["efficiency"]["attention_curve"] = attention_curve_to_json(s.gpu.attention_curve);
  if (Json k = kernels_to_json(s.gpu); !k.empty()) g["kernels"] = k;
  Json j;
  j["name"] = s.name;
  j["memory_reserved_GiB"] = s.memory_reserved_bytes / kGiB;
  if (s.min_headroom_bytes > 0) j["min_headroom_GiB"] = s.min_headroom_bytes / kGiB;
  j["max_gpus"] = s.max_gpus;
  j["gpu"] = g;
  j["node"] = {{"gpus_per_node", s.node.gpus_per_node}, {"intra_GBps", s.node.intra_bw_Bps / kGB},
               {"intra_latency_us", s.node.intra_latency_s / kUs}, {"intra_efficiency", s.node.intra_efficiency}};
  j["network"] = {{"nic_GBps", s.net.nic_bw_Bps / kGB}, {"latency_us", s.net.latency_s / kUs},
                  {"efficiency", s.net.efficiency}, {"pod_gpus", s.net.pod_gpus},
                  {"oversubscription", s.net.oversubscription}};
  Json colls = Json::object();
  for (int i = 0; i < 6; ++i) {
    const LinkRate& l = s.node.collective[static_cast<std::size_t>(i)];
    if (!(l.bw_Bps > 0)) continue;
    colls[kCollectiveNames[i]] = {{"latency_us", l.latency_s / kUs}, {"GBps", l.bw_Bps / kGB}};
    if (l.large_bytes > 0 && l.large_bw_Bps > 0) {
      colls[kCollectiveNames[i]]["large_from_MB"] = l.large_bytes / 1e6;
      colls[kCollectiveNames[i]]["large_GBps"] = l.large_bw_Bps / kGB;
    }
  }
  if (!colls.empty()) j["node"]["collectives"] = colls;
  if (s.host.cores > 0) {
    Json c = Json::object();
    for (int i = 0; i < kCostKinds; ++i)
      if (s.host.contention[static_cast<std::size_t>(i)] != 1) c[kKindNames[i]] = s.host.contention[static_cast<std::size_t>(i)];
    j["host"] = {{"cores", s.host.cores}, {"contention", c}};
  }
  if (const auto& r = s.reliability) {
    Json rj;
    if (r->gpu_mtbf_s > 0) rj["gpu_mtbf_hours"] = r->gpu_mtbf_s / kHour;
    if (r->node_mtbf_s > 0) rj["node_mtbf_hours"] = r->node_mtbf_s / kHour;
    rj["restart_overhead_s"] = r->restart_overhead_s;
    j["reliability"] = rj;
  }
  if (const auto& st = s.storage) {
    Json sj = {{"node_write_GBps", st->node_write_bw / kGB}, {"node_read_GBps", st->node_read_bw / kGB},
               {"d2h_GBps", st->d2h_bw / kGB}, {"async", st->async}};
    if (st->aggregate_bw > 0) sj["aggregate_GBps"] = st->aggregate_bw / kGB;
    j["storage"] = sj;
  }
  if (s.error_band) j["error_band"] = error_band_to_json(s.error_band);
  if (s.moe_error_band) j["moe_error_band"] = error_band_to_json(s.moe_error_band);
  return j;
}

std::vector<std::string> system_preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : tessel_system_presets()) names.emplace_back(name);
  return names;
}

System load_system(const std::string& name_or_path) {
  for (const auto& [name, text] : tessel_system_presets()) {
    if (name == name_or_path) {
      std::string where = "system preset " + std::string(name);
      return parse_system(parse_json_text(std::string(text), where), where);
    }
  }
  if (name_or_path.find('/') == std::string::npos && name_or_path.find(".json") == std::string::npos) {
    std::string list;
    for (const auto& n : system_preset_names()) list += (list.empty() ? "" : ", ") + n;
    throw InputError("--system " + name_or_path + ": no such preset (known: " + list + ") and not a .json path" +
                     did_you_mean(name_or_path, system_preset_names()));
  }
  return parse_system(parse_json_file(name_or_path, "--system "), name_or_path);
}

std::optional<std::string> system_preset_for_gpu(const std::string& gpu) {
  if (gpu.find("A100") != std::string::npos) return "dgx-a100";
  if (gpu.find("H100") != std::string::npos) return "dgx-h100";
  if (gpu.find("H800") != std::string::npos) return "h800";
  if (gpu.find("H200") != std::string::npos) return "dgx-h200";
  if (gpu.find("GB200") != std::string::npos) return "gb200";  // before B200, which it contains
  if (gpu.find("B200") != std::string::npos) return "dgx-b200";
  return std::nullopt;
}

std::string system_for_gpu(const std::string& gpu, const std::string& row_id) {
  if (auto preset = system_preset_for_gpu(gpu)) return *preset;
  std::string list;
  for (const auto& n : system_preset_names()) list += (list.empty() ? "" : ", ") + n;
  throw InputError("row " + row_id + ": hardware.gpu \"" + gpu + "\" matches no system preset (known: " + list + ")");
}

}  // namespace tessel
