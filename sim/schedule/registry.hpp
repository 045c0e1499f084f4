// The schedule registry: the one home of everything Tessel knows about a pipeline schedule family. Every
// other part of the tree (layouts, the cost and memory models, explore, validate, the runtime, the tools)
// asks it by Kind; names are parsed once, at the edge, by find_family / parse_schedule, and an unknown name
// is an InputError listing the known ones everywhere.
//
// One entry per family holds: its names (Tessel's, and PyTorch's class names as aliases), the generator,
// placement (loop or V), whether it splits the backward into I and W, the shape rules of its generator and
// of the layouts the analytical model prices (with their messages and sources), the closed-form makespan and
// bubble rate where the sources give one, and the activations a rank keeps in flight (the memory model).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/schedule/schedule.hpp"

namespace tessel::sched {

enum class Kind : std::uint8_t { gpipe, one_f_one_b, interleaved, looped_bfs, zb1p, zb2p, zbv, dualpipev, zb_greedy };

struct ShapeProblem {
  std::string rule;     // "schedule-vpp" or "schedule-microbatches" (explore counts rejections by these keys)
  std::string message;  // the schedule, the values and the rule's source
};

// Per pipeline rank, seconds per micro-batch of forward, input-gradient and weight-gradient work (summed
// over the rank's stages): what the closed forms take.
struct RankCosts {
  const std::vector<double>& f;
  const std::vector<double>& i;
  const std::vector<double>& w;
};

struct Family {
  Kind kind;
  const char* name;                    // Tessel's name: flags, layout strings, JSON, CSV sidecars
  std::vector<const char*> aliases;    // other names read as this family (PyTorch's schedule class names)
  Placement placement;                 // stage s on rank s % p (Loop) or the V of stage_to_rank()
  bool splits_backward;                // plays I and W as separate actions (zero-bubble family)
  bool forwards_first;                 // every forward of a rank's stage before its first backward
  bool layout_schedule;                // has the closed form the analytical model needs (zb-greedy: simulate only)
  bool takes_mem_limit;                // the generator takes an activation limit per rank (the ZB heuristic)
  // Stages per rank the generator takes: [vpp_min, vpp_max] (0 = no upper bound).
  int vpp_min, vpp_max;
  // Stages per rank the analytical model prices (a layout's rule, at least as strict as the generator's).
  int layout_vpp_min, layout_vpp_max;
  Schedule (*generate)(const GenParams&);
  // Whether the family follows a MicrobatchRule (interleaved: Megatron's or PyTorch's); the others have one.
  bool takes_microbatch_rule;
  // The generator's micro-batch rule for pp ranks and m micro-batches under `rule` (interleaved: Megatron's
  // group of pp, or PyTorch's rounds; the other families ignore `rule`).
  std::optional<ShapeProblem> (*microbatch_problem)(int pp, int m, MicrobatchRule rule);
  // The formulas below take `group`, the micro-batches per group of an interleaved order (microbatch_group():
  // pp under Megatron's rule, m / rounds under PyTorch's); the other families ignore it.
  // Pipeline makespan of m micro-batches from per-rank costs; nullptr where no closed form is known.
  double (*makespan)(const RankCosts& c, int pp, int vpp, double m, int group);
  // Bubble rate (idle share of the makespan) from uniform per-op costs; nullopt where the sources give no
  // formula for these parameters. Compares with SimResult::bubble_rate, except where `span_bubble` is set
  // (zbv, zb2p: the ZB paper's span definition, SimResult::span_bubble_rate).
  std::optional<double> (*bubble_rate)(int pp, int m, int vpp, const Costs& c, int group);
  bool span_bubble;
  // Micro-batch chunks whose activations rank r keeps at the peak (in stage-chunk units: one chunk is
  // 1/vpp of the rank's layers), for pp ranks, vpp stages each and m micro-batches.
  double (*inflight_chunks)(double pp, double vpp, double m, double r, double group);
};

// Every family, in the order listings show them (`tessel schedule gen --help`, error messages).
const std::vector<Family>& families();
const Family& family(Kind k);
const char* name(Kind k);
// The family a name or alias denotes; nullptr when none does.
const Family* find_family(std::string_view name);
// As find_family; an unknown name (or, with layout_only, a family without the closed form a Layout needs) is
// an InputError "<what> <name>: unknown schedule; choose one of ..." (`what`: the flag or key path).
Kind parse_schedule(std::string_view name, const std::string& what, bool layout_only = false);
// "gpipe, 1f1b, ..." (layout_only: the families a Layout may name).
std::string known_names(bool layout_only = false);
// Families a Layout may name (generator-only ones left out), in listing order.
std::vector<Kind> layout_kinds();

// Generator shape rules (tests/schedule/test_rules.cpp checks them both ways against the generators over a
// grid of (pp, vpp, m)): the stages-per-rank rule, the micro-batch rule, and both in that order.
std::optional<ShapeProblem> vpp_problem(Kind k, int vpp);
std::optional<ShapeProblem> microbatch_problem(Kind k, int pp, int m, MicrobatchRule rule = MicrobatchRule::megatron);
std::optional<ShapeProblem> shape_problem(Kind k, int pp, int vpp, int m, MicrobatchRule rule = MicrobatchRule::megatron);

// The micro-batch rules by name: "megatron", "torch". parse: InputError "<what> <name>: ..." listing both.
const char* rule_name(MicrobatchRule r);
MicrobatchRule parse_microbatch_rule(std::string_view name, const std::string& what);
// Micro-batches per group of the interleaved order under `rule`: pp (Megatron's default
// microbatch_group_size_per_vp_stage), or m / max(1, m // pp) (PyTorch's microbatches_per_round). Families
// without a rule: pp.
int microbatch_group(Kind k, MicrobatchRule rule, int pp, int m);
// The family's closed forms with the group of `rule` filled in (makespan: nullptr-checked by the caller).
double makespan(Kind k, MicrobatchRule rule, const RankCosts& c, int pp, int vpp, double m);
std::optional<double> bubble_rate(Kind k, MicrobatchRule rule, int pp, int m, int vpp, const Costs& c);
double inflight_chunks(Kind k, MicrobatchRule rule, int pp, int vpp, int m, int rank);
// The layout rule of stages per rank (layout_vpp_min/max), then the generator's; nullopt when both hold.
std::optional<ShapeProblem> layout_vpp_problem(Kind k, int vpp);
// The vpp a schedule runs with when none is given: its only value where the generator fixes one (2 for the
// V schedules, 1 for single-stage ones), `multi_default` for the multi-chunk loop schedules.
int default_vpp(Kind k, int multi_default);
// Whether rank counts several stages per rank in its listing of values (interleaved, looped-bfs: enumerated
// over vpp; the V schedules and single-stage ones have one value).
bool takes_vpp_range(Kind k);

}  // namespace tessel::sched
