// The goodput-against-interval figure (goodput_mc.hpp: goodput_svg).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "sim/goodput_mc.hpp"

namespace tessel::goodput {

namespace {

constexpr double kWidth = 760, kHeight = 440, kLeft = 70, kRight = 24, kTop = 48, kBottom = 64;

std::string num(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// A duration as a tick label: "30 s", "5 min", "2 h".
std::string duration(double s) {
  const auto in = [](double v, const char* unit) {
    return num(v, std::abs(v - std::round(v)) < 0.05 || v >= 10 ? 0 : 1) + " " + unit;
  };
  if (s < 60) return in(s, "s");
  if (s < 3600) return in(s / 60, "min");
  if (s < 86400) return in(s / 3600, "h");
  return in(s / 86400, "d");
}

struct Axes {
  double x_lo, x_hi, y_lo, y_hi;  // log10 seconds; goodput in percent
  double x(double seconds) const {
    return kLeft + (std::log10(seconds) - x_lo) / (x_hi - x_lo) * (kWidth - kLeft - kRight);
  }
  double y(double goodput) const {
    return kTop + (y_hi - 100.0 * goodput) / (y_hi - y_lo) * (kHeight - kTop - kBottom);
  }
};

// The y range: every plotted value, widened to whole steps of `step` percent.
Axes axes_for(const std::vector<CurvePoint>& curve) {
  double lo = 100, hi = 0;
  for (const CurvePoint& c : curve) {
    lo = std::min(lo, 100 * c.closed_form);
    hi = std::max(hi, 100 * c.closed_form);
    if (c.simulated) {
      lo = std::min(lo, 100 * c.p10_goodput);
      hi = std::max(hi, 100 * c.p90_goodput);
    }
  }
  const double step = hi - lo > 20 ? 10 : hi - lo > 5 ? 2 : 1;
  Axes a;
  a.y_lo = std::floor(lo / step) * step;
  a.y_hi = std::max(a.y_lo + step, std::ceil(hi / step) * step);
  a.x_lo = std::log10(curve.front().interval_s);
  a.x_hi = std::max(a.x_lo + 1e-9, std::log10(curve.back().interval_s));
  return a;
}

void grid(std::ostringstream& os, const Axes& a) {
  const double step = a.y_hi - a.y_lo > 20 ? 10 : a.y_hi - a.y_lo > 5 ? 2 : 1;
  for (double g = a.y_lo; g <= a.y_hi + 1e-9; g += step) {
    const double y = a.y(g / 100.0);
    os << "<line x1='" << kLeft << "' y1='" << y << "' x2='" << kWidth - kRight << "' y2='" << y
       << "' stroke='#ddd'/><text x='" << kLeft - 6 << "' y='" << y + 4 << "' text-anchor='end'>" << num(g, 0)
       << "%</text>\n";
  }
  // Ticks at round durations: seconds, minutes, hours, days.
  const double marks[] = {1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 86400, 172800, 604800};
  for (double m : marks) {
    if (std::log10(m) < a.x_lo || std::log10(m) > a.x_hi) continue;
    const double x = a.x(m);
    os << "<line x1='" << x << "' y1='" << kTop << "' x2='" << x << "' y2='" << kHeight - kBottom
       << "' stroke='#eee'/><text x='" << x << "' y='" << kHeight - kBottom + 16 << "' text-anchor='middle'>"
       << duration(m) << "</text>\n";
  }
}

void marker(std::ostringstream& os, const Axes& a, double seconds, const std::string& label, const char* colour, int row) {
  if (std::log10(seconds) < a.x_lo || std::log10(seconds) > a.x_hi) return;
  const double x = a.x(seconds);
  os << "<line x1='" << x << "' y1='" << kTop << "' x2='" << x << "' y2='" << kHeight - kBottom << "' stroke='" << colour
     << "' stroke-dasharray='4 3'/><text x='" << x + 4 << "' y='" << kTop + 12 + 14 * row << "' fill='" << colour << "'>"
     << label << "</text>\n";
}

}  // namespace

std::string goodput_svg(const Plan& p, const std::vector<CurvePoint>& curve, const std::string& title) {
  std::ostringstream os;
  os << "<svg xmlns='http://www.w3.org/2000/svg' width='" << kWidth << "' height='" << kHeight
     << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n"
     << "<text x='" << kLeft << "' y='20' font-size='14'>" << title << "</text>\n";
  if (curve.empty()) return os.str() + "</svg>\n";
  const Axes a = axes_for(curve);
  grid(os, a);
  os << "<polyline fill='none' stroke='#1f77b4' stroke-width='2' points='";
  for (const CurvePoint& c : curve) os << a.x(c.interval_s) << "," << a.y(c.closed_form) << " ";
  os << "'/>\n";
  for (const CurvePoint& c : curve) {
    if (!c.simulated) continue;
    const double x = a.x(c.interval_s);
    os << "<line x1='" << x << "' y1='" << a.y(c.p10_goodput) << "' x2='" << x << "' y2='" << a.y(c.p90_goodput)
       << "' stroke='#ff7f0e'/><circle cx='" << x << "' cy='" << a.y(c.monte_carlo) << "' r='4' fill='#ff7f0e'/>\n";
  }
  marker(os, a, p.daly_s, "Daly " + duration(p.daly_s), "#2ca02c", 0);
  marker(os, a, p.young_s, "Young " + duration(p.young_s), "#9467bd", 1);
  const double bottom = kHeight - kBottom;
  os << "<line x1='" << kLeft << "' y1='" << bottom << "' x2='" << kWidth - kRight << "' y2='" << bottom
     << "' stroke='black'/><line x1='" << kLeft << "' y1='" << kTop << "' x2='" << kLeft << "' y2='" << bottom
     << "' stroke='black'/>\n<text x='" << (kLeft + kWidth - kRight) / 2 << "' y='" << kHeight - 24
     << "' text-anchor='middle'>checkpoint interval (computation between checkpoints, log scale)</text>\n"
     << "<text x='16' y='" << (kTop + bottom) / 2 << "' transform='rotate(-90 16 " << (kTop + bottom) / 2
     << ")' text-anchor='middle'>goodput</text>\n"
     << "<text x='" << kLeft << "' y='" << kHeight - 6 << "' fill='#1f77b4'>line: closed form (Daly 2006)</text>"
     << "<text x='" << kLeft + 240 << "' y='" << kHeight - 6
     << "' fill='#ff7f0e'>points: Monte Carlo mean, bars P10-P90</text>\n</svg>\n";
  return os.str();
}

}  // namespace tessel::goodput
