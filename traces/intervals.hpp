// Interval arithmetic over [start, end) spans in µs: the busy time of a lane set and the part of one set
// not covered by another (exposed communication = communication time during which no compute runs).
#pragma once

#include <utility>
#include <vector>

namespace tessel::trace {

using Span = std::pair<double, double>;  // [start, end)

// Sorts and merges overlapping or touching spans in place.
void merge_spans(std::vector<Span>& spans);
// Total length of the union.
double union_length(std::vector<Span> spans);
// Length of union(a) minus union(b).
double uncovered_length(std::vector<Span> a, std::vector<Span> b);

}  // namespace tessel::trace
