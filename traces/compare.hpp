// Comparing two traces of the same layout (simulated against measured, or two measured runs), op by op.
//
// Ops align by identity (rank, op, stage, chunk, mb, layers) and, for repeated identities, by their order
// on that rank. A is the reference: every error is (B - A) / A.
//
// Data-parallel collectives (op kinds dp_*) are split differently by the two sides: the simulator reduces
// a rank's gradients in one dp_reducescatter, the runtime in one per gradient group. Where the two sides hold
// different counts of one dp_* kind on a rank (the trace being one step), each side's ops of that kind on
// that rank are merged into one, their durations and bytes summed, and the merged ops are paired; equal
// counts keep the one-to-one pairing.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "traces/trace.hpp"

namespace tessel::trace {

struct OpKindStats {
  std::string op;
  std::size_t matched = 0;          // pairs found in both traces
  std::size_t zero_reference = 0;   // pairs with A's duration 0: no relative error for them
  double median_error_pct = 0;      // signed, median over pairs
  double p90_abs_error_pct = 0;     // 90th percentile of |error|
  double total_a_us = 0, total_b_us = 0;  // over matched pairs
};

// Per rank, over the trace's step (its first start to its last end, all ranks together).
struct RankStats {
  int rank = 0;
  double busy_us = 0;          // union of compute ops
  double bubble_us = 0;        // step time - busy - exposed comm: idle, as tessel simulate counts it
  double comm_us = 0;          // union of communication ops
  double exposed_comm_us = 0;  // communication during which this rank computes nothing
};
std::vector<RankStats> rank_stats(const Trace& t);

struct OpDelta {
  std::size_t a = 0, b = 0;  // indices into A's and B's events (a merged pair: each side's first op)
  double a_us = 0, b_us = 0; // the durations compared (a merged pair: each side's sum)
  double delta_us = 0;       // b_us - a_us
};

// One rank's dp_* collectives of one kind, merged on both sides because their counts differ.
struct MergedCollectives {
  int rank = 0;
  std::string op;
  std::size_t ops_a = 0, ops_b = 0;  // ops merged on each side
  double bytes_a = 0, bytes_b = 0;   // their summed bytes
};

struct OnlyIn {
  std::string op;
  std::size_t count = 0;
  std::vector<std::string> examples;  // up to 3 "rank R name" strings
};

struct MetaDiff {
  std::string path;  // JSON pointer into otherData, e.g. /layout/pp
  std::string a, b;  // values as JSON text, "(absent)" when missing
};

struct Comparison {
  double step_a_us = 0, step_b_us = 0, step_error_pct = 0;
  std::size_t events_a = 0, events_b = 0, matched = 0;
  std::vector<OpKindStats> kinds;           // by op name
  std::vector<RankStats> ranks_a, ranks_b;  // each by rank id
  // Rank ids in one trace only (paired by id, never by position): a simulated trace folds each tensor-
  // parallel group into its first rank, so a measured tp2 run's odd ranks have no counterpart in it.
  std::vector<int> ranks_only_in_a, ranks_only_in_b;
  std::vector<OpDelta> top;                 // the largest |delta| first
  std::vector<OpDelta> pairs;               // every matched pair, in A's order
  std::vector<std::size_t> unmatched_a, unmatched_b;
  std::vector<OnlyIn> only_in_a, only_in_b;
  std::vector<MetaDiff> meta_diffs;         // otherData differences (compared anyway)
  std::vector<MergedCollectives> merged;    // by rank, then op kind
};

Comparison compare_traces(const Trace& a, const Trace& b, std::size_t top_n = 10);
nlohmann::json to_json(const Comparison& c, const Trace& a, const Trace& b);

// Percentile by the nearest-rank method (the smallest value with at least p of the data at or below it);
// `values` need not be sorted. TESSEL_CHECK on an empty input.
double percentile(std::vector<double> values, double p);

}  // namespace tessel::trace
