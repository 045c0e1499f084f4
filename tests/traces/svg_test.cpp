// SVG timelines: well-formed, legend and axis present, lanes only where events are, size bounded.
#include <doctest/doctest.h>

#include <cstdlib>

#include "util/atomic_file.hpp"
#include "tests/traces/trace_fixtures.hpp"
#include "traces/svg.hpp"

using namespace tessel;
using namespace tessel::trace;

namespace {

std::size_t count(const std::string& s, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

// Parses with nlohmann? No: SVG is XML. Check balance of the elements we open instead.
void check_balanced(const std::string& svg) {
  CHECK(svg.rfind("<svg ", 0) == 0);
  CHECK(svg.find("</svg>") == svg.size() - 7);
  CHECK(count(svg, "<g ") == count(svg, "</g>"));
  CHECK(count(svg, "<title>") == count(svg, "</title>"));
}

}  // namespace

TEST_CASE("a 1F1B timeline: one lane per used stream, legend, axis, memory curve") {
  Trace t = test::one_f_one_b(4, 8, 10, 20, 1);
  SvgOptions opt;
  opt.title = "1F1B, 4 stages, 8 micro-batches";
  std::string svg = timeline_svg(t, opt);
  check_balanced(svg);
  // 4 ranks x {compute, pp} lanes drawn with the lane background; 4 memory curves.
  CHECK(count(svg, "fill=\"#f3f3f3\"/>") == 8);
  CHECK(count(svg, "<polyline") == 4);
  CHECK(svg.find(">forward</text>") != std::string::npos);
  CHECK(svg.find(">idle (bubble)</text>") != std::string::npos);
  CHECK(svg.find("time (µs)") != std::string::npos);
  CHECK(svg.find("rank 3 (stage 3)") != std::string::npos);
  // Every op is wide enough to be its own rectangle here: 4 x 8 x 2 compute + 2 x 3 x 8 x 2 transfers.
  CHECK(count(svg, "</title></rect>") == 4 * 8 * 2 + 2 * 3 * 8 * 2);
  CHECK(timeline_svg(t, opt) == svg);  // deterministic
  if (const char* out = std::getenv("TESSEL_SVG_OUT")) write_file_atomic(std::string(out) + "/timeline.svg", svg);
}

TEST_CASE("big traces merge sub-pixel events, so the SVG stays small") {
  // 64 stages x 512 micro-batches: 65,536 compute ops and ~129,000 transfers. At 1600 px a lane holds at
  // most ~2 rectangles per pixel column: bound 64 ranks x 2 lanes x 2 x 1430 px rectangles, ~100 bytes each.
  Trace t = test::one_f_one_b(64, 512, 10, 20, 1);
  SvgOptions opt;
  opt.memory = false;
  std::string svg = timeline_svg(t, opt);
  check_balanced(svg);
  std::size_t rects = count(svg, "<rect");
  MESSAGE(t.events.size() << " events -> " << rects << " rects, " << svg.size() / 1e6 << " MB");
  CHECK(rects < 64 * 2 * 2 * 1430);
  CHECK(rects < t.events.size() / 2);
  CHECK(svg.size() < 8'000'000);
  CHECK(count(svg, "</title></rect>") == 0);  // no tooltips beyond the limit
}

TEST_CASE("compare timeline: both traces, differences outlined") {
  Trace a = test::one_f_one_b(4, 8, 10, 20, 1);
  Trace b = test::one_f_one_b(4, 8, 10, 20, 1);
  for (auto& e : b.events) {
    if (e.rank == 2 && e.op == "backward") e.dur_us *= 1.5;  // rank 2's backward 50% slower
  }
  b.events.push_back(test::op(0, Stream::dp, "dp_allreduce", 0, -1, 300, 40));
  Comparison c = compare_traces(a, b);
  std::string svg = compare_svg(a, "sim.json", b, "measured.json", c, SvgOptions{});
  check_balanced(svg);
  CHECK(svg.find("A: sim.json") != std::string::npos);
  CHECK(svg.find("B: measured.json") != std::string::npos);
  // Rank 2's 8 backwards are outlined in both panels; the dp all-reduce exists only in B.
  CHECK(count(svg, "stroke=\"#d00000\" stroke-width=\"2\"") == 2 * 8 + 1);  // + the legend swatch
  CHECK(count(svg, "stroke=\"#ff00ff\" stroke-width=\"2\"") == 1 + 1);
  if (const char* out = std::getenv("TESSEL_SVG_OUT")) write_file_atomic(std::string(out) + "/compare.svg", svg);
}
