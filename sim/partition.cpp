#include "sim/partition.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "util/error.hpp"

namespace tessel {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Optima found in one pass are caps of the next: a relative slack absorbs the rounding of sums taken in
// another order (a few ulps), far below any difference a layer makes.
double with_slack(double v) { return v + std::abs(v) * 1e-12 + 1e-300; }

// The prefix sums the stage costs are read from, and the bounds on each stage's boundaries.
class Table {
 public:
  explicit Table(const PartitionCosts& c) : c_(c), L_(c.layers()), S_(c.stages()) {
    for (auto* v : {&time_, &state_, &act_}) v->assign(static_cast<std::size_t>(L_) + 1, 0.0);
    for (std::size_t k = 0; k < static_cast<std::size_t>(L_); ++k) {
      time_[k + 1] = time_[k] + c.layer_s[k];
      state_[k + 1] = state_[k] + c.layer_bytes[k];
      act_[k + 1] = act_[k] + c.act_bytes[k];
    }
    // The first and the last stage may be empty; a middle stage holds a layer.
    min_.assign(static_cast<std::size_t>(S_), 1);
    min_.front() = 0;
    min_.back() = 0;
    if (S_ == 1) min_[0] = 0;
    lo_.assign(static_cast<std::size_t>(S_), 0);
    int sum = 0;
    for (int s = 0; s < S_; ++s) lo_[static_cast<std::size_t>(s)] = sum += min_[static_cast<std::size_t>(s)];
  }
  int layers() const { return L_; }
  int stages() const { return S_; }
  int min_layers(int s) const { return min_[static_cast<std::size_t>(s)]; }
  // Layers the first s + 1 stages hold at least / at most, given what the later stages need.
  int lowest_end(int s) const { return lo_[static_cast<std::size_t>(s)]; }
  int highest_end(int s) const { return L_ - (lo_.back() - lo_[static_cast<std::size_t>(s)]); }
  const PartitionCosts& costs() const { return c_; }
  // PartitionCosts::time and ::bytes from the prefix sums.
  double time(int s, int i, int j) const {
    return c_.stage_s[static_cast<std::size_t>(s)] + (time_[static_cast<std::size_t>(j)] - time_[static_cast<std::size_t>(i)]) +
           std::min(j - i, c_.block_layers) * c_.block_s;
  }
  double bytes(int s, int i, int j) const {
    const double act = act_[static_cast<std::size_t>(j)] - act_[static_cast<std::size_t>(i)] -
                       std::min(j - i, c_.block_layers) * c_.block_act_bytes;
    return c_.stage_bytes[static_cast<std::size_t>(s)] + (state_[static_cast<std::size_t>(j)] - state_[static_cast<std::size_t>(i)]) +
           c_.act_scale[static_cast<std::size_t>(s)] * std::max(0.0, act);
  }

 private:
  const PartitionCosts& c_;
  int L_, S_;
  std::vector<int> min_, lo_;
  std::vector<double> time_, state_, act_;  // prefix sums over layers
};

// What a pass minimises and which stages it allows. Both costs grow as a stage takes more layers, so a scan
// of the start boundary i downwards from j stops at the first stage over a cap.
struct Pass {
  bool sum_of_squares = false;  // else the largest stage
  bool by_bytes = false;        // the key is the stage's bytes, else its seconds
  double time_cap = kInf, bytes_cap = kInf;
};

struct Solved {
  double value = kInf;
  std::vector<int> layers;
};

// Under a time cap, the most layers each stage can hold: any k consecutive layers take at least k times the
// fastest one. An upper bound (a hair above the cap absorbs the rounding of prefix sums), so no split within
// the cap is cut; without a cap, every layer.
std::vector<int> most_layers(const Table& t, double time_cap) {
  const PartitionCosts& c = t.costs();
  const int L = t.layers(), S = t.stages();
  std::vector<int> k_max(static_cast<std::size_t>(S), L);
  if (time_cap == kInf || L == 0) return k_max;
  const double fastest = *std::min_element(c.layer_s.begin(), c.layer_s.end());
  const double cap = time_cap * (1 + 1e-9);
  for (int s = 0; s < S; ++s) {
    int k = 0;
    while (k < L && c.stage_s[static_cast<std::size_t>(s)] + (k + 1) * fastest +
                            std::min(k + 1, c.block_layers) * c.block_s <= cap)
      ++k;
    k_max[static_cast<std::size_t>(s)] = k;
  }
  return k_max;
}

// One dynamic programme over the boundaries: best[s][j] is the value of the first j layers over stages
// 0..s, from[s][j] the start boundary of stage s in it. Only the boundaries that can matter are visited: a
// stage starts where its predecessors' split exists (reach_lo .. reach_hi) and ends where the later stages
// can still hold the rest within the time cap, so a capped pass looks at a band a few layers wide.
Solved solve(const Table& t, const Pass& p) {
  const std::vector<double>& budget = t.costs().budget_bytes;
  const int L = t.layers(), S = t.stages();
  const auto W = static_cast<std::size_t>(L + 1);
  std::vector<double> best(static_cast<std::size_t>(S) * W, kInf);
  std::vector<int> from(static_cast<std::size_t>(S) * W, -1);
  auto at = [&](int s, int j) { return static_cast<std::size_t>(s) * W + static_cast<std::size_t>(j); };
  const std::vector<int> k_max = most_layers(t, p.time_cap);
  std::vector<long long> later(static_cast<std::size_t>(S) + 1, 0);  // layers stages s.. can hold at most
  for (int s = S - 1; s >= 0; --s) later[static_cast<std::size_t>(s)] = later[static_cast<std::size_t>(s) + 1] + k_max[static_cast<std::size_t>(s)];
  int reach_lo = 0, reach_hi = 0;  // the boundaries with a finite best for stages 0..s-1 (layer 0 before stage 0)
  for (int s = 0; s < S; ++s) {
    int j_lo = s + 1 == S ? L : t.lowest_end(s), j_hi = s + 1 == S ? L : t.highest_end(s);
    j_lo = std::max<long long>(j_lo, std::max<long long>(L - later[static_cast<std::size_t>(s) + 1], reach_lo + t.min_layers(s)));
    j_hi = static_cast<int>(std::min<long long>(j_hi, static_cast<long long>(reach_hi) + k_max[static_cast<std::size_t>(s)]));
    int next_lo = L + 1, next_hi = -1;
    for (int j = j_lo; j <= j_hi; ++j) {
      double v_best = kInf;
      int i_best = -1;
      // The first stage starts at layer 0; a later one after the layers its predecessors need at least.
      const int i_hi = std::min(s == 0 ? 0 : j - t.min_layers(s), reach_hi);
      const int i_lo = std::max(s == 0 ? 0 : t.lowest_end(s - 1), reach_lo);
      for (int i = i_hi; i >= i_lo; --i) {
        const double secs = t.time(s, i, j), bytes = t.bytes(s, i, j);
        if (secs > p.time_cap || bytes > p.bytes_cap || bytes > budget[static_cast<std::size_t>(s)]) break;
        const double key = p.by_bytes ? bytes : secs;
        const double before = s == 0 ? 0.0 : best[at(s - 1, i)];
        if (before == kInf) continue;
        const double v = p.sum_of_squares ? before + key * key : std::max(before, key);
        // Equal values: the smaller i (more layers on this later stage) wins, as the scan goes down.
        if (v <= v_best) {
          v_best = v;
          i_best = i;
        }
        // A stage holding more layers only costs more: no smaller i can beat the best of a largest-stage pass.
        if (!p.sum_of_squares && key > v_best) break;
      }
      best[at(s, j)] = v_best;
      from[at(s, j)] = i_best;
      if (v_best < kInf) {
        next_lo = std::min(next_lo, j);
        next_hi = j;
      }
    }
    if (next_hi < 0) return {};  // no split of any prefix fits: nothing later can
    reach_lo = next_lo;
    reach_hi = next_hi;
  }
  Solved out;
  out.value = best[at(S - 1, L)];
  if (out.value == kInf) return out;
  out.layers.assign(static_cast<std::size_t>(S), 0);
  for (int s = S - 1, j = L; s >= 0; --s) {
    const int i = from[at(s, j)];
    TESSEL_CHECK(i >= 0 && i <= j, "partition: no start boundary for stage " << s << " ending at layer " << j);
    out.layers[static_cast<std::size_t>(s)] = j - i;
    j = i;
  }
  return out;
}

void check_costs(const PartitionCosts& c) {
  const auto L = c.layer_s.size(), S = c.stage_s.size();
  TESSEL_CHECK(S >= 1, "partition: no stages");
  TESSEL_CHECK(c.layer_bytes.size() == L && c.act_bytes.size() == L, "partition: per-layer vectors differ in size");
  TESSEL_CHECK(c.stage_bytes.size() == S && c.act_scale.size() == S && c.budget_bytes.size() == S,
               "partition: per-stage vectors differ in size");
  for (const auto* v : {&c.layer_s, &c.layer_bytes, &c.act_bytes, &c.stage_s, &c.stage_bytes, &c.act_scale})
    for (double x : *v) TESSEL_CHECK(x >= 0 && std::isfinite(x), "partition: cost " << x << " is not a finite non-negative number");
  TESSEL_CHECK(c.block_layers >= 0 && c.block_s >= 0 && c.block_act_bytes >= 0, "partition: negative block recompute");
}

// The largest stage (seconds, or bytes) of the most even split: stage s holds L / S layers, the last L % S
// stages one more; nullopt when a stage would hold none where it must hold one, or a stage exceeds its budget.
std::optional<double> even_split_value(const Table& t, bool by_bytes) {
  const int L = t.layers(), S = t.stages();
  const int base = L / S, extra = L % S;
  double worst = 0;
  for (int s = 0, i = 0; s < S; ++s) {
    const int n = base + (s >= S - extra ? 1 : 0);
    if (n < t.min_layers(s)) return std::nullopt;
    const double bytes = t.bytes(s, i, i + n);
    if (bytes > t.costs().budget_bytes[static_cast<std::size_t>(s)]) return std::nullopt;
    worst = std::max(worst, by_bytes ? bytes : t.time(s, i, i + n));
    i += n;
  }
  return worst;
}

}  // namespace

double PartitionCosts::time(int s, int first, int end) const {
  double t = stage_s[static_cast<std::size_t>(s)];
  for (int k = first; k < end; ++k) t += layer_s[static_cast<std::size_t>(k)];
  return t + std::min(end - first, block_layers) * block_s;
}

double PartitionCosts::bytes(int s, int first, int end) const {
  double state = 0, act = 0;
  for (int k = first; k < end; ++k) {
    state += layer_bytes[static_cast<std::size_t>(k)];
    act += act_bytes[static_cast<std::size_t>(k)];
  }
  act -= std::min(end - first, block_layers) * block_act_bytes;
  return stage_bytes[static_cast<std::size_t>(s)] + state + act_scale[static_cast<std::size_t>(s)] * std::max(0.0, act);
}

std::optional<Partition> partition(const PartitionCosts& c, Objective objective) {
  check_costs(c);
  const Table t(c);
  if (t.lowest_end(t.stages() - 1) > t.layers()) return std::nullopt;  // more middle stages than layers
  // The optimum of the objective, then (memory) the slowest stage within it, then the most even split
  // within both.
  Pass first;
  first.by_bytes = objective == Objective::memory;
  // An even split that fits bounds the optimum from above: capping the first pass at it prunes the search
  // without losing the optimum.
  if (auto cap = even_split_value(t, first.by_bytes)) (first.by_bytes ? first.bytes_cap : first.time_cap) = with_slack(*cap);
  const Solved opt = solve(t, first);
  if (opt.value == kInf) return std::nullopt;
  Pass even;
  even.sum_of_squares = true;
  if (objective == Objective::memory) {
    even.bytes_cap = with_slack(opt.value);
    Pass fastest;
    fastest.bytes_cap = even.bytes_cap;
    even.time_cap = with_slack(solve(t, fastest).value);
  } else {
    even.time_cap = with_slack(opt.value);
  }
  const Solved chosen = solve(t, even);
  TESSEL_CHECK(chosen.value < kInf, "partition: the optimum's own split was lost within its caps");
  Partition out;
  out.layers = chosen.layers;
  for (int s = 0, first_layer = 0; s < t.stages(); first_layer += out.layers[static_cast<std::size_t>(s)], ++s) {
    const int end = first_layer + out.layers[static_cast<std::size_t>(s)];
    out.slowest_s = std::max(out.slowest_s, c.time(s, first_layer, end));
    out.largest_bytes = std::max(out.largest_bytes, c.bytes(s, first_layer, end));
  }
  return out;
}

}  // namespace tessel
