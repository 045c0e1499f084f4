// SVG timelines a person can read: one row per rank, a lane per stream that has events, a time axis with
// ticks and units, F/B/W/recompute/optimizer/communication colours with a legend, idle time (bubbles)
// left empty on a light lane background, and an optional memory curve per rank from the counters.
//
// Size stays bounded for big traces: events narrower than a pixel are merged with their neighbours on
// the lane, so a lane holds at most about two rectangles per pixel column whatever the event count.
#pragma once

#include <string>

#include "traces/compare.hpp"
#include "traces/trace.hpp"

namespace tessel::trace {

struct SvgOptions {
  double width_px = 1600;
  bool memory = true;           // draw counters as a memory curve under each rank
  std::string title;
  double highlight_pct = 10;    // compare: outline ops whose duration differs by more than this
  std::size_t tooltip_limit = 20000;  // <title> tooltips only when a panel has at most this many events
};

std::string timeline_svg(const Trace& t, const SvgOptions& opt);
// Text for SVG/XML content and attribute values: < > & " escaped.
std::string xml_escape(const std::string& s);

// Two timelines one above the other on one time axis (each from its own first event): ops whose
// duration differs by more than highlight_pct are outlined in red, ops present in one trace only in
// magenta. `c` is compare_traces(a, b).
std::string compare_svg(const Trace& a, const std::string& label_a, const Trace& b, const std::string& label_b,
                        const Comparison& c, const SvgOptions& opt);

}  // namespace tessel::trace
