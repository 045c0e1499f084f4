#include "tools/format.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "util/units.hpp"

namespace tessel::fmt {

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string seconds(double s) {
  if (!std::isfinite(s)) return "n/a";
  if (s < 1e-3) return fixed(s * 1e6, 0) + " us";
  if (s < 1.0) return fixed(s * 1e3, s < 0.1 ? 2 : 1) + " ms";
  return fixed(s, 2) + " s";
}

std::string bytes(double b) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (b >= 1000 && u < 5) {
    b /= 1000;
    ++u;
  }
  return fixed(b, b < 10 ? 2 : b < 100 ? 1 : 0) + " " + units[u];
}

std::string gib(double bytes) {
  // Small sizes (the tiny model, a CPU run) in MiB or KiB rather than "0.0 GiB".
  const double a = std::fabs(bytes);
  if (a > 0 && a < 0.05 * kGiB) {
    if (a < 0.05 * kMiB) return fixed(bytes / kKiB, 1) + " KiB";
    return fixed(bytes / kMiB, 1) + " MiB";
  }
  return fixed(bytes / kGiB, 1) + " GiB";
}

std::string rate(double v) {
  if (v > 0 && v < 0.1) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2g", v);
    return buf;
  }
  return fixed(v, 1);
}

std::string pct(double fraction, int digits) { return fixed(100.0 * fraction, digits) + "%"; }

std::string si(double v, const std::string& unit) {
  const char* prefixes[] = {"", " k", " M", " G", " T", " P"};
  int i = 0;
  while (std::fabs(v) >= 1000.0 && i < 5) {
    v /= 1000.0;
    ++i;
  }
  return fixed(v, v < 10 ? 2 : (v < 100 ? 1 : 0)) + prefixes[i] + (i == 0 ? " " : "") + unit;
}

std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& r : rows)
    for (std::size_t c = 0; c < r.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], r[c].size());
    }
  std::string out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    for (std::size_t c = 0; c < r.size(); ++c) {
      std::string cell = r[c];
      std::string pad(width[c] - cell.size(), ' ');
      out += c == 0 ? cell + pad : "  " + pad + cell;
    }
    out += "\n";
    if (i == 0) {
      std::size_t total = 0;
      for (std::size_t c = 0; c < width.size(); ++c) total += width[c] + (c ? 2 : 0);
      out += std::string(total, '-') + "\n";
    }
  }
  return out;
}

std::string band(const std::optional<ErrorBand>& b, bool moe) {
  if (!b) return moe ? "accuracy unknown (no validated mixture-of-experts rows on this hardware)"
                     : "accuracy unknown (no validated rows on this hardware)";
  return "+-" + fixed(b->step_pct, 1) + "% (mean step error of " + std::to_string(b->rows) + " " + b->hardware_class + " " +
         (b->rows_of.empty() ? std::string("rows of published.json") : b->rows_of) + ")";
}

}  // namespace tessel::fmt
