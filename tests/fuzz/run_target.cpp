#include "util/error.hpp"
#include "tests/fuzz/targets.hpp"

namespace tessel::fuzz {

void run_expecting_rejection_or_success(TargetFn fn, std::string_view data) {
  try {
    fn(data);
  } catch (const InputError&) {
    // a clear rejection: what a parser should do with bad input
  } catch (const InfeasibleLayout&) {
    // a well-formed layout that cannot run: also a clear rejection
  }
}

}  // namespace tessel::fuzz
