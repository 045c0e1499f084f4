// tessel validate
#include "models/util/error.hpp"
#include "tools/commands.hpp"

namespace tessel::cmd {

int validate(const Args&) { throw InputError("tessel validate: not built yet in this version"); }

}  // namespace tessel::cmd
