// `tessel schedule` end to end: exit codes 0 / 1 / 2, files written, the SVG timeline.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "util/atomic_file.hpp"
#include "util/json_reader.hpp"
#include "tests/test_paths.hpp"

namespace {

int run(const std::string& args, const std::string& out_file) {
  const std::string cmd = tessel::test::tessel_exe() + " schedule " + args + " > " + out_file + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace

TEST_CASE("tessel schedule gen / validate / show / diff exit codes") {
  const auto tmp = std::filesystem::temp_directory_path() / ("tessel_sched_cli_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const std::string d = tmp.string(), log = d + "/log.txt";
  const std::string regress = tessel::test::source_root() + "/tests/golden/schedules/regressions/deadlock_172668.csv";

  CHECK(run("gen 1f1b --pp 4 --mb 8 -o " + d + "/a.csv", log) == 0);
  CHECK(std::filesystem::exists(d + "/a.meta.json"));
  CHECK(run("gen zbv --pp 4 --mb 8 --vpp 2 --lower -o " + d + "/b.csv", log) == 0);
  CHECK(run("validate " + d + "/a.csv --comm blocking", log) == 0);
  CHECK(run("validate " + d + "/b.csv --mem-limit 100", log) == 0);
  // Invalid schedule: exit 1 with the violation listed.
  CHECK(run("validate " + regress + " --comm blocking", log) == 1);
  CHECK(tessel::read_text_file(log).find("[deadlock]") != std::string::npos);
  CHECK(run("validate " + regress + " --comm eager", log) == 0);
  CHECK(run("validate " + d + "/a.csv --mem-limit 2", log) == 1);
  // Bad input: exit 2.
  // Without --vpp a generator takes its own stages per rank (zbv: 2), and no rule blames a --vpp never given.
  CHECK(run("gen zbv --pp 4 --mb 8", log) == 0);
  CHECK(run("gen dualpipev --pp 2 --mb 4", log) == 0);
  CHECK(run("gen interleaved --pp 4 --mb 8", log) == 0);
  CHECK(run("gen zbv --pp 4 --mb 8 --vpp 3", log) == 2);
  CHECK(tessel::read_text_file(log).find("--vpp 3: zbv is a V schedule and needs exactly 2 stages per rank") != std::string::npos);
  // Parameters a generator would otherwise ignore or reinterpret: interleaved with one stage per rank is
  // plain 1F1B; 1F1B's in-flight activations are fixed (the limit is zb-greedy's and zb2p's); a request
  // of 2^32 stage-micro-batches would take the machine's memory.
  CHECK(run("gen interleaved --pp 4 --mb 8 --vpp 1", log) == 2);
  CHECK(tessel::read_text_file(log).find("--vpp 1: interleaved needs vpp > 1") != std::string::npos);
  CHECK(run("gen gpipe --pp 4 --mb 8 --vpp 2", log) == 2);
  CHECK(tessel::read_text_file(log).find("gpipe is a single-stage schedule") != std::string::npos);
  CHECK(run("gen zb1p --pp 2 --mb 8 --vpp 2 -o " + d + "/zi.csv", log) == 0);  // PyTorch's interleaved ZB
  CHECK(run("diff " + d + "/zi.csv " + tessel::test::source_root() + "/tests/golden/schedules/zb1p_p2_m8_v2.csv", log) == 0);
  // Interleaved with m not a multiple of pp: PyTorch's rule by default where Megatron's refuses, PyTorch's own
  // order (its ScheduleInterleaved1F1B, p4 m6 v2, the golden file; diff ignores its idle cells), the rule
  // named in the sidecar; --mb-rule megatron keeps Megatron's refusal.
  CHECK(run("gen interleaved --pp 4 --mb 6 --vpp 2 -o " + d + "/i6.csv", log) == 0);
  CHECK(run("diff " + d + "/i6.csv " + tessel::test::source_root() +
                "/tests/golden/schedules/torch/ScheduleInterleaved1F1B_p4_m6_v2.csv",
            log) == 0);
  CHECK(tessel::read_text_file(d + "/i6.meta.json").find("\"mb_rule\": \"torch\"") != std::string::npos);
  CHECK(run("gen interleaved --pp 4 --mb 6 --vpp 2 --mb-rule megatron", log) == 2);
  CHECK(run("gen zb1p --pp 4 --mb 6 --mb-rule torch", log) == 2);
  CHECK(tessel::read_text_file(log).find("--mb-rule torch: only interleaved takes a micro-batch rule") != std::string::npos);
  CHECK(run("gen 1f1b --pp 4 --mb 8 --mem-limit 2", log) == 2);
  CHECK(tessel::read_text_file(log).find("--mem-limit 2: only zb-greedy and zb2p") != std::string::npos);
  CHECK(run("gen zb2p --pp 4 --mb 8 --mem-limit 6 -o " + d + "/z.csv", log) == 0);
  CHECK(run("gen zb-greedy --pp 4096 --mb 1048576", log) == 2);
  CHECK(tessel::read_text_file(log).find("4294967296 stage-micro-batches: over the limit") != std::string::npos);
  CHECK(run("validate " + d + "/missing.csv", log) == 2);
  CHECK(run("validate " + d + "/a.csv --comm sometimes", log) == 2);
  tessel::write_file_atomic(d + "/bad.csv", "0F0,2BW0\n");
  CHECK(run("validate " + d + "/bad.csv", log) == 2);
  CHECK(run("frobnicate", log) == 2);
  // show: ASCII to stdout and an SVG file.
  CHECK(run("show " + d + "/a.csv --svg " + d + "/a.svg", log) == 0);
  CHECK(tessel::read_text_file(log).find("rank 3   |...F") != std::string::npos);
  CHECK(tessel::read_text_file(d + "/a.svg").rfind("<svg", 0) == 0);
  // diff: 0 identical, 1 different.
  CHECK(run("diff " + d + "/a.csv " + d + "/a.csv", log) == 0);
  CHECK(run("gen gpipe --pp 4 --mb 8 -o " + d + "/g.csv", log) == 0);
  CHECK(run("diff " + d + "/a.csv " + d + "/g.csv", log) == 1);
  CHECK(tessel::read_text_file(log).find("rank 0: first difference at #4: 0B0 vs 0F4") != std::string::npos);
  std::filesystem::remove_all(tmp);
}

// PyTorch's older dialect (B = input grad, W = weight grad, as ../shared/schedules/pytorch/
// zb1p_2rank_2stagep_compute.csv): read as full backwards its Ws have no I; validate and show say to read it
// with --legacy-bw, and the count of violations says how many are listed.
TEST_CASE("tessel schedule validate / show suggest --legacy-bw for B with W and no I") {
  const auto tmp = std::filesystem::temp_directory_path() / ("tessel_sched_legacy_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const std::string d = tmp.string(), log = d + "/log.txt", csv = d + "/old.csv";
  // 1 rank, 1 stage, 12 micro-batches: 12 "W without I" violations, 10 listed.
  std::string row;
  for (int i = 0; i < 12; ++i) {
    const std::string mb = std::to_string(i);
    if (i > 0) row += ",";
    row += "0F" + mb + ",0B" + mb + ",0W" + mb;
  }
  tessel::write_file_atomic(csv, row + "\n");
  CHECK(run("validate " + csv, log) == 1);
  const std::string out = tessel::read_text_file(log);
  CHECK(out.find("(12 violations, the first 10 shown; --max-violations N lists more)") != std::string::npos);
  CHECK(out.find("W without I") != std::string::npos);
  CHECK(out.find("read it that way with --legacy-bw") != std::string::npos);
  CHECK(run("validate " + csv + " --legacy-bw", log) == 0);
  CHECK(run("show " + csv, log) == 2);
  CHECK(tessel::read_text_file(log).find("read it that way with --legacy-bw") != std::string::npos);
  CHECK(run("show " + csv + " --legacy-bw", log) == 0);
  std::filesystem::remove_all(tmp);
}

TEST_CASE("tessel schedule: blank lines, BOMs, directories; flags checked before output") {
  const auto tmp = std::filesystem::temp_directory_path() / ("tessel_sched_cli2_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp / "adir.csv");
  const std::string d = tmp.string(), log = d + "/log.txt";
  auto said = [&](const std::string& text) { return tessel::read_text_file(log).find(text) != std::string::npos; };
  // QA: a trailing blank line made a third rank and "valid"; in the middle it moved rank 1's work to rank 2.
  tessel::write_file_atomic(d + "/t.csv", "0F0,0B0\n1F0,1B0\n\n");
  CHECK(run("validate " + d + "/t.csv", log) == 0);
  CHECK(said("valid under eager comms; 2 ranks, 2 stages"));
  tessel::write_file_atomic(d + "/m.csv", "0F0,0B0\n\n1F0,1B0\n");
  CHECK(run("validate " + d + "/m.csv", log) == 2);
  CHECK(said(d + "/m.csv:2: blank line between rank rows 0 and 1"));
  tessel::write_file_atomic(d + "/nl.csv", "\n");
  CHECK(run("validate " + d + "/nl.csv", log) == 2);
  CHECK(said(d + "/nl.csv: empty schedule (no rank rows)"));
  tessel::write_file_atomic(d + "/bom.csv", "\xEF\xBB\xBF" "0F0,0B0\n1F0,1B0\n");
  CHECK(run("validate " + d + "/bom.csv", log) == 0);
  // A directory: "empty schedule" before.
  CHECK(run("validate " + d + "/adir.csv", log) == 2);
  CHECK(said(d + "/adir.csv: is a directory, not a file"));
  // show: a bad --width is refused before the summary is printed; a schedule that cannot be simulated is
  // named by its path ("schedule 'csv'" before).
  CHECK(run("show " + d + "/t.csv --width 0", log) == 2);
  CHECK(said("--width: 0 is out of range [20, 2000]"));
  CHECK(!said("pp 2"));
  CHECK(run("show " + d + "/t.csv", log) == 0);
  CHECK(said(d + "/t.csv: pp 2, 2 stages"));
  tessel::write_file_atomic(d + "/inv.csv", "0F0,0B0\n1F0\n");
  CHECK(run("show " + d + "/inv.csv", log) == 2);
  CHECK(said("cannot simulate schedule '" + d + "/inv.csv'"));
  std::filesystem::remove_all(tmp);
}

TEST_CASE("tessel schedule: numbers out of range say so, with the range") {
  const auto tmp = std::filesystem::temp_directory_path() / ("tessel_sched_cli3_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const std::string d = tmp.string(), log = d + "/log.txt";
  auto said = [&](const std::string& text) { return tessel::read_text_file(log).find(text) != std::string::npos; };
  tessel::write_file_atomic(d + "/t.csv", "0F0,0B0\n1F0,1B0\n");
  // Before: "'18446744073709551615' is not an integer", "'1e-400' is not a finite number".
  CHECK(run("gen 1f1b --pp 18446744073709551615 --mb 2", log) == 2);
  CHECK(said("--pp: 18446744073709551615 is out of range [1, 4096]"));
  CHECK(run("show " + d + "/t.csv --costs 1e-400,1,1,0", log) == 2);
  CHECK(said("--costs F: 1e-400 underflows (its magnitude is below 2.2e-308, the smallest normal double); the range is"));
  CHECK(run("show " + d + "/t.csv --costs 1e400,1,1,0", log) == 2);
  CHECK(said("--costs F: 1e400 overflows a double"));
  std::filesystem::remove_all(tmp);
}

TEST_CASE("tessel schedule show --svg: the file's path in the title is escaped") {
  // The title is the schedule's label, now its path; "a&b.csv" would make the SVG malformed XML.
  const auto tmp = std::filesystem::temp_directory_path() / ("tessel_sched_cli4_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const std::string d = tmp.string(), log = d + "/log.txt", csv = d + "/a&b<1>.csv", svg = d + "/t.svg";
  tessel::write_file_atomic(csv, "0F0,0B0\n1F0,1B0\n");
  CHECK(run("show '" + csv + "' --svg " + svg, log) == 0);
  const std::string text = tessel::read_text_file(svg);
  CHECK(text.find(d + "/a&amp;b&lt;1&gt;.csv: pp 2") != std::string::npos);
  CHECK(text.find("a&b") == std::string::npos);
  std::filesystem::remove_all(tmp);
}

TEST_CASE("tessel schedule validate: what a schedule author needs to find a mistake") {
  const auto tmp = std::filesystem::temp_directory_path() / ("tessel_sched_author_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const std::string d = tmp.string(), log = d + "/log.txt";
  auto out = [&] { return tessel::read_text_file(log); };
  // A typo in one micro-batch index of a file without a sidecar: m is read as 6, every stage misses
  // micro-batches 4 and 5, and those were all the listed violations (QA); the note names the index first.
  const std::string typo = d + "/typo.csv";
  tessel::write_file_atomic(typo, "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B5\n");
  CHECK(run("validate " + typo, log) == 1);
  CHECK(out().find("note: no sidecar, so m = 6 is read from the largest micro-batch index, first at rank 1 #7 '1B5' "
                   "(line 2 cell 8); micro-batch 5 appears in 1 action(s), micro-batch 0 in 4") != std::string::npos);
  // Every violation collected, as JSON for CI, or listed with --max-violations.
  CHECK(run("validate " + typo + " --json", log) == 1);
  const tessel::Json j = tessel::Json::parse(out());
  CHECK(j.at("valid") == false);
  // Completeness failed, so the order, FSDP, send/recv and deadlock checks did not run: not complete.
  CHECK(j.at("checked") == "completeness");
  CHECK(j.at("violations_complete") == false);
  CHECK(j.at("violations").size() == 8);  // F4, F5 and their backwards on both stages, less 1B5, plus 1B3
  CHECK(j.at("violations")[0].at("rule") == "completeness");
  CHECK(j.at("note").get<std::string>().find("m = 6") != std::string::npos);
  CHECK(run("validate " + typo + " --max-violations 2", log) == 1);
  CHECK(out().find("at least 2 violations, the first") == std::string::npos);
  CHECK(out().find("(at least 2 violations)") != std::string::npos);
  CHECK(run("validate " + typo + " --max-violations 0", log) == 2);
  // A current-dialect file with one stray W gets no --legacy-bw hint: read that way it is not valid either
  // (QA: the hint led to 31 violations).
  const std::string stray = d + "/stray.csv";
  tessel::write_file_atomic(stray, "0F0,0F1,0B0,0B1,0W1\n1F0,1B0,1F1,1B1\n");
  CHECK(run("validate " + stray, log) == 1);
  CHECK(out().find("W without I: rank 0 #4 '0W1' (line 1 cell 5)") != std::string::npos);
  CHECK(out().find("--legacy-bw") == std::string::npos);
  // A micro-batch index on a whole-stage action is refused where it is.
  const std::string rgmb = d + "/rgmb.csv";
  tessel::write_file_atomic(rgmb, "0F0,0B0,0REDUCE_GRAD0\n1F0,1B0,1REDUCE_GRAD\n");
  CHECK(run("validate " + rgmb, log) == 2);
  CHECK(out().find(":1:3: token '0REDUCE_GRAD0': REDUCE_GRAD takes no micro-batch index") != std::string::npos);
  // The summary says whose units the makespan is in.
  const std::string ok = d + "/ok.csv";
  tessel::write_file_atomic(ok, "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  CHECK(run("validate " + ok + " --mem-limit 1 --json", log) == 1);
  const tessel::Json mem = tessel::Json::parse(out());
  CHECK(mem.at("checked") == "all");
  CHECK(mem.at("violations_complete") == true);
  CHECK(mem.at("violations").size() == 1);
  CHECK(run("show " + ok, log) == 0);
  CHECK(out().find("unit-cost makespan 9.00") != std::string::npos);
  CHECK(run("show " + ok + " --costs 1,1,1,0.5", log) == 0);
  CHECK(out().find("makespan (--costs units) 10.00") != std::string::npos);
  // -o into a device: the CSV goes in, and no sidecar is put beside it (QA: /dev/null.meta.json).
  // (A /dev/null.meta.json left by an older build is not this run's: only a newer one would be.)
  std::error_code ec;
  const auto before = std::filesystem::last_write_time("/dev/null.meta.json", ec);
  const bool existed = !ec;
  CHECK(run("gen 1f1b --pp 2 --mb 2 -o /dev/null", log) == 0);
  CHECK(out().find("wrote /dev/null (not a regular file: no sidecar beside it)") != std::string::npos);
  const auto after = std::filesystem::last_write_time("/dev/null.meta.json", ec);
  CHECK((ec || (existed && after == before)));
  std::filesystem::remove_all(tmp);
}

TEST_CASE("tessel schedule: the sidecar's dialect and level are read, not only parsed") {
  const auto tmp = std::filesystem::temp_directory_path() / ("tessel_sched_sidecar_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const std::string d = tmp.string(), log = d + "/log.txt", csv = d + "/s.csv", meta = d + "/s.meta.json";
  auto out = [&] { return tessel::read_text_file(log); };
  auto sidecar = [&](const std::string& extra) {
    tessel::write_file_atomic(meta, R"({"schema":1,"pp":2,"num_stages":2,"num_microbatches":2,"stage_to_rank":[0,1])" + extra + "}\n");
  };
  // PyTorch's older dialect, declared: B is the input grad, so B + W is a split backward and the file is valid.
  tessel::write_file_atomic(csv, "0F0,0F1,0B0,0W0,0B1,0W1\n1F0,1B0,1W0,1F1,1B1,1W1\n");
  sidecar(R"(,"dialect":"torch<2025:B=input,BW=full")");
  CHECK(run("validate " + csv, log) == 0);
  sidecar(R"(,"dialect":"torch>=2025:I=input,B=full")");
  CHECK(run("validate " + csv, log) == 1);
  CHECK(run("validate " + csv + " --legacy-bw", log) == 2);
  CHECK(out().find("--legacy-bw: " + csv + "'s sidecar " + meta + " declares dialect torch>=2025:I=input,B=full") != std::string::npos);
  // A sidecar that declares no dialect leaves it to the flag (review: it was refused as "declares" the current one).
  sidecar("");
  CHECK(run("validate " + csv + " --legacy-bw", log) == 0);
  CHECK(run("validate " + csv, log) == 1);
  CHECK(out().find("read it that way with --legacy-bw") != std::string::npos);
  // null is "not given" (QA: "level: unknown key").
  sidecar(R"(,"dialect":null,"level":null,"generator":null)");
  CHECK(run("validate " + csv + " --legacy-bw", log) == 0);
  sidecar(R"(,"dialect":"garbage")");
  CHECK(run("validate " + csv, log) == 2);
  CHECK(out().find("dialect") != std::string::npos);
  CHECK(out().find("'garbage' is not one of") != std::string::npos);
  sidecar(R"(,"level":"garbage")");
  CHECK(run("validate " + csv, log) == 2);
  CHECK(out().find("'garbage' is not compute_only") != std::string::npos);
  // The level has to say what the file holds.
  tessel::write_file_atomic(csv, "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                                 "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n");
  sidecar(R"(,"level":"compute_comms")");
  CHECK(run("validate " + csv, log) == 0);
  sidecar(R"(,"level":"compute_only")");
  CHECK(run("validate " + csv, log) == 2);
  CHECK(out().find(csv + ":1:2: '0SEND_F0' in a file whose sidecar says level compute_only") != std::string::npos);
  tessel::write_file_atomic(csv, "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  sidecar(R"(,"level":"compute_comms")");
  CHECK(run("validate " + csv, log) == 2);
  CHECK(out().find("the sidecar says level compute_comms (lowered), but the file has no SEND/RECV") != std::string::npos);
  std::filesystem::remove_all(tmp);
}

TEST_CASE("tessel schedule: JSON for CI (violations with positions, show's bubble, diff) and a bounded text diff") {
  const auto tmp = std::filesystem::temp_directory_path() / ("tessel_sched_json_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const std::string d = tmp.string(), log = d + "/log.txt";
  auto json = [&] { return tessel::parse_json_text(tessel::read_text_file(log), log); };
  // A wait before its send (line 1, cell 2): the violation carries rank 0, action index 1, line 1, cell 2.
  tessel::write_file_atomic(d + "/w.csv", "0F0,0WAIT_SEND_F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n");
  CHECK(run("validate " + d + "/w.csv --json", log) == 1);
  const tessel::Json v = json().at("violations").at(0);
  CHECK(v.at("rule") == "wait");
  CHECK(v.at("rank") == 0);
  CHECK(v.at("action_index") == 1);
  CHECK(v.at("line") == 1);
  CHECK(v.at("cell") == 2);
  // 1F1B, p 4, m 8, unit costs (F = B = W = 1, B the full backward: 3 a micro-batch): makespan (m + p - 1) 3 =
  // 33, each rank busy 8 x 3 = 24 and idle 9, rank r holding p - r activations at its peak.
  CHECK(run("gen 1f1b --pp 4 --mb 8 -o " + d + "/a.csv", log) == 0);
  CHECK(run("show " + d + "/a.csv --json", log) == 0);
  const tessel::Json s = json();
  CHECK(s.at("makespan").get<double>() == doctest::Approx(33.0));
  CHECK(s.at("bubble_rate").get<double>() == doctest::Approx(9.0 / 33.0));
  REQUIRE(s.at("per_rank").size() == 4);
  for (int r = 0; r < 4; ++r) {
    CHECK(s.at("per_rank").at(r).at("bubble").get<double>() == doctest::Approx(9.0));
    CHECK(s.at("per_rank").at(r).at("peak_inflight") == 4 - r);
  }
  // pp 32: 1F1B against ZB-1P differ on every rank in 64-192 actions each. The text stays under 40 lines of at
  // most 12 actions (it was 133 KB); --json has every rank.
  CHECK(run("gen 1f1b --pp 32 --mb 64 -o " + d + "/p.csv", log) == 0);
  CHECK(run("gen zb1p --pp 32 --mb 64 -o " + d + "/q.csv", log) == 0);
  CHECK(run("diff " + d + "/p.csv " + d + "/q.csv", log) == 1);
  const std::string text = tessel::read_text_file(log);
  CHECK(std::count(text.begin(), text.end(), '\n') == 40);
  CHECK(text.size() < 8000);
  CHECK(text.find("32 ranks differ in all; --json lists every difference") != std::string::npos);
  CHECK(run("diff " + d + "/p.csv " + d + "/q.csv --json", log) == 1);
  const tessel::Json df = json();
  CHECK(df.at("identical") == false);
  CHECK(df.at("ranks").size() == 32);
  CHECK(df.at("ranks").at(0).at("only_in_second").size() == 128);  // 64 I + 64 W where 1F1B has 64 B
  CHECK(run("diff " + d + "/p.csv " + d + "/p.csv --json", log) == 0);
  CHECK(json().at("identical") == true);
  std::filesystem::remove_all(tmp);
}
