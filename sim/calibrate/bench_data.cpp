#include "sim/calibrate/bench_data.hpp"

#include <cmath>
#include <limits>
#include <sstream>

namespace tessel::calib {

namespace {

constexpr double kUs = 1e-6;
// Bounds that catch unit mistakes without limiting real machines: a measured time is at least 1 ns and at
// most an hour; sizes up to 2^50 bytes.
constexpr double kMinUs = 1e-3, kMaxUs = 3.6e9;
constexpr double kMaxBytes = 1125899906842624.0;

const Json& array_of(JsonObject& o, const std::string& key) {
  const Json& a = o.raw(key);
  if (!a.is_array()) o.fail(key, "must be an array of row objects, got " + json_brief(a));
  return a;
}

std::string row_path(const std::string& key, std::size_t i) { return key + "[" + std::to_string(i) + "]"; }

// Derived columns (rates computed from a row's primary time and size) are checked against their primaries:
// a row whose GFLOP/s or GB/s disagrees was edited or mis-transcribed, and the fit would silently use the
// primaries. The writer (bench_to_json) stores full doubles, so its own rows agree to ~1e-15; 1% admits a
// value rounded to 3 significant digits (at most 0.5% off) and nothing that changes a fit visibly.
constexpr double kDerivedTol = 0.01;

void check_derived(JsonObject& o, const std::string& key, double expected, const std::string& rule) {
  if (!o.has(key)) return;
  const double v = o.number(key, 0, 1e30);
  if (std::abs(v - expected) > kDerivedTol * std::abs(expected)) {
    std::ostringstream os;
    os.precision(6);
    os << "value " << v << " contradicts the row's primary measurements: " << rule << " = " << expected
       << " (derived columns must agree within 1%)";
    o.fail(key, os.str());
  }
}

// The repetitions' interquartile range over their median: any finite value >= 0. How much is too much is the
// noise verdict's to say (calibration.hpp: flagged above 10%, refused above --max-noise), not the reader's: a
// bench measured under heavy load writes rows whose middle half spans 100x their median, and the loop has
// to report that as noise rather than fail on its own bench.
double read_spread(JsonObject& o) {
  return o.opt_number("spread", 0, std::numeric_limits<double>::max()).value_or(-1);
}

GemmRow read_gemm(const Json& j, const std::string& where, const std::string& path) {
  JsonObject o(j, where, path);
  GemmRow r;
  r.m = o.integer("m", 1, 1 << 20);
  r.n = o.integer("n", 1, 1 << 20);
  r.k = o.integer("k", 1, 1 << 20);
  r.batch = o.integer("batch", 1, 1 << 20);
  r.time_s = o.number("time_us", kMinUs, kMaxUs) * kUs;
  if (o.has("class")) {
    const std::string c = o.choice("class", {"fwd", "dgrad", "wgrad"});
    r.cls = c == "fwd" ? GemmClass::fwd : c == "dgrad" ? GemmClass::dgrad : GemmClass::wgrad;
  }
  r.spread = read_spread(o);
  check_derived(o, "gflops", 2.0 * r.m * r.n * r.k * r.batch / r.time_s / 1e9, "2 m n k batch / time_us / 1e3");
  o.finish();
  return r;
}

MemRow read_mem(const Json& j, const std::string& where, const std::string& path) {
  JsonObject o(j, where, path);
  MemRow r;
  r.kernel = o.choice("kernel", {"copy", "triad"});
  r.bytes = o.number("bytes", 1, kMaxBytes);
  r.time_s = o.number("time_us", kMinUs, kMaxUs) * kUs;
  r.spread = read_spread(o);
  check_derived(o, "GBps", r.bytes / r.time_s / 1e9, "bytes / time_us / 1e3");
  o.finish();
  return r;
}

CollRow read_coll(const Json& j, const std::string& where, const std::string& path) {
  JsonObject o(j, where, path);
  CollRow r;
  r.comm = o.choice("comm", {"thread", "mpi", "nccl"});
  using cost::Collective;
  r.collective = parse_collective_name(o.string("collective"), where + ": " + o.key_path("collective"));
  // The collectives the fit has a line for (fit_profile): a row of another (all_to_all) would be dropped
  // from the report or, worse, averaged into the link unseen.
  if (r.collective == Collective::all_to_all)
    o.fail("collective", "'all_to_all' is not fitted by calibrate (all_reduce, all_gather, reduce_scatter, broadcast, send_recv)");
  r.ranks = static_cast<int>(o.integer("ranks", 2, 1 << 16));
  r.bytes = o.number("bytes", 1, kMaxBytes);
  r.count = o.integer("count", 1, static_cast<std::int64_t>(kMaxBytes));
  r.time_s = o.number("time_us", kMinUs, kMaxUs) * kUs;
  // nccl-tests' derived columns must agree with the primaries (time, bytes): count is elements of 4-byte
  // floats per rank block (bytes = count x 4, x ranks for all_gather/reduce_scatter, as runtime/comm's bench
  // writes them; integers, so exactly), algbw = bytes / time, busbw = algbw x bus factor.
  if (o.has("type") && o.string("type") != "float") o.fail("type", "value '" + o.string("type") + "' must be \"float\" (the bench's element type)");
  const bool gathered = r.collective == Collective::all_gather || r.collective == Collective::reduce_scatter;
  const double expect_bytes = 4.0 * static_cast<double>(r.count) * (gathered ? r.ranks : 1);
  if (expect_bytes != r.bytes) {
    std::ostringstream os;
    os.precision(15);
    os << "value " << r.count << " contradicts bytes " << r.bytes << ": bytes must be count x 4"
       << (gathered ? " x ranks" : "") << " = " << expect_bytes << " for " << cost::to_string(r.collective);
    o.fail("count", os.str());
  }
  if (o.has("redop")) {
    const std::string want = r.collective == Collective::all_reduce || r.collective == Collective::reduce_scatter ? "sum" : "none";
    if (o.string("redop") != want) o.fail("redop", "value '" + o.string("redop") + "' must be '" + want + "' for " + cost::to_string(r.collective));
  }
  const double algbw = r.bytes / r.time_s / 1e9;
  check_derived(o, "algbw_GBps", algbw, "bytes / time_us / 1e3");
  check_derived(o, "busbw_GBps", algbw * cost::bus_factor(r.collective, r.ranks), "algbw_GBps x bus factor");
  o.finish();
  return r;
}

KernelRow read_kernel(const Json& j, const std::string& where, const std::string& path) {
  JsonObject o(j, where, path);
  KernelRow r;
  r.kernel = o.choice("kernel", kernel_names());
  r.path = o.choice("path", {"memory", "attention"});
  if (r.path != kernel_path(r.kernel))
    o.fail("path", "value '" + r.path + "' contradicts kernel '" + r.kernel + "', which the cost model charges on the " +
                       kernel_path(r.kernel) + " path");
  r.bytes = o.number("bytes", 1, kMaxBytes);
  r.flops = o.number("flops", 0, 1e18);
  if (r.path == "attention" && !(r.flops > 0)) o.fail("flops", "must be > 0 on the attention path");
  r.per_step = o.opt_number("per_step", 0, 1e9).value_or(1.0);
  r.time_s = o.number("time_us", kMinUs, kMaxUs) * kUs;
  r.spread = read_spread(o);
  check_derived(o, "GBps", r.bytes / r.time_s / 1e9, "bytes / time_us / 1e3");
  check_derived(o, "gflops", r.flops / r.time_s / 1e9, "flops / time_us / 1e3");
  o.finish();
  return r;
}

}  // namespace

const char* to_string(GemmClass c) {
  switch (c) {
    case GemmClass::fwd: return "fwd";
    case GemmClass::dgrad: return "dgrad";
    case GemmClass::wgrad: return "wgrad";
  }
  return "?";
}

const std::vector<std::string>& kernel_names() {
  static const std::vector<std::string> names = {
      "layernorm_fwd", "layernorm_bwd", "gelu_fwd",      "gelu_bwd",      "cross_entropy_fwd", "cross_entropy_bwd",
      "embedding_fwd", "embedding_bwd", "attention_fwd", "attention_bwd", "adamw"};
  return names;
}

std::string kernel_path(const std::string& name) {
  return name == "attention_fwd" || name == "attention_bwd" ? "attention" : "memory";
}

cost::Collective parse_collective_name(const std::string& name, const std::string& where) {
  using cost::Collective;
  for (Collective c : {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
                       Collective::all_to_all, Collective::broadcast, Collective::send_recv})
    if (name == cost::to_string(c)) return c;
  throw InputError(where + ": collective '" + name +
                   "' is not one of all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv");
}

BenchData parse_bench(const Json& j, const std::string& where) {
  if (!j.is_object()) throw InputError(where + ": not a tessel bench document (expected a JSON object, got " + json_brief(j) + ")");
  JsonObject o(j, where);
  if (!o.has("format") || !o.raw("format").is_string() || o.raw("format").get<std::string>() != "tessel-bench")
    throw InputError(where + ": not a tessel bench document (\"format\" must be \"tessel-bench\"; write one with `tessel bench --json`)");
  o.integer("version", 1, 1);
  BenchData b;
  b.origin = where;
  b.backend = o.choice("backend", {"cpu", "cuda"});
  b.gemm_backend = o.string("gemm_backend");
  b.precision = o.choice("precision", {"fp32", "bf16", "fp16"});
  b.concurrent = static_cast<int>(o.integer("concurrent", 1, 1 << 16));
  o.ignore("host");
  o.ignore("notes");
  const Json& g = array_of(o, "gemm");
  for (std::size_t i = 0; i < g.size(); ++i) b.gemm.push_back(read_gemm(g[i], where, row_path("gemm", i)));
  const Json& m = array_of(o, "membw");
  for (std::size_t i = 0; i < m.size(); ++i) b.membw.push_back(read_mem(m[i], where, row_path("membw", i)));
  const Json& c = array_of(o, "collectives");
  for (std::size_t i = 0; i < c.size(); ++i) b.collectives.push_back(read_coll(c[i], where, row_path("collectives", i)));
  if (o.has("kernels")) {  // optional: documents written before the kernel rows existed have none
    const Json& k = array_of(o, "kernels");
    for (std::size_t i = 0; i < k.size(); ++i) b.kernels.push_back(read_kernel(k[i], where, row_path("kernels", i)));
  }
  o.finish();
  if (b.gemm.empty() && b.membw.empty() && b.collectives.empty() && b.kernels.empty())
    throw InputError(where + ": the bench document has no rows in gemm, membw or collectives: nothing to fit");
  return b;
}

BenchData load_bench(const std::string& path) { return parse_bench(parse_json_file(path, "--bench "), path); }

Json bench_to_json(const BenchData& b) {
  Json j;
  j["format"] = "tessel-bench";
  j["version"] = 1;
  j["backend"] = b.backend;
  j["gemm_backend"] = b.gemm_backend;
  j["precision"] = b.precision;
  j["concurrent"] = b.concurrent;
  Json g = Json::array();
  for (const GemmRow& r : b.gemm) {
    const double flops = 2.0 * r.m * r.n * r.k * r.batch;
    g.push_back({{"m", r.m}, {"n", r.n}, {"k", r.k}, {"batch", r.batch}, {"time_us", r.time_s / kUs},
                 {"gflops", flops / r.time_s / 1e9}});
    if (r.cls != GemmClass::fwd) g.back()["class"] = to_string(r.cls);
    if (r.spread >= 0) g.back()["spread"] = r.spread;
  }
  j["gemm"] = g;
  Json m = Json::array();
  for (const MemRow& r : b.membw) {
    m.push_back({{"kernel", r.kernel}, {"bytes", r.bytes}, {"time_us", r.time_s / kUs}, {"GBps", r.bytes / r.time_s / 1e9}});
    if (r.spread >= 0) m.back()["spread"] = r.spread;
  }
  j["membw"] = m;
  Json c = Json::array();
  for (const CollRow& r : b.collectives) {
    const double algbw = r.bytes / r.time_s / 1e9;
    c.push_back({{"comm", r.comm}, {"collective", cost::to_string(r.collective)}, {"ranks", r.ranks},
                 {"bytes", r.bytes}, {"count", r.count}, {"type", "float"},
                 {"redop", r.collective == cost::Collective::all_reduce || r.collective == cost::Collective::reduce_scatter ? "sum" : "none"},
                 {"time_us", r.time_s / kUs}, {"algbw_GBps", algbw},
                 {"busbw_GBps", algbw * cost::bus_factor(r.collective, r.ranks)}});
  }
  j["collectives"] = c;
  if (!b.kernels.empty()) {
    Json k = Json::array();
    for (const KernelRow& r : b.kernels)
      k.push_back({{"kernel", r.kernel}, {"path", r.path}, {"bytes", r.bytes}, {"flops", r.flops},
                   {"per_step", r.per_step}, {"time_us", r.time_s / kUs}, {"GBps", r.bytes / r.time_s / 1e9}, {"gflops", r.flops / r.time_s / 1e9}});
    for (std::size_t i = 0; i < b.kernels.size(); ++i)
      if (b.kernels[i].spread >= 0) k[i]["spread"] = b.kernels[i].spread;
    j["kernels"] = k;
  }
  return j;
}

}  // namespace tessel::calib
