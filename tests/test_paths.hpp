// Where tests find the source tree, the built `tessel` and ../shared (tests skip when it is absent).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace tessel::test {

inline std::string source_root() {
  const char* s = std::getenv("TESSEL_SOURCE_ROOT");
  return s ? s : ".";
}

inline std::string tessel_exe() {
  const char* s = std::getenv("TESSEL_EXE");
  return s ? s : "tessel";
}

// ../shared beside the checkout, or TESSEL_SHARED; empty when absent.
inline std::string shared_dir() {
  if (const char* s = std::getenv("TESSEL_SHARED")) return s;
  auto p = std::filesystem::path(source_root()) / ".." / "shared";
  std::error_code ec;
  return std::filesystem::is_directory(p, ec) ? p.string() : std::string();
}

}  // namespace tessel::test
