// `tessel bench` and `tessel calibrate` from the command line: the bench document round trip into a profile
// every command takes, trace calibration, and bad input (exit 2, message naming the file/field/flag).
// Timing is never asserted (the machines are shared and noisy): only mechanics and the fit's own consistency.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "tests/tools/run_util.hpp"

using tessel::test::run_tessel;
using tessel::test::write_temp;

namespace {
std::string slurp(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (std::to_string(::getpid()) + "_" + name)).string();
}
// A bench document written by `tessel bench --json` (collectives and memory only: seconds, not minutes).
const std::string& bench_file() {
  static const std::string path = [] {
    auto r = run_tessel({"bench", "--backend", "cpu", "--what", "gemm,membw,collectives", "--json"});
    REQUIRE(r.code == 0);
    return write_temp("bench.json", r.out);
  }();
  return path;
}
}  // namespace

TEST_CASE("bench: nccl-tests columns, --json rows, cuda without a device refused") {
  auto t = run_tessel({"bench", "--what", "collectives"});
  REQUIRE(t.code == 0);
  for (const char* col : {"size", "count", "type", "redop", "time", "algbw", "busbw", "all_reduce", "send_recv"})
    CHECK(t.out.find(col) != std::string::npos);
  const auto doc = nlohmann::json::parse(slurp(bench_file()));
  CHECK(doc["format"] == "tessel-bench");
  CHECK(doc["gemm"].size() > 3);
  CHECK(doc["membw"].size() > 1);
  // 4 collectives x 9 sizes (1 KiB to 16 MiB a rank) on a group of 2.
  CHECK(doc["collectives"].size() == 36);
  for (const auto& row : doc["collectives"]) {
    // busbw = algbw * factor (nccl-tests PERFORMANCE.md): all_reduce 2(n-1)/n = 1 for n = 2.
    if (row["collective"] == "all_reduce")
      CHECK(row["busbw_GBps"].get<double>() == doctest::Approx(row["algbw_GBps"].get<double>()).epsilon(1e-12));
  }
  // Without a GPU (the test machines): a build without CUDA refuses the backend, a CUDA build finds no device
  // (tests/cuda/test_no_device.cpp holds the CUDA build to the second); either way exit 2 naming the flag.
  auto c = run_tessel({"bench", "--backend", "cuda"});
  CHECK(c.code == 2);
  CHECK(c.err.find("--backend cuda: ") != std::string::npos);
  CHECK((c.err.find("not available in this build") != std::string::npos || c.err.find("no CUDA device") != std::string::npos));
  CHECK(run_tessel({"bench", "--backend", "gpu"}).code == 2);
  CHECK(run_tessel({"bench", "--backend", "cpu", "--quick"}).code == 2);  // a cuda flag
  CHECK(run_tessel({"bench", "--what", "gemv"}).code == 2);
}

TEST_CASE("bench: the runtime's kernels as rows on the cost model's paths; calibrate fits and reports them") {
  auto r = run_tessel({"bench", "--backend", "cpu", "--what", "kernels", "--json"});
  REQUIRE(r.code == 0);
  const auto doc = nlohmann::json::parse(r.out);
  // 4 shapes x (8 memory-path kernels + attention fwd/bwd) + AdamW at 4 sizes (tools/cmd_bench.cpp).
  REQUIRE(doc["kernels"].size() == 44);
  int attention = 0;
  for (const auto& row : doc["kernels"]) {
    if (row["path"] == "attention") {
      ++attention;
      CHECK(row["flops"].get<double>() > 0);
    }
    // The bytes are the cost model's for the op; layernorm_fwd on 128 tokens x 256: 2 x 4 B x 32768.
    if (row["kernel"] == "layernorm_fwd" && row["bytes"].get<double>() < 300000)
      CHECK(row["bytes"].get<double>() == doctest::Approx(2.0 * 4 * 128 * 256).epsilon(1e-12));
  }
  CHECK(attention == 8);
  const std::string bench = write_temp("kernels_bench.json", r.out), prof = temp_path("kernels_profile.json");
  auto c = run_tessel({"calibrate", "--bench", bench, "--base-system", "cpu", "-o", prof});
  REQUIRE(c.code == 0);
  CHECK(c.out.find("kernels (memory)") != std::string::npos);
  CHECK(c.out.find("kernels (attention)") != std::string::npos);
  // AdamW's rate at each size the bench stepped: 0.5, 1, 2 and 3 Mi parameters (bytes / 30), one rate each.
  const auto profile = nlohmann::json::parse(slurp(prof));
  const auto& opt = profile["gpu"]["kernels"]["optimizer"];
  CHECK(opt["params"] == nlohmann::json({524288.0, 1048576.0, 2097152.0, 3145728.0}));
  REQUIRE(opt["by_params_GBps"].size() == 4);
  for (const auto& g : opt["by_params_GBps"]) CHECK(g.get<double>() > 0);
  CHECK(run_tessel({"estimate", "--model", "tiny", "--system", prof, "--tp", "1", "--pp", "1", "--dp", "1", "--gbs", "4", "--mbs", "1", "--precision", "fp32", "--attention", "flash"}).code == 0);
  std::filesystem::remove(prof);
}

TEST_CASE("calibrate: bench -> profile that estimate accepts; residuals printed") {
  const std::string prof = temp_path("profile.json");
  auto r = run_tessel({"calibrate", "--bench", bench_file(), "-o", prof, "--json"});
  REQUIRE(r.code == 0);
  const auto rep = nlohmann::json::parse(r.out);
  CHECK(rep["gemm_GFLOPs"].get<double>() > 0);
  CHECK(rep["link_GBps"].get<double>() > 0);
  // One residual line per category: gemm, its two gradient classes (gemm dgrad, gemm wgrad), membw, four
  // collectives.
  CHECK(rep["residuals"].size() == 8);
  for (const auto& res : rep["residuals"]) CHECK(std::isfinite(res["rms_pct"].get<double>()));
  auto e = run_tessel({"estimate", "--system", prof, "--model", "tiny", "--tp", "1", "--pp", "1", "--dp", "1", "--gbs",
                       "4", "--precision", "fp32", "--json"});
  REQUIRE(e.code == 0);
  CHECK(nlohmann::json::parse(e.out)["step_s"].get<double>() > 0);
  auto h = run_tessel({"calibrate", "--bench", bench_file(), "-o", prof});
  CHECK(h.code == 0);
  CHECK(h.out.find("median |err|") != std::string::npos);
  std::filesystem::remove(prof);
}

TEST_CASE("calibrate: a measured trace adds per-op-kind scales") {
  const std::string trace = temp_path("run_trace.json"), prof = temp_path("profile_t.json");
  REQUIRE(run_tessel({"run", "--backend", "cpu", "--steps", "2", "--trace", trace}).code == 0);
  auto r = run_tessel({"calibrate", "--bench", bench_file(), "--trace", trace, "-o", prof, "--json"});
  REQUIRE(r.code == 0);
  const auto rep = nlohmann::json::parse(r.out);
  // The tiny run has forward, backward and optimizer events (2 micro-batches x 2 steps of F and B); the fit
  // keeps each op once, at its fastest step: 2 backward rows.
  REQUIRE(rep["trace_kinds"].size() == 3);
  CHECK(rep["trace_kinds"][0]["op"] == "backward");
  CHECK(rep["trace_kinds"][0]["events"] == 2);
  CHECK(rep["trace_compute_scale"].get<double>() > 0);
  // The correction is a least-squares fit of the error it reports (absolute, over the rms duration) whose
  // candidates include the uncorrected point (1, 1): it cannot be worse.
  CHECK(rep["trace_rms_rel_after"].get<double>() <= rep["trace_rms_rel_before"].get<double>() + 1e-9);
  std::filesystem::remove(trace);
  std::filesystem::remove(prof);
}

TEST_CASE("calibrate: bad input exits 2 naming the problem") {
  const std::string prof = temp_path("never.json");
  struct Case {
    std::string content;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"", "bad.json"},                                        // empty file: a JSON syntax error with the file name
      {"[1, 2]", "not a tessel bench document"},
      {"{\"format\": \"tessel-bench\", \"version\": 1, \"backend\": \"cpu\", \"gemm_backend\": \"x\", \"precision\": "
       "\"fp32\", \"concurrent\": 1, \"gemm\": [{\"m\": 1, \"n\": 1, \"k\": 1, \"batch\": 1, \"time_us\": NaN}], "
       "\"membw\": [], \"collectives\": []}",
       "bad.json"},                                            // NaN is not JSON
      {"{\"format\": \"tessel-bench\", \"version\": 1, \"backend\": \"cpu\", \"gemm_backend\": \"x\", \"precision\": "
       "\"fp32\", \"concurrent\": 1, \"gemm\": [{\"m\": 1, \"n\": 1, \"k\": 1, \"batch\": 1}], \"membw\": [], "
       "\"collectives\": []}",
       "time_us"},                                             // missing field
      {"{\"format\": \"tessel-bench\", \"version\": 1, \"backend\": \"cpu\", \"gemm_backend\": \"x\", \"precision\": "
       "\"fp32\", \"concurrent\": 1, \"gemm\": [], \"membw\": [], \"collectives\": []}",
       "nothing to fit"},
  };
  for (const auto& c : cases) {
    const std::string path = write_temp("bad.json", c.content);
    auto r = run_tessel({"calibrate", "--bench", path, "-o", prof});
    INFO(c.content);
    CHECK(r.code == 2);
    CHECK(r.err.find(c.expect) != std::string::npos);
    CHECK(!std::filesystem::exists(prof));
  }
  CHECK(run_tessel({"calibrate", "--bench", bench_file()}).code == 2);  // no -o
  CHECK(run_tessel({"calibrate", "-o", prof}).code == 2);               // nothing to fit from
  CHECK(run_tessel({"calibrate", "--bench", "/nonexistent/b.json", "-o", prof}).code == 2);
  const std::string not_trace = write_temp("not_trace.json", "{\"hello\": 1}");
  CHECK(run_tessel({"calibrate", "--bench", bench_file(), "--trace", not_trace, "-o", prof}).code == 2);
  CHECK(run_tessel({"calibrate", "--bench", bench_file(), "--comm", "gloo", "-o", prof}).code == 2);  // not thread, mpi or nccl
}

TEST_CASE("calibrate: bench rows it cannot use exit 2 naming file, row, value and rule") {
  const std::string prof = temp_path("never_b.json");
  const auto good = nlohmann::json::parse(slurp(bench_file()));
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::vector<std::string> args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](nlohmann::json& d) { d["collectives"][0]["collective"] = "all_to_all"; }, {}, "collectives[0].collective: 'all_to_all'"},
      {[](nlohmann::json& d) { d["gemm"][0]["gflops"] = 99999.0; }, {}, "gemm[0].gflops: value 99999 contradicts"},
      {[](nlohmann::json& d) { d["collectives"][1]["algbw_GBps"] = 999.0; }, {}, "collectives[1].algbw_GBps: value 999 contradicts"},
      {[](nlohmann::json& d) { d["collectives"][1]["count"] = 7; }, {}, "collectives[1].count: value 7 contradicts bytes"},
      {[](nlohmann::json& d) { d["precision"] = "bf16"; }, {}, "precision 'bf16': the base system 'cpu' has no bf16 peak"},
      {[](nlohmann::json& d) {
         d["gemm"] = nlohmann::json::array();
         d["membw"] = nlohmann::json::array();
       },
       {"--comm", "mpi"}, "nothing in the file can be fitted for --comm mpi"},
  };
  for (const auto& c : cases) {
    auto doc = good;
    c.edit(doc);
    const std::string path = write_temp("bad_rows.json", doc.dump());
    std::vector<std::string> args = {"calibrate", "--bench", path, "-o", prof};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto r = run_tessel(args);
    INFO(c.expect);
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find(path + ": " + c.expect) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(!std::filesystem::exists(prof));
  }
}

TEST_CASE("calibrate: traces outside a measured layout, and simulated traces, exit 2 naming them") {
  const std::string trace = temp_path("run_trace_mb.json"), prof = temp_path("never_t.json");
  REQUIRE(run_tessel({"run", "--backend", "cpu", "--steps", "1", "--trace", trace}).code == 0);
  auto doc = nlohmann::json::parse(slurp(trace));
  // The tiny run's layout has 2 micro-batches and 1 stage (its otherData): an event with mb 99 or stage 5
  // would be fitted as one more op of the step.
  REQUIRE(doc["otherData"]["layout"]["pp"] == 1);
  for (const char* field : {"mb", "stage"}) {
    auto bad = doc;
    bool done = false;
    for (auto& e : bad["traceEvents"])
      if (!done && e.value("ph", "") == "X" && e.contains("args") && e["args"].value("op", "") == "forward") {
        e["args"][field] = std::string(field) == "mb" ? 99 : 5;
        done = true;
      }
    REQUIRE(done);
    const std::string path = write_temp("bad_trace.json", bad.dump());
    auto r = run_tessel({"calibrate", "--trace", path, "-o", prof});
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find(path + ": event '") != std::string::npos);
    CHECK(r.err.find(std::string(field) == "mb" ? "mb 99 is outside the layout's 2 micro-batch(es)"
                                                : "stage 5 is outside the layout's 1 stage(s)") != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(!std::filesystem::exists(prof));
  }
  // A trace of `tessel simulate`: its otherData names the model only by name; say what it is.
  const std::string sim = temp_path("sim_trace.json");
  REQUIRE(run_tessel({"simulate", "--model", "tiny", "--system", "cpu", "--tp", "1", "--pp", "1", "--dp", "1", "--gbs", "2",
                      "--precision", "fp32", "--trace", sim}).code == 0);
  auto s = run_tessel({"calibrate", "--trace", sim, "-o", prof});
  CHECK(s.code == 2);
  CHECK(s.err.find(sim + ": a simulated trace (otherData.tool \"tessel simulate") != std::string::npos);
  CHECK(s.err.find("tessel run --trace") != std::string::npos);
  CHECK(!std::filesystem::exists(prof));
  std::filesystem::remove(trace);
  std::filesystem::remove(sim);
}

TEST_CASE("calibrate: the report's header says which parts were kept from the base, not fitted as 0") {
  auto doc = nlohmann::json::parse(slurp(bench_file()));
  doc["gemm"] = nlohmann::json::array();
  doc["membw"] = nlohmann::json::array();
  const std::string path = write_temp("colls_only.json", doc.dump()), prof = temp_path("colls_only_profile.json");
  auto r = run_tessel({"calibrate", "--bench", path, "-o", prof});
  REQUIRE(r.code == 0);
  CHECK(r.out.rfind("fitted: GEMM kept, memory kept, link ", 0) == 0);
  CHECK(r.out.find("0.00 GFLOP/s") == std::string::npos);
  std::filesystem::remove(prof);
}

TEST_CASE("calibrate: absurd trace durations exit 2 naming the event and rule; the profile file is untouched") {
  const std::string trace = temp_path("run_trace_absurd.json"), prof = temp_path("kept_profile.json");
  REQUIRE(run_tessel({"run", "--backend", "cpu", "--steps", "1", "--trace", trace}).code == 0);
  const auto doc = nlohmann::json::parse(slurp(trace));
  // Every forward and backward event given one duration (us).
  auto with_dur = [&](double dur) {
    auto d = doc;
    for (auto& e : d["traceEvents"])
      if (e.value("ph", "") == "X" && e.contains("args") &&
          (e["args"].value("op", "") == "forward" || e["args"].value("op", "") == "backward"))
        e["dur"] = dur;
    return write_temp("absurd_trace.json", d.dump());
  };
  struct Case {
    double dur;
    std::string expect;
  };
  // QA: 1e300 printed "-nan%" and 1e-300 "scale 0.000, GFLOP/s inf", both exit 0 with a profile written.
  const std::vector<Case> cases = {
      {1e300, "traceEvents["},
      {1e-300, "us is below the trace's 1 ns resolution; a fitted op's duration must be a measurement"},
  };
  for (const auto& c : cases) {
    std::ofstream(prof) << "KEEP";
    const std::string path = with_dur(c.dur);
    auto r = run_tessel({"calibrate", "--trace", path, "-o", prof});
    INFO(c.dur);
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find(c.expect) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(slurp(prof) == "KEEP");
  }
  auto r = run_tessel({"calibrate", "--trace", with_dur(1e300), "-o", prof});
  CHECK(r.err.find(": dur 1e+300 is beyond") != std::string::npos);
  r = run_tessel({"calibrate", "--trace", with_dur(1e-300), "-o", prof});
  CHECK(r.err.find(": event '") != std::string::npos);
  std::filesystem::remove(trace);
  std::filesystem::remove(prof);
}

// The profile's source text describes the profile as written. QA: trace only, the source said "GEMM 0 GFLOP/s,
// K overhead 0, tile 128x128" over a file with K overhead 1.5 and 8x16 tiles; bench + trace, it gave the bench
// fit's GEMM and memory rates, ~3x off the file's after the trace scales. Each number is read back from the
// written file (datasheet x efficiency where the simulator multiplies them) and must appear, to the 4
// significant digits the text gives.
TEST_CASE("calibrate: the profile's source states the numbers the written file holds") {
  const std::string trace = temp_path("run_trace_src.json"), prof = temp_path("profile_src.json");
  REQUIRE(run_tessel({"run", "--backend", "cpu", "--steps", "2", "--trace", trace}).code == 0);
  auto g4 = [](double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return std::string(buf);
  };
  const std::vector<std::vector<std::string>> runs = {{"--trace", trace}, {"--bench", bench_file(), "--trace", trace}};
  for (const auto& inputs : runs) {
    std::vector<std::string> args = {"calibrate", "-o", prof};
    args.insert(args.end(), inputs.begin(), inputs.end());
    REQUIRE(run_tessel(args).code == 0);
    const auto p = nlohmann::json::parse(slurp(prof));
    const std::string src = p["source"].get<std::string>();
    const auto& gpu = p["gpu"];
    const auto& eff = gpu["efficiency"];
    const double peak_g = gpu["peak_tflops"]["fp32"].get<double>() * 1e3;
    const double mem = gpu["memory_GBps"].get<double>();
    const double roof = mem * (eff.contains("gemm_memory") ? eff["gemm_memory"] : eff["memory"]).get<double>();
    const std::vector<std::string> expect = {
        "GEMM ceiling " + g4(peak_g * eff["gemm"].get<double>()) + " GFLOP/s",
        "K overhead " + g4(eff["gemm_k_overhead"].get<double>()),
        "tile " + std::to_string(eff["gemm_tiles"][0][0].get<int>()) + "x" + std::to_string(eff["gemm_tiles"][0][1].get<int>()),
        "kernel overhead " + g4(eff["kernel_overhead_us"].get<double>()) + " us",
        "element-wise memory " + g4(mem * eff["memory"].get<double>()) + " GB/s",
        "GEMM memory roofline " + g4(roof) + " GB/s",
        "attention " + g4(peak_g * eff["attention"].get<double>()) + " GFLOP/s",
        "intra-node link " + g4(p["node"]["intra_latency_us"].get<double>()) + " us and " +
            g4(p["node"]["intra_GBps"].get<double>() * p["node"]["intra_efficiency"].get<double>()) + " GB/s",
    };
    INFO(src);
    for (const auto& e : expect) {
      CAPTURE(e);
      CHECK(src.find(e) != std::string::npos);
    }
    // Which fit set what: the trace fit's scales always; the bench's fields only with a bench.
    CHECK(src.find("Then the trace fit on " + trace + " scaled the compute times x") != std::string::npos);
    CHECK((src.find("From " + bench_file()) != std::string::npos) == (inputs.front() == "--bench"));
  }
  std::filesystem::remove(trace);
  std::filesystem::remove(prof);
}

TEST_CASE("calibrate: noisy measurements are flagged above 10% and refused above --max-noise") {
  // The bench's rows with their spread set: every row 0.5 (50%): the noise is their median, 50%, over the
  // default --max-noise 25%: refused, exit 2, nothing written. With --max-noise 60 it is written, flagged
  // (above 10%): "trusted": false and a warning. With every spread 0.02 it is trusted.
  auto doc = nlohmann::json::parse(slurp(bench_file()));
  auto with_spread = [&](double s) {
    auto d = doc;
    for (const char* k : {"gemm", "membw"})
      for (auto& row : d[k]) row["spread"] = s;
    return write_temp("bench_spread.json", d.dump());
  };
  const std::string prof = temp_path("noisy_profile.json");
  std::filesystem::remove(prof);
  auto refused = run_tessel({"calibrate", "--bench", with_spread(0.5), "-o", prof});
  CAPTURE(refused.err);
  CHECK(refused.code == 2);
  CHECK(refused.err.find("vary by 50% between repeats (bench rows' median spread 50%)") != std::string::npos);
  CHECK(refused.err.find("--max-noise 25%") != std::string::npos);
  CHECK(!std::filesystem::exists(prof));
  // A bench measured under heavy load: rows whose middle half spans 120x their median (seen at a load average
  // of 113 on 2 cores). Read, and refused by the noise rule (12000% > 25%), not by the reader.
  auto loaded = run_tessel({"calibrate", "--bench", with_spread(120), "-o", prof});
  CAPTURE(loaded.err);
  CHECK(loaded.code == 2);
  CHECK(loaded.err.find("vary by 12000% between repeats") != std::string::npos);
  CHECK(!std::filesystem::exists(prof));
  auto flagged = run_tessel({"calibrate", "--bench", with_spread(0.5), "--max-noise", "60", "-o", prof, "--json"});
  REQUIRE(flagged.code == 0);
  const auto j = nlohmann::json::parse(flagged.out);
  CHECK(j["noise_pct"].get<double>() == doctest::Approx(50));
  CHECK(j["trusted"] == false);
  CHECK(flagged.err.find("warning: the measurements vary by 50%") != std::string::npos);
  auto quiet = run_tessel({"calibrate", "--bench", with_spread(0.02), "-o", prof, "--json"});
  REQUIRE(quiet.code == 0);
  CHECK(nlohmann::json::parse(quiet.out)["trusted"] == true);
  std::filesystem::remove(prof);
}
