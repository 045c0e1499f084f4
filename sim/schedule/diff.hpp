// Differences between two schedules, for `tessel schedule diff` and golden-file tests.
#pragma once

#include <string>
#include <vector>

#include "sim/schedule/schedule.hpp"

namespace tessel::sched {

// One line per difference: shape and placement first, then per rank the first differing position and
// the actions present in only one of the two (as multisets). Empty when the schedules are identical.
std::vector<std::string> diff(const Schedule& a, const Schedule& b, std::size_t max_lines = 40);

}  // namespace tessel::sched
