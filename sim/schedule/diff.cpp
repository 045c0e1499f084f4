#include "sim/schedule/diff.hpp"

#include <algorithm>
#include <map>

namespace tessel::sched {

namespace {

std::string ints(const std::vector<int>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s + "]";
}

}  // namespace

std::vector<std::string> diff(const Schedule& a, const Schedule& b, std::size_t max_lines) {
  std::vector<std::string> out;
  auto add = [&](std::string line) {
    if (out.size() < max_lines) out.push_back(std::move(line));
  };
  auto field = [&](const char* name, int x, int y) {
    if (x != y) add(std::string(name) + ": " + std::to_string(x) + " vs " + std::to_string(y));
  };
  field("ranks", a.num_ranks, b.num_ranks);
  field("stages", a.num_stages, b.num_stages);
  field("microbatches", a.num_microbatches, b.num_microbatches);
  if (a.stage_to_rank != b.stage_to_rank)
    add("stage_to_rank: " + ints(a.stage_to_rank) + " vs " + ints(b.stage_to_rank));
  const std::size_t n = std::min(a.ranks.size(), b.ranks.size());
  for (std::size_t r = 0; r < n; ++r) {
    const auto &x = a.ranks[r], &y = b.ranks[r];
    std::size_t i = 0;
    while (i < x.size() && i < y.size() && x[i] == y[i]) ++i;
    if (i == x.size() && i == y.size()) continue;
    add("rank " + std::to_string(r) + ": first difference at #" + std::to_string(i) + ": " +
        (i < x.size() ? x[i].token() : "<end>") + " vs " + (i < y.size() ? y[i].token() : "<end>") + " (" +
        std::to_string(x.size()) + " vs " + std::to_string(y.size()) + " actions)");
    std::map<std::string, int> count;
    for (const auto& act : x) count[act.token()]++;
    for (const auto& act : y) count[act.token()]--;
    std::string only_a, only_b;
    for (const auto& [tok, c] : count) {
      for (int k = 0; k < c; ++k) only_a += " " + tok;
      for (int k = 0; k < -c; ++k) only_b += " " + tok;
    }
    if (!only_a.empty()) add("rank " + std::to_string(r) + ": only in first:" + only_a);
    if (!only_b.empty()) add("rank " + std::to_string(r) + ": only in second:" + only_b);
  }
  return out;
}

}  // namespace tessel::sched
