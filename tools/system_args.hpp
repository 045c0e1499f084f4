// --system and --min-headroom: the system a planning command prices with, and the memory margin it must keep.
#pragma once

#include <string>

#include "sim/system.hpp"
#include "tools/cli.hpp"

namespace tessel::cli {

// The --system preset or file (fallback when absent), with --min-headroom GiB as its planning margin (it
// replaces the file's min_headroom_GiB).
System read_system(const CommandLine& cl, const std::string& fallback);

inline constexpr const char* kMinHeadroomHelp =
    "GiB to keep free beyond the predicted peak: a layout fits when peak + this <= the GPU's memory [0]";

}  // namespace tessel::cli
