// tessel schedule
#include "models/util/error.hpp"
#include "tools/commands.hpp"

namespace tessel::cmd {

int schedule(const Args&) { throw InputError("tessel schedule: not built yet in this version"); }

}  // namespace tessel::cmd
