// Tests on ../shared's published measurements (validation/published.json). Their main (tests/shared_main.cpp)
// skips the whole executable (exit 77) when ../shared is absent; with it present, a missing file fails.
//
// - Accuracy bounds from the foundation issue: iteration time / throughput MAPE <= 10% and max error <= 20%
//   on the Korthikanti et al. rows and Narayanan et al. Table 2 rows.
// - validate --engine des: the simulator's step times at least as accurate as the analytical estimate's, and
//   the Zero Bubble paper's schedules (Qi et al. 2024, Table 4) ranked as measured.
// - calibrate --published: Korthikanti Table 4 gives the A100 preset's fitted efficiencies again.
// - validate --explore-rank: the published layout's step in the search is validate's prediction.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "sim/calibrate/published_fit.hpp"
#include "sim/engine/simulate.hpp"
#include "sim/explore/published_rank.hpp"
#include "sim/validate.hpp"
#include "tests/sanitized.hpp"
#include "tests/test_paths.hpp"

using namespace tessel;

namespace {

constexpr double kMapeBoundPct = 10.0;
constexpr double kMaxBoundPct = 20.0;
const std::set<std::string> kTimeMetrics = {"iteration_time_s", "tflops_per_gpu", "mfu_pct", "hfu_pct"};

// The simulator must not be worse on any metric; equal is allowed (metrics it does not change, such as
// memory and per-layer times, come out identical up to floating-point noise).
constexpr double kMapeSlackPct = 1e-9;

StepTimeFn des() {
  return [](const Model& m, const Layout& l, const System& sys) {
    engine::SimOptions o;
    o.fidelity = engine::Fidelity::replica;
    o.critical_path = false;
    return engine::simulate(m, l, sys, o).step_s;
  };
}

// ../shared/validation/published.json; the main has checked that ../shared exists.
std::string published_rows() {
  const std::string path = test::shared_dir() + "/validation/published.json";
  REQUIRE_MESSAGE(std::filesystem::exists(path), (path + " is missing from ../shared"));
  return path;
}

// Mean |step error| of a validation's rows in percent (one step metric per row, as the error bands).
double mean_abs_step_pct(const ValidationResult& v) {
  const auto steps = step_errors(v);
  REQUIRE(!steps.empty());
  double sum = 0;
  for (const auto& kv : steps) sum += std::fabs(kv.second);
  return 100 * sum / static_cast<double>(steps.size());
}

}  // namespace

TEST_CASE("published rows: Korthikanti and Narayanan Table 2 within bounds") {
  const std::string path = published_rows();
  const Json all = parse_json_file(path);
  Json rows = Json::array();
  for (const auto& r : all) {
    const std::string id = r.at("id").get<std::string>();
    if (id.rfind("korthikanti22", 0) == 0 || id.rfind("narayanan21_t2", 0) == 0) rows.push_back(r);
  }
  REQUIRE(rows.size() >= 20);
  const ValidationResult res = validate_rows(rows, path);
  CHECK(res.skipped.empty());
  double sum = 0, worst = 0;
  int n = 0;
  for (const auto& m : res.rows) {
    if (!kTimeMetrics.count(m.metric)) continue;
    CAPTURE(m.id);
    CAPTURE(m.metric);
    CHECK(std::fabs(m.error_pct) <= kMaxBoundPct);
    sum += std::fabs(m.error_pct);
    worst = std::max(worst, std::fabs(m.error_pct));
    ++n;
  }
  REQUIRE(n >= 25);
  MESSAGE("time/throughput metrics: " << n << " values, MAPE " << sum / n << "%, max " << worst << "%");
  CHECK(sum / n <= kMapeBoundPct);
  for (const auto& metric : kTimeMetrics) {
    if (!res.mape_pct.count(metric)) continue;
    CAPTURE(metric);
    CHECK(res.mape_pct.at(metric) <= kMapeBoundPct);
  }
}

TEST_CASE("validate --engine des: MAPE no worse than analytical on every metric of the file; ZB Table 4 order") {
  const std::string path = published_rows();
  // Every row of the file, as `tessel validate --engine des` runs it (the criterion), not a subset.
  const Json rows = parse_json_file(path);
  REQUIRE(rows.size() > 100);
  const ValidationResult a = validate_rows(rows, path);
  const ValidationResult d = validate_rows(rows, path, des());
  for (const auto& kv : a.mape_pct) {  // no structured binding: clang 14 cannot capture one in CAPTURE
    const std::string& metric = kv.first;
    const double mape = kv.second;
    CAPTURE(metric);
    MESSAGE(metric << ": analytical " << mape << "%, des " << d.mape_pct.at(metric) << "%");
    CHECK(d.mape_pct.at(metric) <= mape + kMapeSlackPct);
  }
  // Zero Bubble Table 4: for each model and micro-batch count, throughput ZB-2p > ZB-1p > 1F1B measured, and
  // 1F1B-I (one layer per chunk) above 1F1B; the simulator must give the same order (ties are a failure).
  // Where 1F1B-I falls against the ZB schedules is not asserted, because the model gets it wrong: the paper
  // measured ZB-2p 5-21% above 1F1B-I; the event engine puts the two within -2%..+7%, 1F1B-I ahead on the
  // 1.5B and 6.2B models, and 1F1B-I above ZB-1p in 9 of the 12 groups where the paper has it in 3
  // (docs/validation.md: one layer per chunk multiplies per-chunk costs the model does not fully carry).
  std::map<std::string, std::map<std::string, std::pair<double, double>>> groups;  // model_m -> sched -> (meas, pred)
  for (const auto& r : d.rows) {
    if (r.id.rfind("zb24_t4_", 0) != 0 || r.metric != "samples_per_gpu_per_s") continue;
    // id: zb24_t4_<model>_<schedule>_m<m>
    const auto rest = r.id.substr(8);
    const auto s1 = rest.find('_'), s2 = rest.rfind('_');
    groups[rest.substr(0, s1) + rest.substr(s2)][rest.substr(s1 + 1, s2 - s1 - 1)] = {r.measured, r.predicted};
  }
  REQUIRE(groups.size() >= 6);
  for (const auto& kv : groups) {  // no structured binding: clang 14 cannot capture one in CAPTURE
    const auto& key = kv.first;
    const auto& g = kv.second;
    CAPTURE(key);
    REQUIRE(g.size() == 4);
    const auto& zb2 = g.at("ZB-2p");
    const auto& zb1 = g.at("ZB-1p");
    const auto& f1b = g.at("1F1B");
    const auto& f1bi = g.at("1F1B-I");
    REQUIRE(zb2.first > zb1.first);  // the paper's order
    REQUIRE(zb1.first > f1b.first);
    REQUIRE(f1bi.first > f1b.first);
    CHECK(zb2.second > zb1.second);
    CHECK(zb1.second > f1b.second);
    CHECK(f1bi.second > f1b.second);
  }
}

// The A100 preset's efficiency numbers were fitted once to Korthikanti et al. Table 4 (22B per-layer times,
// rows korthikanti22_t4_*). The fit must find them again from a base whose four fitted numbers are all
// wrong, to the grid's resolution: the grid holds each preset value, so within half a step of it is that
// very grid point.
TEST_CASE("calibrate --published: Korthikanti Table 4 gives the A100 preset's fitted numbers again") {
  const std::string path = published_rows();
  const Json rows = select_rows(parse_json_file(path), path, {"korthikanti22_t4"});
  REQUIRE(rows.size() == 5);
  CHECK(calib::rows_system_preset(rows, path) == "dgx-a100");
  const System preset = load_system("dgx-a100");
  System base = preset;
  base.gpu.gemm_efficiency = 0.5;
  base.gpu.gemm_k_overhead = 0;
  base.gpu.memory_efficiency = 0.5;
  base.node.intra_efficiency = 0.3;
  const std::vector<calib::GridAxis> grid = calib::efficiency_grid();
  REQUIRE(grid.size() == 4);
  const calib::PublishedFit f = calib::fit_published(rows, path, base, grid);
  CHECK(f.candidates == 5 * 5 * 5 * 5);
  CHECK(f.at_best.rows.size() == 15);  // forward, backward and combined ms per layer of 5 rows
  // Half a grid step of each axis (0.03, 32, 0.05 near 0.9, 0.1).
  CHECK(std::fabs(f.profile.gpu.gemm_efficiency - preset.gpu.gemm_efficiency) < 0.015);
  CHECK(std::fabs(f.profile.gpu.gemm_k_overhead - preset.gpu.gemm_k_overhead) < 16);
  CHECK(std::fabs(f.profile.gpu.memory_efficiency - preset.gpu.memory_efficiency) < 0.025);
  CHECK(std::fabs(f.profile.node.intra_efficiency - preset.node.intra_efficiency) < 0.05);
  // The fit's error is validate's own on those rows under the preset (docs/validation.md: within 3%).
  const ValidationResult v = validate_rows(rows, path, {}, &preset);
  double sum = 0;
  for (const auto& m : v.rows) sum += std::fabs(m.error_pct);
  CHECK(f.mape_pct == doctest::Approx(sum / v.rows.size()));
  CHECK(f.max_abs_pct < 3.0);
  // Everything not on the grid is the base's.
  CHECK(f.profile.gpu.attention_efficiency == base.gpu.attention_efficiency);
  CHECK(f.profile.node.intra_bw_Bps == base.node.intra_bw_Bps);
}

// validate --explore-rank maps each row as validate does: on the published rows that measure an iteration
// time, the published layout's step in the search is validate's predicted iteration time, to the bit.
TEST_CASE("explore-rank on published rows: the published layout's step is validate's predicted iteration time") {
  const std::string path = published_rows();
  const Json rows = select_rows(parse_json_file(path), path, {"korthikanti22_t5", "narayanan21_t2_PTD-P_174.6B"});
  const ValidationResult v = validate_rows(rows, path);
  const explore::PublishedRanks r = explore::rank_published(rows, path);
  CHECK(r.skipped.empty());
  int compared = 0;
  for (const auto& p : r.rows) {
    CAPTURE(p.id);
    for (const auto& m : v.rows) {
      if (m.id != p.id || m.metric != "iteration_time_s") continue;
      REQUIRE(p.full.rank > 0);
      CHECK(p.full.published.layout.describe() == p.published);
      CHECK(p.full.published.step_s == m.predicted);
      ++compared;
    }
  }
  CHECK(compared == 8);  // Korthikanti Table 5: 22B, 175B, 530B, 1T, each with full and with selective recompute
}

namespace {

// Each preset's committed band (`member`: error_band or moe_error_band) against validate's bands by hardware
// class; a class without scored rows claims none. Returns how many presets carry one.
int check_preset_bands(const std::map<std::string, ErrorBand>& bands, std::optional<ErrorBand> System::*member) {
  int checked = 0;
  for (const auto& name : system_preset_names()) {
    CAPTURE(name);
    const System s = load_system(name);
    const std::optional<ErrorBand>& band = s.*member;
    const std::string cls = hardware_class(name);
    if (!bands.count(cls)) {
      CHECK_FALSE(band.has_value());  // no rows of its class scored: no band claimed
      continue;
    }
    REQUIRE(band.has_value());
    CHECK(band->hardware_class == cls);
    CHECK(band->rows == bands.at(cls).rows);
    CHECK(std::fabs(band->step_pct - bands.at(cls).step_pct) <= 0.05);  // committed rounded to 0.1
    ++checked;
  }
  return checked;
}

}  // namespace

// The error band each preset prints beside its step times is what validate measures on its hardware class: the
// committed figure cannot drift from the model (a change to the cost model that moves it fails here until the
// presets' error_band is updated from `tessel validate published.json`).
TEST_CASE("presets' error bands are validate's step errors on their hardware class") {
  const std::string path = published_rows();
  const Json rows = parse_json_file(path);
  const auto bands = step_error_bands(rows, validate_rows(rows, path));
  REQUIRE(bands.count("A100") == 1);
  REQUIRE(bands.count("Hopper") == 1);
  CHECK(check_preset_bands(bands, &System::error_band) == 6);  // dgx-a100 and the five Hopper presets
}

// The same for mixture-of-experts models: their band comes from published-moe.json's rows of the class (a MoE
// model's errors are not a dense model's: 28.5% against 11.1% on Hopper today), and a class without MoE rows
// (A100) claims none for them, whatever its dense band.
TEST_CASE("presets' MoE error bands are validate's step errors on published-moe.json's rows of their class") {
  const std::string path = test::shared_dir() + "/validation/published-moe.json";
  REQUIRE_MESSAGE(std::filesystem::exists(path), (path + " is missing from ../shared"));
  const Json rows = parse_json_file(path);
  const auto bands = step_error_bands(rows, validate_rows(rows, path));
  REQUIRE(bands.count("Hopper") == 1);
  REQUIRE(bands.count("Blackwell") == 1);
  CHECK(bands.count("A100") == 0);
  CHECK(check_preset_bands(bands, &System::moe_error_band) == 7);  // the five Hopper presets, dgx-b200 and gb200
  // The step times of a MoE model carry this band, of a dense one the dense band; the MoE band names its rows.
  for (const auto& name : system_preset_names()) {
    CAPTURE(name);
    const System s = load_system(name);
    CHECK(&s.step_band(true) == &s.moe_error_band);
    CHECK(&s.step_band(false) == &s.error_band);
    if (s.moe_error_band) CHECK(s.moe_error_band->rows_of == "MoE rows of published-moe.json");
  }
}


// Leave one source out (docs/validation.md, "Per source"): each A100 source's rows predicted by a profile
// fitted with calibrate --published's grid on the other A100 sources only. Bounds: every source within 15%
// mean |step error| under the committed preset (the per-source bound; the Hopper sources are the next
// test case), and within 10% when left out of the fit: today 8.2% (Korthikanti),
// 7.3% (Narayanan), 6.2% (Zero Bubble), so a profile that only fits what it was tuned on fails here.
TEST_CASE("published rows: every A100 source within its bounds, also when left out of the fit") {
  const std::string path = published_rows();
  const Json all = parse_json_file(path);
  const std::vector<std::string> sources = {"korthikanti22_", "narayanan21_", "zb24_"};
  for (const std::string& src : sources) {
    CAPTURE(src);
    // Each source left out costs a grid fit over the other sources' rows. Under ASan (tests/sanitized.hpp) only
    // Zero Bubble's is left out, the cheapest (the fit runs over 33 rows, the other two over 209 and 210): the
    // other two fits run the same code on more rows.
    if (tessel::test::kSanitized && src != "zb24_") continue;
    const Json mine = select_rows(all, path, {src});
    std::vector<std::string> others;
    for (const std::string& o : sources)
      if (o != src) others.push_back(o);
    const Json rest = select_rows(all, path, others);
    const std::string preset = calib::rows_system_preset(rest, path);
    CHECK(preset == "dgx-a100");
    const calib::PublishedFit fit = calib::fit_published(rest, path, load_system(preset), calib::efficiency_grid());
    const double with_preset = mean_abs_step_pct(validate_rows(mine, path));
    const double left_out = mean_abs_step_pct(validate_rows(mine, path, {}, &fit.profile));
    MESSAGE(src << ": preset " << with_preset << "%, left out " << left_out << "%");
    CHECK(with_preset <= 15.0);
    CHECK(left_out <= 10.0);
  }
}

// The Hopper sources under the committed presets (GEMMs measured on an H200, nothing fitted to these rows), held
// to the bounds: each NeMo source within 15% mean |step error| (nemo2407 9.7%, the long-sequence table
// 13.6% today), and all NeMo / H100 rows together within 12% (11.4% over the 21 rows: a thin margin, reached
// when the weight gradients were priced writing fp32 main grads, gemm_fp32_out measured on the H200, and the
// delayed fp8 recipe's amax all-reduces were priced; SwiGLU's backward reading both halves took it from 11.8%,
// the attention rate by key length from 11.6%). The
// nemo2407 rows are predicted under NeMo 24.07's config for each model (sim/recipes/nemo-24.07.json): the 70B
// rows' TP overlap, Nemotron-340B's selective recompute and bf16 optimizer state. Every row but Nemotron-340B
// (-5.7%) is optimistic in tokens/s: GPT-3 175B +2-3%, the others +10-24% (GPT-3 5B the most); the
// long-sequence table's 7B rows +12-20% (docs/validation.md, "H100 / FP8 rows").
TEST_CASE("published rows: each NeMo source within 15% mean |step error|") {
  const std::string path = published_rows();
  const Json all = parse_json_file(path);
  const auto source_pct = [&](const std::vector<std::string>& src) {
    return mean_abs_step_pct(validate_rows(select_rows(all, path, src), path));
  };
  const double nemo2407 = source_pct({"nemo2407_"}), longseq = source_pct({"nemo_longseq_"});
  MESSAGE("nemo2407 " << nemo2407 << "%, nemo long-sequence " << longseq << "% mean |step error|");
  CHECK(nemo2407 <= 15.0);
  CHECK(longseq <= 15.0);
}

TEST_CASE("published rows: the NeMo / H100 rows within 12%") {
  const std::string path = published_rows();
  const Json all = parse_json_file(path);
  const auto rows = validate_rows(select_rows(all, path, {"nemo2407_", "nemo_longseq_"}), path);
  const double both = mean_abs_step_pct(rows);
  MESSAGE("NeMo / H100: " << both << "% mean |step error| over " << step_errors(rows).size() << " rows");
  CHECK(both <= 12.0);
}

// ../shared/validation/published-moe.json (NVIDIA's MoE performance tables): every row is scored by tokens/s
// (Qwen3 MoE, Mixtral, DeepSeek-V3, GPT-OSS with its windowed layers). The bounds (docs/validation.md, "Mixture of experts"):
//  - the mean |error| at most 50%: a regression bound, not an accuracy claim (the same Qwen3-30B-A3B layout
//    was published at 5,113 and 9,058 tokens/s/GPU by two releases a month apart);
//  - a row whose expert-parallel group stays inside one NVLink domain is predicted faster than measured: the
//    model leaves out the dispatcher's host synchronisation, routing imbalance and the grouped GEMM's
//    per-expert overhead, and adds nothing those runs do not do (a row predicted slower would mean a cost
//    counted twice). Except where the row leaves recompute unstated and validate fills in full recompute
//    (the lightest that fits Tessel's memory model): the recipes recompute chosen modules (Megatron-Bridge's
//    --recompute-modules), less than full, so such a row may be predicted slower, but by no more than that
//    recompute: one more forward, a third more compute, is a step at most 4/3 as long (tokens/s -25%);
//  - a row whose group crosses nodes is within 30% either way: its all-to-all sends (n - k) / n of each
//    buffer over the network (NCCL's send-to-every-peer), which those recipes shorten with DeepEP's
//    node-limited dispatch and hide with the 1F1B all-to-all overlap, neither modelled, so they come out
//    slower by up to 27% (an all-to-all priced as a hierarchical all-gather, 1/k of the buffer over the
//    network, had them 30-56% optimistic);
//  - the coarse-expert Mixtral 8x7B on B200 within 15%.
TEST_CASE("published MoE rows: every row scored by tokens/s within the stated bounds") {
  const std::string path = test::shared_dir() + "/validation/published-moe.json";
  REQUIRE_MESSAGE(std::filesystem::exists(path), (path + " is missing from ../shared"));
  const Json rows = parse_json_file(path);
  const ValidationResult res = validate_rows(rows, path);
  REQUIRE(res.rows.size() >= 16);
  std::map<std::string, bool> crosses_nodes;  // row id -> its ep group spans more than one NVLink domain
  for (const Json& row : rows) {
    const std::string id = row.at("id").get<std::string>();
    const std::string preset = system_for_gpu(row.at("hardware").at("gpu").get<std::string>(), id);
    if (preset.empty()) continue;
    // ep members are etp apart (etp fastest in the folding); the group spans (ep - 1) etp + 1 GPUs.
    const Json& lay = row.at("layout");
    const int etp = lay.contains("etp") && lay.at("etp").is_number() ? lay.at("etp").get<int>() : 1;
    crosses_nodes[id] = (lay.at("ep").get<int>() - 1) * etp + 1 > load_system(preset).node.gpus_per_node;
  }
  double sum = 0;
  int across = 0, full_filled = 0;
  for (const auto& r : res.rows) {
    CAPTURE(r.id);
    CAPTURE(r.error_pct);
    CHECK(r.metric == "tokens_per_s_per_gpu");
    REQUIRE(crosses_nodes.count(r.id) == 1);
    const bool filled_full = std::find(r.assumed.begin(), r.assumed.end(), "recompute=full") != r.assumed.end();
    if (crosses_nodes.at(r.id)) {
      ++across;
      CHECK(std::fabs(r.error_pct) <= 30.0);
    } else if (filled_full) {
      ++full_filled;
      CHECK(r.error_pct > -25.0);
    } else {
      CHECK(r.error_pct > 0);
    }
    sum += std::fabs(r.error_pct);
    if (r.id == "nemo2502_Mixtral-8x7B_fp8_b200_64gpu") CHECK(std::fabs(r.error_pct) <= 15.0);
  }
  CHECK(across == 5);
  // Rows inside one NVLink domain with full recompute filled in: DeepSeek-V3 on 256 GB200 (bf16 and mxfp8),
  // GPT-OSS-120B and Qwen3-30B-A3B on H100 (Megatron-Bridge 25.11; these two predicted faster all the same).
  CHECK(full_filled == 4);
  CHECK(sum / res.rows.size() <= 50.0);
  // DeepSeek-V3 (latent attention, dense layers, MTP) and GPT-OSS (windowed layers, sinks, expert biases) scored.
  int deepseek = 0, gpt_oss = 0;
  for (const auto& r : res.rows) {
    deepseek += r.id.find("DeepSeekV3") != std::string::npos;
    gpt_oss += r.id.find("GPT-OSS") != std::string::npos;
  }
  CHECK(deepseek == 4);
  CHECK(gpt_oss == 2);
  CHECK(res.skipped.empty());
  CHECK(res.rows.size() + res.skipped.size() == 18);
}
