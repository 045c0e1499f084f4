// Binary size units, defined once. Specs carry units in their key names and are converted to SI (bytes,
// seconds, FLOP/s) once, at the edge; these convert bytes back and forth for those keys and for reports.
#pragma once

namespace tessel {

inline constexpr double kKiB = 1024.0;
inline constexpr double kMiB = 1024.0 * kKiB;
inline constexpr double kGiB = 1024.0 * kMiB;

}  // namespace tessel
