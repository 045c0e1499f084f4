// Error types shared by every Tessel library.
//
// InputError: the user gave something wrong (file, key, flag, value); the message names it and the rule.
// InfeasibleLayout: a layout that is well-formed but cannot run (explore skips it and can explain why).
// TooLargeToSimulate: an InputError for a layout over the event simulator's size limit (explore keeps its
// analytical score).
// TESSEL_CHECK: an always-on invariant; a failure is a bug in Tessel, reported as InternalError.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tessel {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct InfeasibleLayout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TooLargeToSimulate : InputError {
  using InputError::InputError;
};

struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

namespace detail {
[[noreturn]] inline void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << "internal check failed: " << expr << " at " << file << ":" << line;
  if (!msg.empty()) os << ": " << msg;
  throw InternalError(os.str());
}
}  // namespace detail

}  // namespace tessel

// Always on, also in release builds: invariants are cheap next to a wrong answer.
#define TESSEL_CHECK(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) [[unlikely]] {                                                              \
      std::ostringstream tessel_check_os_;                                                   \
      tessel_check_os_ << "" __VA_OPT__(<< __VA_ARGS__);                                     \
      ::tessel::detail::check_failed(#cond, __FILE__, __LINE__, tessel_check_os_.str());     \
    }                                                                                        \
  } while (0)
