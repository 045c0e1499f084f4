// validate --explore-rank (sim/explore/published_rank.hpp): a published layout's rank in explore's search,
// with the row mapped exactly as validate maps it.
#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <string>

#include "sim/explore/published_rank.hpp"
#include "sim/validate.hpp"

using namespace tessel;

namespace {

// A 1.3B GPT on 16 A100s in validate's schema; `layout` is the row's layout object, the id prefix its source.
Json row(const std::string& id, const std::string& layout, int gpus = 16) {
  return parse_json_text(R"({"id":")" + id + R"(","model":{"name":"GPT 1.3B","layers":24,"hidden":2048,"heads":16,
    "vocab":51200,"seq_len":2048},"hardware":{"gpu":"NVIDIA A100 80GB","gpu_count":)" + std::to_string(gpus) +
                             R"(},"layout":)" + layout + R"(,"measured":{"iteration_time_s":1.0}})", "rows.json");
}

Json rows_of(std::initializer_list<Json> r) {
  Json a = Json::array();
  for (const auto& x : r) a.push_back(x);
  return a;
}

const char* kStated = R"({"tp":2,"pp":2,"dp":4,"micro_batch":2,"global_batch":64,"schedule":"1f1b",
  "recompute":"full","sequence_parallel":false,"zero_stage":0})";

// kStated with one field's text replaced.
std::string with(const std::string& from, const std::string& to) {
  std::string t = kStated;
  t.replace(t.find(from), from.size(), to);
  return t;
}

explore::Result everything(const Model& m, const explore::Space& s) {
  explore::Options all;
  all.top_n = INT_MAX;
  all.threads = 2;
  return explore::run(m, load_system("dgx-a100"), 16, 64, s, all);
}

long long place_of(const explore::Result& r, const std::string& layout) {
  for (std::size_t i = 0; i < r.top.size(); ++i)
    if (r.top[i].layout.describe() == layout) return static_cast<long long>(i) + 1;
  return 0;
}

}  // namespace

TEST_CASE("explore-rank: the published step is validate's prediction, its rank its place in explore's list") {
  // A 2021 Megatron-LM row: validate takes it as unfused attention without DP or pipeline overlap, so the
  // searches must run with those conventions, or the published step would not be validate's.
  const Json rows = rows_of({row("narayanan21_x", kStated)});
  const explore::PublishedRanks r = explore::rank_published(rows, "rows.json", nullptr, 2);
  REQUIRE(r.rows.size() == 1);
  const explore::PublishedRank& p = r.rows[0];
  CHECK(p.published == "tp2 pp2 dp4 mbs2 1f1b full");
  CHECK(p.system == "dgx-a100");
  CHECK(p.gpus == 16);
  CHECK(p.global_batch == 64);
  // Expected step: validate's predicted iteration time for the row (the same mapping, the same estimate).
  const ValidationResult v = validate_rows(rows, "rows.json");
  REQUIRE(v.rows.size() == 1);
  REQUIRE(p.full.rank > 0);
  CHECK(p.full.enumerated);
  CHECK(p.full.published.step_s == v.rows[0].predicted);
  CHECK(p.source.published.step_s == v.rows[0].predicted);
  // Expected ranks: the layout's place in explore's whole ranked list under those conventions, over the full
  // space and over Megatron-LM 2021's options (its stack: 1F1B, interleaved; recompute none or full; no SP,
  // no ZeRO).
  const Model m = std::get<MappedRow>(map_row(rows[0], "rows.json[0]")).model;
  explore::Space conv;
  conv.attention = AttentionImpl::unfused;
  conv.overlap_grad_reduce = conv.overlap_param_gather = conv.overlap_p2p = false;
  const explore::Result full = everything(m, conv);
  CHECK(p.full.rank == place_of(full, p.published));
  CHECK(p.full.ranked == full.scored);
  CHECK(p.full.best.layout.describe() == full.top.front().layout.describe());
  explore::Space era = conv;
  era.schedules = {sched::Kind::one_f_one_b, sched::Kind::interleaved};
  era.recompute = {Recompute::none, Recompute::full};
  era.sp = {0};
  era.zero = {0};
  const explore::Result source = everything(m, era);
  CHECK(p.source.rank == place_of(source, p.published));
  CHECK(p.source.ranked == source.scored);
  CHECK(p.source.ranked < p.full.ranked);
  CHECK(p.source.rank <= p.full.rank);
  // The same row with the defaults' conventions (a NeMo row: flash attention, overlaps) ranks another step.
  const explore::PublishedRanks nemo = explore::rank_published(rows_of({row("nemo_x", kStated)}), "rows.json", nullptr, 2);
  REQUIRE(nemo.rows[0].full.rank > 0);
  CHECK(nemo.rows[0].full.published.step_s < p.full.published.step_s);
}

TEST_CASE("explore-rank: the source's options, widened by what the row states, not by what validate chose") {
  // narayanan21: recompute none or full. The row leaves recompute open (validate tries none, selective and
  // full, listing its choice as assumed): selective must not join the 2021 options.
  const std::string open = with(R"("recompute":"full")", R"("recompute":null)");
  const MappedRow a = std::get<MappedRow>(map_row(row("narayanan21_x", open), "r"));
  const explore::SourceOptions o = explore::source_options("narayanan21_x", a.candidates);
  CHECK(o.space.recompute == std::vector<Recompute>{Recompute::none, Recompute::full});
  CHECK(o.space.sp == std::vector<int>{0});
  CHECK(o.what == "stack megatron-lm-2021: schedules 1f1b interleaved; recompute none full; no SP; ZeRO 0");
  // zb24 stating DualPipeV, which the fork's stack does not list: its schedules and the row's own.
  const std::string dpv = with(R"("schedule":"1f1b")", R"("schedule":"dualpipev")");
  const MappedRow b = std::get<MappedRow>(map_row(row("zb24_x", dpv), "r"));
  const explore::SourceOptions z = explore::source_options("zb24_x", b.candidates);
  CHECK(z.space.schedules == std::vector<sched::Kind>{sched::Kind::one_f_one_b, sched::Kind::interleaved,
                                                      sched::Kind::zb1p, sched::Kind::zb2p, sched::Kind::zbv,
                                                      sched::Kind::dualpipev});
  // NeMo: the distributed optimizer beside none; ZeRO 3 where the row states it.
  CHECK(explore::source_options("nemo_x", a.candidates).space.zero == std::vector<int>{0, 1});
  const std::string z3 = with(R"("zero_stage":0)", R"("zero_stage":3)");
  const MappedRow c = std::get<MappedRow>(map_row(row("narayanan21_x", z3), "r"));
  CHECK(explore::source_options("narayanan21_x", c.candidates).space.zero == std::vector<int>{3});
}

TEST_CASE("explore-rank: outside explore's grid ranked where it would stand; too large and unmodelled rows say why") {
  // Micro-batch 5 is not on explore's grid (1, 2, 3, 4, 6, 8): the layout is placed after every ranked layout
  // that is better than it, and said not to be enumerated.
  const std::string five = with(R"("micro_batch":2,"global_batch":64)", R"("micro_batch":5,"global_batch":80)");
  const explore::PublishedRanks r = explore::rank_published(rows_of({row("korthikanti22_x", five)}), "rows.json", nullptr, 2);
  REQUIRE(r.rows.size() == 1);
  const explore::Standing& s = r.rows[0].full;
  CHECK_FALSE(s.enumerated);
  REQUIRE(s.rank > 0);
  const Model m = std::get<MappedRow>(map_row(row("korthikanti22_x", five), "r")).model;
  explore::Space conv;
  conv.attention = AttentionImpl::unfused;
  conv.overlap_grad_reduce = conv.overlap_param_gather = conv.overlap_p2p = false;
  explore::Options all;
  all.top_n = INT_MAX;
  const explore::Result res = explore::run(m, load_system("dgx-a100"), 16, 80, conv, all);
  const long long better = std::count_if(res.top.begin(), res.top.end(), [&](const explore::Scored& x) {
    return explore::better(x, s.published);
  });
  CHECK(s.rank == better + 1);
  // A micro-batch of 32 sequences without recompute on one GPU: Korthikanti et al.'s s b h (34 + 5 a s / h)
  // bytes of activations per layer, without the 5 a s / h score term under flash attention (NeMo's), is
  // 34 x 2048 x 32 x 2048 = 4.6 GB per layer, 109 GB for 24 layers: over 80 GiB. Not ranked; the reason
  // names the memory.
  const explore::PublishedRanks big = explore::rank_published(
      rows_of({row("nemo_big", R"({"tp":1,"pp":1,"dp":2,"micro_batch":32,"global_batch":64,"schedule":"none",
               "recompute":"none","sequence_parallel":false,"zero_stage":0})", 2)}), "rows.json", nullptr, 2);
  REQUIRE(big.rows.size() == 1);
  CHECK(big.rows[0].full.rank == 0);
  CHECK(big.rows[0].full.why_not.rfind("does not fit: needs ", 0) == 0);
  // A row validate skips is listed with validate's reason.
  Json unknown = row("nemo_x", kStated);
  unknown["hardware"]["gpu_count"] = nullptr;
  const explore::PublishedRanks skipped = explore::rank_published(rows_of({unknown}), "rows.json", nullptr, 2);
  CHECK(skipped.rows.empty());
  REQUIRE(skipped.skipped.size() == 1);
  CHECK(skipped.skipped[0].reason == "hardware.gpu_count is not given");
}
