// `tessel explore` from the command line: the default job, JSON/CSV outputs, explain, and bad input (exit 2).
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/tools/run_util.hpp"

using tessel::test::run_tessel;

TEST_CASE("explore: the default job, JSON and CSV") {
  auto r = run_tessel({"explore"});
  REQUIRE(r.code == 0);
  CHECK(r.out.find("gpt3-175b") != std::string::npos);
  CHECK(r.out.find("re-scored by the event simulator") != std::string::npos);
  CHECK(r.out.find("des") != std::string::npos);  // the tier column
  CHECK(r.err.empty());                           // no progress bar when stderr is not a terminal
  const auto csv = std::filesystem::temp_directory_path() / ("explore_" + std::to_string(::getpid()) + ".csv");
  auto j = run_tessel({"explore", "--json", "--top", "5", "--csv", csv.string(), "--model", "megatron-7.5b", "--gpus",
                       "64", "--gbs", "256"});
  REQUIRE(j.code == 0);
  const auto doc = nlohmann::json::parse(j.out);
  REQUIRE(doc["top"].size() == 5);
  CHECK(doc["counts"]["enumerated"].get<long long>() > doc["counts"]["scored"].get<long long>());
  CHECK(doc["top"][0]["tier"] == "des");
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  CHECK(header.rfind("rank,layout,tier,step_s", 0) == 0);
  std::filesystem::remove(csv);
}

TEST_CASE("explore --explain") {
  auto r = run_tessel({"explore", "--no-simulate", "--explain", "tp1 pp2 dp512 mbs1 1f1b"});
  REQUIRE(r.code == 0);
  CHECK(r.out.find("rejected: needs") != std::string::npos);
  CHECK(r.out.find("with zero 3") != std::string::npos);
  auto bad = run_tessel({"explore", "--no-simulate", "--explain", "tp8 warp9"});
  CHECK(bad.code == 2);
  CHECK(bad.err.find("word 'warp9' is not a layout term") != std::string::npos);
  // Each term once, ZeRO stages 0 to 3, and describe()'s own words (the stage split) read back.
  const std::pair<std::string, std::string> wrong[] = {
      {"tp8 tp4 pp8", "'tp4' gives the tp a second time (already 'tp8')"},
      {"tp8 pp8 1f1b gpipe", "'gpipe' gives the schedule a second time"},
      {"tp8 pp8 full none", "'none' gives the recompute policy a second time"},
      {"tp8 pp8 dp16 zero7", "--explain zero7: 7 is out of range [0, 3]"},
      {"", "names no layout"},
      {"tp8 pp8 dp16 layers=12x", "--explain layers=12x"},
      {"tp8 pp8 dp16 layers=3,4,", "an empty stage entry"},
  };
  for (const auto& c : wrong) {  // no structured binding: doctest's CAPTURE lambdas cannot take one (clang 14)
    auto w = run_tessel({"explore", "--no-simulate", "--explain", c.first});
    CAPTURE(c.first);
    CAPTURE(w.err);
    CHECK(w.code == 2);
    CHECK(w.err.find(c.second) != std::string::npos);
  }
  // Layouts over the event simulator's size limit keep their analytical score (2^23 micro-batches of one
  // sample against 2^22): the search goes on and says so.
  auto huge = run_tessel({"explore", "--model", "tiny", "--system", "cpu", "--precision", "fp32", "--gpus", "1",
                          "--gbs", "8388608", "--mbs", "1"});
  CAPTURE(huge.err);
  CHECK(huge.code == 0);
  CHECK(huge.out.find("0 re-scored by the event simulator (3 over its size limit kept the analytical score") != std::string::npos);
  auto zero0 = run_tessel({"explore", "--no-simulate", "--explain", "tp8 pp8 dp16 mbs1 1f1b zero0"});
  CHECK(zero0.code == 0);
  auto split = run_tessel({"explore", "--no-simulate", "--explain", "tp8 pp8 dp16 mbs1 1f1b layers=11,12x6,13"});
  REQUIRE(split.code == 0);
  CHECK(split.out.find("layers=11,12x6,13") != std::string::npos);
}

// Full recompute's method and layer count are part of a layout's name: explore enumerates both methods, and
// two rows named alike were two layouts 14% apart; --explain reads each name back to its own layout.
TEST_CASE("explore names full recompute's method, and --explain reads the name back") {
  const std::vector<std::string> base = {"explore", "--no-simulate", "--json", "--model", "gpt3-175b", "--system",
                                         "dgx-a100", "--gpus", "1024", "--gbs", "1536", "--tp", "8", "--pp", "8",
                                         "--vpp", "3", "--mbs", "1", "--schedule", "interleaved", "--recompute",
                                         "full", "--sp", "on", "--zero", "0"};
  auto r = run_tessel(base);
  REQUIRE(r.code == 0);
  const auto doc = nlohmann::json::parse(r.out);
  REQUIRE(doc["top"].size() == 2u);
  std::set<std::string> names;
  for (const auto& row : doc["top"]) {
    const std::string name = row["describe"].get<std::string>();
    names.insert(name);
    auto e = run_tessel({"explore", "--no-simulate", "--model", "gpt3-175b", "--system", "dgx-a100", "--gpus", "1024",
                         "--gbs", "1536", "--explain", name});
    CAPTURE(name);
    CAPTURE(e.err);
    REQUIRE(e.code == 0);
    CHECK(e.out.find("layout " + name + ",") != std::string::npos);
    // The same analytical step as the row's.
    char step[32];
    std::snprintf(step, sizeof step, "analytical step %.2f s", row["analytical_step_s"].get<double>());
    CHECK(e.out.find(step) != std::string::npos);
  }
  CHECK(names == std::set<std::string>{"tp8 pp8 dp16 vpp3 mbs1 interleaved full sp",
                                       "tp8 pp8 dp16 vpp3 mbs1 interleaved full-block2 sp"});
  auto bad = run_tessel({"explore", "--no-simulate", "--explain", "tp8 pp8 full-uniform"});
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--explain full-uniform") != std::string::npos);
}

TEST_CASE("explore: bad input and empty results exit 2 with the reason") {
  auto none = run_tessel({"explore", "--model", "megatron-1t", "--gpus", "8", "--gbs", "8"});
  CHECK(none.code == 2);
  CHECK(none.err.find("the smallest peak memory found was") != std::string::npos);
  auto restricted = run_tessel({"explore", "--tp", "1", "--pp", "1"});
  CHECK(restricted.code == 2);
  CHECK(restricted.err.find("the restriction that removed the most is") != std::string::npos);
  auto zero = run_tessel({"explore", "--gpus", "0"});
  CHECK(zero.code == 2);
  CHECK(zero.err.find("--gpus: 0 is out of range") != std::string::npos);
  auto sched = run_tessel({"explore", "--schedule", "1f1b,zigzag"});
  CHECK(sched.code == 2);
  CHECK(sched.err.find("--schedule zigzag: unknown schedule") != std::string::npos);
  auto path = run_tessel({"explore", "--csv", "/nonexistent_dir/x.csv"});
  CHECK(path.code == 2);
  CHECK(path.err.find("/nonexistent_dir") != std::string::npos);
}
