// The schedule registry's table: one entry per family with its rules, closed forms and sources.
#include "sim/schedule/registry.hpp"

#include <algorithm>
#include <numeric>

#include "sim/schedule/generators.hpp"
#include "util/error.hpp"
#include "util/suggest.hpp"

namespace tessel::sched {

namespace {

std::string s(long long v) { return std::to_string(v); }

// ---- micro-batch rules of the generators ----

std::optional<ShapeProblem> any_m(int, int, MicrobatchRule) { return std::nullopt; }

// Megatron: microbatch_group_size_per_vp_stage (default pp) must lie in [pp, m], and a last group of
// 0 < m mod pp < pp micro-batches is refused ("dependency bubbles"); with the group at pp both say
// m >= pp and m mod pp == 0.
// PyTorch's ScheduleInterleaved1F1B: rounds = max(1, m // pp) must divide m (its ValueError), so any m < 2 pp
// and every multiple of pp; the groups of m / rounds may be smaller than pp (m < pp).
std::optional<ShapeProblem> interleaved_m(int pp, int m, MicrobatchRule rule) {
  if (rule == MicrobatchRule::torch) {
    const int rounds = std::max(1, m / std::max(1, pp));
    if (m % rounds == 0) return std::nullopt;
    return ShapeProblem{"schedule-microbatches", "interleaved under PyTorch's rule needs micro-batches m divisible by "
                                                 "its number of rounds max(1, m // pp) = " + s(rounds) + ", got m = " +
                                                     s(m) + " with pp " + s(pp) + " (ScheduleInterleaved1F1B)"};
  }
  if (m >= pp && m % pp == 0) return std::nullopt;
  return ShapeProblem{"schedule-microbatches", "interleaved needs micro-batches m to be a multiple of pp " + s(pp) +
                                                   " (Megatron's micro-batch group is pp and must divide m), got m = " +
                                                   s(m) + " with pp " + s(pp) +
                                                   (interleaved_m(pp, m, MicrobatchRule::torch)
                                                        ? std::string()
                                                        : std::string("; PyTorch's rule (mb-rule=torch) takes it"))};
}

// PyTorch ScheduleInterleavedZeroBubble: rounds = max(1, m // pp) must divide m.
std::optional<ShapeProblem> zb1p_m(int pp, int m, MicrobatchRule) {
  const int rounds = std::max(1, m / std::max(1, pp));
  if (m % rounds == 0) return std::nullopt;
  return ShapeProblem{"schedule-microbatches", "zb1p needs micro-batches m divisible by its number of rounds "
                                               "max(1, m // pp) = " + s(rounds) + ", got m = " + s(m) + " with pp " +
                                                   s(pp) + " (PyTorch ScheduleInterleavedZeroBubble)"};
}

std::optional<ShapeProblem> dualpipev_m(int pp, int m, MicrobatchRule) {
  if (m >= 2 * pp) return std::nullopt;
  return ShapeProblem{"schedule-microbatches", "dualpipev needs micro-batches m >= 2*pp = " + s(2 * pp) + ", got m = " +
                                                   s(m) + " with pp " + s(pp) +
                                                   " (DeepSeek dualpipev.py: every stage needs a micro-batch in flight)"};
}

// ---- closed-form makespans (estimate.cpp's pipeline_time) ----

struct Sums {
  double cmax = 0, csum = 0, F = 0, I = 0, W = 0;
};

Sums sums(const RankCosts& c, int p) {
  Sums x;
  std::vector<double> per(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) per[r] = c.f[r] + c.i[r] + c.w[r];
  x.cmax = *std::max_element(per.begin(), per.end());
  x.csum = std::accumulate(per.begin(), per.end(), 0.0);
  auto avg = [&](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / p; };
  x.F = avg(c.f);
  x.I = avg(c.i);
  x.W = avg(c.w);
  return x;
}

// 1F1B / GPipe: the steady state runs at the slowest rank's pace, plus one pass of every other rank while
// the pipe fills and drains; uniform stages give (m + p - 1) C (bubble (p-1)/m, Narayanan et al.).
double flat_makespan(const RankCosts& c, int p, int, double m, int) {
  const Sums x = sums(c, p);
  return m * x.cmax + (x.csum - x.cmax);
}

// Interleaved / looped: fill and drain cost 1/v of a rank's pass per rank (bubble (p-1)/(v m), Narayanan).
// An interleaved group of g < p micro-batches (PyTorch's rule with m < p) waits at each of the v - 1 chunk
// changes, forward and backward: the group's first micro-batch comes back to rank 0 one pass of the pipe
// (csum / v) after it left, while the group kept the rank busy for g of its own chunk times (g cmax / v);
// uniform stages: (v-1)(p-g) chunk times more (the unit-cost simulation of PyTorch's own order gives the
// same, tests/schedule/test_torch_goldens.cpp). Looped BFS and groups of p or more never wait.
double chunked_makespan(const RankCosts& c, int p, int v, double m, int group) {
  const Sums x = sums(c, p);
  const double wrap = (v - 1) * std::max(0.0, x.csum - group * x.cmax) / v;
  return m * x.cmax + (x.csum - x.cmax) / v + wrap;
}

// Zero-bubble family: W can only fill bubbles that exist beside enough micro-batches. With few of them the
// forward/input-grad chain is the bound: (m + p - 1)(T_F + T_B) + T_W for m <= p (Qi et al. 2024, App. H).
double chain(const Sums& x, int p, double m) { return (m + p - 1) * (x.F + x.I) + x.W; }

// ZB-1P: bubble (p-1)(F + B - 2W) with B = I + W the full backward (DeepSeek-V3 Table 2).
double zb1p_makespan(const RankCosts& c, int p, int, double m, int) {
  const Sums x = sums(c, p);
  return std::max(chain(x, p, m), m * x.cmax + (p - 1) * std::max(0.0, x.F + x.I - x.W));
}

// ZB-2P: twice the in-flight activations let W fill the warm-up; bubble (p-1) max(0, F + I - 2W), zero when
// T_F = T_B = T_W (Qi et al. 2024, ZB-H2).
double zb2p_makespan(const RankCosts& c, int p, int, double m, int) {
  const Sums x = sums(c, p);
  return std::max(chain(x, p, m), m * x.cmax + (p - 1) * std::max(0.0, x.F + x.I - 2 * x.W));
}

// ZB-V: the same bound with chunks of half a stage (zero bubble when T_F = T_B = T_W, ZB README).
double zbv_makespan(const RankCosts& c, int p, int, double m, int) {
  const Sums x = sums(c, p);
  return std::max(chain(x, p, m), m * x.cmax + (p - 1) * std::max(0.0, x.F + x.I - 2 * x.W) / 2);
}

// DualPipeV: (PP/2 - 1)(F&B + B - 3W) with PP = 2p chunk-stages and F, B, W chunk times (half a rank's);
// F&B taken as F + B here; the all-to-all overlap's credit is estimate.cpp's (a2a_hidden), taken off F.
double dualpipev_makespan(const RankCosts& c, int p, int, double m, int) {
  const Sums x = sums(c, p);
  const double fc = x.F / 2, bc = (x.I + x.W) / 2, wc = x.W / 2;
  return std::max(chain(x, p, m), m * x.cmax + (p - 1) * std::max(0.0, (fc + bc) + bc - 3 * wc));
}

// ---- closed-form bubble rates (reference/schedules.md): rate = bubble / (work + bubble), the idle share
// of the makespan (ZB README definition) ----

double rate(double bubble, double work) { return bubble / (work + bubble); }

// (p-1)(F+B) (DualPipe README) -> (p-1)/(m+p-1) (ZB README).
std::optional<double> flat_bubble(int p, int m, int, const Costs& c, int) {
  const double F = c.f(0), full = c.b(0) + c.w(0);
  return rate((p - 1) * (F + full), m * (F + full));
}

// (1/v)(p-1)/m (Narayanan et al. SC'21, formulas.md), with F, B per chunk: bubble (p-1)(F+B); a group of
// g < p adds (v-1)(p-g)(F+B), the waits at the chunk changes (chunked_makespan).
std::optional<double> chunked_bubble(int p, int m, int v, const Costs& c, int group) {
  const double F = c.f(0), full = c.b(0) + c.w(0);
  const double waits = (v - 1.0) * std::max(0, p - group);
  return rate((p - 1 + waits) * (F + full), v * m * (F + full));
}

// DualPipe README / DeepSeek-V3 Table 2 write B for the FULL backward (I + W): ZB1P (p-1)(F+B-2W) =
// (p-1)(F+I-W), as the ZB paper's ZB-H1 bubble.
std::optional<double> zb1p_bubble(int p, int m, int v, const Costs& c, int) {
  if (v != 1) return std::nullopt;
  const double F = c.f(0), W = c.w(0), full = c.b(0) + W;
  return rate((p - 1) * (F + full - 2 * W), m * (F + full));
}

// (PP/2-1)(F&B+B-3W), PP = 2p stages, B full; F&B = F + B (the unit-cost rate: no overlap gain).
std::optional<double> dualpipev_bubble(int p, int m, int v, const Costs& c, int) {
  if (v != 2) return std::nullopt;
  const double F = c.f(0), W = c.w(0), full = c.b(0) + W;
  const double fb = F + full;
  return rate((p - 1) * (fb + full - 3 * W), 2 * m * (F + full));
}

// ZB README table (T_F = T_B = T_W): 0 under the ZB paper's span definition (SimResult::span_bubble_rate).
// Both fill their warm-up with 2p-1 micro-batches (ZBV's n' = max(2p-1, m)); fewer leave a bubble.
std::optional<double> zero_bubble(int p, int m, int, const Costs&, int) {
  if (m >= 2 * p - 1) return 0.0;
  return std::nullopt;
}

std::optional<double> no_bubble_formula(int, int, int, const Costs&, int) { return std::nullopt; }

// ---- activations in flight per rank (cost/memory.cpp's activation model) ----

double all_m(double, double, double m, double, double) { return m; }
double all_mv(double, double v, double m, double, double) { return m * v; }
// 1F1B: rank r warms up with p - r forwards (Narayanan et al. 2021 Sec. 2.2).
double one_f_one_b_inflight(double p, double, double m, double r, double) { return std::min(m, p - r); }
// Megatron's interleaved warm-up: 2 (p - 1 - r) + (v - 1) p + 1 chunk forwards before the first backward
// (megatron/core/pipeline_parallel/schedules.py, num_warmup_microbatches).
// With PyTorch's groups of g micro-batches the same count with g for p (its _get_warmup_ops: (v-1) g +
// 2 (p-1-r) warm-up forwards, the cap m v), one more chunk alive while the first backward runs.
double interleaved_inflight(double p, double v, double m, double r, double g) {
  return std::min(m * v, 2.0 * (p - 1 - r) + (v - 1) * g + 1.0);
}
// Zero-bubble schedules keep a micro-batch's activations until its W (the weight gradient needs the layer
// inputs), and defer W on every rank, so every rank peaks like rank 0: p (ZB-1P), 2p (ZB-2P); the schedule
// validator's liveness over the generated schedules gives the same counts (tests/schedule).
double zb1p_inflight(double p, double, double m, double, double) { return std::min(m, p); }
double zb2p_inflight(double p, double, double m, double, double) { return std::min(m, 2.0 * p); }
// Chunks of half a stage: p full micro-batches (ZB-V, 1x 1F1B's memory).
double zbv_inflight(double p, double, double m, double, double) { return std::min(2.0 * m, 2.0 * p); }
// PP + 1 (DualPipe README), in half-stage chunks.
double dualpipev_inflight(double p, double, double m, double, double) { return std::min(2.0 * m, 2.0 * p + 1.0); }

// ZB-2p: the ZB heuristic with twice 1F1B's activation budget, 2p (arXiv:2401.10241, formulas.md).
Schedule zb2p_generate(const GenParams& p) {
  GenParams q = p;
  if (!q.mem_limit) q.mem_limit = 2 * p.pp;
  return gen::zb_greedy(q, "zb2p");
}
Schedule zb_greedy_generate(const GenParams& p) { return gen::zb_greedy(p, "zb-greedy"); }

const std::vector<Family>& table() {
  constexpr int kAny = 0;  // no upper bound on stages per rank
  static const std::vector<Family> t = {
      {.kind = Kind::gpipe, .name = "gpipe", .aliases = {"ScheduleGPipe"}, .placement = Placement::Loop,
       .splits_backward = false, .forwards_first = true, .layout_schedule = true, .takes_mem_limit = false,
       .vpp_min = 1, .vpp_max = 1, .layout_vpp_min = 1, .layout_vpp_max = 1, .generate = gen::gpipe,
       .takes_microbatch_rule = false,
       .microbatch_problem = any_m, .makespan = flat_makespan, .bubble_rate = flat_bubble, .span_bubble = false,
       .inflight_chunks = all_m},
      {.kind = Kind::one_f_one_b, .name = "1f1b", .aliases = {"Schedule1F1B"}, .placement = Placement::Loop,
       .splits_backward = false, .forwards_first = false, .layout_schedule = true, .takes_mem_limit = false,
       .vpp_min = 1, .vpp_max = 1, .layout_vpp_min = 1, .layout_vpp_max = 1, .generate = gen::one_f_one_b,
       .takes_microbatch_rule = false,
       .microbatch_problem = any_m, .makespan = flat_makespan, .bubble_rate = flat_bubble, .span_bubble = false,
       .inflight_chunks = one_f_one_b_inflight},
      // The analytical model prices interleaved and looped BFS with several chunks per rank (with one they
      // are 1F1B and GPipe under another name).
      {.kind = Kind::interleaved, .name = "interleaved", .aliases = {"ScheduleInterleaved1F1B"},
       .placement = Placement::Loop, .splits_backward = false, .forwards_first = false, .layout_schedule = true,
       .takes_mem_limit = false, .vpp_min = 1, .vpp_max = kAny, .layout_vpp_min = 2, .layout_vpp_max = kAny,
       .generate = gen::interleaved, .takes_microbatch_rule = true,
       .microbatch_problem = interleaved_m, .makespan = chunked_makespan,
       .bubble_rate = chunked_bubble, .span_bubble = false, .inflight_chunks = interleaved_inflight},
      {.kind = Kind::looped_bfs, .name = "looped-bfs", .aliases = {"ScheduleLoopedBFS"}, .placement = Placement::Loop,
       .splits_backward = false, .forwards_first = true, .layout_schedule = true, .takes_mem_limit = false,
       .vpp_min = 1, .vpp_max = kAny, .layout_vpp_min = 2, .layout_vpp_max = kAny, .generate = gen::looped_bfs,
       .takes_microbatch_rule = false,
       .microbatch_problem = any_m, .makespan = chunked_makespan, .bubble_rate = chunked_bubble,
       .span_bubble = false, .inflight_chunks = all_mv},
      // The generator takes several chunks per rank (PyTorch's interleaved zero bubble); the closed form and
      // the memory count are for one.
      {.kind = Kind::zb1p, .name = "zb1p", .aliases = {"ScheduleInterleavedZeroBubble"}, .placement = Placement::Loop,
       .splits_backward = true, .forwards_first = false, .layout_schedule = true, .takes_mem_limit = false,
       .vpp_min = 1, .vpp_max = kAny, .layout_vpp_min = 1, .layout_vpp_max = 1, .generate = gen::zb1p,
       .takes_microbatch_rule = false,
       .microbatch_problem = zb1p_m, .makespan = zb1p_makespan, .bubble_rate = zb1p_bubble, .span_bubble = false,
       .inflight_chunks = zb1p_inflight},
      {.kind = Kind::zb2p, .name = "zb2p", .aliases = {}, .placement = Placement::Loop, .splits_backward = true,
       .forwards_first = false, .layout_schedule = true, .takes_mem_limit = true, .vpp_min = 1, .vpp_max = 1,
       .layout_vpp_min = 1, .layout_vpp_max = 1, .generate = zb2p_generate, .takes_microbatch_rule = false,
       .microbatch_problem = any_m,
       .makespan = zb2p_makespan, .bubble_rate = zero_bubble, .span_bubble = true, .inflight_chunks = zb2p_inflight},
      {.kind = Kind::zbv, .name = "zbv", .aliases = {"ScheduleZBVZeroBubble"}, .placement = Placement::V,
       .splits_backward = true, .forwards_first = false, .layout_schedule = true, .takes_mem_limit = false,
       .vpp_min = 2, .vpp_max = 2, .layout_vpp_min = 2, .layout_vpp_max = 2, .generate = gen::zbv,
       .takes_microbatch_rule = false,
       .microbatch_problem = any_m, .makespan = zbv_makespan, .bubble_rate = zero_bubble, .span_bubble = true,
       .inflight_chunks = zbv_inflight},
      {.kind = Kind::dualpipev, .name = "dualpipev", .aliases = {"ScheduleDualPipeV", "DualPipeV"},
       .placement = Placement::V, .splits_backward = true, .forwards_first = false, .layout_schedule = true,
       .takes_mem_limit = false, .vpp_min = 2, .vpp_max = 2, .layout_vpp_min = 2, .layout_vpp_max = 2,
       .generate = gen::dualpipev, .takes_microbatch_rule = false,
       .microbatch_problem = dualpipev_m, .makespan = dualpipev_makespan,
       .bubble_rate = dualpipev_bubble, .span_bubble = false, .inflight_chunks = dualpipev_inflight},
      // The ZB heuristic with per-stage costs and an optional activation limit (none by default: up to m in
      // flight): a generator the simulator plays (it needs the costs), with no closed form, so the analytical
      // model (and a Layout it prices) cannot name it.
      {.kind = Kind::zb_greedy, .name = "zb-greedy", .aliases = {}, .placement = Placement::Loop,
       .splits_backward = true, .forwards_first = false, .layout_schedule = false, .takes_mem_limit = true,
       .vpp_min = 1, .vpp_max = 1, .layout_vpp_min = 1, .layout_vpp_max = 1, .generate = zb_greedy_generate,
       .takes_microbatch_rule = false,
       .microbatch_problem = any_m, .makespan = nullptr, .bubble_rate = no_bubble_formula, .span_bubble = false,
       .inflight_chunks = all_m},
  };
  return t;
}

// The message of a stages-per-rank range broken: the generators' and the layout model's wording.
std::optional<ShapeProblem> vpp_range_problem(const Family& f, int lo, int hi, int vpp) {
  if (vpp >= lo && (hi == 0 || vpp <= hi)) return std::nullopt;
  const std::string n = f.name;
  if (lo == 1 && hi == 1) return ShapeProblem{"schedule-vpp", n + " takes one stage per rank (vpp 1), got vpp " + s(vpp)};
  if (lo == 2 && hi == 2)
    return ShapeProblem{"schedule-vpp", n + " needs exactly 2 stages per rank (vpp 2: the V placement), got vpp " + s(vpp)};
  if (lo == 2 && hi == 0) return ShapeProblem{"schedule-vpp", n + " needs vpp > 1 (got vpp " + s(vpp) + ")"};
  return ShapeProblem{"schedule-vpp", n + " needs vpp from " + s(lo) + (hi ? " to " + s(hi) : " up") + ", got vpp " + s(vpp)};
}

}  // namespace

const std::vector<Family>& families() { return table(); }

// The table indexed by Kind, its order checked once (family() is on explore's hot path: millions of calls).
const std::vector<Family>& ordered_table() {
  const std::vector<Family>& t = table();
  for (std::size_t i = 0; i < t.size(); ++i)
    TESSEL_CHECK(static_cast<std::size_t>(t[i].kind) == i, "schedule registry out of order at " << i);
  return t;
}

const Family& family(Kind k) {
  static const std::vector<Family>& t = ordered_table();
  const auto i = static_cast<std::size_t>(k);
  TESSEL_CHECK(i < t.size(), "schedule kind " << i << " is not in the registry");
  return t[i];
}

const char* name(Kind k) { return family(k).name; }

const Family* find_family(std::string_view n) {
  for (const Family& f : table()) {
    if (n == f.name) return &f;
    for (const char* a : f.aliases)
      if (n == a) return &f;
  }
  return nullptr;
}

std::string known_names(bool layout_only) {
  std::string all;
  for (const Family& f : table())
    if (!layout_only || f.layout_schedule) all += (all.empty() ? "" : ", ") + std::string(f.name);
  return all;
}

std::vector<Kind> layout_kinds() {
  std::vector<Kind> out;
  for (const Family& f : table())
    if (f.layout_schedule) out.push_back(f.kind);
  return out;
}

Kind parse_schedule(std::string_view n, const std::string& what, bool layout_only) {
  const Family* f = find_family(n);
  const std::string head = what + " " + std::string(n) + ": ";
  if (!f) {
    std::vector<std::string> names;
    for (const Family& g : table())
      if (!layout_only || g.layout_schedule) names.emplace_back(g.name);
    throw InputError(head + "unknown schedule; choose one of " + known_names(layout_only) +
                     did_you_mean(std::string(n), names));
  }
  if (layout_only && !f->layout_schedule)
    throw InputError(head + "the analytical model has no closed form for it; tessel simulate and tessel run play "
                            "it (the layout schedules: " + known_names(true) + ")");
  return f->kind;
}

std::optional<ShapeProblem> vpp_problem(Kind k, int vpp) {
  const Family& f = family(k);
  return vpp_range_problem(f, f.vpp_min, f.vpp_max, vpp);
}

std::optional<ShapeProblem> microbatch_problem(Kind k, int pp, int m, MicrobatchRule rule) {
  return family(k).microbatch_problem(pp, m, rule);
}

std::optional<ShapeProblem> shape_problem(Kind k, int pp, int vpp, int m, MicrobatchRule rule) {
  if (auto p = vpp_problem(k, vpp)) return p;
  return microbatch_problem(k, pp, m, rule);
}

const char* rule_name(MicrobatchRule r) { return r == MicrobatchRule::torch ? "torch" : "megatron"; }

MicrobatchRule parse_microbatch_rule(std::string_view n, const std::string& what) {
  if (n == "megatron") return MicrobatchRule::megatron;
  if (n == "torch") return MicrobatchRule::torch;
  throw InputError(what + " " + std::string(n) + ": unknown micro-batch rule; choose megatron (Megatron-LM: m a "
                   "multiple of pp) or torch (PyTorch's ScheduleInterleaved1F1B: m a multiple of max(1, m // pp))");
}

int microbatch_group(Kind k, MicrobatchRule rule, int pp, int m) {
  if (!family(k).takes_microbatch_rule || rule == MicrobatchRule::megatron) return pp;
  return m / std::max(1, m / std::max(1, pp));
}

double makespan(Kind k, MicrobatchRule rule, const RankCosts& c, int pp, int vpp, double m) {
  const Family& f = family(k);
  TESSEL_CHECK(f.makespan, "no closed form for schedule " << f.name);
  return f.makespan(c, pp, vpp, m, microbatch_group(k, rule, pp, static_cast<int>(m)));
}

std::optional<double> bubble_rate(Kind k, MicrobatchRule rule, int pp, int m, int vpp, const Costs& c) {
  return family(k).bubble_rate(pp, m, vpp, c, microbatch_group(k, rule, pp, m));
}

double inflight_chunks(Kind k, MicrobatchRule rule, int pp, int vpp, int m, int rank) {
  return family(k).inflight_chunks(pp, vpp, m, rank, microbatch_group(k, rule, pp, m));
}

std::optional<ShapeProblem> layout_vpp_problem(Kind k, int vpp) {
  const Family& f = family(k);
  if (auto p = vpp_range_problem(f, f.layout_vpp_min, f.layout_vpp_max, vpp)) return p;
  return vpp_problem(k, vpp);
}

int default_vpp(Kind k, int multi_default) {
  const Family& f = family(k);
  return takes_vpp_range(k) ? multi_default : f.vpp_min;
}

bool takes_vpp_range(Kind k) {
  const Family& f = family(k);
  return f.vpp_max != f.vpp_min && f.layout_vpp_max != f.layout_vpp_min;
}

}  // namespace tessel::sched
