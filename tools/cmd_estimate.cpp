// tessel estimate
#include "models/util/error.hpp"
#include "tools/commands.hpp"

namespace tessel::cmd {

int estimate(const Args&) { throw InputError("tessel estimate: not built yet in this version"); }

}  // namespace tessel::cmd
