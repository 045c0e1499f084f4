// Fits a system's efficiency numbers to published measurements by grid search, each candidate judged by
// validate's own prediction of the rows (sim/validate.hpp: the same row-to-model mapping, layouts, metrics and
// errors as `tessel validate --system`). The A100 preset's GEMM ceiling, K overhead, memory and NVLink
// efficiencies were fitted this way once, to Korthikanti et al. Table 4 (22B per-layer forward and backward
// times), and every other validation row is predicted with them, never fitted.
//
// The objective is the mean absolute percentage error over every value the rows measured that validate
// predicts (MAPE, as validate reports it); the grid is searched exhaustively, in order (the last axis
// fastest), and the first candidate with the lowest MAPE wins.
#pragma once

#include <string>
#include <vector>

#include "sim/system.hpp"
#include "sim/validate.hpp"

namespace tessel::calib {

// One fitted number: its key path in a system file, how it is set on a System, and the values tried.
struct GridAxis {
  std::string field;                  // "gpu.efficiency.gemm"
  void (*set)(System&, double);
  std::vector<double> values;
};

// The grid the A100 preset was fitted on: GEMM ceiling efficiency, K overhead per tile, element-wise memory
// efficiency and the intra-node (NVLink) bus-bandwidth efficiency, five values each (625 candidates).
std::vector<GridAxis> efficiency_grid();

struct PublishedFit {
  System profile;                     // the base with the best value of every axis
  std::vector<double> best;           // per axis, in the grid's order
  double mape_pct = 0;                // over every predicted value of the rows, at the best point
  double max_abs_pct = 0;
  long long candidates = 0;           // grid points evaluated
  ValidationResult at_best;           // validate's report of the rows under the profile
};

// The system preset the rows' GPUs map to (validate's mapping, system_for_gpu); InputError naming an example
// row of each when they map to different presets (one profile holds one GPU's numbers).
std::string rows_system_preset(const Json& rows, const std::string& where);

// `rows`: validate's schema (already filtered, e.g. by select_rows); `where` names the file in messages.
// InputError when the rows were measured on GPUs of different presets (rows_system_preset), or when they
// hold fewer values that validate predicts than there are axes (at least one): the fit would be
// underdetermined.
PublishedFit fit_published(const Json& rows, const std::string& where, const System& base,
                           const std::vector<GridAxis>& grid);

// The profile's "source" text: what was fitted to which rows, at which error, and what was kept.
std::string describe_published_fit(const PublishedFit& f, const std::vector<GridAxis>& grid,
                                   const std::string& rows_origin, const std::string& base_name);

}  // namespace tessel::calib
