#include "traces/compare.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <tuple>

#include "util/error.hpp"
#include "traces/intervals.hpp"

namespace tessel::trace {

double percentile(std::vector<double> v, double p) {
  TESSEL_CHECK(!v.empty(), "percentile of nothing");
  std::sort(v.begin(), v.end());
  auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

std::vector<RankStats> rank_stats(const Trace& t) {
  double step = trace_end_us(t) - trace_begin_us(t);
  std::map<int, std::pair<std::vector<Span>, std::vector<Span>>> lanes;  // compute, comm
  for (const auto& e : t.events) {
    auto& l = lanes[e.rank];
    (is_comm(e) ? l.second : l.first).push_back({e.start_us, e.start_us + e.dur_us});
  }
  std::vector<RankStats> out;
  for (auto& [rank, l] : lanes) {
    RankStats r;
    r.rank = rank;
    r.busy_us = union_length(l.first);
    r.comm_us = union_length(l.second);
    r.exposed_comm_us = uncovered_length(l.second, l.first);
    r.bubble_us = std::max(0.0, step - r.busy_us - r.exposed_comm_us);
    out.push_back(r);
  }
  return out;
}

namespace {

using Identity = std::tuple<int, std::string, int, int, int, int, int>;

Identity identity(const OpEvent& e) {
  return {e.rank, e.op, e.stage, e.chunk, e.mb, e.layer_begin, e.layer_end};
}

// Identity -> event indices in start order, so the n-th repeat in A meets the n-th repeat in B.
std::map<Identity, std::vector<std::size_t>> index_by_identity(const Trace& t) {
  std::map<Identity, std::vector<std::size_t>> m;
  for (std::size_t i = 0; i < t.events.size(); ++i) m[identity(t.events[i])].push_back(i);
  for (auto& [k, v] : m) {
    std::stable_sort(v.begin(), v.end(), [&](std::size_t x, std::size_t y) { return t.events[x].start_us < t.events[y].start_us; });
  }
  return m;
}

std::vector<OnlyIn> group_unmatched(const Trace& t, const std::vector<std::size_t>& idx) {
  std::map<std::string, OnlyIn> by_op;
  for (std::size_t i : idx) {
    const auto& e = t.events[i];
    auto& o = by_op[e.op];
    o.op = e.op;
    ++o.count;
    if (o.examples.size() < 3) o.examples.push_back("rank " + std::to_string(e.rank) + " " + e.name);
  }
  std::vector<OnlyIn> out;
  for (auto& [k, v] : by_op) out.push_back(std::move(v));
  return out;
}

void diff_json(const nlohmann::json& a, const nlohmann::json& b, const std::string& path, std::vector<MetaDiff>& out) {
  constexpr std::size_t kMaxDiffs = 20;
  if (out.size() >= kMaxDiffs || a == b) return;
  if (a.is_object() && b.is_object()) {
    std::vector<std::string> keys;
    for (auto it = a.begin(); it != a.end(); ++it) keys.push_back(it.key());
    for (auto it = b.begin(); it != b.end(); ++it) {
      if (!a.contains(it.key())) keys.push_back(it.key());
    }
    for (const auto& k : keys) {
      std::string p = path + "/" + k;
      if (!a.contains(k) || !b.contains(k)) {
        if (out.size() < kMaxDiffs) out.push_back({p, a.contains(k) ? a[k].dump() : "(absent)", b.contains(k) ? b[k].dump() : "(absent)"});
      } else {
        diff_json(a[k], b[k], p, out);
      }
    }
    return;
  }
  out.push_back({path.empty() ? "/" : path, a.dump(), b.dump()});
}

std::vector<OpKindStats> kind_stats(const Trace& a, const std::vector<OpDelta>& pairs) {
  std::map<std::string, std::pair<OpKindStats, std::vector<double>>> by_op;
  for (const auto& p : pairs) {
    const auto& ea = a.events[p.a];
    auto& [s, errors] = by_op[ea.op];
    s.op = ea.op;
    ++s.matched;
    s.total_a_us += p.a_us;
    s.total_b_us += p.b_us;
    if (p.a_us > 0) errors.push_back((p.b_us - p.a_us) / p.a_us * 100.0);
    else ++s.zero_reference;
  }
  std::vector<OpKindStats> out;
  for (auto& [op, v] : by_op) {
    auto& [s, errors] = v;
    if (!errors.empty()) {
      // The median as the 50th percentile by nearest rank: one of the observed errors, never an average.
      s.median_error_pct = percentile(errors, 0.5);
      for (double& e : errors) e = std::fabs(e);
      s.p90_abs_error_pct = percentile(errors, 0.9);
    }
    out.push_back(s);
  }
  return out;
}

using RankOp = std::pair<int, std::string>;

// Each side's dp_* ops per (rank, op kind), in start order (the identity index keeps start order per key).
std::map<RankOp, std::vector<std::size_t>> dp_ops(const Trace& t, const std::map<Identity, std::vector<std::size_t>>& idx) {
  std::map<RankOp, std::vector<std::size_t>> out;
  for (const auto& [key, v] : idx) {
    const std::string& op = std::get<1>(key);
    if (op.rfind("dp_", 0) != 0) continue;
    auto& dst = out[{std::get<0>(key), op}];
    dst.insert(dst.end(), v.begin(), v.end());
  }
  for (auto& [k, v] : out)
    std::stable_sort(v.begin(), v.end(), [&](std::size_t x, std::size_t y) { return t.events[x].start_us < t.events[y].start_us; });
  return out;
}

// Merges the dp_* kinds whose counts on a rank differ between the sides into one pair each, and takes their
// ops out of the identity indices so the one-to-one pairing does not see them; B's merged ops are marked in
// `b_used` (paired, as part of their merged pair).
void merge_split_collectives(const Trace& a, const Trace& b, std::map<Identity, std::vector<std::size_t>>& ia,
                             std::map<Identity, std::vector<std::size_t>>& ib, Comparison& c, std::vector<bool>& b_used) {
  const auto da = dp_ops(a, ia), db = dp_ops(b, ib);
  std::vector<bool> out_a(a.events.size(), false);
  for (const auto& [key, va] : da) {
    auto it = db.find(key);
    if (it == db.end() || it->second.size() == va.size()) continue;
    const auto& vb = it->second;
    MergedCollectives m{key.first, key.second, va.size(), vb.size(), 0, 0};
    OpDelta d{va.front(), vb.front(), 0, 0, 0};
    for (std::size_t i : va) {
      d.a_us += a.events[i].dur_us;
      m.bytes_a += a.events[i].bytes;
      out_a[i] = true;
    }
    for (std::size_t j : vb) {
      d.b_us += b.events[j].dur_us;
      m.bytes_b += b.events[j].bytes;
      b_used[j] = true;
    }
    d.delta_us = d.b_us - d.a_us;
    c.pairs.push_back(d);
    c.merged.push_back(std::move(m));
  }
  auto drop = [](std::map<Identity, std::vector<std::size_t>>& idx, const std::vector<bool>& out) {
    for (auto& [k, v] : idx) v.erase(std::remove_if(v.begin(), v.end(), [&](std::size_t i) { return out[i]; }), v.end());
  };
  drop(ia, out_a);
  drop(ib, b_used);
}

}  // namespace

Comparison compare_traces(const Trace& a, const Trace& b, std::size_t top_n) {
  Comparison c;
  c.events_a = a.events.size();
  c.events_b = b.events.size();
  c.step_a_us = trace_end_us(a) - trace_begin_us(a);
  c.step_b_us = trace_end_us(b) - trace_begin_us(b);
  c.step_error_pct = c.step_a_us > 0 ? (c.step_b_us - c.step_a_us) / c.step_a_us * 100.0 : 0.0;
  auto ia = index_by_identity(a);
  auto ib = index_by_identity(b);
  std::vector<bool> b_used(b.events.size(), false);
  merge_split_collectives(a, b, ia, ib, c, b_used);
  for (const auto& [key, va] : ia) {
    auto it = ib.find(key);
    std::size_t n = it == ib.end() ? 0 : std::min(va.size(), it->second.size());
    for (std::size_t k = 0; k < n; ++k) {
      std::size_t j = it->second[k];
      const double ta = a.events[va[k]].dur_us, tb = b.events[j].dur_us;
      c.pairs.push_back({va[k], j, ta, tb, tb - ta});
      b_used[j] = true;
    }
    for (std::size_t k = n; k < va.size(); ++k) c.unmatched_a.push_back(va[k]);
  }
  for (std::size_t j = 0; j < b.events.size(); ++j) {
    if (!b_used[j]) c.unmatched_b.push_back(j);
  }
  std::sort(c.pairs.begin(), c.pairs.end(), [](const OpDelta& x, const OpDelta& y) { return x.a < y.a; });
  std::sort(c.unmatched_a.begin(), c.unmatched_a.end());
  c.matched = c.pairs.size();
  c.kinds = kind_stats(a, c.pairs);
  c.ranks_a = rank_stats(a);
  c.ranks_b = rank_stats(b);
  auto ids = [](const std::vector<RankStats>& v) {
    std::vector<int> out;
    for (const auto& r : v) out.push_back(r.rank);
    return out;  // rank_stats is in rank order
  };
  auto ra = ids(c.ranks_a), rb = ids(c.ranks_b);
  std::set_difference(ra.begin(), ra.end(), rb.begin(), rb.end(), std::back_inserter(c.ranks_only_in_a));
  std::set_difference(rb.begin(), rb.end(), ra.begin(), ra.end(), std::back_inserter(c.ranks_only_in_b));
  for (const auto& p : c.pairs) {
    if (p.delta_us != 0) c.top.push_back(p);  // an unchanged op contributes nothing
  }
  std::stable_sort(c.top.begin(), c.top.end(), [](const OpDelta& x, const OpDelta& y) { return std::fabs(x.delta_us) > std::fabs(y.delta_us); });
  if (c.top.size() > top_n) c.top.resize(top_n);
  c.only_in_a = group_unmatched(a, c.unmatched_a);
  c.only_in_b = group_unmatched(b, c.unmatched_b);
  // first_step (a resumed run's first step number) differs between a run and its resumed part by design;
  // the compared steps' numbers are reported with the steps, so it is no difference of what is compared.
  nlohmann::json meta_a = a.other_data, meta_b = b.other_data;
  for (nlohmann::json* m : {&meta_a, &meta_b})
    if (m->is_object()) m->erase("first_step");
  diff_json(meta_a, meta_b, "", c.meta_diffs);
  return c;
}

}  // namespace tessel::trace
