// tessel simulate from the command line: bad input, schedule files, zb-greedy. (validate --engine des on
// ../shared's published rows is in published_test.cpp, skipped as a whole without ../shared.)
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/test_paths.hpp"

using namespace tessel;

TEST_CASE("tessel simulate: bad input exits 2 before simulating and writes nothing") {
  const std::string exe = test::tessel_exe();
  const auto dir = std::filesystem::temp_directory_path() / ("tessel_engine_cli_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto run = [&](const std::string& args) {
    const int rc = std::system((exe + " simulate " + args + " > /dev/null 2>&1").c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  const std::string small = "--model llama2-7b --tp 1 --pp 2 --dp 1 --gbs 4 --vpp 1 --schedule 1f1b";
  CHECK(run(small + " --trace /nonexistent_dir/x.json") == 2);
  CHECK(run(small + " --svg /nonexistent_dir/x.svg") == 2);
  CHECK(run(small + " --fidelity bogus") == 2);
  // A schedule file that does not validate: rank 0 forwards micro-batch 0 twice.
  const auto csv = dir / "bad.csv";
  std::ofstream(csv) << "0F0,0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n";
  CHECK(run(small + " --schedule-file " + csv.string()) == 2);
  // A good run writes the trace.
  const auto out = dir / "ok.json";
  std::filesystem::remove(out);
  CHECK(run(small + " --trace " + out.string()) == 0);
  CHECK(std::filesystem::exists(out));
}

TEST_CASE("tessel simulate --schedule-file: messages name the file; X_RECOMPUTE only places the layout's recompute") {
  const std::string exe = test::tessel_exe();
  const auto dir = std::filesystem::temp_directory_path() / ("tessel_engine_cli_recompute_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string log = (dir / "log.txt").string();
  auto run = [&](const std::string& args) {
    const int rc = std::system((exe + " simulate " + args + " > " + log + " 2>&1").c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  auto said = [&](const std::string& text) {
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str().find(text) != std::string::npos;
  };
  const std::string small = "--model tiny --system cpu --tp 1 --pp 2 --dp 1 --gbs 2 --mbs 1 --schedule 1f1b --precision fp32";
  // A file that does not validate is named by its path (before: "schedule 'csv'").
  const std::string bad = (dir / "bad.csv").string();
  std::ofstream(bad) << "0F0,0B0\n1F0\n";
  CHECK(run(small + " --recompute none --schedule-file " + bad) == 2);
  CHECK(said("schedule '" + bad + "': completeness: missing backward for stage 1 mb 0"));
  // Every backward with its recompute: played under a layout that recomputes; under --recompute none it cost
  // 0 s, the same step as without the actions (QA: "silently ignored").
  const std::string all = (dir / "all.csv").string();
  std::ofstream(all) << "0F0,0F1,0X_RECOMPUTE0,0B0,0X_RECOMPUTE1,0B1\n1F0,1X_RECOMPUTE0,1B0,1F1,1X_RECOMPUTE1,1B1\n";
  CHECK(run(small + " --recompute full --schedule-file " + all) == 0);
  CHECK(said("schedule " + all + ", fidelity"));
  CHECK(run(small + " --recompute selective --attention unfused --schedule-file " + all) == 0);
  // Selective recompute with flash attention runs the flash forward again (Megatron-core checkpoints the core
  // attention whatever its kernel), so its actions cost time as well.
  CHECK(run(small + " --recompute selective --attention flash --schedule-file " + all) == 0);
  CHECK(run(small + " --recompute none --schedule-file " + all) == 2);
  CHECK(said("--schedule-file " + all + ": '0X_RECOMPUTE0' places the layout's recompute, and the layout has "
             "--recompute none (it would cost 0 s)"));
  // Some backwards without one: the simulator would drop their recompute.
  const std::string some = (dir / "some.csv").string();
  std::ofstream(some) << "0F0,0F1,0X_RECOMPUTE0,0B0,0B1\n1F0,1X_RECOMPUTE0,1B0,1F1,1X_RECOMPUTE1,1B1\n";
  CHECK(run(small + " --recompute full --schedule-file " + some) == 2);
  CHECK(said("'0B1' has no X_RECOMPUTE of stage 0 micro-batch 1, but the file places others"));
  // Actions whose work the layout decides stay refused, as before.
  const std::string rg = (dir / "rg.csv").string();
  std::ofstream(rg) << "0F0,0F1,0B0,0B1,0REDUCE_GRAD\n1F0,1B0,1F1,1B1,1REDUCE_GRAD\n";
  CHECK(run(small + " --recompute none --schedule-file " + rg) == 2);
  CHECK(said("--schedule-file " + rg + ":1:5: '0REDUCE_GRAD' is not simulated (REDUCE_GRAD, X_OPTIMIZER_STEP"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("tessel simulate --schedule-file: the file's rank count, dialect, positions and name") {
  const std::string exe = test::tessel_exe();
  const auto dir = std::filesystem::temp_directory_path() / ("tessel_engine_cli_schedule_file_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string log = (dir / "log.txt").string();
  auto run = [&](const std::string& args) {
    const int rc = std::system((exe + " " + args + " > " + log + " 2>&1").c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  auto said = [&](const std::string& text) {
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str().find(text) != std::string::npos;
  };
  const std::string sim = "simulate --model tiny --system cpu --tp 1 --dp 1 --mbs 1 --precision fp32 --recompute none";
  // A 4-rank file under pp 2: the mismatch is the message (QA: "layers do not split evenly over 6 stages").
  const std::string four = (dir / "four.csv").string();
  CHECK(run("schedule gen 1f1b --pp 4 --mb 4 -o " + four) == 0);
  CHECK(run(sim + " --pp 2 --gbs 4 --schedule-file " + four) == 2);
  CHECK(said("--schedule-file " + four + ": the file has 4 rank rows (pp 4), the layout pp 2; give --pp 4"));
  // Violations point into the file as written, not into the lowered schedule the engine plays (QA: #30 for #11).
  const std::string bad = (dir / "bad.csv").string();
  std::ofstream(bad) << "0F0,0F1,0I0,0I1,0W0\n1F0,1I0,1W0,1F1,1I1,1W1\n";
  CHECK(run(sim + " --pp 2 --gbs 2 --schedule-file " + bad) == 2);
  CHECK(said("I without W: rank 0 #3 '0I1' (line 1 cell 4) has no 0W1"));
  // PyTorch's older dialect: the hint, then --legacy-bw plays it.
  const std::string old = (dir / "old.csv").string();
  std::ofstream(old) << "0F0,0F1,0B0,0W0,0B1,0W1\n1F0,1B0,1W0,1F1,1B1,1W1\n";
  CHECK(run(sim + " --pp 2 --gbs 2 --schedule-file " + old) == 2);
  CHECK(said("read it that way with --legacy-bw"));
  CHECK(run(sim + " --pp 2 --gbs 2 --schedule-file " + old + " --legacy-bw") == 0);
  CHECK(run(sim + " --pp 2 --gbs 2 --legacy-bw") == 2);
  CHECK(said("--legacy-bw: reads a --schedule-file, and none is given"));
  // Without a sidecar the name comes from the generator that makes the same order: DualPipeV's file is
  // dualpipev (QA: labelled zbv), and a hand-made order is named by its shape with a note.
  const std::string dpv = (dir / "dpv.csv").string();
  CHECK(run("schedule gen dualpipev --pp 2 --mb 4 -o " + dpv) == 0);
  std::filesystem::remove(dir / "dpv.meta.json");
  CHECK(run(sim + " --pp 2 --gbs 4 --schedule-file " + dpv) == 0);
  CHECK(said("vpp2 mbs1 dualpipev"));
  CHECK(!said("note:"));
  const std::string own = (dir / "own.csv").string();
  std::ofstream(own) << "0F0,0F1,0F2,0B0,0B1,0B2\n1F0,1B0,1F1,1B1,1F2,1B2\n";  // 1F1B with one more warm-up forward
  CHECK(run(sim + " --pp 2 --gbs 3 --schedule-file " + own) == 0);
  CHECK(said("note: " + own + " names no schedule in a sidecar and is not the order a layout schedule makes for pp 2 "
             "with 1 stage per rank; the layout calls it 1f1b after its shape"));
  // A PyTorch class name in the sidecar names the layout schedule.
  std::ofstream((dir / "own.meta.json").string()) << R"({"schema":1,"pp":2,"num_stages":2,"num_microbatches":3,)"
                                                  << R"("stage_to_rank":[0,1],"generator":{"name":"ScheduleGPipe"}})";
  CHECK(run(sim + " --pp 2 --gbs 3 --schedule-file " + own) == 0);
  CHECK(said("mbs1 gpipe"));
  std::filesystem::remove_all(dir);
}

// zb-greedy has no closed form, so estimate and explore refuse it, saying who plays it; simulate plays it
// (before: "unknown schedule", though run and schedule gen knew it): no slower than 1F1B on the same layout.
TEST_CASE("tessel simulate plays zb-greedy; estimate refuses it naming who plays it") {
  const std::string exe = test::tessel_exe();
  const auto dir = std::filesystem::temp_directory_path() / ("tessel_engine_cli_greedy_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string log = (dir / "log.txt").string();
  auto run = [&](const std::string& verb, const std::string& args) {
    const int rc = std::system((exe + " " + verb + " " + args + " > " + log + " 2>&1").c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  auto output = [&] {
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string small = "--model llama2-7b --tp 1 --pp 4 --dp 1 --gbs 32 --json --schedule ";
  REQUIRE(run("simulate", small + "zb-greedy") == 0);
  const auto greedy = nlohmann::json::parse(output());
  CHECK(greedy["schedule"] == "zb-greedy");
  REQUIRE(run("simulate", small + "1f1b") == 0);
  const auto one = nlohmann::json::parse(output());
  CHECK(greedy["step_s"].get<double>() < one["step_s"].get<double>());
  CHECK(run("estimate", small + "zb-greedy") == 2);
  CHECK(output().find("--schedule zb-greedy: the analytical model has no closed form for it") != std::string::npos);
  std::filesystem::remove_all(dir);
}
