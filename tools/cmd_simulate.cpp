// tessel simulate
#include "models/util/error.hpp"
#include "tools/commands.hpp"

namespace tessel::cmd {

int simulate(const Args&) { throw InputError("tessel simulate: not built yet in this version"); }

}  // namespace tessel::cmd
