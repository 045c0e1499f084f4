// tessel simulate
#include "models/util/error.hpp"
#include "tools/commands.hpp"

namespace tessel::cmd {

int simulate(const Args&) { throw InputError("tessel simulate: not built yet in this version"); }

std::function<double(const Model&, const Layout&, const System&)> des_step_time() {
  throw InputError("--engine des: the event simulator is not built yet in this version");
}

}  // namespace tessel::cmd
