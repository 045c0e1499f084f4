// tessel calibrate --published from the command line: the profile it writes holds the fitted numbers and
// gives validate the fit's own errors; bad combinations exit 2 naming the flags.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/tools/run_util.hpp"

using tessel::test::run_tessel;
using tessel::test::write_temp;

namespace {

// Two per-layer rows of a 22B model on 8 A100s (Korthikanti Table 4's shape) with round made-up times: the
// fit's mechanics, not its accuracy (which published_fit_test.cpp and published_test.cpp check).
const char* kRows = R"([
 {"id":"layer_none","model":{"name":"22B","layers":48,"hidden":6144,"heads":64,"vocab":51200,"seq_len":2048},
  "hardware":{"gpu":"NVIDIA A100 80GB","gpu_count":8},"layout":{"tp":8,"pp":1,"dp":1,"micro_batch":4,
  "global_batch":4,"schedule":"none","recompute":"none","sequence_parallel":false,"zero_stage":0},
  "measured":{"forward_ms_per_layer":8,"backward_ms_per_layer":12,"combined_ms_per_layer":20}},
 {"id":"layer_full","model":{"name":"22B","layers":48,"hidden":6144,"heads":64,"vocab":51200,"seq_len":2048},
  "hardware":{"gpu":"NVIDIA A100 80GB","gpu_count":8},"layout":{"tp":8,"pp":1,"dp":1,"micro_batch":4,
  "global_batch":4,"schedule":"none","recompute":"full","sequence_parallel":false,"zero_stage":0},
  "measured":{"forward_ms_per_layer":8,"backward_ms_per_layer":20,"combined_ms_per_layer":28}}
])";

}  // namespace

TEST_CASE("calibrate --published: the profile holds the fitted numbers and validate agrees with the fit") {
  const std::string rows = write_temp("published_rows.json", kRows);
  const std::string profile = write_temp("published_profile.json", "");
  auto r = run_tessel({"calibrate", "--published", rows, "-o", profile, "--json"});
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  const auto fit = nlohmann::json::parse(r.out);
  CHECK(fit["candidates"] == 625);
  CHECK(fit["validation"]["rows"].size() == 6);
  const auto written = nlohmann::json::parse(std::ifstream(profile));
  CHECK(written["name"] == "dgx-a100-calibrated");  // the base is the rows' GPU's preset
  CHECK(written["gpu"]["efficiency"]["gemm"] == fit["fitted"]["gpu.efficiency.gemm"]);
  CHECK(written["gpu"]["efficiency"]["gemm_k_overhead"] == fit["fitted"]["gpu.efficiency.gemm_k_overhead"]);
  CHECK(written["gpu"]["efficiency"]["memory"] == fit["fitted"]["gpu.efficiency.memory"]);
  CHECK(written["node"]["intra_efficiency"] == fit["fitted"]["node.intra_efficiency"]);
  CHECK(written["source"].get<std::string>().find("fitted by `tessel calibrate --published`") != std::string::npos);
  // Expected: `validate --system PROFILE` on the same rows predicts exactly what the fit judged, so the mean
  // of its absolute errors is the fit's MAPE.
  auto v = run_tessel({"validate", rows, "--system", profile, "--json"});
  REQUIRE(v.code == 0);
  double sum = 0;
  int n = 0;
  const auto report = nlohmann::json::parse(v.out);
  for (const auto& row : report["rows"]) {
    sum += std::fabs(row["error_pct"].get<double>());
    ++n;
  }
  REQUIRE(n == 6);
  CHECK(sum / n == doctest::Approx(fit["mape_pct"].get<double>()).epsilon(1e-12));
  // The text report names what was fitted and where the profile went.
  auto t = run_tessel({"calibrate", "--published", rows, "--base-system", "dgx-a100", "--name", "a100-fit", "-o", profile});
  REQUIRE(t.code == 0);
  CHECK(t.out.find("fitted to 6 values of " + rows + " (625 grid points, from dgx-a100): gpu.efficiency.gemm ") == 0);
  CHECK(t.out.find("profile: " + profile) != std::string::npos);
  CHECK(nlohmann::json::parse(std::ifstream(profile))["name"] == "a100-fit");
  std::filesystem::remove(rows);
  std::filesystem::remove(profile);
}

TEST_CASE("calibrate --published: bad combinations and rows exit 2 naming the flag or file") {
  const std::string rows = write_temp("published_rows_bad.json", kRows);
  const std::string out = (std::filesystem::temp_directory_path() / "published_never_written.json").string();
  std::filesystem::remove(out);
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--published", rows, "--bench", "b.json"}, "--published fits a system's efficiencies to published rows; --bench belongs"},
      {{"--published", rows, "--comm", "mpi"}, "--comm belongs to the fit from bench and trace measurements"},
      {{"--bench", "b.json", "--only", "x"}, "--only selects rows of --published, and none is given"},
      {{"--published", rows, "--only", "nosuch"}, "--only nosuch: no row id in " + rows + " starts with it"},
      {{"--published", rows, "--only", "layer_none"}, ": 3 measured value(s) that validate predicts (0 row(s) skipped), "
                                                      "fewer than the 4 numbers to fit"},
      {{"--published", "/nonexistent/rows.json"}, "/nonexistent/rows.json"},
      {{"--published", std::filesystem::temp_directory_path().string()}, "is a directory, not a file"},
      {{}, "give --bench FILE and/or --trace FILES, or --published ROWS"},
  };
  for (const auto& c : cases) {  // no structured binding: doctest's CAPTURE cannot take one (clang 14)
    std::vector<std::string> args = {"calibrate", "-o", out};
    args.insert(args.end(), c.first.begin(), c.first.end());
    auto r = run_tessel(args);
    CAPTURE(c.second);
    CAPTURE(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find(c.second) != std::string::npos);
  }
  CHECK(!std::filesystem::exists(out));
  std::filesystem::remove(rows);
}
