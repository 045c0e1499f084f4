// tessel bench
#include "models/util/error.hpp"
#include "tools/commands.hpp"

namespace tessel::cmd {

int bench(const Args&) { throw InputError("tessel bench: not built yet in this version"); }

}  // namespace tessel::cmd
