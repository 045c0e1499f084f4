// Human-readable numbers for the tables the commands print.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sim/system.hpp"

namespace tessel::fmt {

std::string seconds(double s);           // "812 us", "14.2 ms", "18.13 s"
std::string bytes(double b);             // decimal, as storage bandwidths are quoted: "4.87 TB", "38.0 GB"
std::string gib(double bytes);           // "61.3 GiB"; below 0.05 GiB in MiB ("12.4 MiB") or KiB
std::string rate(double v);              // one decimal ("152.5"), two significant digits below 0.1 ("0.0021")
std::string fixed(double v, int digits);
std::string pct(double fraction, int digits = 1);  // 0.512 -> "51.2%"
std::string si(double v, const std::string& unit); // 1.2e6 tokens/s -> "1.20 M tokens/s"

// How sure a step time is: "+-22.3% (mean step error of 16 Hopper rows of published.json)", or that no
// validated rows cover the hardware (of mixture-of-experts models, where `moe`: System::step_band).
std::string band(const std::optional<ErrorBand>& b, bool moe = false);

// A plain text table: first row is the header; columns right-aligned except the first.
std::string table(const std::vector<std::vector<std::string>>& rows);

}  // namespace tessel::fmt
