// `tessel compare` end to end: exit codes, --json, --svg, --max-error, Kineto input, bad input.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/test_paths.hpp"
#include "tests/traces/trace_fixtures.hpp"
#include "traces/chrome.hpp"

using namespace tessel;

namespace {

struct Run {
  int rc;
  std::string out;
};

Run tessel_compare(const std::string& args) {
  std::string out = test::temp_path("cli-stdout.txt");
  std::string cmd = "\"" + test::tessel_exe() + "\" compare " + args + " > \"" + out + "\" 2>&1";
  int status = std::system(cmd.c_str());
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ss.str()};
}

}  // namespace

TEST_CASE("tessel compare: exit codes, JSON and SVG") {
  auto a = test::two_stage_trace();
  auto b = a;
  b.events[11].dur_us = 30;  // step 112 -> 122 µs: +8.93%
  std::string pa = test::temp_path("cli-a.json"), pb = test::temp_path("cli-b.json"), svg = test::temp_path("cli.svg");
  trace::write_chrome_trace(a, pa);
  trace::write_chrome_trace(b, pb);

  Run same = tessel_compare(pa + " " + pa + " --max-error 0.001");
  CHECK(same.rc == 0);
  Run diff = tessel_compare(pa + " " + pb);
  CHECK(diff.rc == 0);  // differing is not an error
  CHECK(diff.out.find("error +8.93%") != std::string::npos);
  CHECK(tessel_compare(pa + " " + pb + " --max-error 9").rc == 0);
  CHECK(tessel_compare(pa + " " + pb + " --max-error 8").rc == 1);

  std::filesystem::remove(svg);
  Run js = tessel_compare(pa + " " + pb + " --json --svg " + svg);
  REQUIRE(js.rc == 0);
  auto j = nlohmann::json::parse(js.out);  // stdout holds one JSON document and nothing else
  CHECK(j["mode"] == "op_by_op");
  CHECK(j["step_us"]["error_pct"].get<double>() == doctest::Approx(10.0 / 112 * 100));
  CHECK(std::filesystem::file_size(svg) > 1000);
}

TEST_CASE("tessel compare: bad input exits 2 with the file named") {
  std::string bad = test::temp_path("cli-bad.json"), empty = test::temp_path("cli-empty.json");
  std::ofstream(bad) << "this is not json";
  std::ofstream(empty) << "[]";
  Run r = tessel_compare(bad + " " + bad);
  CHECK(r.rc == 2);
  CHECK(r.out.find(bad + ":1:2: malformed JSON") != std::string::npos);
  r = tessel_compare(empty + " " + empty);
  CHECK(r.rc == 2);
  CHECK(r.out.find("empty trace") != std::string::npos);
  CHECK(tessel_compare(bad).rc == 2);  // one trace only
  CHECK(tessel_compare("/nonexistent/a.json /nonexistent/b.json").rc == 2);
}

namespace {

// The line of the per-rank table that starts with this rank id.
std::string rank_row(const std::string& out, int rank) {
  std::istringstream in(out.substr(out.find("busy A us")));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream cells(line);
    int r = -1;
    if (cells >> r && r == rank) return line;
  }
  return "(no row for rank " + std::to_string(rank) + ")";
}

}  // namespace

TEST_CASE("tessel compare: the per-rank table pairs ranks by id, not by position") {
  // A holds ranks 0 and 2 (a simulated tp2 trace folds tp peers), B ranks 0..3: two_stage_trace's ranks
  // renamed 0 and 2 in both; in B rank 2's backward mb1 takes 25 µs instead of 20 (busy 60 -> 65 of the
  // 112 µs step; its recv 10-12 waits exposed: bubble 112 - 65 - 2 = 45), and ranks 1 and 3 compute 0-5,
  // 10-15, 72-82, 92-102 (busy 30, no communication: bubble 82).
  auto a = test::two_stage_trace();
  for (auto& e : a.events) e.rank = e.rank == 1 ? 2 : e.rank;
  a.process_names = {{0, "rank 0 (stage 0)"}, {2, "rank 2 (stage 1)"}};
  a.other_data["tp_folded"] = "each rank stands for its 2 tp ranks";
  auto b = a;
  b.other_data.erase("tp_folded");
  b.process_names[1] = "rank 1 (stage 0)";
  b.process_names[3] = "rank 3 (stage 1)";
  for (auto& e : a.events) {
    if (e.stream != trace::Stream::compute) continue;
    auto peer = e;
    peer.rank = e.rank + 1;
    peer.dur_us = e.dur_us / 2;
    b.events.push_back(peer);
  }
  for (auto& e : b.events) {
    if (e.rank == 2 && e.op == "backward" && e.mb == 1) e.dur_us = 25;
  }
  std::string pa = test::temp_path("cli-folded.json"), pb = test::temp_path("cli-full.json");
  trace::write_chrome_trace(a, pa);
  trace::write_chrome_trace(b, pb);
  Run r = tessel_compare(pa + " " + pb);
  REQUIRE(r.rc == 0);
  // Rank 2: A busy 60, bubble 50 | B busy 65, bubble 45.
  CHECK(rank_row(r.out, 2).find("60.000       50.000") != std::string::npos);
  CHECK(rank_row(r.out, 2).find("65.000       45.000") != std::string::npos);
  // Rank 1 is B's alone: busy 30, bubble 82, and said to have no counterpart in A.
  CHECK(rank_row(r.out, 1).find("(not in A)") != std::string::npos);
  CHECK(rank_row(r.out, 1).find("30.000       82.000") != std::string::npos);
  CHECK(r.out.find("B's ranks 1,3 have no counterpart in A (A: each rank stands for its 2 tp ranks)") != std::string::npos);
}

TEST_CASE("tessel compare: a multi-step run is compared one step at a time") {
  // B: one_step_trace's 120 µs step played 5 times, scaled 2.0, 1.0, 1.5, 1.2, 1.3 (240, 120, 180, 144,
  // 156 µs). Default: the median of steps 2-5 by duration, step 4 (144 µs): +20% against A's 120 µs.
  std::string pa = test::temp_path("cli-one-step.json"), pb = test::temp_path("cli-five-steps.json");
  trace::write_chrome_trace(test::one_step_trace(), pa);
  trace::write_chrome_trace(test::multi_step_trace({2.0, 1.0, 1.5, 1.2, 1.3}, 50), pb);

  Run r = tessel_compare(pa + " " + pb);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("5 steps, compared step 4 (median of steps 2-5 by duration; step 1 is warm-up)") != std::string::npos);
  CHECK(r.out.find("error +20.00%") != std::string::npos);
  CHECK(r.out.find("ops         A 15   B 15   matched 15") != std::string::npos);

  Run js = tessel_compare(pa + " " + pb + " --json");
  REQUIRE(js.rc == 0);
  auto j = nlohmann::json::parse(js.out);
  CHECK(j["step_us"]["b"].get<double>() == doctest::Approx(144).epsilon(1e-12));
  CHECK(j["events"]["b"] == 15);
  CHECK(j["steps"]["a"]["count"] == 1);
  CHECK(j["steps"]["b"]["count"] == 5);
  CHECK(j["steps"]["b"]["compared"] == 4);
  REQUIRE(j["steps"]["b"]["durations_us"].size() == 5);
  CHECK(j["steps"]["b"]["durations_us"][2].get<double>() == doctest::Approx(180).epsilon(1e-12));
  for (const auto& k : j["op_kinds"]) CHECK(k["matched"].get<int>() >= 1);

  // --step 3: 180 µs, +50%; past the trace's steps or not a number: exit 2 naming the flag and the rule.
  js = tessel_compare(pa + " " + pb + " --json --step 3");
  REQUIRE(js.rc == 0);
  CHECK(nlohmann::json::parse(js.out)["step_us"]["error_pct"].get<double>() == doctest::Approx(50).epsilon(1e-9));
  Run bad = tessel_compare(pa + " " + pb + " --step 6");
  CHECK(bad.rc == 2);
  CHECK(bad.out.find("--step 6: " + pb + " holds 5 steps; choose 1 to 5") != std::string::npos);
  bad = tessel_compare(pa + " " + pb + " --step 0");
  CHECK(bad.rc == 2);
  CHECK(bad.out.find("--step") != std::string::npos);
  CHECK(tessel_compare(pa + " " + pb + " --step x").rc == 2);
  // --max-error gates on the compared step: +20%.
  CHECK(tessel_compare(pa + " " + pb + " --max-error 21").rc == 0);
  CHECK(tessel_compare(pa + " " + pb + " --max-error 19").rc == 1);
}

TEST_CASE("tessel compare: --step counts a resumed run's steps as the run printed them") {
  // A: a 5-step run (steps 1-5, kFactors 2.0 1.0 1.5 1.2 1.3: 240 120 180 144 156 µs). B: the last 3 steps
  // of that run, resumed after step 2 (otherData.first_step 3), with the same factors 1.5 1.2 1.3.
  // --step 4 is A's 4th step and B's 2nd, 144 µs each: error 0. --step 2 is no step of B: exit 2.
  std::string pa = test::temp_path("cli-full-run.json"), pb = test::temp_path("cli-resumed-run.json");
  trace::write_chrome_trace(test::multi_step_trace({2.0, 1.0, 1.5, 1.2, 1.3}, 50), pa);
  trace::Trace resumed = test::multi_step_trace({1.5, 1.2, 1.3}, 50);
  resumed.other_data["first_step"] = 3;
  trace::write_chrome_trace(resumed, pb);

  Run r = tessel_compare(pa + " " + pb + " --step 4");
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("A " + pa + ": 5 steps, compared step 4 (--step)") != std::string::npos);
  CHECK(r.out.find("B " + pb + ": 3 steps (3 to 5), compared step 4 (--step)") != std::string::npos);
  CHECK(r.out.find("error +0.00%") != std::string::npos);
  CHECK(r.out.find("first_step") == std::string::npos);  // not listed as an otherData difference

  Run js = tessel_compare(pa + " " + pb + " --step 4 --json");
  REQUIRE(js.rc == 0);
  auto j = nlohmann::json::parse(js.out);
  CHECK(j["steps"]["a"]["compared"] == 4);
  CHECK(j["steps"]["b"]["compared"] == 4);
  CHECK(j["steps"]["b"]["first"] == 3);
  CHECK(j["step_us"]["error_pct"].get<double>() == doctest::Approx(0).epsilon(1e-9));

  Run bad = tessel_compare(pa + " " + pb + " --step 2");
  CHECK(bad.rc == 2);
  CHECK(bad.out.find("--step 2: " + pb + " holds 3 steps, numbered 3 to 5 (its run resumed after step 2); choose 3 to 5") !=
        std::string::npos);

  // By default each trace's median after its own warm-up step: A's step 4 (144 µs), B's steps 4-5 (144,
  // 156 µs) give step 4 too; with B resumed after step 3 instead its numbers shift, and a note says so.
  resumed.other_data["first_step"] = 4;
  trace::write_chrome_trace(resumed, pb);
  r = tessel_compare(pa + " " + pb);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("B " + pb + ": 3 steps (4 to 6), compared step 5 (median of steps 5-6 by duration; step 4 is warm-up)") !=
        std::string::npos);
  CHECK(r.out.find("A's step 4 is compared with B's step 5") != std::string::npos);
}

TEST_CASE("tessel compare: a directory, a repeated key, absurd profiler times exit 2 naming the file") {
  const std::string dir = test::temp_path("cli-adir");
  std::filesystem::create_directories(dir);
  Run r = tessel_compare(dir + " " + dir);
  CHECK(r.rc == 2);
  CHECK(r.out.find(dir + ": is a directory, not a file") != std::string::npos);
  // QA's duplicate dur: the second value (999999 us) replaced the first and the step error read +1762%.
  const std::string dup = test::temp_path("cli-dup.json");
  std::ofstream(dup) << R"([{"ph":"X","name":"f","pid":0,"tid":0,"ts":0,"dur":4665.437,"dur":999999.0,"args":{"op":"forward"}}])";
  r = tessel_compare(dup + " " + dup);
  CHECK(r.rc == 2);
  CHECK(r.out.find(dup + ": traceEvents[0]: dur (value 999999.0): duplicate key") != std::string::npos);
  const std::string huge = test::temp_path("cli-huge-kineto.json"), sim = test::temp_path("cli-sim2.json");
  std::ofstream(huge) << R"({"schemaVersion":1,"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":0,"dur":1e300}]})";
  trace::write_chrome_trace(test::two_stage_trace(), sim);
  r = tessel_compare(sim + " " + huge);
  CHECK(r.rc == 2);
  CHECK(r.out.find(huge + ": traceEvents[0]: dur 1e+300 is beyond") != std::string::npos);
}

TEST_CASE("tessel compare: a profiler trace without ProfilerSteps says its step time is the kernel span") {
  const std::string k = test::temp_path("cli-nosteps-kineto.json"), sim = test::temp_path("cli-sim3.json");
  std::ofstream(k) << R"({"schemaVersion":1,"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":10,"dur":5},)"
                      R"({"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":30,"dur":5}]})";
  trace::write_chrome_trace(test::two_stage_trace(), sim);
  Run r = tessel_compare(sim + " " + k);
  REQUIRE(r.rc == 0);
  // Before: "0 ProfilerStep(s), their mean" beside a step time that was no mean of anything.
  CHECK(r.out.find(k + ": no ProfilerStep annotations; the step time is the kernel span (first kernel start to last "
                       "kernel end)") != std::string::npos);
  CHECK(r.out.find("0 ProfilerStep(s)") == std::string::npos);
  r = tessel_compare(sim + " " + k + " --json");
  REQUIRE(r.rc == 0);
  CHECK(nlohmann::json::parse(r.out)["steps"]["b"]["rule"] == "no ProfilerSteps: the kernel span");
}

// otherData.model is a name in a simulated trace and the whole object in a measured one (`tessel run`); QA:
// compare always listed /model as a difference ("tiny" vs the object) for the same model. A preset name is
// resolved to the preset's fields, so only a field that really differs is listed; a name that is no preset
// is compared with the object's name.
TEST_CASE("tessel compare: the model is compared by meaning, a name against an object") {
  const std::string run = test::temp_path("cli-model-run.json");
  const std::string cmd = "\"" + test::tessel_exe() + "\" run --backend cpu --model tiny --steps 1 --trace \"" + run + "\" > /dev/null 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const nlohmann::json tiny = trace::read_chrome_trace(run).other_data["model"];
  REQUIRE(tiny.is_object());
  auto a = test::two_stage_trace();
  auto b = a;
  auto other_data_lines = [&](const nlohmann::json& ma, const nlohmann::json& mb) {
    a.other_data["model"] = ma;
    b.other_data["model"] = mb;
    const std::string pa = test::temp_path("cli-model-a.json"), pb = test::temp_path("cli-model-b.json");
    trace::write_chrome_trace(a, pa);
    trace::write_chrome_trace(b, pb);
    Run r = tessel_compare(pa + " " + pb);
    REQUIRE(r.rc == 0);
    std::string lines;  // the "  /path  A ..  B .." lines under "otherData differs"
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("  /", 0) == 0) lines += line + "\n";
    return lines;
  };
  CHECK(other_data_lines("tiny", tiny).empty());
  CHECK(other_data_lines(tiny, "tiny").empty());
  nlohmann::json longer = tiny;
  longer["seq_len"] = tiny["seq_len"].get<int>() * 2;
  const std::string seq = other_data_lines("tiny", longer);
  CHECK(seq.find("/model/seq_len") != std::string::npos);
  CHECK(std::count(seq.begin(), seq.end(), '\n') == 1);
  nlohmann::json mine = tiny;
  mine["name"] = "my-model";
  CHECK(other_data_lines("my-model", mine).empty());
  CHECK(other_data_lines("other-model", mine).find("/model ") != std::string::npos);
}
