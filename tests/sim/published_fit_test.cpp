// calibrate --published (sim/calibrate/published_fit.hpp): the grid search recovers the efficiency numbers
// that generated synthetic measurements through validate's own predictions; its input rules. (The A100
// preset refitted from Korthikanti Table 4 itself is in published_test.cpp, which needs ../shared.)
#include <doctest/doctest.h>

#include <cmath>

#include "sim/calibrate/published_fit.hpp"
#include "sim/validate.hpp"

using namespace tessel;

namespace {

// Rows shaped like Korthikanti et al. Table 4 (the 22B model on 8 A100s, tp8, micro-batch 4: per-layer
// forward/backward times under each recompute and SP setting) plus a pipelined 16-GPU row with an iteration
// time, so that every fitted number moves some value: GEMM rate and K overhead the layers' GEMMs, memory
// the element-wise kernels, the intra-node efficiency the tp8 all-reduces. `measured` is a placeholder
// replaced by the truth's predictions.
Json rows_like_table4() {
  Json rows = Json::array();
  const char* variants[][3] = {{"none", "false", "a"}, {"none", "true", "b"}, {"full", "false", "c"},
                               {"selective", "false", "d"}, {"selective", "true", "e"}};
  for (const auto& v : variants) {
    rows.push_back(parse_json_text(std::string(R"({"id":"t4_)") + v[2] + R"(","model":{"name":"22B","layers":48,
      "hidden":6144,"heads":64,"ffn":null,"vocab":51200,"seq_len":2048},"hardware":{"gpu":"NVIDIA A100 80GB",
      "gpu_count":8},"layout":{"tp":8,"pp":1,"dp":1,"micro_batch":4,"global_batch":4,"schedule":"none",
      "recompute":")" + v[0] + R"(","sequence_parallel":)" + v[1] + R"(,"zero_stage":0},
      "measured":{"forward_ms_per_layer":1,"backward_ms_per_layer":1,"combined_ms_per_layer":1}})", "rows"));
  }
  rows.push_back(parse_json_text(R"({"id":"pp_row","model":{"name":"22B","layers":48,"hidden":6144,"heads":64,
    "seq_len":2048,"vocab":51200},"hardware":{"gpu":"NVIDIA A100 80GB","gpu_count":16},"layout":{"tp":8,"pp":2,
    "dp":1,"micro_batch":1,"global_batch":32,"schedule":"1f1b","recompute":"selective","sequence_parallel":true,
    "zero_stage":0},"measured":{"iteration_time_s":1}})", "rows"));
  return rows;
}

System truth() {
  System s = load_system("dgx-a100");
  // A grid point of efficiency_grid() on every axis, each different from the preset's (0.78, 96, 0.9, 0.6).
  s.gpu.gemm_efficiency = 0.81;
  s.gpu.gemm_k_overhead = 32;
  s.gpu.memory_efficiency = 0.7;
  s.node.intra_efficiency = 0.5;
  return s;
}

// The rows with every measured value replaced by validate's prediction under `sys`.
Json measured_by(const Json& rows, const System& sys) {
  const ValidationResult v = validate_rows(rows, "rows", {}, &sys);
  Json out = rows;
  for (auto& row : out)
    for (const auto& m : v.rows)
      if (m.id == row["id"]) row["measured"][m.metric] = m.predicted;
  return out;
}

std::string error_of(const Json& rows) {
  try {
    calib::fit_published(rows, "rows.json", load_system("dgx-a100"), calib::efficiency_grid());
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("published fit: recovers the grid point that generated the measurements") {
  const Json rows = measured_by(rows_like_table4(), truth());
  // From the preset (every fitted number off the truth); 5 x 5 x 5 x 5 candidates.
  const calib::PublishedFit f = calib::fit_published(rows, "rows", load_system("dgx-a100"), calib::efficiency_grid());
  CHECK(f.candidates == 625);
  CHECK(f.at_best.rows.size() == 16);  // 5 rows x 3 per-layer times + 1 iteration time
  CHECK(f.profile.gpu.gemm_efficiency == 0.81);
  CHECK(f.profile.gpu.gemm_k_overhead == 32);
  CHECK(f.profile.gpu.memory_efficiency == 0.7);
  CHECK(f.profile.node.intra_efficiency == 0.5);
  CHECK(f.best == std::vector<double>{0.81, 32, 0.7, 0.5});
  // At the truth, validate's prediction is the measurement: zero error (up to rounding).
  CHECK(f.mape_pct < 1e-9);
  CHECK(f.max_abs_pct < 1e-9);
  // Not on the grid: kept from the base.
  CHECK(f.profile.gpu.attention_efficiency == load_system("dgx-a100").gpu.attention_efficiency);
  const std::string text = calib::describe_published_fit(f, calib::efficiency_grid(), "rows.json", "dgx-a100");
  CHECK(text.find("gpu.efficiency.gemm 0.81, gpu.efficiency.gemm_k_overhead 32, gpu.efficiency.memory 0.7, "
                  "node.intra_efficiency 0.5") != std::string::npos);
}

TEST_CASE("published fit: ties go to the first grid point, the last axis moving fastest") {
  // One axis that changes nothing validate predicts (the network's efficiency, which the rows on the 8 GPUs of
  // one node never use; the 16-GPU row, two nodes, is left out) beside one that does: both values of the
  // first tie, and the first must win (a later equal MAPE does not replace it).
  const Json rows = measured_by(rows_like_table4(), truth());
  std::vector<calib::GridAxis> grid = {
      {"network.efficiency", [](System& s, double v) { s.net.efficiency = v; }, {0.3, 0.9}},
      {"gpu.efficiency.gemm", [](System& s, double v) { s.gpu.gemm_efficiency = v; }, {0.78, 0.81, 0.84}},
  };
  Json one_node = Json::array();
  for (const auto& r : rows)
    if (r["hardware"]["gpu_count"] == 8) one_node.push_back(r);
  const calib::PublishedFit f = calib::fit_published(one_node, "rows", truth(), grid);
  CHECK(f.candidates == 6);
  CHECK(f.best == std::vector<double>{0.3, 0.81});
}

TEST_CASE("published fit: rows of two GPUs, and too few values, are input errors naming the file") {
  Json two = rows_like_table4();
  two[1]["hardware"]["gpu"] = "NVIDIA H100 SXM";
  CHECK(error_of(two) == "rows.json: the rows were measured on GPUs of different system presets (dgx-a100 (e.g. t4_a), "
                         "dgx-h100 (e.g. t4_b)); one profile holds one GPU's numbers: select one GPU's rows with --only");
  Json few = Json::array();
  few.push_back(rows_like_table4().back());  // one iteration time: 1 value for 4 numbers
  CHECK(error_of(few) == "rows.json: 1 measured value(s) that validate predicts (0 row(s) skipped), fewer than the 4 "
                         "numbers to fit; select rows with more measurements");
  Json unknown = rows_like_table4();
  unknown[0]["hardware"]["gpu"] = "NVIDIA V100";
  CHECK(error_of(unknown).rfind("row t4_a: hardware.gpu \"NVIDIA V100\" matches no system preset", 0) == 0);
  CHECK(error_of(Json::array()) == "rows.json: no rows");
}
