// CSV token grammar, canonical form, JSON sidecar, golden CSVs and PyTorch's own schedule CSVs.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/json_reader.hpp"
#include "sched_test_util.hpp"
#include "sim/schedule/diff.hpp"
#include "tests/test_paths.hpp"

using namespace tessel::sched;
using tessel::InputError;
using tessel::test::params;
using tessel::test::violations_text;

TEST_CASE("token grammar: PyTorch's lowering round-trip tokens") {
  // TestScheduleLowering parse round-trip list.
  for (const char* t : {"1F0", "2I1", "0W3", "0B3", "1UNSHARD", "3RESHARD", "2SEND_B2", "1RECV_F1", "0REDUCE_GRAD",
                        "(0F7;7B3)OVERLAP_F_B", "(1F2;5I0)OVERLAP_F_B"})
    CHECK(parse_token(t, "t").token() == t);
  const Action a = parse_token("12SEND_F345", "t");
  CHECK(a.type == ActionType::SEND_F);
  CHECK(a.stage == 12);
  CHECK(a.mb == 345);
  // Canonical form: no leading zeros, F first inside OVERLAP_F_B.
  CHECK(parse_token("007F01", "t").token() == "7F1");
  CHECK(parse_token("(7B3;0F7)OVERLAP_F_B", "t").token() == "(0F7;7B3)OVERLAP_F_B");
}

TEST_CASE("regression: tokens that only prefix-match are rejected") {
  // PyTorch's regex `match` reads 2BW0 as (2, B, None) silently.
  CHECK_THROWS_WITH_AS(parse_token("2BW0", "f.csv:1:3"), doctest::Contains("f.csv:1:3: token '2BW0': unknown action type 'BW'"),
                       InputError);
  for (const char* bad : {"F1", "1F", "1F1x", "1f1", "1 F1", "1SEND_X0", "(0F1)OVERLAP_F_B", "(0F1;1B0)OVERLAP_F_BX",
                          "(0F1;1F0)OVERLAP_F_B", "(0B1;1W0)OVERLAP_F_B", "1F99999999999"})
    CHECK_THROWS_AS(parse_token(bad, "t"), InputError);
  // The older dialect, asked for explicitly: BW = full backward, B = input grad.
  CHECK(parse_token("2BW0", "t", true).token() == "2B0");
  CHECK(parse_token("2B0", "t", true).token() == "2I0");
}

TEST_CASE("CSV read/write: idles dropped, placement inferred or from the sidecar, canonical output") {
  const Schedule s = parse_csv("0F0,,0F1,0B0,0B1\r\n,1F0,1B0,1F1,1B1\n", "t", std::nullopt);
  CHECK(s.num_ranks == 2);
  CHECK(s.num_stages == 2);
  CHECK(s.num_microbatches == 2);
  CHECK(s.stage_to_rank == std::vector<int>{0, 1});
  CHECK(to_csv(s) == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  // A stage computed on two ranks cannot be placed without a sidecar.
  CHECK_THROWS_WITH_AS(parse_csv("0F0,0B0\n0F1,0B1\n", "x.csv", std::nullopt), doctest::Contains("computed on ranks 0 and 1"),
                       InputError);
  const Schedule z = generate("zbv", params(2, 4, 2));
  const CsvMeta m = parse_meta_json(to_meta_json(z), "z.meta.json");
  CHECK(m.stage_to_rank == z.stage_to_rank);
  CHECK(m.generator == "zbv");
  const Schedule back = parse_csv(to_csv(z), "z.csv", m);
  CHECK(back.ranks == z.ranks);
  CHECK(diff(back, z).empty());
  // Strict sidecar: an unknown key or a wrong-length placement is an error naming it.
  CHECK_THROWS_WITH_AS(parse_meta_json(R"({"schema":1,"pp":2,"num_stages":2,"num_microbatches":1,"stage_to_rank":[0,1],"colour":1})", "m"),
                       doctest::Contains("colour"), InputError);
  CHECK_THROWS_WITH_AS(parse_meta_json(R"({"schema":1,"pp":2,"num_stages":3,"num_microbatches":1,"stage_to_rank":[0,1]})", "m"),
                       doctest::Contains("stage_to_rank"), InputError);
}

TEST_CASE("lowered CSV round-trips with peers restored from the placement") {
  const Schedule low = lower(generate("interleaved", params(2, 4, 2)));
  const Schedule back = parse_csv(to_csv(low), "t", parse_meta_json(to_meta_json(low), "m"));
  CHECK(back.ranks == low.ranks);
  CHECK(validate(back).ok());
}

namespace {

struct Golden {
  const char* file;
  const char* gen;
  int pp, m, v;
  bool lowered;
  int mem_limit;
};

const Golden kGolden[] = {
    {"gpipe_p4_m4", "gpipe", 4, 4, 1, false, 0},           {"1f1b_p4_m8", "1f1b", 4, 8, 1, false, 0},
    {"1f1b_p4_m8_lowered", "1f1b", 4, 8, 1, true, 0},      {"interleaved_p4_m8_v2", "interleaved", 4, 8, 2, false, 0},
    {"looped-bfs_p2_m4_v2", "looped-bfs", 2, 4, 2, false, 0}, {"zb1p_p4_m8", "zb1p", 4, 8, 1, false, 0},
    {"zb1p_p2_m8_v2", "zb1p", 2, 8, 2, false, 0},          {"zb2p_p4_m8", "zb2p", 4, 8, 1, false, 0},
    {"zbv_p4_m8", "zbv", 4, 8, 2, false, 0},               {"dualpipev_p4_m10", "dualpipev", 4, 10, 2, false, 0},
    {"zb-greedy_p4_m8_mem4", "zb-greedy", 4, 8, 1, false, 4},
};

}  // namespace

TEST_CASE("generators reproduce the golden CSVs (TESSEL_UPDATE_GOLDEN=1 rewrites them)") {
  const std::string dir = tessel::test::source_root() + "/tests/golden/schedules/";
  const bool update = std::getenv("TESSEL_UPDATE_GOLDEN") != nullptr;
  for (const auto& g : kGolden) {
    INFO(g.file);
    GenParams p = params(g.pp, g.m, g.v);
    if (g.mem_limit) p.mem_limit = g.mem_limit;
    Schedule s = generate(g.gen, p);
    if (g.lowered) s = lower(s);
    const std::string csv = dir + g.file + ".csv";
    if (update) {
      tessel::write_file_atomic(csv, to_csv(s));
      tessel::write_file_atomic(meta_path_for(csv), to_meta_json(s));
    }
    const Schedule golden = read_csv(csv);
    const auto d = diff(golden, s);
    std::string all;
    for (const auto& l : d) all += l + "\n";
    CHECK_MESSAGE(d.empty(), all);
    CHECK(tessel::read_text_file(csv) == to_csv(s));  // byte-identical canonical form
    CHECK(validate(golden).ok());
  }
}

namespace {

std::string csv_error(const std::string& text, const std::string& origin = "t.csv") {
  try {
    parse_csv(text, origin, std::nullopt);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("CSV blank lines: trailing ones ignored, one before or between rank rows refused with its line") {
  // Row i is rank i. PyTorch's csv.reader reads a blank line as a rank without actions, so a blank line in the
  // middle moves every later row one rank down; at the end it is an editor's final newline.
  const std::string two = "0F0,0B0\n1F0,1B0\n";
  CHECK(parse_csv(two + "\n\n \r\n\t\n", "t.csv", std::nullopt).num_ranks == 2);
  CHECK(csv_error("0F0,0B0\n\n1F0,1B0\n") ==
        "t.csv:2: blank line between rank rows 0 and 1; row i is rank i, so a blank line would shift every later row "
        "to the next rank (only trailing blank lines are ignored)");
  CHECK(csv_error("0F0,0B0\r\n  \r\n\r\n1F0,1B0\r\n").find("t.csv:2: blank line between rank rows 0 and 1") == 0);
  CHECK(csv_error("\n" + two).find("t.csv:1: blank line before the first rank row") == 0);
  // Nothing but blank lines is an empty schedule (it read as a rank without stages: "stage_to_rank has 0
  // entries, expected 0 stages").
  CHECK(csv_error("\n") == "t.csv: empty schedule (no rank rows)");
  CHECK(csv_error("") == "t.csv: empty schedule (no rank rows)");
  // QA: one row and 3,000,000 newlines read as 3,000,001 ranks.
  const Schedule one = parse_csv("0F0,0B0" + std::string(3000000, '\n'), "t.csv", std::nullopt);
  CHECK(one.num_ranks == 1);
  // Rows beyond the sidecar's limit on pp (2^20) are refused at the first one over it.
  std::string rows;
  for (int r = 0; r <= (1 << 20); ++r) rows += ",\n";
  CHECK(csv_error(rows) == "t.csv:1048577: more than 2^20 rank rows (the limit on pp)");
}

TEST_CASE("CSV: a leading UTF-8 byte order mark is dropped; other bytes are shown escaped and cut") {
  // PyTorch opens its CSVs as utf-8-sig, which drops the mark a Windows editor writes.
  const Schedule s = parse_csv("\xEF\xBB\xBF" "0F0,0B0\n", "t.csv", std::nullopt);
  CHECK(s.ranks.at(0).at(0).token() == "0F0");
  // Elsewhere it is an unknown byte, shown as \xNN, not raw.
  CHECK(csv_error("0F0,\xEF\xBB\xBF" "0B0\n").find("t.csv:1:2: token '\\xEF\\xBB\\xBF0B0': must start with a stage index") == 0);
  // A binary file: the message holds 40 characters of the cell, escaped, and its length.
  std::string garbage = "\x01\x02\x7f\x80\xff";
  while (garbage.size() < 5000) garbage += static_cast<char>('A' + garbage.size() % 7);
  const std::string msg = csv_error(garbage);
  CHECK(msg.find("t.csv:1:1: token '\\x01\\x02\\x7F\\x80\\xFF") == 0);
  CHECK(msg.find("... (5000 bytes)'") != std::string::npos);
  CHECK(msg.size() < 400);
  CHECK(std::all_of(msg.begin(), msg.end(), [](char c) { return c >= 0x20 && c < 0x7f; }));
}

TEST_CASE("read_csv: directories are named as such; a file's schedule is labelled by its path") {
  const auto dir = std::filesystem::temp_directory_path() / ("tessel_csv_dir_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "adir.csv");
  CHECK_THROWS_WITH_AS(read_csv((dir / "adir.csv").string()), ((dir / "adir.csv").string() + ": is a directory, not a file").c_str(),
                       InputError);
  const std::string csv = (dir / "x.csv").string();
  tessel::write_file_atomic(csv, "0F0,0B0\n1F0,1B0\n");
  // Messages say schedule '<label>' (the simulator's, unit_cost_simulate's): "csv" named no file.
  CHECK(read_csv(csv).generator == csv);
  std::filesystem::create_directories(dir / "x.meta.json");
  CHECK_THROWS_WITH_AS(read_csv(csv), ((dir / "x.meta.json").string() + ": is a directory, not a file").c_str(), InputError);
  std::filesystem::remove(dir / "x.meta.json");
  tessel::write_file_atomic((dir / "x.meta.json").string(),
                            R"({"schema":1,"pp":2,"num_stages":2,"num_microbatches":1,"stage_to_rank":[0,1],"generator":{"name":"1f1b"}})");
  CHECK(read_csv(csv).generator == csv + " (1f1b)");
  std::filesystem::remove_all(dir);
}
