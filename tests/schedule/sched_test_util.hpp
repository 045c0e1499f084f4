// Helpers shared by the schedule tests.
#pragma once

#include <string>
#include <vector>

#include "sim/schedule/schedule.hpp"

namespace tessel::test {

// PyTorch test_schedule.py's 23 (num_local_stages v, n_mb m, group_size p) cases.
struct VmpCase {
  int v, m, p;
};
inline const std::vector<VmpCase>& pytorch_cases() {
  static const std::vector<VmpCase> c = {
      {2, 2, 2},  {2, 4, 4},  {2, 8, 2},  {2, 8, 4},  {2, 8, 8},   {4, 4, 4},  {4, 8, 4},  {4, 8, 8},
      {4, 16, 4}, {4, 32, 4}, {4, 64, 4}, {4, 16, 16}, {4, 32, 32}, {4, 128, 64}, {3, 2, 2}, {3, 8, 2},
      {3, 12, 4}, {4, 6, 3},  {4, 10, 5}, {2, 3, 4},  {2, 4, 4},   {2, 10, 4}, {2, 15, 4}};
  return c;
}

inline sched::GenParams params(int pp, int m, int v) {
  sched::GenParams g;
  g.pp = pp;
  g.microbatches = m;
  g.vpp = v;
  return g;
}

inline std::string violations_text(const sched::ValidationReport& r) {
  std::string s;
  for (const auto& v : r.violations) s += "[" + v.rule + "] " + v.message + "\n";
  return s;
}

}  // namespace tessel::test
