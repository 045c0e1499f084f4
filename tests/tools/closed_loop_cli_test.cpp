// `tessel calibrate --closed-loop` and the simulate flags it relies on, from the command line: the loop's
// mechanics (every layout measured and predicted, per-op errors, noise and load reported, the profile and
// figure written), its bad input, simulate's CPU defaults and --like. Timing is never asserted: the machines
// are shared and noisy (the loop's accuracy is measured by hand, docs/calibration.md).
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/host_sched.hpp"
#include "tests/tools/run_util.hpp"

using tessel::test::run_tessel;

namespace {
std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tessel-loop-" + std::to_string(::getpid()) + "_" + name)).string();
}
std::string slurp(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
bool finite_number(const nlohmann::json& v) { return v.is_number() && std::isfinite(v.get<double>()); }
// tessel over the fake CUDA runtime (tests/cuda_fake), where built.
const char* fake_exe() { return std::getenv("TESSEL_FAKE_EXE"); }
}  // namespace

TEST_CASE("closed loop --quick: every held-out layout measured and predicted, op by op, with its noise and load") {
  const std::string out = temp_path("quick"), svg = out + "/loop.svg";
  auto r = run_tessel({"calibrate", "--closed-loop", "--quick", "--json", "--out", out, "--svg", svg});
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  // --quick: 2 calibration layouts (1 rank; pp2 zb1p) and 3 held-out ones of 1, 2 and 4 ranks, 1 repeat.
  CHECK(j["backend"] == "cpu");
  CHECK(j["calibration_layouts"].size() == 2);
  REQUIRE(j["held_out_layouts"].size() == 3);
  REQUIRE(j["repeats"].size() == 1);
  // The measured order's repeatability: one tau per pair of repeats, none with one repeat.
  CHECK(j["overall"]["measured_tau_between_repeats"].is_array());
  CHECK(j["overall"]["measured_tau_between_repeats"].empty());
  CHECK_FALSE(j["overall"].contains("error_free_tau"));  // no pair of repeats, no bounds
  const auto& rep = j["repeats"][0];
  REQUIRE(rep["rows"].size() == 3);
  std::vector<int> ranks;
  for (const auto& row : rep["rows"]) {
    CAPTURE(row.dump());
    ranks.push_back(row["ranks"].get<int>());
    CHECK(row["measured_s"].get<double>() > 0);
    CHECK(row["predicted_s"].get<double>() > 0);
    CHECK(finite_number(row["error_pct"]));
    CHECK(row["measured_spread_pct"].get<double>() >= 0);
    // Each layout ran twice (--quick: two passes), the faster run kept: every run's median step, the other's,
    // and how far apart.
    REQUIRE(row["runs_s"].size() == 2);
    const double a = row["runs_s"][0].get<double>(), b = row["runs_s"][1].get<double>();
    CHECK(row["measured_s"].get<double>() == doctest::Approx(std::min(a, b)));
    CHECK(row["other_run_s"].get<double>() == doctest::Approx(std::max(a, b)));
    CHECK(row["run_to_run_pct"].get<double>() ==
          doctest::Approx(100 * (row["other_run_s"].get<double>() / row["measured_s"].get<double>() - 1)));
    // Forward, backward and the optimizer at least are compared on every layout.
    CHECK(row["ops"].size() >= 3);
    for (const auto& o : row["ops"]) CHECK(o["measured_s"].get<double>() > 0);
    // The host's cores over a step, where the kernel counts them (runtime/host_sched.hpp): the ranks' CPU
    // seconds, the idle seconds they leave, and the engine's counterparts (idle = cores x step - CPU). One
    // rank's CPU time cannot exceed its step (1 ms for reading the counters).
    if (tessel::rt::thread_sched()) {
      REQUIRE(row.contains("host"));
      const auto& h = row["host"];
      CHECK(h["measured_cpu_s"].get<double>() > 0);
      CHECK(h["measured_run_delay_s"].get<double>() >= 0);
      CHECK(h["predicted_cpu_s"].get<double>() > 0);
      CHECK(h["predicted_idle_s"].get<double>() ==
            doctest::Approx(j["host_cores"].get<double>() * row["predicted_s"].get<double>() - h["predicted_cpu_s"].get<double>()));
      if (row["ranks"] == 1) CHECK(h["measured_cpu_s"].get<double>() <= row["measured_s"].get<double>() + 1e-3);
    } else {
      CHECK_FALSE(row.contains("host"));
    }
    // The hypervisor's steal time over the run, as a share of the cores' time, where /proc/stat gives it.
    if (row.contains("steal_pct")) {
      CHECK(row["steal_pct"].get<double>() >= 0);
      CHECK(row["steal_pct"].get<double>() <= 100);
    }
  }
  CHECK(ranks == std::vector<int>{1, 2, 4});
  const auto& s = rep["summary"];
  CHECK(finite_number(s["median_abs_error_pct"]));
  CHECK(finite_number(s["op_median_abs_error_pct"]));
  CHECK(s["kendall_tau"].get<double>() >= -1);
  CHECK(s["kendall_tau"].get<double>() <= 1);
  CHECK(finite_number(s["calibration_noise_pct"]));
  CHECK(finite_number(s["measurement_noise_pct"]));
  // The median of the layouts' run-to-run differences (3 layouts: the middle one).
  std::vector<double> r2r;
  for (const auto& row : rep["rows"]) r2r.push_back(row["run_to_run_pct"].get<double>());
  std::sort(r2r.begin(), r2r.end());
  CHECK(s["run_to_run_pct"].get<double>() == doctest::Approx(r2r[1]));
  CHECK(std::filesystem::exists(out + "/rep0/heldout_0.b.trace.json"));
  CHECK_FALSE(std::filesystem::exists(out + "/rep0/heldout_0.c.trace.json"));
  CHECK(j["runs_per_layout"].get<int>() == 2);
  CHECK(s["trusted"].is_boolean());
  // Untrusted repeats say why; trusted ones say nothing.
  CHECK(s["trusted"].get<bool>() == s["untrusted_because"].get<std::string>().empty());
  // The drift: every calibration run measured again after the held-out runs (their traces are there), the
  // largest change of their median steps. Trusted exactly when the calibration, contention and measurement
  // noises and the drift are all within 10% (the contention's: null where the bench fitted none).
  REQUIRE(finite_number(s["drift_pct"]));
  CHECK(s["drift_pct"].get<double>() >= 0);
  CHECK(std::filesystem::exists(out + "/rep0/drift.trace.json"));
  CHECK(std::filesystem::exists(out + "/rep0/drift_1.trace.json"));  // the second calibration layout's (pp2 ZB-1P)
  // The calibration layouts ran twice as well (--quick), the fit on the faster run's trace.
  REQUIRE(s["calibration_runs_s"].size() == 2);
  for (const auto& runs : s["calibration_runs_s"]) CHECK(runs.size() == 2);
  CHECK(std::filesystem::exists(out + "/rep0/calib_1.b.trace.json"));
  // Which calibration layout moved most: one of the two.
  CHECK((s["drift_layout"] == "calib 1 rank" || s["drift_layout"] == "calib pp2 zb1p"));
  const bool contention_steady = s["contention_noise_pct"].is_null() || s["contention_noise_pct"].get<double>() <= 10;
  // Steal time: the largest share of one run's, known where every row's is.
  const bool steal_known = std::all_of(rep["rows"].begin(), rep["rows"].end(), [](const auto& row) { return row.contains("steal_pct"); });
  CHECK(s["steal_pct"].is_null() == !steal_known);
  double row_steal = 0;
  for (const auto& row : rep["rows"])
    if (row.contains("steal_pct")) row_steal = std::max(row_steal, row["steal_pct"].get<double>());
  if (steal_known) CHECK(s["steal_pct"].get<double>() >= row_steal);
  const bool no_steal = s["steal_pct"].is_null() || s["steal_pct"].get<double>() <= 10;
  CHECK(has(s["untrusted_because"].get<std::string>(), "steal time") == !no_steal);
  const bool within = s["calibration_noise_pct"].get<double>() <= 10 && s["measurement_noise_pct"].get<double>() <= 10 &&
                      s["run_to_run_pct"].get<double>() <= 10 && s["drift_pct"].get<double>() <= 10 &&
                      contention_steady && no_steal;
  CHECK(has(s["untrusted_because"].get<std::string>(), "two fastest runs differ") == (s["run_to_run_pct"].get<double>() > 10));
  CHECK(s["trusted"].get<bool>() == within);
  CHECK(has(s["untrusted_because"].get<std::string>(), "measured again at the end") ==
        (s["drift_pct"].get<double>() > 10));
  CHECK(has(s["untrusted_because"].get<std::string>(), "the host's cores were not steady") == !contention_steady);
  CHECK(finite_number(rep["load_before"]));
  // The calibration: per-kind rates, the host's contention, the per-op trace fit of the glue.
  CHECK(rep["calibration"]["trace_method"] == "per-op");
  CHECK(rep["calibration"]["kinds"].size() >= 9);
  CHECK(j["targets"]["median_abs_error_pct"] == 10);
  // Written: the results, the profile (loadable: simulate --like a held-out trace on it), the figure.
  CHECK(nlohmann::json::parse(slurp(out + "/results.json")) == j);
  const std::string profile = rep["profile"].get<std::string>();
  auto sim = run_tessel({"simulate", "--like", out + "/rep0/heldout_2.trace.json", "--system", profile, "--json"});
  CAPTURE(sim.err);
  CHECK(sim.code == 0);
  // A trusted repeat's profile carries its own error band: the mean |step error| of its held-out layouts, which
  // estimate prints beside the step time; an untrusted one carries none ("accuracy unknown").
  const auto pj = nlohmann::json::parse(slurp(profile));
  CHECK(pj.contains("error_band") == s["trusted"].get<bool>());
  auto est = run_tessel({"estimate", "--system", profile, "--model", "tiny", "--tp", "1", "--pp", "1", "--gpus", "1", "--gbs", "4"});
  CAPTURE(est.err);
  REQUIRE(est.code == 0);
  if (pj.contains("error_band")) {
    double sum = 0;
    for (const auto& row : rep["rows"]) sum += std::fabs(row["error_pct"].get<double>());
    CHECK(pj["error_band"]["rows"] == rep["rows"].size());
    CHECK(pj["error_band"]["step_pct"].get<double>() == doctest::Approx(sum / static_cast<double>(rep["rows"].size())));
    CHECK(has(est.out, "held-out layouts run on this host"));
  } else {
    CHECK(has(est.out, "accuracy unknown"));
  }
  CHECK(has(slurp(svg), "<svg"));
  // The figure's caption marks an untrusted repeat as the document does.
  CHECK(has(slurp(svg), "(NOT TRUSTED)") == !s["trusted"].get<bool>());
  std::filesystem::remove_all(out);
}

TEST_CASE("closed loop: bad input names the flag") {
  struct Case {
    std::vector<std::string> args;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {{"--closed-loop", "-o", "p.json"}, "-o: not with --closed-loop"},
      {{"--closed-loop", "--bench", "b.json"}, "--bench: not with --closed-loop"},
      {{"--closed-loop", "--gpu-threads"}, "--gpu-threads: only with --backend cuda"},
      {{"--closed-loop", "--backend", "tpu"}, "--backend tpu: expected cpu or cuda"},
      {{"--closed-loop", "--repeats", "0"}, "--repeats"},
      {{"--closed-loop", "--runs", "1"}, "--runs"},
      {{"--quick", "-o", "p.json", "--bench", "b.json"}, "--quick: a flag of --closed-loop"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> a = {"calibrate"};
    a.insert(a.end(), c.args.begin(), c.args.end());
    auto r = run_tessel(a);
    CAPTURE(c.expect);
    CAPTURE(r.err);
    CHECK(r.code == 2);
    CHECK(has(r.err, c.expect));
  }
}

TEST_CASE("simulate --system cpu defaults to what the CPU runtime executes") {
  // The four flags docs/compare.md needed before (and --no-overlap: the CPU runtime overlaps nothing) give the
  // same simulation as none.
  const std::vector<std::string> base = {"simulate", "--model", "tiny", "--system", "cpu", "--tp", "2", "--pp", "2",
                                         "--dp", "2", "--schedule", "zbv", "--gbs", "16", "--json"};
  auto plain = run_tessel(base);
  std::vector<std::string> explicit_flags = base;
  for (const char* f : {"--precision", "fp32", "--recompute", "none", "--attention", "unfused", "--no-sp", "--no-overlap"})
    explicit_flags.push_back(f);
  auto flagged = run_tessel(explicit_flags);
  REQUIRE(plain.code == 0);
  REQUIRE(flagged.code == 0);
  const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(flagged.out);
  CHECK(a["step_s"] == b["step_s"]);
  CHECK(a["layout"] == b["layout"]);
  CHECK(a["layout"]["precision"] == "fp32");
  CHECK(a["layout"]["attention"] == "unfused");
  CHECK(a["layout"]["sequence_parallel"] == false);
  CHECK(a["layout"]["overlap_grad_reduce"] == false);
  // A GPU system keeps Megatron's defaults.
  auto gpu = run_tessel({"simulate", "--model", "tiny", "--system", "dgx-a100", "--tp", "2", "--pp", "1", "--dp", "1",
                         "--gbs", "4", "--json"});
  REQUIRE(gpu.code == 0);
  const auto g = nlohmann::json::parse(gpu.out);
  CHECK(g["layout"]["precision"] == "bf16");
  CHECK(g["layout"]["recompute"] == "selective");
}

TEST_CASE("simulate --like RUN.json takes the run's model and layout; layout flags beside it are refused") {
  const std::string trace = temp_path("like.json");
  REQUIRE(run_tessel({"run", "--backend", "cpu", "--model", "tiny", "--tp", "2", "--pp", "2", "--schedule", "zbv",
                      "--gbs", "8", "--steps", "1", "--trace", trace})
              .code == 0);
  auto like = run_tessel({"simulate", "--like", trace, "--json"});
  CAPTURE(like.err);
  REQUIRE(like.code == 0);
  const auto j = nlohmann::json::parse(like.out);
  CHECK(j["layout"]["tp"] == 2);
  CHECK(j["layout"]["pp"] == 2);
  CHECK(j["layout"]["vpp"] == 2);
  CHECK(j["layout"]["schedule"] == "zbv");
  CHECK(j["layout"]["global_batch"] == 8);
  CHECK(j["layout"]["overlap_grad_reduce"] == false);  // the CPU runtime overlaps nothing
  auto both = run_tessel({"simulate", "--like", trace, "--tp", "1"});
  CHECK(both.code == 2);
  CHECK(has(both.err, "--tp: cannot be combined with --like " + trace));
  auto none = run_tessel({"simulate", "--like", temp_path("absent.json")});
  CHECK(none.code == 2);
  std::filesystem::remove(trace);
}

TEST_CASE("closed loop --backend cuda --gpu-threads: the same loop on the (fake) GPU" * doctest::skip(fake_exe() == nullptr)) {
  // tessel_fake runs the CUDA runtime's code on the CPU kernels: the mechanics of the GPU loop, as the device
  // check calls it (tools/device-check.sh). One calibration run (the ranks of --gpu-threads share the GPU,
  // which the scale fit does not model), the 3 quick held-out layouts; the profile's host is the one GPU.
  const std::string out = temp_path("cuda");
  auto r = tessel::test::run_exe(fake_exe(), {"calibrate", "--closed-loop", "--backend", "cuda", "--gpu-threads", "--quick",
                                              "--json", "--out", out});
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["backend"] == "cuda");
  CHECK(j["calibration_layouts"].size() == 1);
  const auto& rep = j["repeats"][0];
  REQUIRE(rep["rows"].size() == 3);
  for (const auto& row : rep["rows"]) {
    CHECK(row["measured_s"].get<double>() > 0);
    CHECK(row["predicted_s"].get<double>() > 0);
  }
  CHECK(rep["calibration"]["trace_method"] == "scales");  // the GPU bench has no element-wise kernel rows
  const auto profile = nlohmann::json::parse(slurp(rep["profile"].get<std::string>()));
  CHECK(profile["host"]["cores"] == 1);
  auto no_threads = tessel::test::run_exe(fake_exe(), {"calibrate", "--closed-loop", "--backend", "cuda", "--out", out});
  CHECK(no_threads.code == 2);
  CHECK(has(no_threads.err, "--backend cuda: the loop runs several ranks on the one GPU as threads; give --gpu-threads"));
  std::filesystem::remove_all(out);
}
