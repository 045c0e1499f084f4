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

#include <functional>
namespace tessel {
struct Model;
struct Layout;
struct System;
struct ValidationResult;
}  // namespace tessel
namespace tessel::cmd {
// The event simulator's step time, for `validate --engine des` (defined in cmd_simulate.cpp).
std::function<double(const Model&, const Layout&, const System&)> des_step_time();
// validate's text report: the table of rows, the MAPE per metric and the skipped rows (cmd_validate.cpp;
// calibrate --published prints the rows it fitted with it).
std::string validation_text(const ValidationResult& r);
}  // namespace tessel::cmd
