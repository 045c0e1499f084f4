// ASCII and SVG timelines of a unit-cost simulated schedule.
#include "sim/schedule/timeline.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "traces/svg.hpp"

namespace tessel::sched {

namespace {

char glyph(const Schedule& s, const Action& a) {
  char c = 'X';
  switch (a.type) {
    case ActionType::F: c = 'F'; break;
    case ActionType::B: c = 'B'; break;
    case ActionType::I: c = 'I'; break;
    case ActionType::W: c = 'W'; break;
    case ActionType::RECOMPUTE: c = 'R'; break;
    default: return 'X';
  }
  return s.chunk_of(a.stage) == 0 ? c : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

const char* colour(ActionType t) {
  switch (t) {
    case ActionType::F: return "#4e79a7";  // blue
    case ActionType::B: return "#8e6bb5";  // purple: full backward
    case ActionType::I: return "#f28e2b";  // orange: input grad
    case ActionType::W: return "#59a14f";  // green: weight grad
    default: return "#9c755f";
  }
}

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return buf;
}

}  // namespace

std::string ascii_timeline(const Schedule& s, const SimResult& sim, int width) {
  const double span = sim.makespan > 0 ? sim.makespan : 1.0;
  // One column per time unit when it fits, else scale down.
  const int cols = std::max(1, std::min(width, static_cast<int>(std::ceil(span))));
  const double per_col = span / cols;
  std::string out;
  for (int r = 0; r < s.num_ranks; ++r) {
    std::string row(static_cast<std::size_t>(cols), '.');
    for (std::size_t p = 0; p < s.ranks[r].size(); ++p) {
      const Action& a = s.ranks[r][p];
      if (!is_compute(a.type)) continue;
      const auto& t = sim.times[r][p];
      // Mark every column whose centre lies inside [start, end).
      for (int c = 0; c < cols; ++c) {
        const double mid = (c + 0.5) * per_col;
        if (mid >= t.start && mid < t.end) row[static_cast<std::size_t>(c)] = glyph(s, a);
      }
    }
    char head[32];
    std::snprintf(head, sizeof head, "rank %-3d |", r);
    out += head + row + "|  bubble " + fmt(100.0 * sim.bubble[r] / span) + "%\n";
  }
  out += "makespan " + fmt(sim.makespan) + " (" + fmt(per_col) + " per column), bubble rate " +
         fmt(100.0 * sim.bubble_rate) + "%\n";
  out += "legend: F forward, B full backward, I input grad, W weight grad, X overlapped F&B, . idle; lower case = "
         "a rank's later stages\n";
  return out;
}

std::string svg_timeline(const Schedule& s, const SimResult& sim) {
  const double span = sim.makespan > 0 ? sim.makespan : 1.0;
  const double left = 70, top = 30, row_h = 28, plot_w = std::clamp(span * 12.0, 600.0, 1800.0);
  const double scale = plot_w / span;
  const double height = top + s.num_ranks * row_h + 60, width = left + plot_w + 20;
  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt(width) + "\" height=\"" + fmt(height) +
                  "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o += "<text x=\"" + fmt(left) + "\" y=\"18\" font-size=\"13\">" + trace::xml_escape(s.generator) + ": pp " + std::to_string(s.num_ranks) +
       ", " + std::to_string(s.num_stages) + " stages, " + std::to_string(s.num_microbatches) + " micro-batches; makespan " +
       fmt(sim.makespan) + ", bubble " + fmt(100 * sim.bubble_rate) + "%</text>\n";
  for (int r = 0; r < s.num_ranks; ++r) {
    const double y = top + r * row_h;
    o += "<text x=\"4\" y=\"" + fmt(y + row_h * 0.65) + "\">rank " + std::to_string(r) + "</text>\n";
    // Idle background: whatever the ops do not cover stays visible as a bubble.
    o += "<rect x=\"" + fmt(left) + "\" y=\"" + fmt(y + 2) + "\" width=\"" + fmt(plot_w) + "\" height=\"" +
         fmt(row_h - 4) + "\" fill=\"#e6e6e6\"/>\n";
    for (std::size_t p = 0; p < s.ranks[r].size(); ++p) {
      const Action& a = s.ranks[r][p];
      if (!is_compute(a.type)) continue;
      const auto& t = sim.times[r][p];
      const double x = left + t.start * scale, w = std::max(1.0, (t.end - t.start) * scale);
      std::vector<Action> parts = a.type == ActionType::OVERLAP_F_B ? a.sub : std::vector<Action>{a};
      const double h = (row_h - 4) / static_cast<double>(parts.size());
      for (std::size_t k = 0; k < parts.size(); ++k) {
        const bool later = s.chunk_of(parts[k].stage) > 0;  // later local stages drawn lighter
        o += "<rect x=\"" + fmt(x) + "\" y=\"" + fmt(y + 2 + k * h) + "\" width=\"" + fmt(w) + "\" height=\"" + fmt(h) +
             "\" fill=\"" + colour(parts[k].type) + "\" fill-opacity=\"" + (later ? "0.6" : "1") +
             "\" stroke=\"white\" stroke-width=\"0.5\"><title>" + parts[k].token() + "</title></rect>\n";
      }
      if (w >= 14)
        o += "<text x=\"" + fmt(x + w / 2) + "\" y=\"" + fmt(y + row_h * 0.65) + "\" text-anchor=\"middle\" fill=\"white\">" +
             std::to_string(parts[0].mb) + "</text>\n";
    }
  }
  const double ly = top + s.num_ranks * row_h + 25;
  double lx = left;
  for (auto [name, t] : {std::pair{"F forward", ActionType::F}, {"B full backward", ActionType::B},
                         {"I input grad", ActionType::I}, {"W weight grad", ActionType::W}}) {
    o += "<rect x=\"" + fmt(lx) + "\" y=\"" + fmt(ly - 10) + "\" width=\"12\" height=\"12\" fill=\"" + colour(t) + "\"/>";
    o += "<text x=\"" + fmt(lx + 16) + "\" y=\"" + fmt(ly) + "\">" + name + "</text>\n";
    lx += 130;
  }
  o += "<rect x=\"" + fmt(lx) + "\" y=\"" + fmt(ly - 10) + "\" width=\"12\" height=\"12\" fill=\"#e6e6e6\"/><text x=\"" +
       fmt(lx + 16) + "\" y=\"" + fmt(ly) + "\">idle (bubble)</text>\n";
  o += "<text x=\"" + fmt(left) + "\" y=\"" + fmt(ly + 20) + "\">time 0 .. " + fmt(sim.makespan) +
       " (unit costs); lighter = later local stage; split box = overlapped F&amp;B</text>\n</svg>\n";
  return o;
}

}  // namespace tessel::sched
