#include "sim/recipe.hpp"

#include <map>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/stack.hpp"
#include "util/error.hpp"
#include "util/suggest.hpp"

namespace tessel {

const std::vector<std::pair<std::string_view, std::string_view>>& tessel_recipe_presets();

namespace {

// Later terms over earlier ones.
RecipeTerms over(RecipeTerms base, const RecipeTerms& top) {
  if (top.recompute) base.recompute = top.recompute;
  if (top.sequence_parallel) base.sequence_parallel = top.sequence_parallel;
  if (top.tp_comm_overlap) base.tp_comm_overlap = top.tp_comm_overlap;
  if (top.overlap_p2p) base.overlap_p2p = top.overlap_p2p;
  if (top.cross_entropy) base.cross_entropy = top.cross_entropy;
  if (top.main_grads) base.main_grads = top.main_grads;
  if (top.moments) base.moments = top.moments;
  if (top.master_weights) base.master_weights = top.master_weights;
  if (top.fp8_param_gather) base.fp8_param_gather = top.fp8_param_gather;
  return base;
}

struct Release {
  std::string name, stack, rows;
  std::map<std::string, Recipe> by_model;  // folded model name -> recipe
};

Release parse_release(const Json& j, const std::string& where) {
  JsonObject o(j, where);
  Release r;
  r.name = o.string("name");
  r.stack = o.string("stack");
  stack_preset(r.stack);  // an unknown stack is an error naming it
  // The published rows the release's tables are (validate), when some are: their id prefix.
  if (auto rows = o.opt_string("rows")) {
    if (rows->empty()) o.fail("rows", "must be a non-empty row id prefix");
    r.rows = *rows;
  }
  o.ignore("source");
  const RecipeTerms defaults = o.has("defaults") ? parse_recipe_terms(o.object("defaults")) : RecipeTerms{};
  const Json& mj = o.raw("models");
  if (!mj.is_object() || mj.empty()) o.fail("models", "must be a non-empty object of model name -> recipe");
  for (const auto& [model, entry] : mj.items()) {
    JsonObject e(entry, where, o.key_path("models") + "." + model);
    Recipe rec;
    rec.release = r.name;
    rec.stack = r.stack;
    rec.model = model;
    rec.config = e.string("config");
    // The model preset the release's model is, where their names differ ("Llama3.1-8B": llama3-8b).
    const std::optional<std::string> preset = e.opt_string("preset");
    e.ignore("why");  // the config's words behind a term, for the reader
    rec.terms = over(defaults, parse_recipe_terms(e.object("layout")));
    e.finish();
    std::vector<std::string> names = {model};
    if (preset && folded_name(*preset) != folded_name(model)) names.push_back(*preset);
    for (const std::string& name : names)
      if (!r.by_model.emplace(folded_name(name), rec).second)
        o.fail("models", "model \"" + name + "\" is listed twice (names compare without case and punctuation)");
  }
  o.finish();
  return r;
}

const std::vector<Release>& releases() {
  static const std::vector<Release> all = [] {
    std::vector<Release> v;
    for (const auto& [name, text] : tessel_recipe_presets()) {
      const std::string where = "recipe preset " + std::string(name);
      v.push_back(parse_release(parse_json_text(std::string(text), where), where));
    }
    return v;
  }();
  return all;
}

}  // namespace

RecipeTerms parse_recipe_terms(JsonObject o) {
  RecipeTerms t;
  if (auto r = o.opt_string("recompute")) t.recompute = parse_recompute(*r, o.key_path("recompute"));
  t.sequence_parallel = o.opt_boolean("sequence_parallel");
  t.tp_comm_overlap = o.opt_boolean("tp_comm_overlap");
  t.overlap_p2p = o.opt_boolean("overlap_p2p");
  if (auto c = o.opt_string("cross_entropy")) t.cross_entropy = parse_cross_entropy(*c, o.key_path("cross_entropy"));
  if (auto g = o.opt_string("main_grads")) t.main_grads = parse_state_dtype(*g, o.key_path("main_grads"));
  if (auto g = o.opt_string("moments")) t.moments = parse_state_dtype(*g, o.key_path("moments"));
  if (auto w = o.opt_string("master_weights")) t.master_weights = parse_master_weights(*w, o.key_path("master_weights"));
  t.fp8_param_gather = o.opt_boolean("fp8_param_gather");
  o.finish();
  return t;
}

void apply_recipe_terms(const RecipeTerms& t, Layout& l) {
  if (t.tp_comm_overlap) l.tp_comm_overlap = *t.tp_comm_overlap && l.sequence_parallel && l.tp > 1;
  if (t.overlap_p2p) l.overlap_p2p = *t.overlap_p2p;
  if (t.cross_entropy) l.cross_entropy = *t.cross_entropy;
  if (t.main_grads) l.state.main_grads = *t.main_grads;
  if (t.moments) l.state.moments = *t.moments;
  if (t.master_weights) l.state.master_weights = *t.master_weights;
  if (t.fp8_param_gather) l.fp8_param_gather = *t.fp8_param_gather;
}

std::string describe(const RecipeTerms& t) {
  std::string out;
  const auto add = [&](const std::string& key, const std::string& value) { out += (out.empty() ? "" : " ") + key + "=" + value; };
  const auto yes = [](bool b) { return std::string(b ? "true" : "false"); };
  if (t.recompute) add("recompute", to_string(*t.recompute));
  if (t.sequence_parallel) add("sequence_parallel", yes(*t.sequence_parallel));
  if (t.tp_comm_overlap) add("tp_comm_overlap", yes(*t.tp_comm_overlap));
  if (t.overlap_p2p) add("overlap_p2p", yes(*t.overlap_p2p));
  if (t.cross_entropy) add("cross_entropy", to_string(*t.cross_entropy));
  if (t.main_grads) add("main_grads", to_string(*t.main_grads));
  if (t.moments) add("moments", to_string(*t.moments));
  if (t.master_weights) add("master_weights", to_string(*t.master_weights));
  if (t.fp8_param_gather) add("fp8_param_gather", yes(*t.fp8_param_gather));
  return out;
}

std::vector<std::string> recipe_releases() {
  std::vector<std::string> names;
  for (const Release& r : releases()) names.push_back(r.name);
  return names;
}

Recipe load_recipe(const std::string& release, const std::string& model_name) {
  for (const Release& r : releases()) {
    if (r.name != release) continue;
    const auto it = r.by_model.find(folded_name(model_name));
    if (it != r.by_model.end()) return it->second;
    std::string models;  // each recipe once, though found under its preset's name too
    std::set<std::string> listed;
    for (const auto& [key, rec] : r.by_model)
      if (listed.insert(rec.model).second) models += (models.empty() ? "" : ", ") + rec.model;
    throw InputError("--recipe " + release + ": no recipe for model " + model_name + " in that release (it has: " +
                     models + ")");
  }
  std::string known;
  for (const auto& n : recipe_releases()) known += (known.empty() ? "" : ", ") + n;
  throw InputError("--recipe " + release + ": no such release (known: " + known + ")" +
                   did_you_mean(release, recipe_releases()));
}

std::optional<Recipe> row_recipe(const std::string& row_id, const std::string& model_name) {
  for (const Release& r : releases()) {
    if (r.rows.empty() || row_id.rfind(r.rows, 0) != 0) continue;
    const auto it = r.by_model.find(folded_name(model_name));
    if (it != r.by_model.end()) return it->second;
  }
  return std::nullopt;
}

}  // namespace tessel
