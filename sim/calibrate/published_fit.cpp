#include "sim/calibrate/published_fit.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "util/error.hpp"

namespace tessel::calib {

std::vector<GridAxis> efficiency_grid() {
  return {
      {"gpu.efficiency.gemm", [](System& s, double v) { s.gpu.gemm_efficiency = v; }, {0.72, 0.75, 0.78, 0.81, 0.84}},
      {"gpu.efficiency.gemm_k_overhead", [](System& s, double v) { s.gpu.gemm_k_overhead = v; }, {0, 32, 64, 96, 128}},
      // At most 0.9: STREAM-like copies on an A100 reach about 1.8 of its 2.04 TB/s.
      {"gpu.efficiency.memory", [](System& s, double v) { s.gpu.memory_efficiency = v; }, {0.6, 0.7, 0.8, 0.85, 0.9}},
      {"node.intra_efficiency", [](System& s, double v) { s.node.intra_efficiency = v; }, {0.4, 0.5, 0.6, 0.7, 0.8}},
  };
}

std::string rows_system_preset(const Json& rows, const std::string& where) {
  if (!rows.is_array()) throw InputError(where + ": expected a JSON array of rows, got " + json_brief(rows));
  std::map<std::string, std::string> first_row;  // preset -> the first row measured on it
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Json& row = rows[i];
    const std::string id = row.is_object() && row.contains("id") && row["id"].is_string() ? row["id"].get<std::string>()
                                                                                          : where + "[" + std::to_string(i) + "]";
    if (!row.is_object() || !row.contains("hardware") || !row["hardware"].is_object() ||
        !row["hardware"].contains("gpu") || !row["hardware"]["gpu"].is_string())
      throw InputError(where + " (" + id + ").hardware.gpu: must be a string (the GPU the row was measured on)");
    first_row.emplace(system_for_gpu(row["hardware"]["gpu"].get<std::string>(), id), id);
  }
  if (first_row.empty()) throw InputError(where + ": no rows");
  if (first_row.size() == 1) return first_row.begin()->first;
  std::string list;
  for (const auto& [preset, id] : first_row) list += (list.empty() ? "" : ", ") + preset + " (e.g. " + id + ")";
  throw InputError(where + ": the rows were measured on GPUs of different system presets (" + list +
                   "); one profile holds one GPU's numbers: select one GPU's rows with --only");
}

PublishedFit fit_published(const Json& rows, const std::string& where, const System& base,
                           const std::vector<GridAxis>& grid) {
  rows_system_preset(rows, where);
  PublishedFit out;
  std::vector<std::size_t> at(grid.size(), 0);  // the candidate's index on each axis; the last moves fastest
  while (true) {
    System cand = base;
    for (std::size_t a = 0; a < grid.size(); ++a) grid[a].set(cand, grid[a].values[at[a]]);
    ValidationResult v = validate_rows(rows, where, {}, &cand);
    if (out.candidates == 0) {
      const std::size_t need = std::max<std::size_t>(1, grid.size());
      if (v.rows.size() < need)
        throw InputError(where + ": " + std::to_string(v.rows.size()) + " measured value(s) that validate predicts (" +
                         std::to_string(v.skipped.size()) + " row(s) skipped), fewer than the " + std::to_string(need) +
                         " numbers to fit; select rows with more measurements");
    }
    ++out.candidates;
    // Bubble rates (in points) measure the schedule, not the efficiencies on the grid: not in the objective.
    double sum = 0, worst = 0;
    std::size_t n = 0;
    for (const MetricResult& m : v.rows) {
      if (m.points) continue;
      sum += std::fabs(m.error_pct);
      worst = std::max(worst, std::fabs(m.error_pct));
      ++n;
    }
    const double mape = n ? sum / static_cast<double>(n) : 0.0;
    if (out.candidates == 1 || mape < out.mape_pct) {
      out.mape_pct = mape;
      out.max_abs_pct = worst;
      out.profile = cand;
      out.best.clear();
      for (std::size_t a = 0; a < grid.size(); ++a) out.best.push_back(grid[a].values[at[a]]);
      out.at_best = std::move(v);
    }
    // Next grid point, the last axis fastest (as nested loops over the axes in order).
    std::size_t a = grid.size();
    while (a > 0 && ++at[a - 1] == grid[a - 1].values.size()) at[--a] = 0;
    if (a == 0) break;
  }
  return out;
}

std::string describe_published_fit(const PublishedFit& f, const std::vector<GridAxis>& grid,
                                   const std::string& rows_origin, const std::string& base_name) {
  std::ostringstream os;
  os << "Profile fitted by `tessel calibrate --published` to " << f.at_best.rows.size() << " measured values of "
     << rows_origin << " through validate's predictions (grid search of " << f.candidates << " points, lowest MAPE): ";
  for (std::size_t a = 0; a < grid.size(); ++a) os << (a ? ", " : "") << grid[a].field << " " << f.best[a];
  os << "; MAPE " << f.mape_pct << "%, max " << f.max_abs_pct << "%. Every other number is " << base_name << "'s.";
  return os.str();
}

}  // namespace tessel::calib
