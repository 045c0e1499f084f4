// tessel run
#include "models/util/error.hpp"
#include "tools/commands.hpp"

namespace tessel::cmd {

int run(const Args&) { throw InputError("tessel run: not built yet in this version"); }

}  // namespace tessel::cmd
