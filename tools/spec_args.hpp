// The flags every planning command shares: --model, --system, --gpus and the layout flags (or --layout FILE).
#pragma once

#include <vector>

#include "models/model.hpp"
#include "sim/layout.hpp"
#include "sim/system.hpp"
#include "tools/cli.hpp"

namespace tessel::cli {

std::vector<OptionSpec> spec_options();

struct Specs {
  Model model;
  System system;
  Layout layout;
  int gpus = 0;
};

// The built-in default: GPT-3 175B on 1,024 A100 80GB (Selene-like), global batch 1536, sequence 2048,
// tp8 pp8 dp16 interleaved with 3 chunks per rank, micro-batch 1, selective recompute + sequence parallel.
// `played`: the command plays the schedule event by event (tessel simulate), so --schedule also takes
// zb-greedy, which the analytical model has no closed form for. On a system of CPU cores (a host section, or no
// 16-bit peak: the cpu preset) the defaults are what the CPU runtime executes: fp32, no recompute, unfused
// attention, no SP, no overlap.
Specs read_specs(const CommandLine& cl, bool played = false);
// --recompute-method / --recompute-layers given without --recompute full: InputError.
void check_recompute_flags(const CommandLine& cl, const Layout& l);

}  // namespace tessel::cli
