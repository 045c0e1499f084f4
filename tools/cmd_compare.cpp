// tessel compare
#include "models/util/error.hpp"
#include "tools/commands.hpp"

namespace tessel::cmd {

int compare(const Args&) { throw InputError("tessel compare: not built yet in this version"); }

}  // namespace tessel::cmd
