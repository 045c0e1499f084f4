// The flags every planning command shares: --model, --system, --gpus, the layout flags, --layout (a layout
// as explore prints it, or a layout JSON file, whose fields the other flags override) and the split flags.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "models/model.hpp"
#include "sim/layout.hpp"
#include "sim/recipe.hpp"
#include "sim/stage_split.hpp"
#include "sim/system.hpp"
#include "tools/cli.hpp"

namespace tessel::cli {

std::vector<OptionSpec> spec_options();
// --stage-layers, --first-stage-layers, --last-stage-layers, --account-for-embedding, --account-for-loss,
// --balance (in spec_options(); `tessel run` takes them too).
std::vector<OptionSpec> split_options();

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
// Sets s.layout.stage_layers from the split flags (or the model's Megatron-LM file) for the layout's
// current pp and vpp: read_specs calls it, and a verb that changes them afterwards (simulate's
// --schedule-file) calls it again.
void resolve_specs_split(const CommandLine& cl, Specs& s);
// --recipe for the model named `model_name` (sim/recipes/), and the stack to run: --stack when given (refused
// where it is not the recipe's release's stack), else the recipe's; neither when neither flag is given. A term
// the command line gives by its own flag (--recompute, --sp / --no-sp, --tp-comm-overlap, --overlap-p2p,
// --cross-entropy, --main-grads, --moments, --master-weights) is the flag's: the recipe's terms come back
// without it.
struct RecipeChoice {
  std::optional<Recipe> recipe;
  std::optional<std::string> stack;
};
RecipeChoice read_recipe(const CommandLine& cl, const std::string& model_name);
// --main-grads, --moments and --master-weights onto `s` (estimate, simulate and explore alike).
void read_state_dtype_flags(const CommandLine& cl, StateDtypes& s);
// --flash-kernel, checked against the attention it would run on (InputError unless flash); nullopt when absent.
std::optional<FlashKernel> read_flash_kernel(const CommandLine& cl, AttentionImpl attention);
// --fp8-param-gather (true) or --no-fp8-param-gather (false); absent: neither given. Both given: an InputError.
std::optional<bool> read_fp8_param_gather(const CommandLine& cl);
// --recompute-method / --recompute-layers given without --recompute full: InputError.
void check_recompute_flags(const CommandLine& cl, const Layout& l);
// --layout's layout (words or a JSON file), its global batch --gbs (or `default_gbs`) when words; none
// without --layout.
std::optional<Layout> layout_argument(const CommandLine& cl, int default_gbs);
// The split the flags ask for; without one, and without a split of the layout's own, the split flags of a
// Megatron-LM argument file given as --model (`model_arg`).
SplitRequest split_request(const CommandLine& cl, const std::string& model_arg, const Layout& l);

}  // namespace tessel::cli
