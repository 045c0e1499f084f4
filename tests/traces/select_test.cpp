// Rank selection and identical-rank collapsing for readable timelines of large layouts.
#include <doctest/doctest.h>

#include "traces/select.hpp"
#include "trace_fixtures.hpp"
#include "util/error.hpp"

using namespace tessel;
using trace::Stream;

TEST_CASE("parse_rank_list: ranges and single ranks, in order, each once; bad entries named") {
  CHECK(trace::parse_rank_list("0-3,64,2", "--trace-ranks", 128) == std::vector<int>{0, 1, 2, 3, 64});
  CHECK_THROWS_AS(trace::parse_rank_list("0-3,,5", "--trace-ranks", 8), InputError);
  CHECK_THROWS_AS(trace::parse_rank_list("5-2", "--trace-ranks", 8), InputError);
  try {
    trace::parse_rank_list("0-8", "--trace-ranks", 8);
    FAIL("rank 8 of 8 accepted");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("--trace-ranks 0-8") == 0);
  }
}

TEST_CASE("collapse_identical_ranks draws each run of identical ranks once and keeps differing ones apart") {
  // Ranks 0-3 play the same two ops at the same times (a stage's tensor-parallel ranks); rank 4 starts one
  // microsecond later; rank 5 is identical to 0-3 but not next to them, so it stays on its own.
  trace::Trace t;
  for (int r : {0, 1, 2, 3, 5}) {
    t.events.push_back(test::op(r, Stream::compute, "forward", 0, 0, 0, 10));
    t.events.push_back(test::op(r, Stream::compute, "backward", 0, 0, 10, 20));
    t.process_names[r] = "rank " + std::to_string(r) + " (stage 0)";
  }
  t.events.push_back(test::op(4, Stream::compute, "forward", 0, 0, 1, 10));
  t.process_names[4] = "rank 4 (stage 0)";
  const trace::Trace c = trace::collapse_identical_ranks(t);
  REQUIRE(c.process_names.size() == 3);
  CHECK(c.process_names.at(0) == "ranks 0-3 (4 identical): rank 0 (stage 0)");
  CHECK(c.process_names.at(4) == "rank 4 (stage 0)");
  CHECK(c.process_names.at(5) == "rank 5 (stage 0)");
  CHECK(c.events.size() == 2 + 1 + 2);
  // Selecting keeps only the listed ranks' events.
  const trace::Trace s = trace::select_ranks(t, {4, 5});
  CHECK(s.events.size() == 3);
  CHECK(s.process_names.size() == 2);
}
