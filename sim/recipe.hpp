// Recipes: the configuration a stack's release documents for one model (NeMo-Framework-Launcher's training
// configs), so that validate fills what a published row of that release leaves unstated with what the
// release ran, not with the stack's generic defaults (sim/recipes/*.json, each with its sources;
// docs/stacks.md). A row's stated layout always wins over its recipe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sim/layout.hpp"
#include "util/json_reader.hpp"

namespace tessel {

// The layout terms a recipe may state, as the layout JSON keys of the same names (docs/layout.md); an unset
// one is the stack's default.
struct RecipeTerms {
  std::optional<Recompute> recompute;
  std::optional<bool> sequence_parallel, tp_comm_overlap, overlap_p2p;
  std::optional<CrossEntropyImpl> cross_entropy;
  std::optional<StateDtype> main_grads, moments;
  std::optional<MasterWeights> master_weights;
  std::optional<bool> fp8_param_gather;  // NeMo's fp8_params (in effect under fp8 with ZeRO >= 1)
};

struct Recipe {
  std::string release;  // "nemo-24.07"
  std::string stack;    // the stack preset the release is (sim/stacks/)
  std::string model;    // as the release names it ("LLAMA2-70B")
  std::string config;   // the release's config file for it
  RecipeTerms terms;    // the release's defaults with the model's own terms over them
};

// Parses "recompute", "sequence_parallel", "tp_comm_overlap", "overlap_p2p", "cross_entropy", "main_grads",
// "moments", "master_weights", "fp8_param_gather" from `o`; any other key is an InputError naming it.
RecipeTerms parse_recipe_terms(JsonObject o);

// The terms set in `t` (the others left as they are) on `l`, except recompute and sequence_parallel, which
// validate enumerates; tp_comm_overlap only where `l` runs sequence parallelism under tp > 1 (it needs both).
void apply_recipe_terms(const RecipeTerms& t, Layout& l);

// "recompute=selective sequence_parallel=true main_grads=bf16 ...": the terms `t` sets, in key order.
std::string describe(const RecipeTerms& t);

// The release names of the recipe presets ("nemo-24.07").
std::vector<std::string> recipe_releases();

// `release`'s recipe for the model named `model_name` (compared as row_recipe does): --recipe's meaning. An
// unknown release, or a model the release has no recipe for, is an InputError naming the flag, the value and
// what is known.
Recipe load_recipe(const std::string& release, const std::string& model_name);

// The recipe of the published row `row_id` (by the release's row id prefix) for the row's model name
// (compared without case and punctuation), or nullopt when its release has none for that model.
std::optional<Recipe> row_recipe(const std::string& row_id, const std::string& model_name);

}  // namespace tessel
