// The JSON form of a Comparison (tessel compare --json).
#include "traces/compare.hpp"

namespace tessel::trace {

namespace {

nlohmann::json ranks_json(const std::vector<RankStats>& rs) {
  auto out = nlohmann::json::array();
  for (const auto& r : rs) {
    out.push_back({{"rank", r.rank}, {"busy_us", r.busy_us}, {"bubble_us", r.bubble_us}, {"comm_us", r.comm_us},
                   {"exposed_comm_us", r.exposed_comm_us}});
  }
  return out;
}

nlohmann::json only_json(const std::vector<OnlyIn>& v) {
  auto out = nlohmann::json::array();
  for (const auto& o : v) out.push_back({{"op", o.op}, {"count", o.count}, {"examples", o.examples}});
  return out;
}

nlohmann::json identity_json(const OpEvent& e) {
  return {{"rank", e.rank}, {"op", e.op}, {"stage", e.stage}, {"chunk", e.chunk}, {"mb", e.mb},
          {"layers", {e.layer_begin, e.layer_end}}, {"name", e.name}};
}

}  // namespace

nlohmann::json to_json(const Comparison& c, const Trace& a, const Trace&) {
  nlohmann::json j;
  j["step_us"] = {{"a", c.step_a_us}, {"b", c.step_b_us}, {"error_pct", c.step_error_pct}};
  j["events"] = {{"a", c.events_a}, {"b", c.events_b}, {"matched", c.matched}};
  auto kinds = nlohmann::json::array();
  for (const auto& k : c.kinds) {
    kinds.push_back({{"op", k.op}, {"matched", k.matched}, {"median_error_pct", k.median_error_pct},
                     {"p90_abs_error_pct", k.p90_abs_error_pct}, {"total_a_us", k.total_a_us},
                     {"total_b_us", k.total_b_us}, {"zero_reference", k.zero_reference}});
  }
  j["op_kinds"] = kinds;
  j["ranks"] = {{"a", ranks_json(c.ranks_a)}, {"b", ranks_json(c.ranks_b)}, {"only_in_a", c.ranks_only_in_a},
                {"only_in_b", c.ranks_only_in_b}};
  auto top = nlohmann::json::array();
  for (const auto& d : c.top) {
    auto t = identity_json(a.events[d.a]);
    t["a_us"] = d.a_us;
    t["b_us"] = d.b_us;
    t["delta_us"] = d.delta_us;
    top.push_back(t);
  }
  j["top_contributors"] = top;
  j["only_in"] = {{"a", only_json(c.only_in_a)}, {"b", only_json(c.only_in_b)}};
  auto meta = nlohmann::json::array();
  for (const auto& m : c.meta_diffs) meta.push_back({{"path", m.path}, {"a", m.a}, {"b", m.b}});
  j["other_data_differences"] = meta;
  auto merged = nlohmann::json::array();
  for (const auto& m : c.merged)
    merged.push_back({{"rank", m.rank}, {"op", m.op}, {"ops_a", m.ops_a}, {"ops_b", m.ops_b}, {"bytes_a", m.bytes_a},
                      {"bytes_b", m.bytes_b}});
  j["merged_collectives"] = merged;
  return j;
}

}  // namespace tessel::trace
