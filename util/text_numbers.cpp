#include "util/text_numbers.hpp"

#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "util/error.hpp"

namespace tessel {

std::int64_t parse_int(const std::string& text, const std::string& what, std::int64_t min, std::int64_t max) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size()) throw InputError(what + ": '" + text + "' is not an integer");
  // A well-formed integer beyond int64 (strtoll's ERANGE) is out of the flag's range like any other.
  const bool beyond = errno == ERANGE;
  if (beyond || v < min || v > max) {
    std::ostringstream os;
    os << what << ": ";
    if (beyond) os << text;
    else os << v;
    os << " is out of range [" << min << ", " << max << "]";
    throw InputError(os.str());
  }
  return v;
}

double parse_double(const std::string& text, const std::string& what, double min, double max) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || (errno != ERANGE && !std::isfinite(v)))
    throw InputError(what + ": '" + text + "' is not a finite number");
  // strtod's ERANGE: beyond the largest double (1e400), or a nonzero value below the smallest normal one
  // (1e-400), which would be read as 0 or lose its precision.
  if (errno == ERANGE) {
    const bool under = std::fabs(v) <= DBL_MIN;
    std::ostringstream os;
    os << what << ": " << text << (under ? " underflows (its magnitude is below 2.2e-308, the smallest normal double)"
                                         : " overflows a double (over 1.8e308)")
       << "; the range is [" << min << ", " << max << "]";
    throw InputError(os.str());
  }
  if (v < min || v > max) {
    std::ostringstream os;
    os << what << ": " << v << " is out of range [" << min << ", " << max << "]";
    throw InputError(os.str());
  }
  return v;
}

}  // namespace tessel
