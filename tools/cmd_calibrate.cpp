// tessel calibrate
#include "models/util/error.hpp"
#include "tools/commands.hpp"

namespace tessel::cmd {

int calibrate(const Args&) { throw InputError("tessel calibrate: not built yet in this version"); }

}  // namespace tessel::cmd
