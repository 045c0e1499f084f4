// Strict reading of a number written as text (a flag's value, a layout word such as "tp8"): the whole string
// must be the number, and it must lie in [min, max]; otherwise an InputError naming `what`, the text and
// the rule. The command line (tools/cli.hpp) and the layout words (sim/layout_words.hpp) both read with these.
#pragma once

#include <cstdint>
#include <string>

namespace tessel {

std::int64_t parse_int(const std::string& text, const std::string& what, std::int64_t min, std::int64_t max);
double parse_double(const std::string& text, const std::string& what, double min, double max);

}  // namespace tessel
