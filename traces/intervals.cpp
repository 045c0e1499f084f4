#include "traces/intervals.hpp"

#include <algorithm>

namespace tessel::trace {

void merge_spans(std::vector<Span>& s) {
  std::sort(s.begin(), s.end());
  std::size_t out = 0;
  for (const auto& x : s) {
    if (x.second <= x.first) continue;
    if (out > 0 && x.first <= s[out - 1].second) {
      s[out - 1].second = std::max(s[out - 1].second, x.second);
    } else {
      s[out++] = x;
    }
  }
  s.resize(out);
}

double union_length(std::vector<Span> s) {
  merge_spans(s);
  double total = 0;
  for (const auto& x : s) total += x.second - x.first;
  return total;
}

double uncovered_length(std::vector<Span> a, std::vector<Span> b) {
  merge_spans(a);
  merge_spans(b);
  double total = 0;
  std::size_t j = 0;
  for (const auto& x : a) {
    double cur = x.first;
    while (j < b.size() && b[j].second <= cur) ++j;
    for (std::size_t k = j; k < b.size() && b[k].first < x.second; ++k) {
      if (b[k].first > cur) total += b[k].first - cur;
      cur = std::max(cur, b[k].second);
      if (cur >= x.second) break;
    }
    if (cur < x.second) total += x.second - cur;
  }
  return total;
}

}  // namespace tessel::trace
