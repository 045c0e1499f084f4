// One function per `tessel` verb; each lives in its own tools/cmd_<verb>.cpp.
// A command returns the process exit code; errors are thrown (InputError -> 2, anything else -> 1).
#pragma once

#include <string>
#include <vector>

namespace tessel::cmd {

using Args = std::vector<std::string>;

int estimate(const Args& args);
int validate(const Args& args);
int simulate(const Args& args);
int explore(const Args& args);
int schedule(const Args& args);
int run(const Args& args);
int bench(const Args& args);
int compare(const Args& args);
int calibrate(const Args& args);

}  // namespace tessel::cmd
