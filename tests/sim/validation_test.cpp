// validate on inline rows: the GPU mapping, nulls chosen and listed, measured values and --only checked.
// The accuracy bounds on ../shared's published rows are in published_test.cpp (skipped without ../shared).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "sim/layout_words.hpp"
#include "sim/recipe.hpp"
#include "sim/validate.hpp"

using namespace tessel;

TEST_CASE("validate: inline rows, GPU mapping, nulls chosen and listed") {
  const char* text = R"([{"id":"x","model":{"layers":24,"hidden":2304,"heads":24,"ffn":null,"vocab":51200,
    "seq_len":2048},"hardware":{"gpu":"NVIDIA A100 80GB","gpu_count":64},
    "layout":{"tp":8,"pp":1,"dp":8,"cp":1,"ep":1,"vpp":1,"micro_batch":null,"global_batch":512,
    "num_microbatches":null,"schedule":"none","recompute":null,"sequence_parallel":null,"zero_stage":0,
    "precision":"fp16_or_bf16"},"measured":{"iteration_time_s":1.0}}])";
  const ValidationResult r = validate_rows(parse_json_text(text, "rows.json"), "rows.json");
  REQUIRE(r.rows.size() == 1);
  bool listed_mbs = false;
  for (const auto& a : r.rows[0].assumed) listed_mbs = listed_mbs || a.rfind("micro_batch=", 0) == 0;
  CHECK(listed_mbs);
  CHECK(r.rows[0].error_pct == doctest::Approx(100.0 * (r.rows[0].predicted - 1.0)));
  std::string err;
  try {
    system_for_gpu("NVIDIA V100", "row7");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err.find("row row7: hardware.gpu \"NVIDIA V100\" matches no system preset") == 0);
  err.clear();
  try {
    validate_rows(parse_json_text("{}", "rows.json"), "rows.json");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err.find("expected a JSON array of rows") != std::string::npos);
}

// Memory verdicts: a row that ran fit, one measured out of memory did not. The 22B GPT of Korthikanti's Table 3
// on 8 A100s at tp 8 (the whole model on one tp group, fully stated): with full recompute it fits (114.9 GiB
// without recompute, 93 with sequence parallelism alone, by the same model), so "ran" is a right verdict and
// "out of memory" a wrong one; without recompute the reverse. A row with only per-layer times has no verdict,
// and out_of_memory must be a boolean.
TEST_CASE("validate: memory verdicts for rows that ran and rows out of memory") {
  const auto row = [](const std::string& id, const std::string& recompute, const std::string& measured) {
    return R"({"id":")" + id + R"(","model":{"layers":48,"hidden":6144,"heads":64,"ffn":24576,"vocab":51200,
      "seq_len":2048},"hardware":{"gpu":"NVIDIA A100 80GB","gpu_count":8},
      "layout":{"tp":8,"pp":1,"dp":1,"cp":1,"ep":1,"vpp":1,"micro_batch":4,"global_batch":4,
      "num_microbatches":null,"schedule":"none","recompute":")" + recompute + R"(","sequence_parallel":false,
      "zero_stage":0,"precision":"fp16_or_bf16"},"measured":)" + measured + "}";
  };
  const std::string text = "[" + row("korthikanti22_ran_full", "full", R"({"iteration_time_s":1.0})") + "," +
                           row("korthikanti22_ran_none", "none", R"({"iteration_time_s":1.0})") + "," +
                           row("korthikanti22_oom_none", "none", R"({"out_of_memory":true})") + "," +
                           row("korthikanti22_oom_full", "full", R"({"iteration_time_s":null,"out_of_memory":true})") + "," +
                           row("korthikanti22_layer", "none", R"({"forward_ms_per_layer":7.7})") + "]";
  const ValidationResult r = validate_rows(parse_json_text(text, "rows.json"), "rows.json");
  CHECK(r.skipped.empty());
  REQUIRE(r.memory.size() == 4);  // the per-layer row has none
  std::map<std::string, MemoryVerdict> v;
  for (const auto& m : r.memory) v[m.id] = m;
  CHECK(v.at("korthikanti22_ran_full").ran);
  CHECK(v.at("korthikanti22_ran_full").predicted_fits);
  CHECK(v.at("korthikanti22_ran_full").right());
  CHECK(v.at("korthikanti22_ran_none").ran);
  CHECK_FALSE(v.at("korthikanti22_ran_none").predicted_fits);
  CHECK_FALSE(v.at("korthikanti22_ran_none").right());
  CHECK(v.at("korthikanti22_ran_none").peak_GiB > v.at("korthikanti22_ran_none").capacity_GiB);
  CHECK_FALSE(v.at("korthikanti22_oom_none").ran);
  CHECK(v.at("korthikanti22_oom_none").right());
  CHECK_FALSE(v.at("korthikanti22_oom_full").right());
  // The out-of-memory rows have no measured number to score: verdicts only.
  for (const auto& m : r.rows) CHECK(m.id.find("_oom_") == std::string::npos);
  const Json j = validation_to_json(r);
  CHECK(j["memory_verdicts"]["ran"] == 2);
  CHECK(j["memory_verdicts"]["ran_predicted_to_fit"] == 1);
  CHECK(j["memory_verdicts"]["out_of_memory"] == 2);
  CHECK(j["memory_verdicts"]["out_of_memory_predicted_not_to_fit"] == 1);
  std::string err;
  try {
    validate_rows(parse_json_text("[" + row("korthikanti22_bad", "full", R"({"out_of_memory":"yes"})") + "]", "rows.json"),
                  "rows.json");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err.find("(korthikanti22_bad): measured.out_of_memory: value \"yes\" must be true or false") != std::string::npos);
  // No fp8 row, no other reading of the weights.
  for (const auto& m : r.memory) CHECK_FALSE(m.fp8_weights_peak_GiB.has_value());
  // The same model in fp8 on H100s with the distributed optimizer keeps 16-bit weights (no stack says otherwise);
  // the verdict reports the peak with fp8 primary weights beside it: 2 bytes less on each of the GEMM weights,
  // about 22B / 8 of them on each GPU (5.1 GiB), in the JSON too.
  std::string f8 = row("korthikanti22_fp8", "full", R"({"iteration_time_s":1.0})");
  f8.replace(f8.find("NVIDIA A100 80GB"), 16, "NVIDIA H100 80GB");
  f8.replace(f8.find(R"("zero_stage":0,"precision":"fp16_or_bf16")"), 41, R"("zero_stage":1,"precision":"fp8")");
  const ValidationResult rf = validate_rows(parse_json_text("[" + f8 + "]", "rows.json"), "rows.json");
  REQUIRE(rf.memory.size() == 1);
  REQUIRE(rf.memory[0].fp8_weights_peak_GiB.has_value());
  const double saved = rf.memory[0].peak_GiB - *rf.memory[0].fp8_weights_peak_GiB;
  CHECK(saved > 4.8);
  CHECK(saved < 5.2);
  CHECK(validation_to_json(rf)["memory_verdicts"]["rows"][0]["fp8_weights_peak_GiB"].get<double>() ==
        doctest::Approx(*rf.memory[0].fp8_weights_peak_GiB));
}

// A row the model cannot predict is the row's limit, not the file's: a GPU without a preset and a mixture of
// experts are listed under skipped with the reason, and the rows beside them are still predicted.
TEST_CASE("validate: a row with an unknown GPU or a mixture of experts is skipped with its reason") {
  const std::string row = R"({"id":"ID","model":{"layers":24,"hidden":2304,"heads":24,"ffn":null,"vocab":51200,
    "seq_len":2048EXTRA},"hardware":{"gpu":"GPU","gpu_count":64},
    "layout":{"tp":8,"pp":1,"dp":8,"cp":1,"ep":1,"vpp":1,"micro_batch":1,"global_batch":512,
    "num_microbatches":null,"schedule":"none","recompute":"full","sequence_parallel":false,"zero_stage":0,
    "precision":"fp16_or_bf16"},"measured":{"iteration_time_s":1.0}})";
  const auto make = [&](const std::string& id, const std::string& gpu, const std::string& extra) {
    std::string r = row;
    r.replace(r.find("ID"), 2, id);
    r.replace(r.find("GPU"), 3, gpu);
    r.replace(r.find("EXTRA"), 5, extra);
    return r;
  };
  const std::string text = "[" + make("a100", "NVIDIA A100 80GB", "") + "," + make("b200", "NVIDIA B100", "") + "," +
                           make("moe", "NVIDIA A100 80GB", ",\"experts\":8,\"experts_per_token\":2") + "]";
  const ValidationResult r = validate_rows(parse_json_text(text, "rows.json"), "rows.json");
  REQUIRE(r.rows.size() == 1);
  CHECK(r.rows[0].id == "a100");
  REQUIRE(r.skipped.size() == 2);
  CHECK(r.skipped[0].id == "b200");
  CHECK(r.skipped[0].reason.rfind("hardware.gpu \"NVIDIA B100\" matches no system preset (known: ", 0) == 0);
  CHECK(r.skipped[1].id == "moe");
  // A MoE row takes its architecture from the preset of its name; a name without one is skipped.
  CHECK(r.skipped[1].reason == "model: mixture of experts row model has no model preset to take its architecture from");
}

TEST_CASE("validate: a measured value that is not a positive number is rejected, naming file, row and field") {
  // Errors are relative to the measured value: -5, 0 or a string cannot be compared and must not vanish from
  // the report. null means not measured; keys Tessel does not predict (notes) are not checked.
  const std::string head = R"([{"id":"a","model":{"layers":24,"hidden":2304,"heads":24,"ffn":null,"vocab":51200,
    "seq_len":2048},"hardware":{"gpu":"NVIDIA A100 80GB","gpu_count":64},
    "layout":{"tp":8,"pp":1,"dp":8,"cp":1,"ep":1,"vpp":1,"micro_batch":1,"global_batch":512,
    "num_microbatches":null,"schedule":"none","recompute":"full","sequence_parallel":false,"zero_stage":0,
    "precision":"fp16_or_bf16"},"measured":{"note":"x","overhead_pct":-3,"tflops_per_gpu":null,"iteration_time_s":)";
  const auto error_of = [&](const std::string& value) {
    try {
      validate_rows(parse_json_text(head + value + "}}]", "rows.json"), "rows.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error_of("1.0").empty());
  for (const std::string v : {"-5", "0", "\"13.75\"", "true"}) {
    CAPTURE(v);
    CHECK(error_of(v) == "rows.json[0] (a): measured.iteration_time_s: value " + v +
                             " must be a positive number (or null when not measured)");
  }
}

TEST_CASE("validate --only: a prefix that matches no row is an error listing what the ids start with") {
  const Json rows = parse_json_text(R"([{"id":"korthikanti22_a"},{"id":"korthikanti22_b"},{"id":"zb24_c"}])", "rows.json");
  CHECK(select_rows(rows, "rows.json", {"korthikanti22"}).size() == 2);
  CHECK(select_rows(rows, "rows.json", {"zb24_c", "korthikanti22_b"}).size() == 2);
  std::string err;
  try {
    select_rows(rows, "rows.json", {"korthikanti22", "nosuchrow", "zb"});
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err == "--only nosuchrow: no row id in rows.json starts with it (3 rows; ids start with: korthikanti22, zb24)");
}

TEST_CASE("validate: a row's schedule is checked against the registry whatever its pp") {
  // pp 1 runs no pipeline, so the schedule does not change the prediction; an unknown name is still a typo
  // in the file, named with the known ones (the check once ran only for pp > 1).
  const auto row = [](const std::string& schedule) {
    return R"([{"id":"s","model":{"layers":24,"hidden":2304,"heads":24,"ffn":null,"vocab":51200,"seq_len":2048},
      "hardware":{"gpu":"NVIDIA A100 80GB","gpu_count":64},"layout":{"tp":8,"pp":1,"dp":8,"cp":1,"ep":1,"vpp":1,
      "micro_batch":1,"global_batch":512,"num_microbatches":null,"schedule":")" + schedule +
           R"(","recompute":"full","sequence_parallel":false,"zero_stage":0,"precision":"fp16_or_bf16"},
      "measured":{"iteration_time_s":1.0}}])";
  };
  CHECK(validate_rows(parse_json_text(row("1f1b"), "rows.json"), "rows.json").rows.size() == 1);
  std::string err;
  try {
    validate_rows(parse_json_text(row("zigzag"), "rows.json"), "rows.json");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err == "rows.json[0].layout.schedule: value \"zigzag\" is not a known schedule (none, dualpipe, gpipe, 1f1b, "
               "interleaved, looped-bfs, zb1p, zb2p, zbv, dualpipev)");
}

TEST_CASE("validate: a row whose layers do not divide is predicted with the balanced split, listed as assumed") {
  // 26 layers over pp 4 (vpp 1, 1F1B stated): 26 % 4 = 2, no even split, and the source states none. It was
  // skipped ("no feasible layout: layers 26 do not split evenly"); now the time-balanced split predicts it.
  // Its four entries sum to 26 and, the embedding and head loading the ends, no end stage holds more layers
  // than a middle one.
  const char* text = R"([{"id":"u","model":{"layers":26,"hidden":2304,"heads":24,"ffn":null,"vocab":51200,
    "seq_len":2048},"hardware":{"gpu":"NVIDIA A100 80GB","gpu_count":32},
    "layout":{"tp":8,"pp":4,"dp":1,"cp":1,"ep":1,"vpp":1,"micro_batch":1,"global_batch":16,
    "num_microbatches":null,"schedule":"1f1b","recompute":"full","sequence_parallel":false,"zero_stage":0,
    "precision":"fp16_or_bf16"},"measured":{"iteration_time_s":1.0}}])";
  const ValidationResult r = validate_rows(parse_json_text(text, "rows.json"), "rows.json");
  CHECK(r.skipped.empty());
  REQUIRE(r.rows.size() == 1);
  std::string split;
  for (const auto& a : r.rows[0].assumed)
    if (a.rfind("stage_layers=", 0) == 0) split = a;
  CAPTURE(split);
  REQUIRE(split.find(" (time-balanced)") != std::string::npos);
  const std::vector<int> layers = parse_stage_layers(split.substr(13, split.find(' ') - 13), "split");
  REQUIRE(layers.size() == 4);
  CHECK(layers[0] + layers[1] + layers[2] + layers[3] == 26);
  CHECK(std::max(layers[0], layers[3]) <= std::min(layers[1], layers[2]));
}

// vpp "max" (the Zero Bubble paper's 1F1B-I: every transformer layer its own chunk) is predicted, not skipped:
// 22 layers with the first and last stage one layer short is 24 virtual stages of pp 8, vpp 3, the first and
// the last holding the embedding and the head alone. A split that cannot be one layer per chunk is skipped
// with the arithmetic; any other string is an input error naming the field.
TEST_CASE("validate: vpp \"max\" is one layer per chunk") {
  const std::string row = R"([{"id":"zb","model":{"layers":LAYERS,"hidden":2304,"heads":24,"ffn":null,"vocab":51200,
    "seq_len":1024,"arch":"first and last pipeline stage have one fewer transformer layer"},
    "hardware":{"gpu":"NVIDIA A100 80GB","gpu_count":8},
    "layout":{"tp":1,"pp":8,"dp":1,"cp":1,"ep":1,"vpp":VPP,"micro_batch":6,"global_batch":144,
    "num_microbatches":24,"schedule":"interleaved","recompute":"none","sequence_parallel":false,"zero_stage":0,
    "precision":"fp16_or_bf16"},"measured":{"samples_per_gpu_per_s":13.1}}])";
  const auto rows = [&](const std::string& layers, const std::string& vpp) {
    std::string r = row;
    r.replace(r.find("LAYERS"), 6, layers);
    r.replace(r.find("VPP"), 3, vpp);
    return parse_json_text(r, "rows.json");
  };
  const ValidationResult ok = validate_rows(rows("22", "\"max\""), "rows.json");
  REQUIRE(ok.rows.size() == 1);
  CHECK(ok.skipped.empty());
  // The same prediction as the explicit layout it stands for.
  const ValidationResult same = validate_rows(rows("22", "3"), "rows.json");
  REQUIRE(same.rows.size() == 1);
  CHECK(ok.rows[0].predicted == same.rows[0].predicted);
  const ValidationResult odd = validate_rows(rows("23", "\"max\""), "rows.json");
  CHECK(odd.rows.empty());
  REQUIRE(odd.skipped.size() == 1);
  CHECK(odd.skipped[0].reason == "vpp \"max\" (one layer per chunk) needs the layers + 2 (25) to split evenly over pp 8");
  std::string err;
  try {
    validate_rows(rows("22", "\"most\""), "rows.json");
  } catch (const InputError& e) {
    err = e.what();
  }
  CHECK(err.find("layout.vpp: value \"most\" must be a whole number, \"max\" or null") != std::string::npos);
}

// A bubble-rate table (one rate per schedule for one configuration, as the Zero Bubble paper's Tables 5 and 8
// give them) is one row per schedule, its error in percentage points; a schedule Tessel does not have and a
// row with nothing validate predicts are listed as skipped with the reason, never dropped.
TEST_CASE("validate: a bubble rate per schedule is a row per schedule, in points; nothing is dropped") {
  const std::string head = R"([{"id":"zb","model":{"layers":22,"hidden":2304,"heads":24,"ffn":null,"vocab":51200,
    "seq_len":1024,"arch":"first and last pipeline stage have one fewer transformer layer"},
    "hardware":{"gpu":"NVIDIA A100 80GB","gpu_count":8},
    "layout":{"tp":1,"pp":8,"dp":1,"cp":1,"ep":1,"vpp":null,"micro_batch":6,"global_batch":null,
    "num_microbatches":24,"schedule":null,"recompute":"none","sequence_parallel":false,"zero_stage":0,
    "precision":null},"measured":)";
  const std::string text = head + R"({"bubble_rate":{"1F1B":0.2431,"1F1B-I":0.1055,"ZB-H2":0.1083,"ZB-2p":0.0433}}},)" +
                           head.substr(1).replace(head.find("\"zb\"") - 1, 4, "\"t9\"") +
                           R"({"T_comm":0.6,"units":"ms"}}])";
  const ValidationResult r = validate_rows(parse_json_text(text, "rows.json"), "rows.json");
  REQUIRE(r.rows.size() == 3);
  std::map<std::string, MetricResult> by_id;
  for (const auto& m : r.rows) by_id[m.id] = m;
  REQUIRE(by_id.count("zb/1F1B") == 1);
  REQUIRE(by_id.count("zb/1F1B-I") == 1);
  REQUIRE(by_id.count("zb/ZB-2p") == 1);
  for (const auto& kv : by_id) {
    CAPTURE(kv.first);
    CHECK(kv.second.metric == "bubble_rate");
    CHECK(kv.second.points);
    CHECK(kv.second.error_pct == doctest::Approx(100 * (kv.second.predicted - kv.second.measured)));
    CHECK(kv.second.predicted >= 0);
    CHECK(kv.second.predicted < 1);
  }
  // The schedules keep their order: 1F1B idles more than interleaving one layer per chunk, and more than ZB-2p.
  CHECK(by_id["zb/1F1B"].predicted > by_id["zb/1F1B-I"].predicted);
  CHECK(by_id["zb/1F1B"].predicted > by_id["zb/ZB-2p"].predicted);
  REQUIRE(r.skipped.size() == 2);
  CHECK(r.skipped[0].id == "zb/ZB-H2");
  CHECK(r.skipped[0].reason.find("ZB-H2") != std::string::npos);
  CHECK(r.skipped[1].id == "t9");
  CHECK(r.skipped[1].reason == "measured holds no number validate predicts (T_comm, units)");
}

// Unstated fields are what the source's stack runs by default (sim/stacks/): Megatron-LM 2022 has sequence
// parallelism opt-in and no distributed optimizer, so a korthikanti22 row with neither stated is predicted
// without them, and the faster choice is reported beside it as the best case. A default that does not fit in
// memory gives way to the fewest changes that fit, and says so; a source without a stack keeps the fastest.
TEST_CASE("validate: unstated fields take the source stack's defaults; the best case is reported beside them") {
  const auto row = [](const std::string& id, int seq) {
    return R"({"id":")" + id + R"(","model":{"layers":48,"hidden":6144,"heads":64,"ffn":null,"vocab":51200,
      "seq_len":)" + std::to_string(seq) + R"(},"hardware":{"gpu":"NVIDIA A100 80GB","gpu_count":64},
      "layout":{"tp":8,"pp":1,"dp":8,"cp":1,"ep":1,"vpp":1,"micro_batch":1,"global_batch":512,
      "num_microbatches":null,"schedule":"none","recompute":null,"sequence_parallel":null,"zero_stage":null,
      "precision":"fp16_or_bf16"},"measured":{"iteration_time_s":1.0}})";
  };
  const auto has = [](const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); };
  const auto one = [](const std::string& text) {
    const ValidationResult r = validate_rows(parse_json_text(text, "rows.json"), "rows.json");
    REQUIRE(r.rows.size() == 1);
    return r.rows[0];
  };
  const MetricResult stack = one("[" + row("korthikanti22_x", 2048) + "]");
  CHECK(has(stack.assumed, "recompute=none"));
  CHECK(has(stack.assumed, "sequence_parallel=false"));
  CHECK(has(stack.assumed, "zero_stage=0"));
  REQUIRE(stack.best_case.has_value());
  CHECK(has(stack.best_case->assumed, "sequence_parallel=true"));
  CHECK(stack.best_case->predicted < stack.predicted);  // faster, so fewer seconds
  CHECK(stack.best_case->error_pct == doctest::Approx(100.0 * (stack.best_case->predicted - 1.0)));
  // The same row from a source without a stack: the fastest, and it says why.
  const MetricResult free = one("[" + row("elsewhere_x", 2048) + "]");
  CHECK_FALSE(free.best_case.has_value());
  CHECK(has(free.assumed, "sequence_parallel=true"));
  CHECK(has(free.assumed, "zero_stage=1"));
  CHECK(has(free.assumed, "no software stack for this source: unstated fields at their fastest"));
  // 8k tokens: without recompute the unfused attention's scores do not fit; one change does (recompute).
  const MetricResult longer = one("[" + row("korthikanti22_y", 8192) + "]");
  CHECK_FALSE(has(longer.assumed, "recompute=none"));
  CHECK(has(longer.assumed, "sequence_parallel=false"));
  CHECK(has(longer.assumed, "no layout with the stack's defaults fits (recompute=none, sequence_parallel=false, "
                            "zero_stage=0 under stack megatron-lm-2022)"));
  // An unstated micro-batch: NeMo's configs run 1, so a nemo row is predicted at 1 and the faster size is the
  // best case beside it; Megatron-LM has no default (--micro-batch-size must be given), so a korthikanti22 row
  // takes its fastest size among those that fit with the stack's defaults. At 1,024 tokens 1, 2 and 4 do (with the
  // stack's allocator fragmentation); 8 needs sequence parallelism, which the stack leaves off.
  const auto with_mbs = [&](const std::string& id, const std::string& mbs) {
    std::string r = row(id, 1024);
    r.replace(r.find("\"micro_batch\":1"), 15, "\"micro_batch\":" + mbs);
    return one("[" + r + "]");
  };
  const auto unstated_mbs = [&](const std::string& id) { return with_mbs(id, "null"); };
  const MetricResult nemo = unstated_mbs("nemo_x");
  CHECK(has(nemo.assumed, "micro_batch=1"));
  REQUIRE(nemo.best_case.has_value());
  CHECK_FALSE(has(nemo.best_case->assumed, "micro_batch=1"));
  CHECK(nemo.best_case->predicted < nemo.predicted);
  const MetricResult lm = unstated_mbs("korthikanti22_z");
  CHECK_FALSE(has(lm.assumed, "micro_batch=1"));
  const auto mbs_of = [](const std::vector<std::string>& v) {
    return std::count_if(v.begin(), v.end(), [](const std::string& s) { return s.rfind("micro_batch=", 0) == 0; });
  };
  CHECK(mbs_of(lm.assumed) == 1);
  double fastest = 1e300;
  for (const char* k : {"1", "2", "4"}) fastest = std::min(fastest, with_mbs("korthikanti22_z", k).predicted);
  CHECK(has(with_mbs("korthikanti22_z", "8").assumed, "sequence_parallel=true"));
  CHECK(lm.predicted == doctest::Approx(fastest));
  CHECK(nemo.predicted == doctest::Approx(with_mbs("nemo_x", "1").predicted));
}

// A row of a release with a recipe for its model (sim/recipes/) takes the recipe's terms for what it leaves
// unstated: NeMo 24.07's Nemotron-340B config runs selective recompute with bf16 gradients and optimizer state
// and no master copy, which is how the layout fits; with the stack's generic defaults (another NeMo source, no
// recipe) it does not fit without recompute, so full recompute is filled in and the step is slower.
TEST_CASE("validate: a release's recipe fills a row's unstated fields before the stack's defaults") {
  const auto row = [](const std::string& id, const std::string& recompute) {
    return R"J({"id":")J" + id + R"J(","model":{"name":"Nemotron-340B","seq_len":4096},
      "hardware":{"gpu":"NVIDIA H100 80GB (DGX-H100)","gpus_per_node":8,"gpu_count":128},
      "layout":{"tp":8,"pp":8,"dp":2,"cp":1,"ep":1,"vpp":12,"micro_batch":1,"global_batch":32,
      "num_microbatches":null,"schedule":null,"recompute":)J" + recompute + R"J(,"sequence_parallel":null,
      "zero_stage":null,"precision":"fp8"},"measured":{"iteration_time_s":3.0}})J";
  };
  const auto one = [](const std::string& text) {
    const ValidationResult r = validate_rows(parse_json_text("[" + text + "]", "rows.json"), "rows.json");
    REQUIRE(r.rows.size() == 1);
    return r.rows[0];
  };
  const auto with_prefix = [](const std::vector<std::string>& v, const std::string& p) {
    return std::count_if(v.begin(), v.end(), [&](const std::string& s) { return s.rfind(p, 0) == 0; });
  };
  const auto has = [](const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); };

  const MetricResult recipe = one(row("nemo2407_x", "null"));
  CHECK(has(recipe.assumed, "recipe nemo-24.07 Nemotron-340B (nemotron/nemotron_340b.yaml): recompute=selective "
                            "sequence_parallel=true tp_comm_overlap=false overlap_p2p=false main_grads=bf16 "
                            "moments=bf16 master_weights=none"));
  CHECK(with_prefix(recipe.assumed, "recompute=") == 0);  // the recipe's, not a candidate's
  CHECK(with_prefix(recipe.assumed, "no layout with the stack's defaults fits") == 0);
  CHECK_FALSE(has(recipe.assumed, "predicted peak memory exceeds the GPU"));

  const MetricResult generic = one(row("nemo_elsewhere_x", "null"));
  CHECK(with_prefix(generic.assumed, "recipe ") == 0);
  CHECK(has(generic.assumed, "recompute=full"));
  CHECK(with_prefix(generic.assumed, "no layout with the stack's defaults fits") == 1);
  CHECK(recipe.predicted < 0.9 * generic.predicted);  // selective against full recompute: far less recomputed

  // The row's own word wins over the recipe's, and the note lists only what the recipe filled.
  const MetricResult stated = one(row("nemo2407_y", R"("full")"));
  CHECK(has(stated.assumed, "recipe nemo-24.07 Nemotron-340B (nemotron/nemotron_340b.yaml): sequence_parallel=true "
                            "tp_comm_overlap=false overlap_p2p=false main_grads=bf16 moments=bf16 master_weights=none"));
  CHECK(stated.predicted > recipe.predicted);
}

TEST_CASE("recipes: a row maps by its release's id prefix and its model's name; bad terms are named") {
  const auto r = row_recipe("nemo2407_LLAMA3-70B_64gpu", "llama3 70b");  // case and punctuation aside
  REQUIRE(r.has_value());
  CHECK(r->release == "nemo-24.07");
  CHECK(r->stack == "megatron-core-2024");
  CHECK(r->config == "llama/llama3_70b.yaml");
  CHECK(describe(r->terms) == "recompute=none sequence_parallel=true tp_comm_overlap=true overlap_p2p=true "
                              "cross_entropy=megatron-fused master_weights=remainder");  // the release's default below
  CHECK_FALSE(row_recipe("nemo_longseq_llama2_7b_4k", "LLAMA2-7B").has_value());  // another release's table
  CHECK(recipe_releases() == std::vector<std::string>{"dgxc-24.11", "nemo-24.07"});
  // A release's model found by its own name or by the preset it names ("preset"); a release with no published
  // rows ("rows" absent) maps no row.
  CHECK(load_recipe("dgxc-24.11", "llama3-8b").model == "Llama3.1-8B");
  CHECK(load_recipe("dgxc-24.11", "Llama 3.1 8B").config == "llama3.1/llama3.1_8b.yaml");
  CHECK_FALSE(row_recipe("dgxc-24.11_x", "Llama3.1-8B").has_value());
  CHECK_FALSE(row_recipe("nemo2407_x", "GPT3-1T").has_value());                   // no recipe for that model
  // Applied: the TP overlap only where sequence parallelism runs under tp > 1.
  Layout l;
  l.tp = 4;
  apply_recipe_terms(r->terms, l);
  CHECK_FALSE(l.tp_comm_overlap);
  CHECK(l.cross_entropy == CrossEntropyImpl::megatron_fused);
  CHECK(l.state.master_weights == MasterWeights::remainder);
  l.sequence_parallel = true;
  apply_recipe_terms(r->terms, l);
  CHECK(l.tp_comm_overlap);
  const auto error_of = [](const std::string& json) {
    try {
      parse_recipe_terms(JsonObject(parse_json_text(json, "r.json"), "r.json"));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error_of(R"({"recompute":"some"})").find("recompute") != std::string::npos);
  CHECK(error_of(R"({"recompute":"some"})").find("some") != std::string::npos);
  CHECK(error_of(R"({"zero_stage":1})").find("zero_stage") != std::string::npos);
  CHECK(error_of(R"({"master_weights":"fp16"})").find("master_weights") != std::string::npos);
  CHECK(error_of(R"({"sequence_parallel":"yes"})").find("sequence_parallel") != std::string::npos);
  CHECK(error_of(R"({"moments":"bf16"})").empty());
  CHECK(error_of(R"({"fp8_param_gather":1})").find("fp8_param_gather") != std::string::npos);
  // dgxc-benchmarking's GPT-3 175B config sets fp8_params: fp8 primary weights, where an fp8 layout has the
  // distributed optimizer; NeMo 24.07's configs leave them off (NeMo 1's default).
  const Recipe g = load_recipe("dgxc-24.11", "gpt3-175b");
  CHECK(g.terms.fp8_param_gather == std::optional<bool>(true));
  CHECK(describe(g.terms).find("fp8_param_gather=true") != std::string::npos);
  Layout f;
  f.precision = Precision::fp8;
  f.zero_stage = 1;
  apply_recipe_terms(g.terms, f);
  CHECK(f.fp8_params());
  CHECK_FALSE(r->terms.fp8_param_gather.has_value());
}
