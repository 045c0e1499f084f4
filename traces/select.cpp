#include "traces/select.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "util/error.hpp"
#include "util/text_numbers.hpp"

namespace tessel::trace {

std::vector<int> parse_rank_list(const std::string& text, const std::string& what, int ranks) {
  std::set<int> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    if (item.empty()) throw InputError(what + " " + text + ": an empty entry (give ranks as 0-7,64)");
    const std::size_t dash = item.find('-', 1);
    const long long a = parse_int(item.substr(0, dash), what + " " + text, 0, ranks - 1);
    const long long b = dash == std::string::npos ? a : parse_int(item.substr(dash + 1), what + " " + text, 0, ranks - 1);
    if (b < a) throw InputError(what + " " + text + ": range " + item + " runs backwards");
    for (long long r = a; r <= b; ++r) out.insert(static_cast<int>(r));
    start = end + 1;
  }
  return {out.begin(), out.end()};
}

Trace select_ranks(const Trace& t, const std::vector<int>& ranks) {
  const std::set<int> keep(ranks.begin(), ranks.end());
  Trace out;
  out.other_data = t.other_data;
  for (const OpEvent& e : t.events)
    if (keep.count(e.rank)) out.events.push_back(e);
  for (const Counter& c : t.counters)
    if (keep.count(c.rank)) out.counters.push_back(c);
  for (const auto& [r, n] : t.process_names)
    if (keep.count(r)) out.process_names[r] = n;
  return out;
}

namespace {

// What makes two ranks' timelines the same picture.
struct RankPicture {
  std::vector<const OpEvent*> events;
  std::vector<const Counter*> counters;
  bool operator==(const RankPicture& o) const {
    auto same_event = [](const OpEvent* a, const OpEvent* b) {
      return a->name == b->name && a->op == b->op && a->stream == b->stream && a->stage == b->stage && a->mb == b->mb &&
             a->start_us == b->start_us && a->dur_us == b->dur_us;
    };
    auto same_counter = [](const Counter* a, const Counter* b) {
      return a->name == b->name && a->ts_us == b->ts_us && a->value == b->value;
    };
    return std::equal(events.begin(), events.end(), o.events.begin(), o.events.end(), same_event) &&
           std::equal(counters.begin(), counters.end(), o.counters.begin(), o.counters.end(), same_counter);
  }
};

}  // namespace

Trace collapse_identical_ranks(const Trace& t) {
  std::map<int, RankPicture> pic;
  for (const OpEvent& e : t.events) pic[e.rank].events.push_back(&e);
  for (const Counter& c : t.counters) pic[c.rank].counters.push_back(&c);
  for (const auto& [r, n] : t.process_names) pic[r];
  std::vector<int> keep;
  std::map<int, std::string> names;
  for (auto it = pic.begin(); it != pic.end();) {
    auto run_end = std::next(it);
    int last = it->first;
    while (run_end != pic.end() && run_end->first == last + 1 && run_end->second == it->second) last = (run_end++)->first;
    const int first = it->first;
    keep.push_back(first);
    const auto pn = t.process_names.find(first);
    const std::string name = pn != t.process_names.end() ? pn->second : "rank " + std::to_string(first);
    names[first] = last > first ? "ranks " + std::to_string(first) + "-" + std::to_string(last) + " (" +
                                      std::to_string(last - first + 1) + " identical): " + name
                                : name;
    it = run_end;
  }
  Trace out = select_ranks(t, keep);
  out.process_names = names;
  return out;
}

}  // namespace tessel::trace
