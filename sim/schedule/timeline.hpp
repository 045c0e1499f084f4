// Pictures of a timed schedule: an ASCII chart for the terminal and an SVG (ranks as rows, time as
// columns, F/B/I/W coloured, idle time left grey so bubbles show).
#pragma once

#include <string>

#include "sim/schedule/schedule.hpp"

namespace tessel::sched {

// At most `width` columns of time; one character per column: F/B/I/W (upper case for a rank's first
// local stage, lower case for later ones), X for OVERLAP_F_B, '.' for idle.
std::string ascii_timeline(const Schedule& s, const SimResult& sim, int width = 120);
std::string svg_timeline(const Schedule& s, const SimResult& sim);

}  // namespace tessel::sched
