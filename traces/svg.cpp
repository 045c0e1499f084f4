#include "traces/svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "util/error.hpp"

namespace tessel::trace {

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

namespace {

constexpr double kLeft = 170, kRight = 20, kLaneH = 14, kLaneGap = 2, kRankGap = 8, kMemH = 30;
constexpr double kAxisH = 34, kLegendH = 24, kTitleH = 26;

enum Mark : unsigned char { none = 0, slower = 1, only_here = 2 };

struct Style {
  const char* color;
  const char* label;
  char letter;
};

// Colour-blind-safe Tableau 10 colours; communication in grey/red so compute phases stand out.
Style style_of(OpClass c) {
  switch (c) {
    case OpClass::forward: return {"#4e79a7", "forward", 'F'};
    case OpClass::backward: return {"#59a14f", "backward", 'B'};
    case OpClass::weight_grad: return {"#76b7b2", "weight grad", 'W'};
    case OpClass::recompute: return {"#f28e2b", "recompute", 'R'};
    case OpClass::optimizer: return {"#9c755f", "optimizer", 'O'};
    case OpClass::p2p: return {"#bab0ac", "send/recv", 'P'};
    case OpClass::collective: return {"#e15759", "collective", 'C'};
    case OpClass::other: return {"#b07aa1", "other", '?'};
  }
  return {"#000000", "?", '?'};
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string esc(const std::string& s) { return xml_escape(s); }

struct Axis {
  double x0, width, span_us;
  double x(double rel_us) const { return x0 + (span_us > 0 ? rel_us / span_us * width : 0); }
};

// Tick spacing 1, 2 or 5 x 10^k giving about 10 ticks; the unit follows the span.
void draw_axis(std::string& o, const Axis& ax, double top, double bottom) {
  double raw = ax.span_us / 10;
  double mag = std::pow(10, std::floor(std::log10(std::max(raw, 1e-3))));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) { step = m * mag; break; }
  }
  const char* unit = ax.span_us >= 2e6 ? "s" : ax.span_us >= 2e3 ? "ms" : "µs";
  double div = ax.span_us >= 2e6 ? 1e6 : ax.span_us >= 2e3 ? 1e3 : 1;
  o += "<g stroke=\"#dddddd\" stroke-width=\"1\">\n";
  for (double t = 0; t <= ax.span_us * (1 + 1e-9); t += step) {
    o += "<line x1=\"" + fmt("%.1f", ax.x(t)) + "\" y1=\"" + fmt("%.1f", top) + "\" x2=\"" + fmt("%.1f", ax.x(t)) +
         "\" y2=\"" + fmt("%.1f", bottom + 4) + "\"/>\n";
  }
  o += "</g>\n<g text-anchor=\"middle\" fill=\"#333333\">\n";
  for (double t = 0; t <= ax.span_us * (1 + 1e-9); t += step) {
    o += "<text x=\"" + fmt("%.1f", ax.x(t)) + "\" y=\"" + fmt("%.1f", bottom + 16) + "\">" + fmt("%g", t / div) + "</text>\n";
  }
  o += "</g>\n<text x=\"" + fmt("%.1f", ax.x0 + ax.width / 2) + "\" y=\"" + fmt("%.1f", bottom + 30) +
       "\" text-anchor=\"middle\" fill=\"#333333\">time (" + unit + ")</text>\n";
}

void draw_legend(std::string& o, double y, bool compare) {
  double x = kLeft;
  for (OpClass c : {OpClass::forward, OpClass::backward, OpClass::weight_grad, OpClass::recompute, OpClass::optimizer,
                    OpClass::p2p, OpClass::collective, OpClass::other}) {
    Style s = style_of(c);
    o += "<rect x=\"" + fmt("%.1f", x) + "\" y=\"" + fmt("%.1f", y) + "\" width=\"12\" height=\"12\" fill=\"" + s.color + "\"/>";
    o += "<text x=\"" + fmt("%.1f", x + 16) + "\" y=\"" + fmt("%.1f", y + 10) + "\">" + s.label + "</text>\n";
    x += 24 + 7.0 * static_cast<double>(std::string(s.label).size());
  }
  o += "<rect x=\"" + fmt("%.1f", x) + "\" y=\"" + fmt("%.1f", y) + "\" width=\"12\" height=\"12\" fill=\"#f3f3f3\" stroke=\"#cccccc\"/>";
  o += "<text x=\"" + fmt("%.1f", x + 16) + "\" y=\"" + fmt("%.1f", y + 10) + "\">idle (bubble)</text>\n";
  x += 110;
  if (compare) {
    o += "<rect x=\"" + fmt("%.1f", x) + "\" y=\"" + fmt("%.1f", y) + "\" width=\"12\" height=\"12\" fill=\"none\" stroke=\"#d00000\" stroke-width=\"2\"/>";
    o += "<text x=\"" + fmt("%.1f", x + 16) + "\" y=\"" + fmt("%.1f", y + 10) + "\">duration differs</text>\n";
    x += 125;
    o += "<rect x=\"" + fmt("%.1f", x) + "\" y=\"" + fmt("%.1f", y) + "\" width=\"12\" height=\"12\" fill=\"none\" stroke=\"#ff00ff\" stroke-width=\"2\"/>";
    o += "<text x=\"" + fmt("%.1f", x + 16) + "\" y=\"" + fmt("%.1f", y + 10) + "\">in one trace only</text>\n";
  }
}

struct Box {
  double x0, x1, dur;  // px, and the µs of the events inside
  OpClass cls;
  unsigned char mark;
  std::size_t count;
  std::size_t first;
};

void emit_box(std::string& o, const Box& b, double y, const Trace& t, bool tooltips) {
  Style s = style_of(b.cls);
  double w = std::max(b.x1 - b.x0, 0.6);  // a sub-pixel op stays visible as a hairline
  o += "<rect x=\"" + fmt("%.1f", b.x0) + "\" y=\"" + fmt("%.1f", y) + "\" width=\"" + fmt("%.1f", w) + "\" height=\"" +
       fmt("%.0f", kLaneH) + "\" fill=\"" + s.color + "\"";
  if (b.mark & only_here) o += " stroke=\"#ff00ff\" stroke-width=\"2\"";
  else if (b.mark & slower) o += " stroke=\"#d00000\" stroke-width=\"2\"";
  const OpEvent& e = t.events[b.first];
  if (tooltips && b.count == 1) {
    o += "><title>" + esc(e.name.empty() ? e.op : e.name) + " (" + esc(e.op) + "): " + fmt("%.3f", e.start_us) + " + " +
         fmt("%.3f", e.dur_us) + " µs</title></rect>\n";
  } else {
    o += "/>\n";
  }
  // A label when it fits: the op's letter and micro-batch, e.g. F12.
  if (b.count == 1 && e.mb >= 0) {
    std::string label = std::string(1, s.letter) + std::to_string(e.mb);
    if (w >= 7.0 * static_cast<double>(label.size()) + 2) {
      o += "<text x=\"" + fmt("%.1f", b.x0 + w / 2) + "\" y=\"" + fmt("%.1f", y + 11) +
           "\" text-anchor=\"middle\" font-size=\"10\" fill=\"#ffffff\">" + label + "</text>\n";
    }
  }
}

// One lane: events in start order. An event joins the open box when together they stay under a pixel,
// when it is itself under a pixel and touches the box, or when it continues a box of the same class
// without a visible gap; what cannot be seen apart is drawn once.
void draw_lane(std::string& o, const Trace& t, std::vector<std::size_t>& idx, double begin, const Axis& ax, double y,
               const std::vector<unsigned char>& marks, bool tooltips) {
  std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return t.events[a].start_us < t.events[b].start_us; });
  o += "<rect x=\"" + fmt("%.1f", ax.x0) + "\" y=\"" + fmt("%.1f", y) + "\" width=\"" + fmt("%.1f", ax.width) +
       "\" height=\"" + fmt("%.0f", kLaneH) + "\" fill=\"#f3f3f3\"/>\n";
  bool open = false;
  Box cur{};
  for (std::size_t i : idx) {
    const OpEvent& e = t.events[i];
    Box b{ax.x(e.start_us - begin), ax.x(e.start_us + e.dur_us - begin), e.dur_us, op_class(e.op),
          static_cast<unsigned char>(marks.empty() ? 0 : marks[i]), 1, i};
    bool tiny_together = b.x1 - cur.x0 < 1.0 || (b.x1 - b.x0 < 1.0 && b.x0 <= cur.x1 + 0.5);
    bool continues = b.cls == cur.cls && b.x0 <= cur.x1 + 0.5 && (b.x1 - b.x0 < 1.0 || cur.x1 - cur.x0 < 1.0);
    if (open && (tiny_together || continues)) {
      if (b.dur > cur.dur) cur.cls = b.cls;  // the merged box shows the class holding most of it
      cur.x1 = std::max(cur.x1, b.x1);
      cur.dur += b.dur;
      cur.mark |= b.mark;
      ++cur.count;
      continue;
    }
    if (open) emit_box(o, cur, y, t, tooltips);
    cur = b;
    open = true;
  }
  if (open) emit_box(o, cur, y, t, tooltips);
}

// Counters of one rank as a step curve, on a scale shared by all ranks; per pixel column the maximum is
// kept so peaks survive the down-sampling.
void draw_memory(std::string& o, const std::vector<const Counter*>& cs, double begin, const Axis& ax, double y, double vmax) {
  o += "<rect x=\"" + fmt("%.1f", ax.x0) + "\" y=\"" + fmt("%.1f", y) + "\" width=\"" + fmt("%.1f", ax.width) +
       "\" height=\"" + fmt("%.0f", kMemH) + "\" fill=\"#fbfbfb\" stroke=\"#eeeeee\"/>\n";
  std::map<long, double> col;
  for (const Counter* c : cs) {
    long px = std::lround(ax.x(c->ts_us - begin));
    auto [it, fresh] = col.emplace(px, c->value);
    if (!fresh) it->second = std::max(it->second, c->value);
  }
  auto yv = [&](double v) { return y + kMemH - (vmax > 0 ? v / vmax * (kMemH - 2) : 0); };
  std::string pts;
  double last = 0;
  bool first = true;
  for (auto [px, v] : col) {
    if (!first) pts += fmt("%.1f", static_cast<double>(px)) + "," + fmt("%.1f", yv(last)) + " ";
    pts += fmt("%.1f", static_cast<double>(px)) + "," + fmt("%.1f", yv(v)) + " ";
    last = v;
    first = false;
  }
  o += "<polyline fill=\"none\" stroke=\"#8c2d04\" stroke-width=\"1.2\" points=\"" + pts + "\"/>\n";
  double peak = 0;
  for (const Counter* c : cs) peak = std::max(peak, c->value);
  o += "<text x=\"" + fmt("%.1f", kLeft - 8) + "\" y=\"" + fmt("%.1f", y + kMemH / 2 + 4) +
       "\" text-anchor=\"end\" font-size=\"10\" fill=\"#8c2d04\">" + esc(cs.front()->name) + " peak " + fmt("%.3g", peak) + "</text>\n";
}

// Draws every rank of `t` from height y; returns the height used.
double draw_panel(std::string& o, const Trace& t, double y0, const Axis& ax, const std::vector<unsigned char>& marks,
                  const SvgOptions& opt) {
  double begin = trace_begin_us(t);
  std::map<int, std::map<int, std::vector<std::size_t>>> lanes;  // rank -> stream -> events
  for (std::size_t i = 0; i < t.events.size(); ++i) lanes[t.events[i].rank][static_cast<int>(t.events[i].stream)].push_back(i);
  std::map<int, std::vector<const Counter*>> mem;
  double vmax = 0;
  if (opt.memory) {
    for (const auto& c : t.counters) {
      mem[c.rank].push_back(&c);
      vmax = std::max(vmax, c.value);
    }
  }
  bool tooltips = t.events.size() <= opt.tooltip_limit;
  double y = y0;
  for (auto& [rank, streams] : lanes) {
    auto pn = t.process_names.find(rank);
    std::string label = pn != t.process_names.end() ? pn->second : "rank " + std::to_string(rank);
    // Long names would run into the lane labels: cut them, and keep the whole name as a tooltip.
    std::string shown = label.size() > 17 ? label.substr(0, 16) + "…" : label;
    o += "<text x=\"8\" y=\"" + fmt("%.1f", y + 11) + "\" font-weight=\"bold\"><title>" + esc(label) + "</title>" +
         esc(shown) + "</text>\n";
    for (auto& [stream, idx] : streams) {
      o += "<text x=\"" + fmt("%.1f", kLeft - 8) + "\" y=\"" + fmt("%.1f", y + 11) + "\" text-anchor=\"end\" font-size=\"10\" fill=\"#666666\">" +
           stream_name(static_cast<Stream>(stream)) + "</text>\n";
      draw_lane(o, t, idx, begin, ax, y, marks, tooltips);
      y += kLaneH + kLaneGap;
    }
    if (auto m = mem.find(rank); m != mem.end()) {
      draw_memory(o, m->second, begin, ax, y, vmax);
      y += kMemH + kLaneGap;
    }
    y += kRankGap;
  }
  return y - y0;
}

std::string header(double w, double h, const std::string& title) {
  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", w) + "\" height=\"" + fmt("%.0f", h) +
                  "\" viewBox=\"0 0 " + fmt("%.0f", w) + " " + fmt("%.0f", h) +
                  "\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"11\">\n";
  o += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  o += "<text x=\"8\" y=\"18\" font-size=\"14\" font-weight=\"bold\">" + esc(title) + "</text>\n";
  return o;
}

}  // namespace

std::string timeline_svg(const Trace& t, const SvgOptions& opt) {
  TESSEL_CHECK(!t.events.empty(), "timeline of an empty trace");
  Axis ax{kLeft, opt.width_px - kLeft - kRight, trace_end_us(t) - trace_begin_us(t)};
  std::string body;
  double top = kTitleH + kLegendH;
  double h = draw_panel(body, t, top, ax, {}, opt);
  std::string o = header(opt.width_px, top + h + kAxisH, opt.title.empty() ? "Tessel timeline" : opt.title);
  draw_legend(o, kTitleH, false);
  draw_axis(o, ax, top, top + h);
  o += body;
  o += "</svg>\n";
  return o;
}

std::string compare_svg(const Trace& a, const std::string& label_a, const Trace& b, const std::string& label_b,
                        const Comparison& c, const SvgOptions& opt) {
  TESSEL_CHECK(!a.events.empty() && !b.events.empty(), "comparison of an empty trace");
  std::vector<unsigned char> ma(a.events.size(), none), mb(b.events.size(), none);
  for (std::size_t i : c.unmatched_a) ma[i] = only_here;
  for (std::size_t j : c.unmatched_b) mb[j] = only_here;
  for (const auto& p : c.pairs) {
    double ref = a.events[p.a].dur_us;
    if (ref > 0 && std::fabs(p.delta_us) / ref * 100.0 > opt.highlight_pct) {
      ma[p.a] = slower;
      mb[p.b] = slower;
    }
  }
  double span = std::max(c.step_a_us, c.step_b_us);
  Axis ax{kLeft, opt.width_px - kLeft - kRight, span};
  double top = kTitleH + kLegendH;
  std::string body;
  double y = top;
  for (int k = 0; k < 2; ++k) {
    const std::string& label = k == 0 ? label_a : label_b;
    double step = k == 0 ? c.step_a_us : c.step_b_us;
    body += "<text x=\"8\" y=\"" + fmt("%.1f", y + 14) + "\" font-size=\"12\" font-weight=\"bold\" fill=\"#1f3a93\">" +
            (k == 0 ? "A: " : "B: ") + esc(label) + " (step " + fmt("%.3f", step / 1e3) + " ms)</text>\n";
    y += 22;
    y += draw_panel(body, k == 0 ? a : b, y, ax, k == 0 ? ma : mb, opt);
    if (k == 0) {
      body += "<line x1=\"0\" x2=\"" + fmt("%.0f", opt.width_px) + "\" y1=\"" + fmt("%.1f", y) + "\" y2=\"" +
              fmt("%.1f", y) + "\" stroke=\"#999999\" stroke-dasharray=\"4,3\"/>\n";
      y += 6;
    }
  }
  std::string o = header(opt.width_px, y + kAxisH, opt.title.empty() ? "Tessel compare: A above, B below" : opt.title);
  draw_legend(o, kTitleH, true);
  draw_axis(o, ax, top, y);
  o += body;
  o += "</svg>\n";
  return o;
}

}  // namespace tessel::trace
