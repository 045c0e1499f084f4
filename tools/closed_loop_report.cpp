// The closed loop's outputs (tools/closed_loop.hpp): one JSON document, the text tables and the figure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "sim/calibrate/calibration.hpp"
#include "sim/calibrate/trace_events.hpp"
#include "tools/closed_loop.hpp"
#include "tools/format.hpp"

namespace tessel::cmd {

namespace {

// The targets (docs/calibration.md): reported beside the numbers, never enforced (timing is noisy).
constexpr double kTargetStep = 0.10, kTargetOp = 0.15, kTargetTau = 0.8;

Json layout_json(const LoopLayout& l) {
  return {{"name", l.name}, {"tp", l.tp}, {"pp", l.pp}, {"dp", l.dp}, {"vpp", l.vpp}, {"mbs", l.mbs}, {"gbs", l.gbs},
          {"schedule", l.schedule}, {"recompute", l.recompute}, {"sp", l.sp}, {"zero", l.zero}, {"ranks", l.ranks()},
          {"mpirun", l.mpi}};
}

Json row_json(const LoopRow& r) {
  Json ops = Json::array();
  for (const calib::OpError& e : r.ops)
    ops.push_back({{"op", e.op}, {"matched", e.matched}, {"measured_s", e.measured_s}, {"predicted_s", e.predicted_s},
                   {"error_pct", 100 * e.error}});
  Json j = {{"layout", r.layout}, {"ranks", r.ranks}, {"measured_s", r.measured_s}, {"measured_spread_pct", 100 * r.spread},
            {"runs_s", r.runs_s}, {"other_run_s", r.other_run_s}, {"run_to_run_pct", 100 * r.run_to_run()},
            {"predicted_s", r.predicted_s}, {"error_pct", 100 * r.error}, {"ops", ops}};
  if (r.measured_cpu_s >= 0)
    j["host"] = {{"measured_cpu_s", r.measured_cpu_s}, {"measured_run_delay_s", r.measured_run_delay_s},
                 {"measured_idle_s", r.measured_idle_s}, {"predicted_cpu_s", r.predicted_cpu_s},
                 {"predicted_idle_s", r.predicted_idle_s}};
  if (r.steal >= 0) j["steal_pct"] = 100 * r.steal;
  return j;
}

// Why a repeat's numbers cannot be trusted, or "" when they can.
std::string distrust(const LoopRepeat& r) {
  std::ostringstream os;
  os.precision(3);
  if (r.calibration_noise > calib::kNoiseFlag)
    os << "the calibration's measurements vary by " << calib::noise_text(r.calibration_noise) << " between repeats";
  if (r.contention_noise > calib::kNoiseFlag)
    os << (os.str().empty() ? "" : "; ") << r.contention_unsteady
       << ": the host's cores were not steady while the benches ran, so the fitted contention holds part of the time";
  if (r.measurement_noise > calib::kNoiseFlag)
    os << (os.str().empty() ? "" : "; ") << "the held-out runs' steps vary by " << calib::noise_text(r.measurement_noise);
  if (r.run_to_run > calib::kNoiseFlag)
    os << (os.str().empty() ? "" : "; ") << "a held-out layout's two fastest runs differ by " << calib::noise_text(r.run_to_run)
       << " (median over the layouts)";
  if (r.drift > calib::kNoiseFlag)
    os << (os.str().empty() ? "" : "; ") << "a calibration run (" << r.drift_layout << ": " << fmt::seconds(r.drift_from_s)
       << " a step, then " << fmt::seconds(r.drift_to_s) << "), measured again at the end, moved by " << calib::noise_text(r.drift);
  if (r.steal > calib::kNoiseFlag)
    os << (os.str().empty() ? "" : "; ") << "a run lost " << calib::noise_text(r.steal)
       << " of the cores' time to the hypervisor (steal time)";
  if (!os.str().empty())
    os << " (load average " << r.load_before << " before, " << r.load_after << " after): above the "
       << 100 * calib::kNoiseFlag << "% the targets are stated in, so these errors say more about the machine's load than "
       << "about the model";
  return os.str();
}

}  // namespace

Json loop_to_json(const LoopResult& r) {
  Json j;
  j["tool"] = std::string("tessel ") + TESSEL_VERSION;
  j["date"] = r.date;
  j["backend"] = r.backend;
  j["quick"] = r.quick;
  j["runs_per_layout"] = r.runs;
  j["host_cores"] = r.cores;
  j["model"] = model_to_json(r.model);
  Json cal = Json::array(), held = Json::array();
  for (const LoopLayout& l : r.calibration) cal.push_back(layout_json(l));
  for (const LoopLayout& l : r.held_out) held.push_back(layout_json(l));
  j["calibration_layouts"] = cal;
  j["held_out_layouts"] = held;
  Json reps = Json::array();
  std::vector<double> med, opm, tau;
  std::vector<std::vector<double>> measured;
  for (const LoopRepeat& p : r.repeats) {
    measured.emplace_back();
    for (const LoopRow& row : p.rows) measured.back().push_back(row.measured_s);
    Json rows = Json::array();
    for (const LoopRow& row : p.rows) rows.push_back(row_json(row));
    reps.push_back({{"repeat", p.repeat}, {"load_before", p.load_before}, {"load_after", p.load_after},
                    {"profile", p.profile}, {"calibration", p.calibration}, {"rows", rows},
                    {"summary",
                     {{"median_abs_error_pct", 100 * p.median_abs_error},
                      {"op_median_abs_error_pct", 100 * p.op_median_abs_error},
                      {"kendall_tau", p.kendall_tau},
                      {"calibration_noise_pct", p.calibration_noise >= 0 ? Json(100 * p.calibration_noise) : Json(nullptr)},
                      {"contention_noise_pct", p.contention_noise >= 0 ? Json(100 * p.contention_noise) : Json(nullptr)},
                      {"measurement_noise_pct", 100 * p.measurement_noise},
                      {"run_to_run_pct", 100 * p.run_to_run},
                      {"drift_pct", 100 * p.drift},
                      {"drift_layout", p.drift_layout},
                      {"calibration_runs_s", p.calibration_runs_s},
                      {"steal_pct", p.steal >= 0 ? Json(100 * p.steal) : Json(nullptr)},
                      {"trusted", p.trusted},
                      {"untrusted_because", distrust(p)}}}});
    med.push_back(100 * p.median_abs_error);
    opm.push_back(100 * p.op_median_abs_error);
    tau.push_back(p.kendall_tau);
  }
  j["repeats"] = reps;
  const std::vector<double> between = calib::tau_between_repeats(measured);
  j["overall"] = {{"median_abs_error_pct", med}, {"op_median_abs_error_pct", opm}, {"kendall_tau", tau},
                  {"measured_tau_between_repeats", between}};
  if (!between.empty()) {
    double mean = 0;
    for (double x : between) mean += x / static_cast<double>(between.size());
    const calib::TauBounds b = calib::error_free_tau(mean);
    j["overall"]["error_free_tau"] = {{"low", b.low}, {"high", b.high}};
  }
  j["targets"] = {{"median_abs_error_pct", 100 * kTargetStep}, {"op_median_abs_error_pct", 100 * kTargetOp},
                  {"kendall_tau", kTargetTau}, {"noise_pct", 100 * calib::kNoiseFlag}};
  return j;
}

void print_loop(const LoopResult& r) {
  for (const LoopRepeat& p : r.repeats) {
    std::cout << "repeat " << p.repeat << " ("
              << (r.backend == "cuda" ? std::string("cuda, the ranks as threads on one GPU")
                                      : "cpu, " + std::to_string(r.cores) + " cores")
              << "; load average "
              << fmt::fixed(p.load_before, 2) << " before, " << fmt::fixed(p.load_after, 2) << " after; profile "
              << p.profile << ")\n";
    std::vector<std::vector<std::string>> t = {
        {"held-out layout", "ranks", "measured", "spread", "next run", "predicted", "error", "worst op"}};
    for (const LoopRow& row : p.rows) {
      std::string worst = "-";
      double w = -1;
      for (const calib::OpError& e : row.ops)
        if (std::abs(e.error) > w) {
          w = std::abs(e.error);
          worst = e.op + " " + fmt::pct(e.error);
        }
      t.push_back({row.layout, std::to_string(row.ranks), fmt::seconds(row.measured_s), fmt::pct(row.spread),
                   fmt::seconds(row.other_run_s), fmt::seconds(row.predicted_s), fmt::pct(row.error), worst});
    }
    std::cout << fmt::table(t) << "  median |step error| " << fmt::pct(p.median_abs_error) << " (target 10%), median |op "
              << "error| " << fmt::pct(p.op_median_abs_error) << " (target 15%), Kendall tau " << fmt::fixed(p.kendall_tau, 3)
              << " (target 0.8); noise: calibration "
              << (p.calibration_noise >= 0 ? fmt::pct(p.calibration_noise) : std::string("-")) << ", contention "
              << (p.contention_noise >= 0 ? fmt::pct(p.contention_noise) : std::string("-")) << ", held-out runs "
              << fmt::pct(p.measurement_noise) << ", run to run " << fmt::pct(p.run_to_run) << ", drift "
              << fmt::pct(p.drift) << "\n";
    const std::string why = distrust(p);
    std::cout << (why.empty() ? "  trusted: the noises and the drift within 10%\n" : "  NOT TRUSTED: " + why + "\n") << "\n";
  }
}

namespace {

struct Point {
  double measured, predicted;
  int repeat;
};

// One log-log panel at x0 of width w: the y = x line, +-10% dashed, the points.
void panel(std::ostringstream& os, const std::vector<Point>& pts, double x0, double w, double h, const std::string& title) {
  if (pts.empty()) return;
  double lo = 1e300, hi = 0;
  for (const Point& p : pts) {
    lo = std::min({lo, p.measured, p.predicted});
    hi = std::max({hi, p.measured, p.predicted});
  }
  lo /= 1.5;
  hi *= 1.5;
  const double m = 50;
  const auto X = [&](double v) { return x0 + m + (std::log(v) - std::log(lo)) / (std::log(hi) - std::log(lo)) * (w - 2 * m); };
  const auto Y = [&](double v) { return h - m - (std::log(v) - std::log(lo)) / (std::log(hi) - std::log(lo)) * (h - 2 * m); };
  char buf[256];
  for (double f : {1.0, 1.1, 1 / 1.1}) {
    const double a = f > 1 ? lo : lo / f, b = f > 1 ? hi / f : hi;
    std::snprintf(buf, sizeof buf, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"%s/>\n", X(a),
                  Y(a * f), X(b), Y(b * f), f == 1.0 ? "" : " stroke-dasharray=\"4,3\"");
    os << buf;
  }
  std::snprintf(buf, sizeof buf, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"black\"/>\n",
                x0 + m, m, w - 2 * m, h - 2 * m);
  os << buf;
  const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
  for (const Point& p : pts) {
    std::snprintf(buf, sizeof buf, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\" fill-opacity=\"0.75\"/>\n",
                  X(p.measured), Y(p.predicted), colours[p.repeat % 5]);
    os << buf;
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">measured (log, %.3g .. %.3g ms)</text>\n",
                x0 + w / 2, h - 15, 1e3 * lo, 1e3 * hi);
  os << buf;
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"30\" text-anchor=\"middle\">%s</text>\n", x0 + w / 2, title.c_str());
  os << buf;
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\" transform=\"rotate(-90 %.0f %.0f)\" text-anchor=\"middle\">"
                "predicted (log)</text>\n", x0 + 15, h / 2, x0 + 15, h / 2);
  os << buf;
}

}  // namespace

std::string loop_svg(const LoopResult& r) {
  std::vector<Point> steps, ops;
  std::string loads;
  for (const LoopRepeat& p : r.repeats) {
    for (const LoopRow& row : p.rows) {
      steps.push_back({row.measured_s, row.predicted_s, p.repeat});
      for (const calib::OpError& e : row.ops) ops.push_back({e.measured_s, e.predicted_s, p.repeat});
    }
    char b[96];
    std::snprintf(b, sizeof b, "%s%d: %.2f-%.2f%s", loads.empty() ? "" : ", ", p.repeat, p.load_before, p.load_after,
                  p.trusted ? "" : " (NOT TRUSTED)");
    loads += b;
  }
  const double w = 420, h = 420;
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << 2 * w << "\" height=\"" << h + 30
     << "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  panel(os, steps, 0, w, h, "held-out step time (y = x solid, +-10% dashed)");
  panel(os, ops, w, w, h, "per op kind, the compared step's totals");
  os << "<text x=\"" << w << "\" y=\"" << h + 20 << "\" text-anchor=\"middle\">tessel calibrate --closed-loop, " << r.date
     << ", " << r.cores << " cores; colour = repeat; load average per repeat (before-after) " << loads << "</text>\n";
  os << "</svg>\n";
  return os.str();
}

}  // namespace tessel::cmd
