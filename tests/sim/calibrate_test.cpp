// Calibration: the fit recovers the parameters that generated synthetic measurements through the cost model
// itself; NNLS on hand-solved cases; strict reading of bench documents.
#include <doctest/doctest.h>

#include <algorithm>

#include <cmath>

#include "sim/calibrate/bench_data.hpp"
#include "sim/calibrate/fit.hpp"
#include "sim/calibrate/nnls.hpp"
#include "sim/calibrate/trace_fit.hpp"
#include "sim/cost/comm.hpp"
#include "sim/cost/compute.hpp"
#include "sim/estimate.hpp"
#include "traces/trace.hpp"

using namespace tessel;
using namespace tessel::calib;

namespace {
// Synthetic data is exact, so recovery is limited only by rounding in QR on ~100 rows whose coefficients
// span ~1e8: 1e-6 relative is far above that rounding and far below any real modelling difference.
constexpr double kRecoverTol = 1e-6;
constexpr double kExact = 1e-12;

// The truth: a made-up core whose every number differs from the cpu preset's starting guesses.
System truth_system() {
  System s = load_system("cpu");
  s.gpu.peak_flops[static_cast<int>(Precision::fp32)] = 80e9;
  s.gpu.gemm_efficiency = 0.7;          // ceiling 56 GFLOP/s
  s.gpu.gemm_k_overhead = 24;
  s.gpu.gemm_tiles = {{16, 32}};
  s.gpu.memory_bw_Bps = 4e9;
  s.gpu.memory_efficiency = 0.5;        // 2 GB/s: slow enough that a GEMV is memory-bound
  s.gpu.kernel_overhead_s = 3e-6;
  s.node.intra_latency_s = 7e-6;
  s.node.intra_bw_Bps = 6e9;
  s.node.intra_efficiency = 0.6;        // 3.6 GB/s
  return s;
}

BenchData synthetic(const System& t) {
  BenchData b;
  b.gemm_backend = "synthetic";
  // Sizes off the tile grid (37, 100, 200) so the tile shape is identifiable; m = 1 GEMVs so some rows sit
  // on the memory roofline; batched rows like attention's.
  for (std::int64_t m : {1, 37, 100, 256, 512})
    for (std::int64_t n : {64, 200, 1024})
      for (std::int64_t k : {32, 256, 2048}) {
        GemmRow r{m, n, k, 1, 0};
        r.time_s = cost::gemm_time(t.gpu, Precision::fp32, {m, n, k, 1});
        b.gemm.push_back(r);
      }
  b.gemm.push_back({32, 32, 16, 64, cost::gemm_time(t.gpu, Precision::fp32, {32, 32, 16, 64})});
  for (double bytes : {4e3, 6.4e4, 1e6, 1.6e7, 2.56e8})
    b.membw.push_back({"copy", bytes, cost::memory_time(t.gpu, bytes, 1)});
  for (cost::Collective c : {cost::Collective::all_reduce, cost::Collective::all_gather, cost::Collective::reduce_scatter,
                             cost::Collective::send_recv})
    for (int n : {2, 4})
      for (double bytes : {1024.0, 65536.0, 4194304.0, 67108864.0}) {
        // count: 4-byte elements per rank block (runtime/comm's bench: S is n blocks for all_gather/reduce_scatter).
        const bool gathered = c == cost::Collective::all_gather || c == cost::Collective::reduce_scatter;
        CollRow r{"thread", c, n, bytes, static_cast<std::int64_t>(bytes / 4 / (gathered ? n : 1)), 0};
        r.time_s = c == cost::Collective::send_recv ? cost::p2p_time(t, bytes, 1).seconds
                                                    : cost::collective_time(t, c, bytes, {n, 1}).seconds;
        b.collectives.push_back(r);
      }
  return b;
}

double rel(double a, double b) { return std::abs(a / b - 1); }
}  // namespace

TEST_CASE("NNLS: hand-solved cases") {
  // A = [[1,1],[1,0],[0,1]], b = [1,1,-1]. Unconstrained: A^T A = [[2,1],[1,2]], A^T b = [2,0] -> x = (4/3, -2/3).
  // With x2 >= 0 active (x2 = 0): minimise 2 (x1 - 1)^2 + 1 -> x1 = 1.
  Matrix A(3, 2);
  A.at(0, 0) = 1; A.at(0, 1) = 1; A.at(1, 0) = 1; A.at(2, 1) = 1;
  const std::vector<double> b{1, 1, -1};
  const auto u = least_squares(A, b, {0, 1});
  CHECK(u[0] == doctest::Approx(4.0 / 3).epsilon(kExact));
  CHECK(u[1] == doctest::Approx(-2.0 / 3).epsilon(kExact));
  const auto x = nnls(A, b);
  CHECK(x[0] == doctest::Approx(1.0).epsilon(kExact));
  CHECK(x[1] == 0.0);
  // Columns of very different scale (1e9 and 1) with an exact positive solution (2e-9, 3): recovered.
  Matrix B(3, 2);
  const double c0[] = {1e9, 2e9, 5e8}, c1[] = {1, 1, 2};
  std::vector<double> y(3);
  for (int i = 0; i < 3; ++i) {
    B.at(i, 0) = c0[i];
    B.at(i, 1) = c1[i];
    y[i] = 2e-9 * c0[i] + 3 * c1[i];
  }
  const auto z = nnls(B, y);
  CHECK(z[0] == doctest::Approx(2e-9).epsilon(kExact * 1e3));
  CHECK(z[1] == doctest::Approx(3.0).epsilon(kExact * 1e3));
}

TEST_CASE("calibrate recovers the parameters that generated the measurements") {
  const System t = truth_system();
  const BenchData b = synthetic(t);
  // Precondition of the test: some rows are memory-bound under the truth (bytes / 2 GB/s above the tiled
  // compute time), so the roofline classification is exercised. m=1, n=1024, k=2048: bytes 4(2048 + 2^21 +
  // 1024) = 8.4 MB -> 4.2 ms; compute 64 tiles of 16x32 x 2*(2048+24) FLOPs -> 0.14 ms.
  const double gemv = cost::gemm_time(t.gpu, Precision::fp32, {1, 1024, 2048, 1});
  CHECK(gemv == doctest::Approx(4.0 * (2048 + 1024 * 2048 + 1024) / 2e9 + 3e-6).epsilon(kExact));

  const FitResult f = fit_profile(b, load_system("cpu"));
  CHECK(f.tile.m == 16);
  CHECK(f.tile.n == 32);
  CHECK(rel(f.gemm_rate, 56e9) < kRecoverTol);
  CHECK(rel(f.k_overhead, 24) < kRecoverTol);
  CHECK(rel(f.kernel_overhead_s, 3e-6) < kRecoverTol);
  CHECK(rel(f.mem_rate, 2e9) < kRecoverTol);
  CHECK(rel(f.link_latency_s, 7e-6) < kRecoverTol);
  CHECK(rel(f.link_bw, 3.6e9) < kRecoverTol);
  CHECK(f.gemm_memory_bound > 0);
  // The written profile means the same: its predictions through sim/cost equal the measurements.
  const System& p = f.profile;
  CHECK(rel(p.gpu.peak(Precision::fp32) * p.gpu.gemm_efficiency, 56e9) < kRecoverTol);
  CHECK(rel(p.node.intra_bw_Bps * p.node.intra_efficiency, 3.6e9) < kRecoverTol);
  for (const Residuals& r : f.residuals) {
    INFO(r.category);
    CHECK(r.max_abs < kRecoverTol);
  }
  // Every per-collective alpha/beta also equals the truth (one link generated them all).
  CHECK(f.links.size() == 4);
  for (const LinkFit& l : f.links) {
    INFO(l.collective);
    CHECK(rel(l.alpha_s, 7e-6) < kRecoverTol);
    CHECK(rel(l.bw, 3.6e9) < kRecoverTol);
  }
  // Round trip through the system JSON every command reads.
  const System back = parse_system(system_to_json(p), "profile");
  CHECK(rel(cost::gemm_time(back.gpu, Precision::fp32, {100, 200, 256, 1}),
            cost::gemm_time(t.gpu, Precision::fp32, {100, 200, 256, 1})) < kRecoverTol);
}

TEST_CASE("calibrate: rates outside the preset's efficiency bounds replace the datasheet value") {
  // A core 100x faster than the preset's 0.05 TFLOP/s peak guess: efficiency would be 70 > 1, so the peak
  // becomes the fitted rate and the efficiency 1; the product (what gemm_time uses) is still the truth.
  // Memory 1000x faster too (2 TB/s against the preset's 10 GB/s), so the GEMMs stay compute-bound.
  System t = truth_system();
  t.gpu.peak_flops[static_cast<int>(Precision::fp32)] = 5e12;
  t.gpu.memory_bw_Bps = 4e12;
  const FitResult f = fit_profile(synthetic(t), load_system("cpu"));
  CHECK(f.profile.gpu.gemm_efficiency == 1.0);
  CHECK(rel(f.profile.gpu.peak(Precision::fp32), 3.5e12) < kRecoverTol);
  CHECK(f.profile.gpu.memory_efficiency == 1.0);
  CHECK(rel(f.profile.gpu.memory_bw_Bps, 2e12) < kRecoverTol);
  CHECK(!f.notes.empty());
}

TEST_CASE("calibrate: too few rows are input errors") {
  BenchData b = synthetic(truth_system());
  b.gemm.resize(2);
  CHECK_THROWS_AS(fit_profile(b, load_system("cpu")), InputError);
  BenchData c = synthetic(truth_system());
  c.collectives.resize(1);
  CHECK_THROWS_AS(fit_profile(c, load_system("cpu")), InputError);
}

TEST_CASE("bench documents: strict reading") {
  const Json good = bench_to_json(synthetic(truth_system()));
  const BenchData back = parse_bench(good, "good.json");
  CHECK(back.gemm.size() == 46);
  CHECK(back.collectives.size() == 32);
  CHECK_THROWS_WITH_AS(parse_bench(Json::array(), "x.json"), doctest::Contains("not a tessel bench document"), InputError);
  Json wrong = good;
  wrong["format"] = "chrome-trace";
  CHECK_THROWS_WITH_AS(parse_bench(wrong, "x.json"), doctest::Contains("\"format\" must be"), InputError);
  Json missing = good;
  missing["gemm"][0].erase("time_us");
  CHECK_THROWS_WITH_AS(parse_bench(missing, "x.json"), doctest::Contains("time_us"), InputError);
  Json neg = good;
  neg["membw"][0]["time_us"] = -1.0;
  CHECK_THROWS_WITH_AS(parse_bench(neg, "x.json"), doctest::Contains("membw[0]"), InputError);
  Json unknown = good;
  unknown["collectives"][0]["colour"] = "red";
  CHECK_THROWS_WITH_AS(parse_bench(unknown, "x.json"), doctest::Contains("colour"), InputError);
  Json empty = good;
  empty["gemm"] = Json::array();
  empty["membw"] = Json::array();
  empty["collectives"] = Json::array();
  CHECK_THROWS_WITH_AS(parse_bench(empty, "x.json"), doctest::Contains("nothing to fit"), InputError);
  Json badcoll = good;
  badcoll["collectives"][0]["collective"] = "allreduce";
  CHECK_THROWS_WITH_AS(parse_bench(badcoll, "x.json"), doctest::Contains("allreduce"), InputError);
}

namespace {
// Kernel rows generated by the cost model from a system whose element-wise rate (0.8 GB/s) and attention
// rate (peak 80 GFLOP/s x 0.125 = 10 GFLOP/s) differ from the rate its STREAM-like copy rows and its GEMMs'
// memory roofline run at (2 GB/s, `stream`): a CPU's runtime loops against its BLAS.
BenchData with_kernel_rows(const System& stream, const System& kern) {
  BenchData b = synthetic(stream);
  // memory_time(kern) includes the same kernel overhead (3 us) the GEMM fit recovers from the other rows.
  for (double bytes : {2.6e5, 1.0e6, 3.1e7})
    b.kernels.push_back({"gelu_fwd", "memory", bytes, 0, 4, cost::memory_time(kern.gpu, bytes, 1)});
  for (double flops : {8.4e6, 2.1e7})
    b.kernels.push_back({"attention_fwd", "attention", 5e5, flops, 4, cost::attention_time(kern.gpu, Precision::fp32, flops, 5e5)});
  return b;
}
}  // namespace

TEST_CASE("calibrate: kernel rows set the memory and attention rates the runtime's kernels run at") {
  const System t = truth_system();
  System k = t;
  k.gpu.memory_efficiency = 0.2;        // 4 GB/s x 0.2 = 0.8 GB/s on the runtime's element-wise kernels
  k.gpu.attention_efficiency = 0.125;   // 80 GFLOP/s x 0.125 = 10 GFLOP/s on its attention core
  // Precondition: attention_time of the rows is on its compute branch (5e5 B / 0.8 GB/s = 0.63 ms is below
  // 8.4e6 / 10e9 = 0.84 ms), so the rows determine the attention rate.
  CHECK(cost::attention_time(k.gpu, Precision::fp32, 8.4e6, 5e5) == doctest::Approx(8.4e6 / 10e9 + 3e-6).epsilon(kExact));
  const FitResult f = fit_profile(with_kernel_rows(t, k), load_system("cpu"));
  CHECK(rel(f.gemm_rate, 56e9) < kRecoverTol);
  CHECK(rel(f.stream_rate, 2e9) < kRecoverTol);  // the copy rows' own rate, reported
  // Exact data: the step-weighted totals estimator returns the generating rates.
  CHECK(rel(f.mem_rate, 0.8e9) < kRecoverTol);
  CHECK(rel(f.attention_rate, 10e9) < kRecoverTol);
  const System& p = f.profile;
  CHECK(rel(p.gpu.memory_bw_Bps * p.gpu.memory_efficiency, 0.8e9) < kRecoverTol);
  CHECK(rel(p.gpu.peak(Precision::fp32) * p.gpu.attention_efficiency, 10e9) < kRecoverTol);
  for (const Residuals& r : f.residuals)
    if (r.category.rfind("kernels", 0) == 0) {
      INFO(r.category);
      CHECK(r.rows > 0);
      CHECK(r.max_abs < kRecoverTol);
    }
  // A base whose attention has a published kernel's curve (the Hopper presets'): the fitted rate is the
  // runtime's kernel at the bench's shapes, so the profile does not scale it by that curve, and says so.
  System curved = load_system("cpu");
  curved.gpu.attention_curve = load_system("dgx-h100").gpu.attention_curve;
  REQUIRE_FALSE(curved.gpu.attention_curve.empty());
  const FitResult fc = fit_profile(with_kernel_rows(t, k), curved);
  CHECK(fc.profile.gpu.attention_curve.empty());
  CHECK(rel(fc.attention_rate, 10e9) < kRecoverTol);
  CHECK(std::any_of(fc.notes.begin(), fc.notes.end(),
                    [](const std::string& n) { return n.find("attention_curve is not kept") != std::string::npos; }));
}

TEST_CASE("calibrate: with kernel rows the GEMMs keep the memory roofline they were fitted with") {
  // The kernel rows' rate (0.8 GB/s) becomes the profile's element-wise rate; the GEMMs' roofline stays at the
  // copy rate they were measured against (2 GB/s), written apart (gpu.efficiency.gemm_memory). With one
  // shared rate the GEMMs sat on a 0.8 GB/s roofline: more of them memory-bound than measured (precondition
  // below) and predicted slow. Every GEMM parameter and the memory-bound count are recovered, the profile's
  // GEMM predictions through sim/cost equal the measurements, and the split survives the system JSON.
  const System t = truth_system();
  System k = t;
  k.gpu.memory_efficiency = 0.2;
  System compute_only = k;
  compute_only.gpu.memory_bw_Bps = 1e300;
  const BenchData b = with_kernel_rows(t, k);
  int bound_k = 0, bound_t = 0;
  for (const GemmRow& r : b.gemm) {
    const cost::GemmShape g{r.m, r.n, r.k, r.batch};
    const double c = cost::gemm_time(compute_only.gpu, Precision::fp32, g);
    bound_k += cost::gemm_time(k.gpu, Precision::fp32, g) > c * (1 + 1e-9);
    bound_t += cost::gemm_time(t.gpu, Precision::fp32, g) > c * (1 + 1e-9);
  }
  REQUIRE(bound_k > bound_t);
  const FitResult f = fit_profile(b, load_system("cpu"));
  CHECK(f.tile.m == 16);
  CHECK(f.tile.n == 32);
  CHECK(rel(f.gemm_rate, 56e9) < kRecoverTol);
  CHECK(rel(f.k_overhead, 24) < kRecoverTol);
  CHECK(rel(f.kernel_overhead_s, 3e-6) < kRecoverTol);
  CHECK(rel(f.mem_rate, 0.8e9) < kRecoverTol);
  CHECK(rel(f.gemm_memory_rate, 2e9) < kRecoverTol);
  CHECK(f.gemm_memory_bound == bound_t);
  const System& p = f.profile;
  CHECK(rel(p.gpu.memory_bw_Bps * p.gpu.memory_efficiency, 0.8e9) < kRecoverTol);
  CHECK(rel(p.gpu.memory_bw_Bps * p.gpu.gemm_memory_efficiency, 2e9) < kRecoverTol);
  const Residuals g = gemm_residuals(b.gemm, p, Precision::fp32);
  CHECK(g.max_abs < kRecoverTol);
  for (const Residuals& r : f.residuals) {
    INFO(r.category);
    CHECK(r.max_abs < kRecoverTol);
  }
  const System back = parse_system(system_to_json(p), "profile");
  CHECK(back.gpu.gemm_memory_efficiency == doctest::Approx(p.gpu.gemm_memory_efficiency).epsilon(kExact));
  for (const GemmRow& r : b.gemm)
    CHECK(rel(cost::gemm_time(back.gpu, Precision::fp32, {r.m, r.n, r.k, r.batch}), r.time_s) < kRecoverTol);
}

// The two memory rates stay apart through what comes after a fit: a profile refitted from the same rows with
// itself as the base (the probe must not read the GEMM bytes at the base's roofline), a bench of kernel rows
// alone (the GEMM roofline keeps the base's rate, not the new element-wise one), and the trace fit's memory
// scale (the element-wise rate only).
TEST_CASE("calibrate: the GEMM roofline's rate survives a refit, a kernels-only bench and the trace fit's memory scale") {
  const System t = truth_system();
  System k = t;
  k.gpu.memory_efficiency = 0.2;
  const BenchData b = with_kernel_rows(t, k);
  const FitResult f1 = fit_profile(b, load_system("cpu"));
  REQUIRE(f1.profile.gpu.gemm_memory_efficiency > 0);
  const FitResult f2 = fit_profile(b, f1.profile);
  CHECK(rel(f2.gemm_memory_rate, 2e9) < kRecoverTol);
  CHECK(rel(f2.mem_rate, 0.8e9) < kRecoverTol);
  CHECK(gemm_residuals(b.gemm, f2.profile, Precision::fp32).max_abs < kRecoverTol);

  BenchData kernels_only;
  kernels_only.gemm_backend = "synthetic";
  kernels_only.kernels = b.kernels;
  const System cpu = load_system("cpu");
  const double cpu_rate = cpu.gpu.memory_bw_Bps * cpu.gpu.memory_efficiency;
  const FitResult f3 = fit_profile(kernels_only, cpu);
  const GpuSpec& g3 = f3.profile.gpu;
  CHECK(rel(g3.memory_bw_Bps * g3.memory_efficiency, f3.mem_rate) < kRecoverTol);
  REQUIRE(g3.gemm_memory_efficiency > 0);
  CHECK(rel(g3.memory_bw_Bps * g3.gemm_memory_efficiency, cpu_rate) < kRecoverTol);

  System scaled = f1.profile;
  std::vector<std::string> notes;
  apply_memory_scale(scaled, 2.0, notes);
  CHECK(rel(scaled.gpu.memory_bw_Bps * scaled.gpu.memory_efficiency, 0.4e9) < kRecoverTol);
  CHECK(rel(scaled.gpu.memory_bw_Bps * scaled.gpu.gemm_memory_efficiency, 2e9) < kRecoverTol);
}

TEST_CASE("calibrate: kernel rows weigh by their per-step count") {
  // Two memory rows the model cannot both fit: 1 MB in 1 ms (1 GB/s) run 3 times a step, and 1 MB in 0.1 ms
  // (10 GB/s) once. The rate that gets the step's total right: 4 MB / (3 ms + 0.1 ms) = 1.2903 GB/s; a
  // relative fit (1/rate = sum r / sum r^2, r = bytes/time) would pick 9.2 GB/s, 7x too fast for the step. No GEMM/membw rows: kernel overhead 0 (the cpu preset's).
  BenchData b;
  b.gemm_backend = "synthetic";
  b.kernels.push_back({"slow", "memory", 1e6, 0, 3, 1e-3});
  b.kernels.push_back({"fast", "memory", 1e6, 0, 1, 1e-4});
  const System base = load_system("cpu");
  REQUIRE(base.gpu.kernel_overhead_s == 0.0);
  const FitResult f = fit_profile(b, base);
  CHECK(rel(f.mem_rate, 4e6 / 3.1e-3) < kRecoverTol);
}

TEST_CASE("bench documents: kernel rows are optional and strict") {
  const System t = truth_system();
  System k = t;
  k.gpu.memory_efficiency = 0.2;
  const Json good = bench_to_json(with_kernel_rows(t, k));
  const BenchData back = parse_bench(good, "good.json");
  CHECK(back.kernels.size() == 5);
  CHECK(back.kernels[0].per_step == 4);
  Json old = good;
  old.erase("kernels");  // documents from before the kernel rows
  CHECK(parse_bench(old, "old.json").kernels.empty());
  Json badpath = good;
  badpath["kernels"][0]["path"] = "gemm";
  CHECK_THROWS_WITH_AS(parse_bench(badpath, "x.json"), doctest::Contains("kernels[0]"), InputError);
  Json noflops = good;
  noflops["kernels"][3]["flops"] = 0.0;
  CHECK_THROWS_WITH_AS(parse_bench(noflops, "x.json"), doctest::Contains("attention path"), InputError);
}

TEST_CASE("bench documents: names the fit has no line for are rejected") {
  System k = truth_system();
  k.gpu.memory_efficiency = 0.2;
  const Json good = bench_to_json(with_kernel_rows(truth_system(), k));
  Json a2a = good;
  a2a["collectives"][0]["collective"] = "all_to_all";  // a known collective, but no fit line: it was dropped
  CHECK_THROWS_WITH_AS(parse_bench(a2a, "x.json"), doctest::Contains("x.json: collectives[0].collective: 'all_to_all'"), InputError);
  Json foo = good;
  foo["kernels"][0]["kernel"] = "foo";
  CHECK_THROWS_WITH_AS(parse_bench(foo, "x.json"), doctest::Contains("x.json: kernels[0].kernel: value \"foo\""), InputError);
  Json path = good;
  path["kernels"][0]["path"] = "attention";  // gelu_fwd is charged on the memory path
  path["kernels"][0]["flops"] = 1e6;
  CHECK_THROWS_WITH_AS(parse_bench(path, "x.json"), doctest::Contains("kernels[0].path: value 'attention' contradicts kernel 'gelu_fwd'"), InputError);
}

TEST_CASE("bench documents: derived columns must agree with time and size") {
  System k = truth_system();
  k.gpu.memory_efficiency = 0.2;
  const Json good = bench_to_json(with_kernel_rows(truth_system(), k));
  // The writer's own document agrees to rounding; a value rounded to 3 significant digits (<= 0.5% off) too.
  CHECK_NOTHROW(parse_bench(good, "good.json"));
  Json rounded = good;
  const double g = rounded["gemm"][3]["gflops"].get<double>();
  rounded["gemm"][3]["gflops"] = g * 1.005;
  CHECK_NOTHROW(parse_bench(rounded, "x.json"));
  // 1% (the tolerance) and beyond: rejected naming the row, the value and the primaries' value.
  struct Case {
    const char* section;
    int row;
    const char* key;
    double factor;
  };
  for (const Case& c : {Case{"gemm", 3, "gflops", 1.011}, Case{"gemm", 3, "gflops", 1000.0}, Case{"membw", 1, "GBps", 0.98},
                        Case{"collectives", 2, "algbw_GBps", 1.02}, Case{"collectives", 9, "busbw_GBps", 2.0},
                        Case{"kernels", 0, "GBps", 1.5}, Case{"kernels", 3, "gflops", 0.5}}) {
    Json bad = good;
    const double v = bad[c.section][c.row][c.key].get<double>();
    bad[c.section][c.row][c.key] = v * c.factor;
    const std::string at = std::string("x.json: ") + c.section + "[" + std::to_string(c.row) + "]." + c.key + ": value ";
    INFO(at);
    CHECK_THROWS_WITH_AS(parse_bench(bad, "x.json"), doctest::Contains(at.c_str()), InputError);
    CHECK_THROWS_WITH_AS(parse_bench(bad, "x.json"), doctest::Contains("contradicts"), InputError);
  }
  // count is an integer rule: bytes = count x 4 (x ranks for all_gather / reduce_scatter), exactly.
  Json count = good;
  count["collectives"][2]["count"] = 7;
  CHECK_THROWS_WITH_AS(parse_bench(count, "x.json"), doctest::Contains("collectives[2].count: value 7 contradicts bytes"), InputError);
  Json gathered = good;  // collectives[8]: all_gather on 2 ranks, 1 KiB: count 128 (not 256)
  REQUIRE(gathered["collectives"][8]["collective"] == "all_gather");
  gathered["collectives"][8]["count"] = 256;
  CHECK_THROWS_WITH_AS(parse_bench(gathered, "x.json"), doctest::Contains("x ranks"), InputError);
}

TEST_CASE("calibrate: a precision the base system has no peak for, and nothing for the chosen communicator") {
  BenchData b = synthetic(truth_system());
  b.origin = "b.json";
  b.precision = "bf16";  // the cpu preset has no bf16 peak: the fit would invent one ("0 of the base value 0")
  REQUIRE(load_system("cpu").gpu.peak(Precision::bf16) == 0.0);
  CHECK_THROWS_WITH_AS(fit_profile(b, load_system("cpu")), doctest::Contains("b.json: precision 'bf16': the base system 'cpu' has no bf16 peak"), InputError);
  // Only collective rows, all of another communicator (or of larger groups than --max-ranks): nothing fits.
  BenchData mpi;
  mpi.origin = "mpi.json";
  for (const CollRow& r : synthetic(truth_system()).collectives) {
    mpi.collectives.push_back(r);
    mpi.collectives.back().comm = "mpi";
  }
  CHECK_THROWS_WITH_AS(fit_profile(mpi, load_system("cpu")), doctest::Contains("mpi.json: nothing in the file can be fitted for --comm thread"), InputError);
  FitOptions o;
  o.comm = "mpi";
  CHECK_NOTHROW(fit_profile(mpi, load_system("cpu"), o));
  o.max_ranks = 1;  // every row has >= 2 ranks
  CHECK_THROWS_WITH_AS(fit_profile(mpi, load_system("cpu"), o), doctest::Contains("--comm mpi --max-ranks 1"), InputError);
}

TEST_CASE("check_profile: a fitted profile that would not load is refused before it is written") {
  const System cpu = load_system("cpu");
  CHECK_NOTHROW(check_profile(cpu, Precision::fp32, "calibrate"));
  // A rate the fit drove to 0, to infinity or to NaN (QA: 1e300 durations printed "-nan%" and wrote the file).
  System zero = cpu;
  zero.gpu.peak_flops[static_cast<int>(Precision::fp32)] = 0;
  CHECK_THROWS_WITH_AS(check_profile(zero, Precision::fp32, "calibrate --trace t.json (-o p.json not written)"),
                       "calibrate --trace t.json (-o p.json not written): the fitted peak FLOP/s of the fitted precision is "
                       "0, not a positive finite rate; the measurements cannot be fitted to this model",
                       InputError);
  System inf = cpu;
  inf.gpu.memory_bw_Bps = HUGE_VAL;
  CHECK_THROWS_WITH_AS(check_profile(inf, Precision::fp32, "c"), doctest::Contains("c: the fitted memory bandwidth is inf"), InputError);
  System nan = cpu;
  nan.gpu.gemm_efficiency = std::nan("");
  CHECK_THROWS_AS(check_profile(nan, Precision::fp32, "c"), InputError);
  // Finite and positive but outside what --system accepts: the parser's message, with the inputs named.
  System slow = cpu;
  slow.gpu.kernel_overhead_s = 1e300;
  CHECK_THROWS_WITH_AS(check_profile(slow, Precision::fp32, "c"),
                       doctest::Contains("c: the fitted profile: gpu.efficiency.kernel_overhead_us: value 1e+306 is out of range"),
                       InputError);
}

// The trace fit gives the TP collectives inside the compute ops their own scale. QA: an 8-rank run on 2 cores
// (TP all-reduces waiting for descheduled peers) fitted compute x31.9 while its weight-gradient ops, pure
// GEMM, measured x1.47: the excess of the ops holding TP collectives went to the compute scale, and the profile
// predicted weight_grad 18x slow. Here the "measured" trace is the estimate on a truth whose communication
// alone is 10x slower (apply_comm_scale: latency x10, bandwidth / 10, so every collective time x10 exactly);
// a zero-bubble schedule has weight-gradient ops without TP collectives, which pin the compute scale. The
// fit must recover compute x1, memory x1, communication x10, and predict every op kind's total.
TEST_CASE("trace fit: communication inside the ops is fitted apart from compute; ranks over cores warn") {
  const Model m = load_model("tiny");
  Layout l;
  l.tp = 2, l.pp = 2, l.dp = 1, l.vpp = 2, l.schedule = sched::Kind::zbv, l.global_batch = 4, l.precision = Precision::fp32;
  l.recompute = Recompute::none, l.attention = AttentionImpl::unfused, l.sequence_parallel = false;
  const System base = load_system("cpu");
  System truth = base;
  std::vector<std::string> ignore;
  apply_comm_scale(truth, 10, ignore);
  const Estimate e = estimate(m, l, truth);
  trace::Trace t;
  t.other_data["model"] = model_to_json(m);
  t.other_data["layout"] = layout_to_json(l);
  double ts = 0;
  auto add = [&](int rank, const std::string& op, int stage, int mb, double s) {
    trace::OpEvent ev;
    ev.rank = rank, ev.op = op, ev.name = op, ev.stage = stage, ev.mb = mb, ev.start_us = ts, ev.dur_us = s * 1e6;
    ts += ev.dur_us;
    t.events.push_back(ev);
  };
  for (int rank = 0; rank < 2; ++rank) {
    for (int s = 0; s < static_cast<int>(e.stage_f.size()); ++s)
      for (int mb = 0; mb < l.num_microbatches(); ++mb) {
        add(rank, "forward", s, mb, e.stage_f[s]);
        add(rank, "input_grad", s, mb, e.stage_i[s]);
        add(rank, "weight_grad", s, mb, e.stage_w[s]);
      }
    add(rank, "optimizer", -1, -1, e.optimizer_s);
  }
  System prof = base;
  std::vector<std::string> notes;
  const TraceFit f = fit_traces({t}, {"synthetic.json"}, prof, Precision::fp32, notes);
  CHECK(f.compute_scale == doctest::Approx(1).epsilon(kRecoverTol));
  CHECK(f.memory_scale == doctest::Approx(1).epsilon(kRecoverTol));
  CHECK(f.comm_scale == doctest::Approx(10).epsilon(kRecoverTol));
  for (const OpKindFit& k : f.kinds) {
    CAPTURE(k.op);
    CHECK(k.predicted_after_s == doctest::Approx(k.measured_s).epsilon(kRecoverTol));
  }
  // Consistent kinds and no host record: no warning but the communication wait (x10 > kCommWait = 4).
  REQUIRE(f.warnings.size() == 1);
  CHECK(f.warnings[0].find("TP collectives inside the compute ops took 10x") != std::string::npos);
  // A trace that records its host's cores: 2 ranks on 1 core is said.
  t.other_data["host"] = {{"cores", 1}};
  System prof2 = base;
  const TraceFit g = fit_traces({t}, {"synthetic.json"}, prof2, Precision::fp32, notes);
  REQUIRE(g.warnings.size() == 2);
  CHECK(g.warnings[0].find("synthetic.json: 2 ranks ran on a host of 1 cores") != std::string::npos);
}

// The trace fit's compute scale divides the GEMM and the attention rates alike: where the attention
// efficiency would fall below its 0.01 floor, the shared peak moves so both rates stay exact (before, the
// attention efficiency was clamped after the peak had moved for the GEMM, and its rate came out 10% off).
TEST_CASE("trace fit: the compute scale keeps both the GEMM and the attention rate exact") {
  for (double att : {0.0102, 0.4}) {
    for (double scale : {8.167, 0.5, 3.0}) {
      CAPTURE(att);
      CAPTURE(scale);
      System s = load_system("cpu");
      const Precision p = Precision::fp32;
      s.gpu.attention_efficiency = att;
      const double peak = s.gpu.peak(p);
      const double gemm_rate = peak * s.gpu.gemm_efficiency, att_rate = peak * s.gpu.attention_efficiency;
      std::vector<std::string> notes;
      calib::apply_compute_scale(s, scale, p, notes);
      CHECK(s.gpu.peak(p) * s.gpu.gemm_efficiency == doctest::Approx(gemm_rate / scale).epsilon(1e-12));
      CHECK(s.gpu.peak(p) * s.gpu.attention_efficiency == doctest::Approx(att_rate / scale).epsilon(1e-12));
      CHECK(s.gpu.gemm_efficiency <= 1.0);
      CHECK(s.gpu.attention_efficiency >= 0.01);
    }
  }
}

// Rates over 100x apart cannot both be exact inside [0.01, 1]: the GEMM's stays exact, attention is clamped
// at the bound it crosses, and the profile's notes say so, whichever of the two is the faster.
TEST_CASE("trace fit: attention over 100x from the GEMM rate is clamped and noted, both ways") {
  for (double att : {1e-5, 0.9}) {
    CAPTURE(att);
    System s = load_system("cpu");
    const Precision p = Precision::fp32;
    s.gpu.gemm_efficiency = att < 0.5 ? 0.9 : 0.005;
    s.gpu.attention_efficiency = att;
    const double gemm_rate = s.gpu.peak(p) * s.gpu.gemm_efficiency;
    std::vector<std::string> notes;
    calib::apply_compute_scale(s, 1.0, p, notes);
    CHECK(s.gpu.peak(p) * s.gpu.gemm_efficiency == doctest::Approx(gemm_rate).epsilon(1e-12));
    CHECK(s.gpu.gemm_efficiency <= 1.0);
    CHECK(s.gpu.gemm_efficiency >= 0.01);
    CHECK(s.gpu.attention_efficiency == doctest::Approx(att < 0.5 ? 0.01 : 1.0));
    bool noted = false;
    for (const auto& n : notes) noted |= n.find("attention efficiency clamped") != std::string::npos;
    CHECK(noted);
  }
}
