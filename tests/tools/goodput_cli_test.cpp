// The time to train from the command line (docs/goodput.md): estimate's block and JSON against hand-derived
// numbers, the Monte Carlo against the closed form on Llama 3 405B, explore's columns and --objective
// time-to-train, run --save-every auto from a measured save, calibrate --checkpoints, and bad input (exit 2).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/tools/run_util.hpp"

using tessel::test::run_tessel;
using tessel::test::write_temp;
using nlohmann::json;

namespace {

// Daly 2006, written out again here so that the test does not trust the library's copy.
double daly(double delta, double m) {
  if (delta >= 2 * m) return m;
  const double x = delta / (2 * m);
  return std::sqrt(2 * delta * m) * (1 + std::sqrt(x) / 3 + x / 9) - delta;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// dgx-h100 with a checkpoint path and a failure model simple enough to derive by hand: 1 GB/s per node, no cap,
// synchronous saves; 1,000 h per GPU; 300 s of restart overhead.
std::string hand_system() {
  json s = json::parse(read_file(std::string(std::getenv("TESSEL_SOURCE_ROOT")) + "/sim/presets/dgx-h100.json"));
  s["name"] = "hand";
  s["reliability"] = {{"source", "test"}, {"gpu_mtbf_hours", 1000}, {"restart_overhead_s", 300}};
  s["storage"] = {{"source", "test"}, {"node_write_GBps", 1}, {"node_read_GBps", 1}, {"d2h_GBps", 64}, {"async", false}};
  return write_temp("hand_system.json", s.dump());
}

// Llama 3 405B as Llama 3 ran it on 16,384 H100: tp8 pp16 dp128 with a lighter first and last stage (126 layers
// do not split over 16 evenly, so the layout comes as a file: the flags cannot give stage_layers).
std::string llama405_layout() {
  json l = {{"tp", 8},          {"pp", 16},        {"dp", 128},         {"cp", 1},           {"vpp", 1},
            {"micro_batch", 1}, {"global_batch", 2048}, {"schedule", "1f1b"}, {"recompute", "none"},
            {"sequence_parallel", true}, {"zero_stage", 1}, {"precision", "bf16"}, {"attention", "flash"},
            {"stage_layers", {7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7}}};
  return write_temp("llama405_layout.json", l.dump());
}

}  // namespace

TEST_CASE("estimate --steps: the interval is Daly's for the save time and job MTBF it reports, hand-derived") {
  // llama2-7b has 6,738,415,616 parameters. tp8 dp2 on 8-GPU nodes, ZeRO-0: dp rank 0 (node 0) writes every
  // element once, 12 bytes each (fp32 value + two moments), plus 16 KiB per rank for RNG and data position:
  // 12 x 6,738,415,616 + 8 x 16,384 = 80,861,118,464 bytes; at 1 GB/s, delta = 80.861 s.
  // M = 1,000 h x 3,600 / 16 GPUs = 225,000 s. Young: sqrt(2 x 80.861 x 225,000) = 6,032.21 s.
  // Daly: x = 80.861 / 450,000 = 1.79691e-4, sqrt(x) = 0.0134049; bracket 1 + 0.0044683 + 0.0000200 = 1.0044883;
  // tau = 6,032.21 x 1.0044883 - 80.861 = 5,978.42 s.
  const auto r = run_tessel({"estimate", "--model", "llama2-7b", "--seq", "4096", "--system", hand_system(), "--tp", "8",
                             "--pp", "1", "--dp", "2", "--gpus", "16", "--gbs", "64", "--zero", "0", "--steps", "100000",
                             "--json", "--mc-runs", "200"});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const json t = json::parse(r.out)["time_to_train"];
  CHECK(t["checkpoint"]["bytes_busiest_node"].get<double>() == doctest::Approx(80861118464.0).epsilon(1e-12));
  CHECK(t["save_s"].get<double>() == doctest::Approx(80.861118464).epsilon(1e-12));
  CHECK(t["job_mtbf_s"].get<double>() == doctest::Approx(225000).epsilon(1e-12));
  CHECK(t["young_interval_s"].get<double>() == doctest::Approx(6032.2055).epsilon(1e-8));
  CHECK(t["daly_interval_s"].get<double>() == doctest::Approx(5978.4185).epsilon(1e-8));
  CHECK(t["daly_interval_s"].get<double>() ==
        doctest::Approx(daly(t["save_s"].get<double>(), t["job_mtbf_s"].get<double>())).epsilon(1e-12));
  // The interval used is Daly's in whole steps: within half a step of it.
  const double step = t["step_s"].get<double>();
  CHECK(t["interval_s"].get<double>() == doctest::Approx(t["interval_steps"].get<double>() * step).epsilon(1e-12));
  CHECK(std::abs(t["interval_s"].get<double>() - t["daly_interval_s"].get<double>()) <= step / 2 + 1e-9);
  // Restart: 300 s overhead + each replica reading its 12 P (2 x 80.86 GB over two nodes at 1 GB/s each): 380.86 s.
  CHECK(t["restart_s"].get<double>() == doctest::Approx(300 + 80.861118464).epsilon(1e-12));
  // Days, GPU-hours and goodput from the wall time.
  const double wall = t["wall_s"].get<double>();
  CHECK(t["days"].get<double>() == doctest::Approx(wall / 86400).epsilon(1e-12));
  CHECK(t["gpu_hours"].get<double>() == doctest::Approx(wall * 16 / 3600).epsilon(1e-12));
  CHECK(t["goodput"].get<double>() == doctest::Approx(100000 * step / wall).epsilon(1e-12));
  CHECK(t["usd"].is_null());
}

TEST_CASE("estimate --tokens on Llama 3 405B: days, GPU-hours, goodput, interval; the Monte Carlo within 3 points") {
  const auto r = run_tessel({"estimate", "--model", "llama3-405b", "--system", "meta-h100", "--gpus", "16384", "--seq",
                             "8192", "--layout", llama405_layout(), "--tokens", "15.6e12", "--usd-per-gpu-hour", "2",
                             "--json"});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const json t = json::parse(r.out)["time_to_train"];
  // 15.6e12 / (2,048 x 8,192) = 929,832.5 -> 929,833 steps.
  CHECK(t["steps"] == 929833);
  // Llama 3's 16,384 GPUs at 50,677 h each: 3.0931 h between failures, as 54 days x 24 h / 419 interruptions.
  CHECK(t["job_mtbf_s"].get<double>() == doctest::Approx(54.0 * 24 * 3600 / 419).epsilon(1e-4));
  for (const char* k : {"days", "gpu_hours", "goodput", "interval_s", "save_s", "usd"}) CHECK(t[k].is_number());
  CHECK(t["daly_interval_s"].get<double>() ==
        doctest::Approx(daly(t["save_s"].get<double>(), t["job_mtbf_s"].get<double>())).epsilon(1e-12));
  // The issue's acceptance: the Monte Carlo's goodput within 3 points of the closed form, in the JSON too.
  const json mc = t["monte_carlo"];
  CHECK(mc["runs"] == 1000);
  CHECK(mc["goodput_gap_points"].get<double>() ==
        doctest::Approx(100 * std::abs(mc["goodput"].get<double>() - t["goodput"].get<double>())).epsilon(1e-9));
  CHECK(mc["goodput_gap_points"].get<double>() < 3.0);
  CHECK(mc["days_p10"].get<double>() <= mc["days_p50"].get<double>());
  CHECK(mc["days_p50"].get<double>() <= mc["days_p90"].get<double>());
  // Above 90% effective training time, as Llama 3 reports; below 100%.
  CHECK(t["goodput"].get<double>() > 0.9);
  CHECK(t["goodput"].get<double>() < 1.0);
  CHECK(t["usd"].get<double>() == doctest::Approx(2 * t["gpu_hours"].get<double>()).epsilon(1e-12));
  // Deterministic: the same seed gives the same document.
  const auto again = run_tessel({"estimate", "--model", "llama3-405b", "--system", "meta-h100", "--gpus", "16384", "--seq",
                                 "8192", "--layout", llama405_layout(), "--tokens", "15.6e12", "--usd-per-gpu-hour", "2",
                                 "--json"});
  CHECK(json::parse(again.out)["time_to_train"] == t);
}

TEST_CASE("estimate: the block appears with --tokens only; the SVG of goodput against the interval") {
  const auto plain = run_tessel({"estimate", "--json"});
  REQUIRE(plain.code == 0);
  CHECK_FALSE(json::parse(plain.out).contains("time_to_train"));
  CHECK(run_tessel({"estimate"}).out.find("time to train") == std::string::npos);
  const std::string svg = (std::filesystem::temp_directory_path() / ("goodput_" + std::to_string(::getpid()) + ".svg")).string();
  // GPT-3 175B by default: 300e9 / (1,536 x 2,048) = 95,367.4 -> 95,368 steps.
  const auto r = run_tessel({"estimate", "--tokens", "300e9", "--mc-runs", "100", "--goodput-svg", svg});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.out.find("time to train (docs/goodput.md): 300 G tokens = 95,368 steps") != std::string::npos);
  CHECK(r.out.find("Monte Carlo (100 runs, seed 1)") != std::string::npos);
  const std::string text = read_file(svg);
  CHECK(text.rfind("<svg", 0) == 0);
  CHECK(text.find("Daly") != std::string::npos);
  CHECK(text.find("<circle") != std::string::npos);
  std::filesystem::remove(svg);
}

TEST_CASE("estimate and explore: bad time-to-train input exits 2 naming the flag, the value and the rule") {
  json bare = json::parse(read_file(std::string(std::getenv("TESSEL_SOURCE_ROOT")) + "/sim/presets/dgx-a100.json"));
  bare.erase("reliability");
  const std::string no_rel = write_temp("no_reliability.json", bare.dump());
  bare = json::parse(read_file(std::string(std::getenv("TESSEL_SOURCE_ROOT")) + "/sim/presets/dgx-a100.json"));
  bare.erase("storage");
  const std::string no_storage = write_temp("no_storage.json", bare.dump());
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const Case cases[] = {
      {{"estimate", "--tokens", "1e12", "--steps", "10"}, "--tokens 1e12 and --steps 10: give one"},
      {{"estimate", "--tokens", "-5"}, "--tokens: -5 is out of range"},
      {{"estimate", "--steps", "0"}, "--steps: 0 is out of range"},
      {{"estimate", "--gpu-mtbf-hours", "1000"}, "--gpu-mtbf-hours 1000: only with --tokens N or --steps N"},
      {{"estimate", "--mc-runs", "10"}, "--mc-runs 10: only with --tokens N or --steps N"},
      {{"estimate", "--steps", "10", "--gpu-mtbf-hours", "0"}, "--gpu-mtbf-hours: 0 is out of range"},
      {{"estimate", "--steps", "10", "--restart-s", "-1"}, "--restart-s: -1 is out of range"},
      {{"estimate", "--steps", "10", "--system", no_rel}, "has no \"reliability\" object"},
      {{"estimate", "--steps", "10", "--system", no_rel, "--gpu-mtbf-hours", "1000"}, "give --restart-s S too"},
      {{"estimate", "--steps", "10", "--system", no_storage}, "has no \"storage\" object"},
      {{"estimate", "--steps", "10", "--mc-runs", "0", "--goodput-svg", "/tmp/x.svg"}, "give --mc-runs above 0"},
      {{"estimate", "--steps", "10", "--gpu-mtbf-hours", "0.001"}, "the job would not finish"},
      {{"explore", "--objective", "time-to-train"}, "--objective time-to-train: needs the job's length"},
      {{"explore", "--objective", "days"}, "--objective days: must be step or time-to-train"},
      {{"run", "--save-every", "auto"}, "--save-every auto: needs --mtbf-hours H"},
      {{"run", "--save-every", "2", "--mtbf-hours", "3"}, "--mtbf-hours 3: only with --save-every auto"},
  };
  for (const auto& c : cases) {
    const auto r = run_tessel(c.args);
    INFO(c.args.front() << " " << c.expect);
    CHECK(r.code == 2);
    CHECK(r.err.find(c.expect) != std::string::npos);
    CHECK(r.out.empty());
  }
}

TEST_CASE("explore --objective time-to-train: a slower step with a faster restart can win") {
  // Llama-2 7B on 64 H100 with ZeRO-0 and slow storage (2 GB/s a node, 4 GB/s in all) and a GPU failing every
  // 500 h: a restart reads every replica's whole state, so dp 32 reads twice what dp 16 does (646.9 s against
  // 323.4 s). Ranked by step the pp2 dp32 layouts come first; by time to train a pp4 dp16 layout passes one of them.
  json s = json::parse(read_file(std::string(std::getenv("TESSEL_SOURCE_ROOT")) + "/sim/presets/dgx-h100.json"));
  s["name"] = "slow-storage";
  s["storage"] = {{"node_write_GBps", 2}, {"node_read_GBps", 2}, {"aggregate_GBps", 4}, {"d2h_GBps", 64}, {"async", false}};
  const std::string sys = write_temp("slow_storage.json", s.dump());
  const std::vector<std::string> base = {"explore", "--model", "llama2-7b", "--system", sys, "--gpus", "64", "--gbs",
                                         "512", "--seq", "4096", "--zero", "0", "--tokens", "2e12", "--gpu-mtbf-hours",
                                         "500", "--no-simulate", "--top", "6", "--json"};
  auto by_step = base, by_days = base;
  by_days.insert(by_days.end(), {"--objective", "time-to-train"});
  const auto a = run_tessel(by_step), b = run_tessel(by_days);
  REQUIRE_MESSAGE(a.code == 0, a.err);
  REQUIRE_MESSAGE(b.code == 0, b.err);
  const json step_rows = json::parse(a.out)["top"], day_rows = json::parse(b.out)["top"];
  CHECK(json::parse(b.out)["objective"] == "time-to-train");
  REQUIRE(day_rows.size() == 6);
  bool reordered = false;
  for (std::size_t i = 0; i + 1 < day_rows.size(); ++i) {
    CHECK(day_rows[i]["time_to_train"]["wall_s"].get<double>() <= day_rows[i + 1]["time_to_train"]["wall_s"].get<double>());
    CHECK(step_rows[i]["step_s"].get<double>() <= step_rows[i + 1]["step_s"].get<double>());
    // A row ahead of a faster-stepping one: it won by its checkpoint and restart.
    if (day_rows[i]["step_s"].get<double>() > day_rows[i + 1]["step_s"].get<double>()) {
      reordered = true;
      CHECK(day_rows[i]["time_to_train"]["load_s"].get<double>() < day_rows[i + 1]["time_to_train"]["load_s"].get<double>());
    }
  }
  CHECK(reordered);
  // The text report has the columns and says what ranked the rows.
  std::vector<std::string> text_args = by_days;
  text_args.erase(std::find(text_args.begin(), text_args.end(), "--json"));
  const auto text = run_tessel(text_args);
  CHECK(text.out.find("goodput") != std::string::npos);
  CHECK(text.out.find("Ranked by the time to train") != std::string::npos);
}

TEST_CASE("explore: the simulated tier's rows carry the time to train at their own step time") {
  const auto r = run_tessel({"explore", "--model", "llama2-7b", "--system", "dgx-h100", "--gpus", "64", "--gbs", "512",
                             "--seq", "4096", "--steps", "1000", "--top", "3", "--json", "--objective", "time-to-train"});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const json doc = json::parse(r.out);
  REQUIRE(doc["top"].size() == 3);
  for (const json& row : doc["top"]) {
    const json& t = row["time_to_train"];
    CHECK(t["interval_s"].get<double>() / t["interval_steps"].get<double>() == doctest::Approx(row["step_s"].get<double>()));
  }
}

TEST_CASE("run --save-every auto: Daly's interval from the measured save, and calibrate fits the storage from it") {
  const auto dir = std::filesystem::temp_directory_path() / ("tessel_auto_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  // A job MTBF of 3.6 s makes Daly's interval a few steps of the tiny model, so the run saves more than once.
  const auto r = run_tessel({"run", "--model", "tiny", "--steps", "40", "--save-every", "auto", "--mtbf-hours", "0.001",
                             "--checkpoint-dir", dir.string(), "--json"});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const json doc = json::parse(r.out);
  const json& iv = doc["checkpoint_interval"];
  // The first step is saved and measured; the interval is Daly's for that save (the slowest rank's) and 3.6 s,
  // in whole steps of the measured step time.
  CHECK(iv["first_step"] == 1);
  CHECK(iv["mtbf_s"].get<double>() == doctest::Approx(3.6));
  CHECK(iv["daly_interval_s"].get<double>() == doctest::Approx(daly(iv["save_s"].get<double>(), 3.6)).epsilon(1e-6));
  const int every = iv["every_steps"];
  CHECK(every == std::max(1, static_cast<int>(std::lround(iv["daly_interval_s"].get<double>() / iv["step_s"].get<double>()))));
  const json& saved = doc["checkpoints"]["saved"];
  REQUIRE(saved.size() >= 1);
  for (std::size_t i = 0; i < saved.size(); ++i) CHECK(saved[i]["step"] == 1 + static_cast<int>(i) * every);
  CHECK(r.err.find("checkpoint: step 1 saved") != std::string::npos);
  CHECK(r.err.find("checkpoint interval (--save-every auto)") != std::string::npos);
  // calibrate --checkpoints: the node write bandwidth is the saves' bytes over their seconds.
  double bytes = 0, seconds = 0;
  for (const json& c : saved) {
    bytes += c["bytes"].get<double>();
    seconds += c["seconds"].get<double>();
  }
  const std::string runs = write_temp("auto_run.json", r.out);
  const std::string profile = (dir / "profile.json").string();
  const auto c = run_tessel({"calibrate", "--checkpoints", runs, "-o", profile, "--json"});
  REQUIRE_MESSAGE(c.code == 0, c.err);
  const json p = json::parse(read_file(profile));
  CHECK(p["storage"]["node_write_GBps"].get<double>() == doctest::Approx(bytes / seconds / 1e9).epsilon(1e-9));
  // No load was measured: the read bandwidth is the base's (the cpu preset's).
  CHECK(p["storage"]["node_read_GBps"].get<double>() == doctest::Approx(0.17));
  CHECK(p["source"].get<std::string>().find("node_read_GBps kept") != std::string::npos);
  // A document without checkpoints is refused, naming the file.
  const std::string empty = write_temp("no_ckpt_run.json", R"({"steps": []})");
  const auto bad = run_tessel({"calibrate", "--checkpoints", empty, "-o", profile});
  CHECK(bad.code == 2);
  CHECK(bad.err.find(empty + ": checkpoints: missing") != std::string::npos);
  std::filesystem::remove_all(dir);
}
