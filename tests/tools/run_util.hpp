// Runs the built `tessel` (or another executable) with arguments and captures exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_paths.hpp"

namespace tessel::test {

struct RunResult {
  int code = -1;
  std::string out, err;
};

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `exe` (a path) with arguments.
inline RunResult run_exe(const std::string& exe, const std::vector<std::string>& args) {
  static int counter = 0;
  const auto dir = std::filesystem::temp_directory_path();
  const std::string out = (dir / ("tessel_test_out_" + std::to_string(::getpid()) + "_" + std::to_string(counter))).string();
  const std::string err = (dir / ("tessel_test_err_" + std::to_string(::getpid()) + "_" + std::to_string(counter++))).string();
  std::string cmd = shell_quote(exe);
  for (const auto& a : args) cmd.append(" ").append(shell_quote(a));  // append: GCC 12's -Wrestrict misfires on " " + string
  cmd += " >" + out + " 2>" + err;
  RunResult r;
  const int status = std::system(cmd.c_str());
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

inline RunResult run_tessel(const std::vector<std::string>& args) { return run_exe(tessel_exe(), args); }

inline std::string write_temp(const std::string& name, const std::string& content) {
  const auto p = std::filesystem::temp_directory_path() / (std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << content;
  return p.string();
}

}  // namespace tessel::test
