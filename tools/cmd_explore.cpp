// tessel explore
#include "models/util/error.hpp"
#include "tools/commands.hpp"

namespace tessel::cmd {

int explore(const Args&) { throw InputError("tessel explore: not built yet in this version"); }

}  // namespace tessel::cmd
