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

RankDiff rank_diff(int r, const std::vector<Action>& x, const std::vector<Action>& y) {
  RankDiff d;
  d.rank = r;
  std::size_t i = 0;
  while (i < x.size() && i < y.size() && x[i] == y[i]) ++i;
  d.first = i;
  d.first_a = i < x.size() ? x[i].token() : "<end>";
  d.first_b = i < y.size() ? y[i].token() : "<end>";
  d.actions_a = x.size();
  d.actions_b = y.size();
  std::map<std::string, int> count;
  for (const auto& act : x) count[act.token()]++;
  for (const auto& act : y) count[act.token()]--;
  for (const auto& [tok, c] : count) {
    for (int k = 0; k < c; ++k) d.only_a.push_back(tok);
    for (int k = 0; k < -c; ++k) d.only_b.push_back(tok);
  }
  return d;
}

// " t1 t2 ... (+N more)": at most `most` tokens.
std::string tokens(const std::vector<std::string>& v, std::size_t most) {
  std::string s;
  for (std::size_t i = 0; i < v.size() && i < most; ++i) s += " " + v[i];
  if (v.size() > most) s += " ... (+" + std::to_string(v.size() - most) + " more)";
  return s;
}

}  // namespace

ScheduleDiff diff_schedules(const Schedule& a, const Schedule& b) {
  ScheduleDiff out;
  auto field = [&](const char* name, int x, int y) {
    if (x != y) out.shape.push_back(std::string(name) + ": " + std::to_string(x) + " vs " + std::to_string(y));
  };
  field("ranks", a.num_ranks, b.num_ranks);
  field("stages", a.num_stages, b.num_stages);
  field("microbatches", a.num_microbatches, b.num_microbatches);
  if (a.stage_to_rank != b.stage_to_rank)
    out.shape.push_back("stage_to_rank: " + ints(a.stage_to_rank) + " vs " + ints(b.stage_to_rank));
  const std::size_t n = std::min(a.ranks.size(), b.ranks.size());
  for (std::size_t r = 0; r < n; ++r)
    if (a.ranks[r] != b.ranks[r]) out.ranks.push_back(rank_diff(static_cast<int>(r), a.ranks[r], b.ranks[r]));
  return out;
}

std::vector<std::string> diff(const Schedule& a, const Schedule& b, std::size_t max_lines, std::size_t max_tokens) {
  const ScheduleDiff d = diff_schedules(a, b);
  std::vector<std::string> all = d.shape;
  for (const RankDiff& r : d.ranks) {
    const std::string rank = "rank " + std::to_string(r.rank);
    all.push_back(rank + ": first difference at #" + std::to_string(r.first) + ": " + r.first_a + " vs " + r.first_b +
                  " (" + std::to_string(r.actions_a) + " vs " + std::to_string(r.actions_b) + " actions)");
    if (!r.only_a.empty()) all.push_back(rank + ": only in first:" + tokens(r.only_a, max_tokens));
    if (!r.only_b.empty()) all.push_back(rank + ": only in second:" + tokens(r.only_b, max_tokens));
  }
  if (all.size() > max_lines) {
    const std::size_t cut = all.size() - (max_lines - 1);
    all.resize(max_lines - 1);
    all.push_back("... " + std::to_string(cut) + " more lines (" + std::to_string(d.ranks.size()) +
                  " ranks differ in all; --json lists every difference)");
  }
  return all;
}

}  // namespace tessel::sched
