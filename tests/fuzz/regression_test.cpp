// Replays every committed fuzz input through its target in a normal (non-fuzzing) build: the seed corpus
// (tests/fuzz/corpus/<target>/) and every input that once crashed a target (tests/fuzz/regressions/<target>/).
// An input passes when the target accepts it or rejects it with InputError/InfeasibleLayout; any other
// exception fails the test, a crash or a sanitizer report fails the run.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/fuzz/targets.hpp"
#include "tests/test_paths.hpp"

namespace fs = std::filesystem;
using namespace tessel;

namespace {
std::vector<fs::path> files_under(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != "README.md") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs every file of `kind` ("corpus" or "regressions"); returns how many ran.
std::size_t replay(const std::string& kind) {
  std::size_t n = 0;
  for (const auto& t : fuzz::targets()) {
    for (const auto& f : files_under(fs::path(test::source_root()) / "tests" / "fuzz" / kind / t.name)) {
      INFO(kind << "/" << t.name << "/" << f.filename().string());
      CHECK_NOTHROW(fuzz::run_expecting_rejection_or_success(t.fn, slurp(f)));
      ++n;
    }
  }
  return n;
}
}  // namespace

TEST_CASE("every target has a seed corpus, and every seed is accepted or cleanly rejected") {
  for (const auto& t : fuzz::targets()) {
    INFO("target " << t.name);
    // At least 2 seeds per target: one valid input from the project's files and one edge case.
    CHECK(files_under(fs::path(test::source_root()) / "tests" / "fuzz" / "corpus" / t.name).size() >= 2);
  }
  CHECK(replay("corpus") > 0);
}

TEST_CASE("every input that once crashed a fuzz target is handled") {
  // The folder may be empty for a target that never crashed; the count is reported in docs/reliability.md.
  MESSAGE("regression inputs replayed: " << replay("regressions"));
}
