// Prediction of published measurements: rows in the schema of shared/validation/published.json (one
// measured configuration each). Each row's GPU maps to a system preset by name; its model and layout are
// built from the row; a layout field the row leaves null is chosen as the best predicted value and listed
// as assumed. Every metric the row measured that Tessel can predict is predicted and its error reported.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sim/system.hpp"  // system_for_gpu: a row's GPU to its preset
#include "util/json_reader.hpp"

namespace tessel {

struct MetricResult {
  std::string id;
  std::string metric;
  double measured = 0;
  double predicted = 0;
  double error_pct = 0;                 // (predicted - measured) / measured * 100; with `points`, (predicted - measured) * 100
  bool points = false;                  // a rate near zero (bubble_rate): the error in percentage points
  std::vector<std::string> assumed;     // "micro_batch=1 (best predicted)", "attention=unfused (Megatron-LM 2021)"
  // Unstated fields are filled with the source stack's defaults (the fastest of what stays open: micro-batch,
  // schedule, vpp); where the fastest fitting choice of every unstated field is another layout, its prediction
  // too, with the values it chose.
  struct BestCase {
    double predicted = 0, error_pct = 0;
    std::vector<std::string> assumed;
  };
  std::optional<BestCase> best_case;
};

struct SkippedRow {
  std::string id;
  std::string reason;
};

// Whether a row's layout fits, against what the source saw: a row with a scored measurement ran (so it fit);
// one whose measured says "out_of_memory": true did not. The prediction is the scored layout's (the stack's
// defaults, the fewest changes that fit where they do not); for a row that ran out of memory, the stack's
// defaults' layout whether or not it fits, since that is what the source ran.
struct MemoryVerdict {
  std::string id;
  bool ran = true;             // false: the source reports it out of memory
  bool predicted_fits = true;  // peak (with the allocator's fragmentation and the system's reserve) within the GPU
  double peak_GiB = 0, capacity_GiB = 0;
  // An fp8 layout that keeps 16-bit weights (its stack's or recipe's reading of a setting the source does not
  // state) has the other reading reported beside it: its peak with fp8 primary weights (Layout::fp8_params).
  std::optional<double> fp8_weights_peak_GiB;
  bool right() const { return ran == predicted_fits; }
};

// The verdicts counted: rows that ran and of them those predicted to fit; rows out of memory and of them those
// predicted not to fit.
struct MemoryCounts {
  int ran = 0, ran_right = 0, out_of_memory = 0, out_of_memory_right = 0;
};
MemoryCounts count_memory_verdicts(const std::vector<MemoryVerdict>& verdicts);

struct ValidationResult {
  std::vector<MetricResult> rows;
  std::vector<MemoryVerdict> memory;  // one per row modelled
  std::vector<SkippedRow> skipped;
  std::map<std::string, double> mape_pct;   // per metric
  std::map<std::string, double> max_abs_pct;
};

// One layout a row allows, with the values it chose for the row's null fields ("micro_batch=2").
struct RowCandidate {
  Layout layout;
  std::vector<std::string> assumed;
  // How many of the row's unstated fields this candidate sets otherwise than the source's stack runs them by
  // default (recompute, sequence parallelism, ZeRO stage; Stack::*_default); 0 for a source without a stack.
  int departures = 0;
};

// A row as validate maps it: the system (its GPU's preset, or the override), the GPU count, the model, what
// the row's source implies (notes: conventions, unstated values), and every layout the row allows, its stated
// fields fixed and the null ones enumerated. validate_rows predicts with the best of the candidates.
struct MappedRow {
  std::string id;
  System system;
  int gpus = 0;
  Model model;
  std::vector<std::string> notes;
  std::vector<RowCandidate> candidates;
};

// Maps row `rw` (its position in the file, for messages) as validate_rows does; a row Tessel cannot model is
// a SkippedRow with the reason; InputError for a malformed row.
std::variant<MappedRow, SkippedRow> map_row(const Json& row, const std::string& rw, const System* system_override = nullptr);

// Step time of a layout by another engine (the event simulator); empty = the analytical estimate alone.
using StepTimeFn = std::function<double(const Model&, const Layout&, const System&)>;

// `where` names the file for messages; InputError if the document is not an array of rows or a row is
// malformed, including a measured value of a metric Tessel predicts that is not a positive number (null: not
// measured). Rows Tessel cannot model (MoE, missing sizes) are listed as skipped with the reason.
// With `step_time`, time-based metrics use it; layout choices for null fields still use the estimate.
// `system_override`, when given, replaces the GPU-name mapping for every row (e.g. a calibrated profile).
ValidationResult validate_rows(const Json& rows, const std::string& where, const StepTimeFn& step_time = {},
                               const System* system_override = nullptr);
Json validation_to_json(const ValidationResult& r);

// The hardware class of a system preset whose rows share one error band: "A100", "Hopper" (H100, H800, H200:
// the same SMs and clocks), "Blackwell"; empty for others (cpu).
std::string hardware_class(const std::string& preset);

// Each scored row's step-time error (a fraction), by the first of its step metrics: iteration time; else
// tokens, samples, model TFLOP/s, TFLOP/s or MFU per GPU, a rate's error r turned into the step's,
// 1/(1+r) - 1. Rows without a step metric (memory only, per-layer times) are absent.
std::map<std::string, double> step_errors(const ValidationResult& r);

// The step-time error bands of scored rows, per hardware class of the rows' GPUs: each row counts once
// (step_errors); the band is their mean absolute value.
std::map<std::string, ErrorBand> step_error_bands(const Json& rows, const ValidationResult& r);

// The rows whose id starts with one of `prefixes` (--only). InputError naming every prefix that matches no
// row, with the first ids of the file, so that a mistyped filter cannot pass as an empty report.
Json select_rows(const Json& rows, const std::string& where, const std::vector<std::string>& prefixes);

}  // namespace tessel
