#include "sim/stack.hpp"

#include <algorithm>
#include <map>
#include <string_view>
#include <utility>

#include "util/error.hpp"
#include "util/json_reader.hpp"
#include "util/suggest.hpp"

namespace tessel {

const std::vector<std::pair<std::string_view, std::string_view>>& tessel_stack_presets();

namespace {

template <class T, class Name>
std::string listed(const std::vector<T>& v, Name&& name) {
  std::string out;
  for (const T& x : v) out += (out.empty() ? "" : ", ") + std::string(name(x));
  return out;
}

}  // namespace

Stack parse_stack(const Json& j, const std::string& where) {
  JsonObject o(j, where);
  Stack s;
  s.name = o.string("name");
  s.source = o.string("source");
  s.attention = o.choice("attention", {"flash", "unfused"}) == "flash" ? AttentionImpl::flash : AttentionImpl::unfused;
  if (auto c = o.opt_string("cross_entropy")) s.cross_entropy = parse_cross_entropy(*c, where + ": cross_entropy");
  if (auto r = o.opt_string("fp8_recipe")) s.fp8_recipe = parse_fp8_recipe(*r, where + ": fp8_recipe");
  s.fp8_param_gather = o.opt_boolean("fp8_param_gather").value_or(false);
  if (auto c = o.opt_string("fp8_weight_cast")) s.fp8_weight_cast = parse_fp8_weight_cast(*c, where + ": fp8_weight_cast");
  if (auto k = o.opt_string("flash_kernel")) s.flash_kernel = parse_flash_kernel(*k, where + ": flash_kernel");
  if (o.has("unfused")) s.unfused = parse_unfused_json(o.raw("unfused"), where + ": unfused");
  {
    JsonObject ov = o.object("overlap");
    s.overlap_grad_reduce = ov.boolean("grad_reduce");
    s.overlap_param_gather = ov.boolean("param_gather");
    s.overlap_p2p = ov.boolean("p2p");
    ov.finish();
  }
  s.tp_comm_overlap = o.choice("tp_comm_overlap", {"none", "optional"}) == "optional" ? TpOverlap::optional : TpOverlap::none;
  s.sequence_parallel = o.boolean("sequence_parallel");
  s.context_parallel = o.boolean("context_parallel");
  const Json& sj = o.raw("schedules");
  if (!sj.is_array() || sj.empty()) o.fail("schedules", "must be a non-empty array of schedule names");
  for (const Json& n : sj) {
    const sched::Family* f = n.is_string() ? sched::find_family(n.get<std::string>()) : nullptr;
    if (!f || !f->layout_schedule)
      o.fail("schedules", "value " + json_brief(n) + " is not a layout schedule (" + sched::known_names(true) + ")");
    s.schedules.push_back(f->kind);
  }
  if (auto r = o.opt_string("microbatch_rule")) s.microbatch_rule = sched::parse_microbatch_rule(*r, o.key_path("microbatch_rule"));
  const Json& rj = o.raw("recompute");
  if (!rj.is_array() || rj.empty()) o.fail("recompute", "must be a non-empty array of none, selective, full");
  for (const Json& r : rj) {
    if (!r.is_string()) o.fail("recompute", "value " + json_brief(r) + " must be none, selective or full");
    s.recompute.push_back(parse_recompute(r.get<std::string>(), o.key_path("recompute")));
  }
  s.recompute_default = parse_recompute(o.choice("recompute_default", {"none", "selective", "full"}), o.key_path("recompute_default"));
  if (std::find(s.recompute.begin(), s.recompute.end(), s.recompute_default) == s.recompute.end())
    o.fail("recompute_default", "must be one of the stack's recompute policies");
  for (double z : o.number_array("zero", 0, 3)) {
    if (z != static_cast<int>(z)) o.fail("zero", "entries must be ZeRO stages 0-3");
    s.zero.push_back(static_cast<int>(z));
  }
  if (s.zero.empty()) o.fail("zero", "must list at least one ZeRO stage");
  s.zero_default = static_cast<int>(o.opt_integer("zero_default", 0, 3).value_or(s.zero.front()));
  if (std::find(s.zero.begin(), s.zero.end(), s.zero_default) == s.zero.end())
    o.fail("zero_default", "must be one of the stack's ZeRO stages");
  if (const auto mb = o.opt_integer("micro_batch_default", 1, 1 << 20)) s.micro_batch_default = static_cast<int>(*mb);
  s.sequence_parallel_default = o.opt_boolean("sequence_parallel_default").value_or(false);
  if (s.sequence_parallel_default && !s.sequence_parallel)
    o.fail("sequence_parallel_default", "cannot be true for a stack without sequence parallelism");
  s.fragmentation = o.opt_number("fragmentation", 0, 1).value_or(0.0);
  s.deepep = o.opt_boolean("deepep").value_or(false);
  s.a2a_overlap = o.opt_boolean("a2a_overlap").value_or(false);
  o.finish();
  return s;
}

std::vector<std::string> stack_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : tessel_stack_presets()) names.emplace_back(name);
  return names;
}

Stack load_stack(const std::string& name_or_path) {
  for (const auto& [name, text] : tessel_stack_presets())
    if (name == name_or_path) {
      const std::string where = "stack preset " + std::string(name);
      return parse_stack(parse_json_text(std::string(text), where), where);
    }
  if (name_or_path.find('/') == std::string::npos && name_or_path.find(".json") == std::string::npos)
    throw InputError("--stack " + name_or_path + ": no such stack (known: " + listed(stack_names(), [](const std::string& n) { return n; }) +
                     ") and not a .json path" + did_you_mean(name_or_path, stack_names()));
  return parse_stack(parse_json_file(name_or_path, "--stack "), name_or_path);
}

const Stack& stack_preset(const std::string& name) {
  static const std::map<std::string, Stack> all = [] {
    std::map<std::string, Stack> m;
    for (const auto& n : stack_names()) m.emplace(n, load_stack(n));
    return m;
  }();
  const auto it = all.find(name);
  if (it == all.end()) throw InputError("stack " + name + ": no such preset (known: " +
                                        listed(stack_names(), [](const std::string& n) { return n; }) + ")");
  return it->second;
}

std::string defaults_text(const Stack& s) {
  return "recompute=" + to_string(s.recompute_default) + ", sequence_parallel=" +
         (s.sequence_parallel_default ? "true" : "false") + ", zero_stage=" + std::to_string(s.zero_default) +
         (s.micro_batch_default ? ", micro_batch=" + std::to_string(*s.micro_batch_default) : std::string()) +
         " under stack " + s.name;
}

void apply_stack(const Stack& s, Layout& l) {
  l.attention = s.attention;
  l.cross_entropy = s.cross_entropy;
  l.fp8_recipe = s.fp8_recipe;
  l.fp8_param_gather = s.fp8_param_gather;
  l.fp8_weight_cast = s.fp8_weight_cast;
  l.unfused = s.unfused;
  l.flash_kernel = s.flash_kernel;
  l.overlap_grad_reduce = s.overlap_grad_reduce;
  l.overlap_param_gather = s.overlap_param_gather;
  l.overlap_p2p = s.overlap_p2p;
  l.fragmentation = s.fragmentation;
  if (sched::family(l.schedule).takes_microbatch_rule) l.microbatch_rule = s.microbatch_rule;
}

std::optional<std::string> stack_problem(const Stack& s, const Layout& l) {
  const std::string head = "stack " + s.name + ": ";
  if (l.pp > 1 && std::find(s.schedules.begin(), s.schedules.end(), l.schedule) == s.schedules.end())
    return head + "schedule " + sched::name(l.schedule) + " is not one of its schedules (" +
           listed(s.schedules, [](sched::Kind k) { return sched::name(k); }) + ")";
  if (std::find(s.recompute.begin(), s.recompute.end(), l.recompute) == s.recompute.end())
    return head + "recompute " + to_string(l.recompute) + " is not one of its policies (" +
           listed(s.recompute, [](Recompute r) { return to_string(r); }) + ")";
  if (std::find(s.zero.begin(), s.zero.end(), l.zero_stage) == s.zero.end())
    return head + "zero" + std::to_string(l.zero_stage) + " is not one of its ZeRO stages (" +
           listed(s.zero, [](int z) { return "zero" + std::to_string(z); }) + ")";
  if (l.sequence_parallel && !s.sequence_parallel) return head + "it has no sequence parallelism (sp)";
  if (l.cp > 1 && !s.context_parallel) return head + "it has no context parallelism (cp " + std::to_string(l.cp) + ")";
  if (l.tp_comm_overlap && s.tp_comm_overlap == TpOverlap::none) return head + "it does not overlap TP communication (tp-overlap)";
  if (l.deepep && !s.deepep) return head + "it has no DeepEP dispatcher (deepep)";
  if (l.a2a_overlap && !s.a2a_overlap) return head + "it does not overlap the expert all-to-alls (a2a-overlap)";
  if (l.attention != s.attention)
    return head + "it runs " + to_string(s.attention) + " attention, the layout asks for " + to_string(l.attention);
  return std::nullopt;
}

std::optional<std::string> source_stack(const std::string& id) {
  const auto starts = [&](const char* p) { return id.rfind(p, 0) == 0; };
  if (starts("narayanan21")) return "megatron-lm-2021";
  if (starts("korthikanti22")) return "megatron-lm-2022";
  if (starts("zb24")) return "megatron-zb-2023";
  if (starts("nemo")) return "megatron-core-2024";
  if (starts("mbridge")) return "megatron-bridge-2025";
  return std::nullopt;
}

}  // namespace tessel
