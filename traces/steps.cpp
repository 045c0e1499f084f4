#include "traces/steps.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>

#include "util/error.hpp"

namespace tessel::trace {

namespace {

using Identity = std::tuple<int, std::string, int, int, int, int, int>;

Identity identity(const OpEvent& e) {
  return {e.rank, e.op, e.stage, e.chunk, e.mb, e.layer_begin, e.layer_end};
}

// Optimizer ops per rank, which must agree: every rank steps the same number of times.
int count_steps(const Trace& t, const std::string& origin) {
  std::map<int, int> per_rank;
  for (const auto& e : t.events) per_rank[e.rank] += e.op == "optimizer" ? 1 : 0;
  int steps = 0;
  for (const auto& [rank, n] : per_rank) steps = std::max(steps, n);
  if (steps == 0) return 1;  // no optimizer op (a hand-made or partial trace): one step
  for (const auto& [rank, n] : per_rank) {
    if (n != steps) {
      throw InputError(origin + ": rank " + std::to_string(rank) + " has " + std::to_string(n) + " optimizer ops, other ranks " +
                       std::to_string(steps) + ": every rank records one optimizer op per step");
    }
  }
  return steps;
}

// otherData.first_step: the number of a resumed run's first step; 1 when absent.
int first_step(const Trace& t, const std::string& origin) {
  if (!t.other_data.is_object() || !t.other_data.contains("first_step")) return 1;
  const nlohmann::json& v = t.other_data["first_step"];
  constexpr std::int64_t kMax = std::int64_t{1} << 30;  // tessel run's largest --steps
  if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > kMax)
    throw InputError(origin + ": otherData.first_step: value " + v.dump() + " must be an integer from 1 to " +
                     std::to_string(kMax) + " (the number of the trace's first step)");
  return static_cast<int>(v.get<std::int64_t>());
}

}  // namespace

StepSplit split_steps(const Trace& t, const std::string& origin) {
  const int steps = count_steps(t, origin);
  StepSplit s;
  s.first = first_step(t, origin);
  s.step_of.assign(t.events.size(), 0);
  if (steps > 1) {
    std::map<Identity, std::vector<std::size_t>> repeats;
    for (std::size_t i = 0; i < t.events.size(); ++i) repeats[identity(t.events[i])].push_back(i);
    for (auto& [key, v] : repeats) {
      if (v.size() % static_cast<std::size_t>(steps) != 0) {
        const auto& e = t.events[v.front()];
        throw InputError(origin + ": rank " + std::to_string(e.rank) + " has " + std::to_string(v.size()) + " x '" + e.name +
                         "', not a multiple of its " + std::to_string(steps) +
                         " steps (optimizer ops): a trace of whole steps repeats every op in every step");
      }
      std::stable_sort(v.begin(), v.end(), [&](std::size_t x, std::size_t y) { return t.events[x].start_us < t.events[y].start_us; });
      const std::size_t per_step = v.size() / static_cast<std::size_t>(steps);
      for (std::size_t k = 0; k < v.size(); ++k) s.step_of[v[k]] = static_cast<int>(k / per_step);
    }
  }
  std::vector<double> begin(static_cast<std::size_t>(steps), 0), end(static_cast<std::size_t>(steps), 0);
  std::vector<bool> seen(static_cast<std::size_t>(steps), false);
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const auto k = static_cast<std::size_t>(s.step_of[i]);
    const auto& e = t.events[i];
    begin[k] = seen[k] ? std::min(begin[k], e.start_us) : e.start_us;
    end[k] = seen[k] ? std::max(end[k], e.start_us + e.dur_us) : e.start_us + e.dur_us;
    seen[k] = true;
  }
  for (std::size_t k = 0; k < begin.size(); ++k) s.durations_us.push_back(end[k] - begin[k]);
  return s;
}

StepChoice choose_step(const StepSplit& s, std::optional<int> requested, const std::string& flag,
                       const std::string& origin) {
  StepChoice c;
  c.count = s.count();
  c.first = s.first;
  c.durations_us = s.durations_us;
  const int last = c.first + c.count - 1;
  auto number = [&](int k) { return std::to_string(c.first + k); };  // step k (from 0) as the run numbered it
  if (c.count <= 1) {
    c.rule = "only step";
  } else if (requested) {
    if (*requested < c.first || *requested > last) {
      const std::string held = c.first == 1 ? std::to_string(c.count) + " steps"
                                            : std::to_string(c.count) + " steps, numbered " + number(0) + " to " +
                                                  std::to_string(last) + " (its run resumed after step " +
                                                  std::to_string(c.first - 1) + ")";
      throw InputError(flag + " " + std::to_string(*requested) + ": " + origin + " holds " + held + "; choose " +
                       number(0) + " to " + std::to_string(last));
    }
    c.step = *requested - c.first;
    c.rule = flag;
  } else {
    // Steps 2..S ordered by duration (ties by index); the lower median by nearest rank is one real step.
    std::vector<int> after_warmup;
    for (int k = 1; k < c.count; ++k) after_warmup.push_back(k);
    std::stable_sort(after_warmup.begin(), after_warmup.end(),
                     [&](int x, int y) { return s.durations_us[static_cast<std::size_t>(x)] < s.durations_us[static_cast<std::size_t>(y)]; });
    c.step = after_warmup[(after_warmup.size() - 1) / 2];
    c.rule = c.count == 2 ? "step " + number(1) + ": step " + number(0) + " is warm-up"
                          : "median of steps " + number(1) + "-" + std::to_string(last) + " by duration; step " +
                                number(0) + " is warm-up";
  }
  c.step_us = s.durations_us.empty() ? 0 : s.durations_us[static_cast<std::size_t>(c.step)];
  return c;
}

Trace step_trace(const Trace& t, const StepSplit& s, int step) {
  TESSEL_CHECK(s.step_of.size() == t.events.size(), "step split of another trace");
  Trace out;
  out.process_names = t.process_names;
  out.other_data = t.other_data;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    if (s.step_of[i] == step) out.events.push_back(t.events[i]);
  }
  const double begin = trace_begin_us(out), end = trace_end_us(out);
  for (const auto& c : t.counters) {
    if (c.ts_us >= begin && c.ts_us <= end) out.counters.push_back(c);
  }
  return out;
}

nlohmann::json to_json(const StepChoice& c) {
  return {{"count", c.count},   {"first", c.first},     {"compared", c.first + c.step},
          {"rule", c.rule},     {"step_us", c.step_us}, {"durations_us", c.durations_us}};
}

}  // namespace tessel::trace
