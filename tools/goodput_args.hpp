// The flags of the time-to-train block that tessel estimate and tessel explore share (docs/goodput.md): the job's
// length (--tokens or --steps), overrides of the system's failure model and restart cost, and the price.
#pragma once

#include <optional>
#include <vector>

#include "models/model.hpp"
#include "sim/goodput.hpp"
#include "sim/system.hpp"
#include "tools/cli.hpp"

namespace tessel::cli {

std::vector<OptionSpec> goodput_options();

// The job of --tokens N (ceil(N / (gbs x seq)) steps) or --steps N under the system's "reliability" and
// "storage" objects as the flags override them; nullopt when neither is given (the other flags are then refused:
// they would change nothing). InputError naming the flag, or the missing object, and the rule.
std::optional<goodput::Job> read_goodput_job(const CommandLine& cl, const Model& m, int global_batch, const System& sys);

// "15.6 T tokens = 929,856 steps" or "1,000 steps".
std::string job_length_text(const CommandLine& cl, const goodput::Job& job);

}  // namespace tessel::cli
