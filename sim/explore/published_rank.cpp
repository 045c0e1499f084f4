#include "sim/explore/published_rank.hpp"

#include "sim/stack.hpp"

#include <algorithm>
#include <climits>
#include <map>

#include "util/error.hpp"

namespace tessel::explore {

namespace {

// describe() with an explicit stage split that is the even one left out: validate writes the split of a
// "one fewer layer on the first and last stage" row even where it comes out even, explore leaves it empty.
std::string layout_key(Layout l, int model_layers) {
  const int stages = l.num_stages();
  if (!l.stage_layers.empty() && model_layers % stages == 0 &&
      std::all_of(l.stage_layers.begin(), l.stage_layers.end(), [&](int n) { return n == model_layers / stages; }))
    l.stage_layers.clear();
  return l.describe();
}

// Whether the space's restrictions (the given vectors) admit the layout, as enumerate() applies them.
bool admits(const Space& s, const Layout& l) {
  auto in = [](const auto& given, auto v) { return given.empty() || std::find(given.begin(), given.end(), v) != given.end(); };
  return in(s.tp, l.tp) && in(s.pp, l.pp) && in(s.cp, l.cp) && in(s.mbs, l.micro_batch) &&
         (l.pp == 1 || in(s.schedules, l.schedule)) &&
         (l.pp == 1 || !sched::takes_vpp_range(l.schedule) || in(s.vpp, l.vpp)) && in(s.recompute, l.recompute) &&
         in(s.sp, l.sequence_parallel ? 1 : 0) && (l.dp * l.cp == 1 || in(s.zero, l.zero_stage));
}

// A row's conventions on a search space: its precision, attention and overlaps (shared by every layout
// validate builds for it).
void apply_conventions(Space& s, const Layout& l) {
  s.precision = l.precision;
  s.attention = l.attention;
  s.cross_entropy = l.cross_entropy;
  s.fp8_recipe = l.fp8_recipe;
  s.unfused = l.unfused;
  s.flash_kernel = l.flash_kernel;
  s.state = l.state;
  s.overlap_grad_reduce = l.overlap_grad_reduce;
  s.overlap_param_gather = l.overlap_param_gather;
  s.overlap_p2p = l.overlap_p2p;
  s.tp_comm_overlap = l.tp_comm_overlap;
}

// What distinguishes one search from another: the model, system, GPUs, batch and the whole space.
std::string search_key(const MappedRow& mr, int gbs, const Space& s) {
  auto ints = [](const std::vector<int>& v) {
    std::string o;
    for (int x : v) o += std::to_string(x) + ",";
    return o;
  };
  std::string k = model_to_json(mr.model).dump() + system_to_json(mr.system).dump() + std::to_string(mr.gpus) + "/" +
                  std::to_string(gbs) + "/" + ints(s.tp) + "/" + ints(s.pp) + "/" + ints(s.cp) + "/" + ints(s.vpp) +
                  "/" + ints(s.mbs) + "/" + ints(s.zero) + "/" + ints(s.sp) + "/";
  for (sched::Kind x : s.schedules) k += std::to_string(static_cast<int>(x)) + ",";
  for (Recompute x : s.recompute) k += "r" + std::to_string(static_cast<int>(x));
  k += "/" + std::to_string(static_cast<int>(s.precision)) + std::to_string(static_cast<int>(s.attention)) +
       std::to_string(static_cast<int>(s.cross_entropy)) + std::to_string(static_cast<int>(s.fp8_recipe.value_or(Fp8Recipe::delayed))) +
       to_string(s.unfused.value_or(Unfused{})) + to_string(s.flash_kernel.value_or(FlashKernel::cudnn)) + std::to_string(static_cast<int>(s.state.main_grads)) +
       std::to_string(static_cast<int>(s.state.moments)) + std::to_string(static_cast<int>(s.state.master_weights)) +
       std::to_string(s.overlap_grad_reduce) + std::to_string(s.overlap_param_gather) + std::to_string(s.overlap_p2p) +
       std::to_string(s.tp_comm_overlap);
  return k;
}

// The published layout's standing in a search's ranked list: the best of its candidates that the space admits
// and that fits, found in the list when enumerated, else placed after every listed layout better than it.
Standing standing_in(const MappedRow& mr, const std::vector<Layout>& published, const Space& space, const Result& res) {
  Standing st;
  st.ranked = static_cast<long long>(res.top.size());
  if (!res.top.empty()) st.best = res.top.front();
  std::optional<Scored> mine;
  std::string problem;
  double least_peak = 0;
  for (const Layout& l : published) {
    if (!admits(space, l)) continue;
    if (auto p = layout_problem(l, mr.model, mr.gpus)) {
      if (problem.empty()) problem = "breaks " + p->rule + ": " + p->message;
      continue;
    }
    try {
      const Estimate e = estimate(mr.model, l, mr.system, mr.gpus);
      if (!e.fits) {
        if (least_peak == 0 || e.peak_memory_bytes < least_peak) {
          least_peak = e.peak_memory_bytes;
          problem = "does not fit: " + memory_message(e);
        }
        continue;
      }
      const Scored s = scored_of(e);
      if (!mine || better(s, *mine)) mine = s;
    } catch (const InfeasibleLayout& err) {
      if (problem.empty()) problem = err.what();
    }
  }
  if (!mine) {
    st.why_not = problem.empty() ? "outside the space searched" : problem;
    return st;
  }
  const std::string key = layout_key(mine->layout, mr.model.layers);
  for (std::size_t i = 0; i < res.top.size(); ++i)
    if (layout_key(res.top[i].layout, mr.model.layers) == key) {
      st.rank = static_cast<long long>(i) + 1;
      st.published = res.top[i];
      return st;
    }
  st.enumerated = false;
  st.published = *mine;
  st.rank = 1 + std::count_if(res.top.begin(), res.top.end(), [&](const Scored& s) { return better(s, *mine); });
  return st;
}

// One row's searches before they run: its mapping, the published layouts, and the two spaces.
struct Pending {
  MappedRow row;
  std::vector<Layout> published;
  std::string chosen;
  int global_batch = 0;
  Space full, source;
  std::string source_what;
};

}  // namespace

SourceOptions source_options(const std::string& id, const std::vector<RowCandidate>& published) {
  using sched::Kind;
  SourceOptions o;
  Space& s = o.space;
  std::string era;
  // What the source's software offered is its stack's (sim/stacks/): schedules, recompute policies, SP,
  // ZeRO stages. A source without a stack: 1F1B and interleaved, no ZeRO.
  if (const auto name = source_stack(id)) {
    const Stack& st = stack_preset(*name);
    s.schedules = st.schedules;
    s.recompute = st.recompute;
    if (!st.sequence_parallel) s.sp = {0};
    s.zero = st.zero;
    era = "stack " + st.name;
  } else {
    s.schedules = {Kind::one_f_one_b, Kind::interleaved};
    s.zero = {0};
    era = "other sources";
  }
  // Narayanan et al.'s ZeRO-3 rows ran DeepSpeed's ZeRO-3, not their Megatron-LM: that is their option.
  const bool zero3 = std::any_of(published.begin(), published.end(), [](const RowCandidate& c) { return c.layout.zero_stage == 3; });
  if (zero3) s.zero = {3};
  // The source ran the published layout, so what the row states of its schedule, recompute, SP and ZeRO is
  // among its options (the Zero Bubble paper's ZB-V rows, say, beyond the fork's first schedules). Values
  // validate chose for null fields are not: it lists them as assumed ("recompute=full").
  auto add = [](auto& options, auto value) {
    if (std::find(options.begin(), options.end(), value) == options.end()) options.push_back(value);
  };
  auto stated = [&](const std::string& field) {
    for (const RowCandidate& c : published)
      for (const std::string& a : c.assumed)
        if (a.rfind(field + "=", 0) == 0) return false;
    return true;
  };
  for (const RowCandidate& c : published) {
    if (c.layout.pp > 1 && stated("schedule")) add(s.schedules, c.layout.schedule);
    if (!s.recompute.empty() && stated("recompute")) add(s.recompute, c.layout.recompute);
    if (!s.sp.empty() && stated("sequence_parallel")) add(s.sp, c.layout.sequence_parallel ? 1 : 0);
    if (stated("zero_stage")) add(s.zero, c.layout.zero_stage);
  }
  o.what = era + ": schedules";
  for (Kind k : s.schedules) o.what += std::string(" ") + sched::name(k);
  if (!s.recompute.empty()) {
    o.what += "; recompute";
    for (Recompute r : s.recompute) o.what += " " + to_string(r);
  }
  if (s.sp == std::vector<int>{0}) o.what += "; no SP";
  o.what += "; ZeRO";
  for (int z : s.zero) o.what += " " + std::to_string(z);
  return o;
}

namespace {

// A mapped row's searches: validate's choice among its layouts (the fastest that fits, else the fastest)
// names the published layout and its batch (rows that leave both the global batch and the micro-batch open
// have one batch per micro-batch size); a row none of whose layouts is feasible is skipped, as validate does.
std::variant<Pending, SkippedRow> prepare(MappedRow row) {
  const RowCandidate* chosen = nullptr;
  std::optional<Estimate> best;
  std::string reason = "the row allows no layout";
  for (const RowCandidate& c : row.candidates) {
    try {
      const Estimate e = estimate(row.model, c.layout, row.system, row.gpus);
      if (!best || (e.fits && !best->fits) || (e.fits == best->fits && e.step_s < best->step_s)) {
        best = e;
        chosen = &c;
      }
    } catch (const InfeasibleLayout& err) {
      reason = err.what();
    }
  }
  if (!chosen) return SkippedRow{row.id, "no feasible layout: " + reason};
  Pending p;
  p.chosen = chosen->layout.describe();
  p.global_batch = chosen->layout.global_batch;
  for (const RowCandidate& c : row.candidates)
    if (c.layout.global_batch == p.global_batch) p.published.push_back(c.layout);
  apply_conventions(p.full, chosen->layout);
  const SourceOptions so = source_options(row.id, row.candidates);
  p.source = so.space;
  apply_conventions(p.source, chosen->layout);
  p.source_what = so.what;
  p.row = std::move(row);
  return p;
}

}  // namespace

PublishedRanks rank_published(const Json& rows, const std::string& where, const System* system_override, int threads) {
  if (!rows.is_array()) throw InputError(where + ": expected a JSON array of rows, got " + json_brief(rows));
  PublishedRanks out;
  std::vector<Pending> pending;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    auto mapped = map_row(rows[i], where + "[" + std::to_string(i) + "]", system_override);
    auto prepared = std::holds_alternative<SkippedRow>(mapped) ? std::variant<Pending, SkippedRow>(std::get<SkippedRow>(mapped))
                                                               : prepare(std::move(std::get<MappedRow>(mapped)));
    if (auto* skip = std::get_if<SkippedRow>(&prepared)) out.skipped.push_back(std::move(*skip));
    else pending.push_back(std::move(std::get<Pending>(prepared)));
  }
  // Each distinct search once, in the order rows first need it; its ranked list is dropped when done.
  std::map<std::string, std::vector<std::pair<std::size_t, bool>>> users;  // key -> (pending row, source space?)
  std::vector<std::string> order;
  for (std::size_t i = 0; i < pending.size(); ++i)
    for (bool src : {false, true}) {
      const Space& s = src ? pending[i].source : pending[i].full;
      const std::string key = search_key(pending[i].row, pending[i].global_batch, s);
      if (users[key].empty()) order.push_back(key);
      users[key].emplace_back(i, src);
    }
  out.rows.resize(pending.size());
  Options opt;
  opt.top_n = INT_MAX;
  opt.threads = threads;
  for (const std::string& key : order) {
    const auto& [first, first_src] = users[key].front();
    const Pending& f = pending[first];
    const Space& space = first_src ? f.source : f.full;
    const Result res = run(f.row.model, f.row.system, f.row.gpus, f.global_batch, space, opt);
    for (const auto& [i, src] : users[key]) {
      const Pending& p = pending[i];
      (src ? out.rows[i].source : out.rows[i].full) = standing_in(p.row, p.published, src ? p.source : p.full, res);
    }
  }
  for (std::size_t i = 0; i < pending.size(); ++i) {
    PublishedRank& r = out.rows[i];
    r.id = pending[i].row.id;
    r.model = pending[i].row.model.name;
    r.system = pending[i].row.system.name;
    r.gpus = pending[i].row.gpus;
    r.global_batch = pending[i].global_batch;
    r.published = pending[i].chosen;
    r.source_options = pending[i].source_what;
  }
  return out;
}

Json published_ranks_to_json(const PublishedRanks& r) {
  auto standing = [](const Standing& s) {
    Json j;
    j["rank"] = s.rank > 0 ? Json(s.rank) : Json();
    j["ranked"] = s.ranked;
    j["enumerated"] = s.enumerated;
    if (s.rank > 0) j["published"] = scored_to_json(s.published);
    else j["why_not"] = s.why_not;
    if (s.ranked > 0) j["best"] = scored_to_json(s.best);
    return j;
  };
  Json j;
  j["rows"] = Json::array();
  for (const auto& p : r.rows)
    j["rows"].push_back({{"id", p.id}, {"model", p.model}, {"system", p.system}, {"gpus", p.gpus},
                         {"global_batch", p.global_batch}, {"published", p.published}, {"full_space", standing(p.full)},
                         {"source_options", standing(p.source)}, {"source_options_text", p.source_options}});
  j["skipped"] = Json::array();
  for (const auto& s : r.skipped) j["skipped"].push_back({{"id", s.id}, {"reason", s.reason}});
  return j;
}

}  // namespace tessel::explore
