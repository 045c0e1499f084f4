#include "util/suggest.hpp"

#include <cctype>

#include <algorithm>
#include <numeric>

namespace tessel {

std::string folded_name(const std::string& name) {
  std::string o;
  for (char c : name)
    if (std::isalnum(static_cast<unsigned char>(c))) o += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  // The optimal-string-alignment distance: Wagner and Fischer's dynamic programme (1974) with Damerau's
  // adjacent transposition as one edit ("gne" is one edit from "gen"), over three rows.
  std::vector<std::size_t> prev2(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  std::iota(prev.begin(), prev.end(), std::size_t{0});
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    prev2.swap(prev);
    prev.swap(cur);
  }
  return prev[b.size()];
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& known) {
  const std::size_t limit = std::min<std::size_t>(2, word.size() / 3);
  const std::string* best = nullptr;
  std::size_t best_d = limit + 1;
  for (const std::string& k : known) {
    const std::size_t d = edit_distance(word, k);
    if (d < best_d) {
      best_d = d;
      best = &k;
    }
  }
  return best ? "; did you mean '" + *best + "'?" : std::string();
}

}  // namespace tessel
