// A directory where a file is expected, at every file a command reads: each says "[--flag ]<path>: is a
// directory, not a file" and exits 2. Before, an ifstream opened the directory and the readers reported what reading it gave:
// an empty schedule, malformed JSON at the end of input, a 2^63-byte trace, or (`run --data`) an internal error.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/tools/run_util.hpp"

using tessel::test::run_tessel;

TEST_CASE("a directory given as an input file exits 2 naming it as a directory") {
  const auto root = std::filesystem::temp_directory_path() / ("tessel_dir_inputs_" + std::to_string(::getpid()));
  const std::string dir = (root / "adir.json").string(), csv = (root / "adir.csv").string();
  std::filesystem::create_directories(dir);
  std::filesystem::create_directories(csv);
  const std::string out = (root / "out.json").string();
  const std::vector<std::vector<std::string>> cases = {
      {"compare", dir, dir},
      {"calibrate", "--trace", dir, "-o", out},
      {"calibrate", "--bench", dir, "-o", out},
      {"estimate", "--layout", dir},
      {"estimate", "--model", dir},
      {"estimate", "--system", dir},
      {"validate", dir},
      {"schedule", "validate", csv},
      {"schedule", "show", csv},
      {"run", "--backend", "cpu", "--steps", "1", "--data", (root).string()},
      {"simulate", "--pp", "2", "--gbs", "8", "--schedule-file", csv},
      {"explore", "--explain", dir},
  };
  // Where the path came from a flag, the message leads with the flag.
  const std::vector<std::string> named_flags = {"--layout", "--model", "--system", "--bench", "--data",
                                                "--schedule-file", "--explain", "--trace"};
  for (const auto& args : cases) {
    const auto r = run_tessel(args);
    std::string cmd;
    for (const auto& a : args) cmd += a + " ";
    INFO(cmd);
    INFO(r.err);
    CHECK(r.code == 2);
    const std::size_t at = args.back() == out ? 2 : args.size() - 1;
    const std::string& named = args[at];
    std::string expect = named + ": is a directory, not a file";
    if (std::find(named_flags.begin(), named_flags.end(), args[at - 1]) != named_flags.end())
      expect = args[at - 1] + " " + expect;
    CHECK(r.err.find(expect) != std::string::npos);
    CHECK(r.err.find("internal error") == std::string::npos);
  }
  // The sidecar beside a CSV, when it is a directory.
  std::filesystem::create_directories(root / "x.meta.json");
  {
    std::ofstream(root / "x.csv") << "0F0,0B0\n";
  }
  const auto r = run_tessel({"schedule", "validate", (root / "x.csv").string()});
  CHECK(r.code == 2);
  CHECK(r.err.find((root / "x.meta.json").string() + ": is a directory, not a file") != std::string::npos);
  CHECK(!std::filesystem::exists(out));
  std::filesystem::remove_all(root);
}
