#include "traces/summary.hpp"

#include <map>

#include "traces/compare.hpp"

namespace tessel::trace {

TraceSummary summarize(const Trace& t) {
  TraceSummary s;
  s.source = "tessel";
  s.step_us = trace_end_us(t) - trace_begin_us(t);
  auto ranks = rank_stats(t);
  s.ranks = static_cast<int>(ranks.size());
  double n = std::max(1.0, static_cast<double>(ranks.size()));
  for (const auto& r : ranks) {
    s.compute_us += r.busy_us / n;
    s.comm_us += r.comm_us / n;
    s.exposed_comm_us += r.exposed_comm_us / n;
  }
  std::map<std::string, CategoryTime> cats;
  for (const auto& e : t.events) {
    auto& c = cats[e.op];
    c.name = e.op;
    c.count += 1 / n;
    c.total_us += e.dur_us / n;
  }
  for (auto& [k, v] : cats) s.categories.push_back(v);
  return s;
}

TraceSummary summarize(const kineto::KinetoTrace& k) {
  TraceSummary s;
  s.source = "pytorch profiler";
  s.ranks = 1;
  s.steps = std::max<int>(1, static_cast<int>(k.steps.size()));
  double n = s.steps;
  s.step_us = k.step_time_us();
  s.compute_us = k.gpu_busy_us / n;
  s.comm_us = k.comm_us / n;
  s.exposed_comm_us = k.exposed_comm_us / n;
  for (int c = 0; c < kineto::kNumCategories; ++c) {
    const auto& t = k.totals[c];
    if (t.count == 0) continue;
    s.categories.push_back({kineto::category_name(static_cast<kineto::Category>(c)), static_cast<double>(t.count) / n, t.total_us / n});
  }
  return s;
}

namespace {

nlohmann::json one(const TraceSummary& s) {
  auto cats = nlohmann::json::object();
  for (const auto& c : s.categories) cats[c.name] = {{"count", c.count}, {"total_us", c.total_us}};
  return {{"source", s.source}, {"ranks", s.ranks}, {"steps", s.steps}, {"step_us", s.step_us},
          {"compute_us", s.compute_us}, {"comm_us", s.comm_us}, {"exposed_comm_us", s.exposed_comm_us},
          {"categories", cats}};
}

}  // namespace

nlohmann::json summary_json(const TraceSummary& a, const TraceSummary& b) {
  double err = a.step_us > 0 ? (b.step_us - a.step_us) / a.step_us * 100.0 : 0.0;
  return {{"mode", "summary"}, {"a", one(a)}, {"b", one(b)}, {"step_error_pct", err}};
}

}  // namespace tessel::trace
