#include "sim/explore/explore.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <tuple>
#include <type_traits>

#include "sim/stage_split.hpp"
#include "sim/workload.hpp"
#include "util/error.hpp"
#include "util/units.hpp"

namespace tessel::explore {

namespace {

std::vector<int> divisors(int n, int max) {
  std::vector<int> d;
  for (int i = 1; i <= std::min(n, max); ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}


std::string gib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", b / kGiB);
  return buf;
}

// LayerWork depends only on these layout fields: explore lowers each combination once per thread.
using LayerKey = std::tuple<int, int, int, bool, int, int, int, int, bool, int, int, double, bool, int, int>;
LayerKey layer_key(const Layout& l) {
  return {l.tp, l.cp, l.micro_batch, l.sequence_parallel, static_cast<int>(l.recompute), static_cast<int>(l.attention),
          static_cast<int>(l.precision), static_cast<int>(l.fp8_recipe), l.tp_comm_overlap, l.ep, l.expert_tp(),
          l.moe_load_factor(), l.deepep, l.unfused.norm + 2 * l.unfused.act + 4 * l.unfused.rope, static_cast<int>(l.flash_kernel)};
}

struct ThreadOut {
  std::vector<Scored> fitting;
  std::map<std::string, Rejection> rejected;
  double smallest_peak = 0;
  std::string smallest_peak_layout;
  long long duplicates = 0;  // balanced splits that came out even: the enumeration's even layout already
};

// Counts a rejection under its rule; only the first of a rule keeps its message as the example, so a message
// that must be formatted comes as a callable and is built once per rule, not once per rejected layout.
template <class Message>
void reject(ThreadOut& out, const std::string& rule, Message&& message) {
  auto& r = out.rejected[rule];
  if (r.count == 0) {
    r.rule = rule;
    if constexpr (std::is_invocable_v<Message>) r.example = message();
    else r.example = message;
  }
  ++r.count;
}

// A fitting layout's row, with its time to train when the search was given the job; a job that would not finish
// on it rejects it under "time-to-train".
void keep_fitting(const Model& m, const System& sys, const Estimate& e, const std::optional<goodput::Job>& job,
                  ThreadOut& out) {
  Scored sc = scored_of(e);
  if (job) {
    try {
      sc.plan = goodput::plan(m, e, sys, *job);
    } catch (const InfeasibleLayout& err) {
      reject(out, "time-to-train", err.what());
      return;
    }
  }
  out.fitting.push_back(std::move(sc));
}

// The time-balanced split of a layout depends on its layer's cost and the end stages' (the LayerKey fields),
// its stage count and Megatron's block recompute: one partition per such key and thread.
using SplitKey = std::tuple<LayerKey, int, int, int>;

// Replaces the kBalancedSplit marker by the partitioner's time-balanced split (sim/stage_split.hpp; memory is
// the estimate's to check, so the explore tier stays fast). False when that split is the even one, which
// the enumeration already holds: the duplicate is dropped.
bool resolve_balanced(const Model& m, const System& sys, const LayerWork& lw, Layout& l,
                      std::map<SplitKey, std::vector<int>>& splits) {
  const SplitKey key{layer_key(l), l.num_stages(), static_cast<int>(l.recompute_method), l.recompute_layers};
  auto it = splits.find(key);
  if (it == splits.end()) {
    const std::optional<Partition> p = partition(partition_costs(m, l, sys, &lw, false));
    it = splits.emplace(key, p ? p->layers : even_split(m.layers, l.num_stages())).first;
  }
  l.stage_layers = it->second;
  drop_even_split(l, m.layers);
  return !l.stage_layers.empty() || m.layers % l.num_stages() != 0;
}

void score_range(const Model& m, const System& sys, int gpus, const std::vector<Layout>& layouts, std::size_t begin,
                 std::size_t end, const std::optional<goodput::Job>& job, ThreadOut& out, std::atomic<std::size_t>& done) {
  std::map<LayerKey, LayerWork> cache;
  std::map<SplitKey, std::vector<int>> splits;
  for (std::size_t i = begin; i < end; ++i) {
    Layout l = layouts[i];
    const bool balanced = is_balanced_marker(l);
    if (balanced) l.stage_layers = even_split(m.layers, l.num_stages());  // its other rules first
    if (auto p = layout_problem(l, m, gpus)) {
      reject(out, p->rule, p->message);
    } else {
      const LayerKey key = layer_key(l);
      auto it = cache.find(key);
      if (it == cache.end()) it = cache.emplace(key, lower_layer(m, l, sys)).first;
      if (balanced && !resolve_balanced(m, sys, it->second, l, splits)) {
        ++out.duplicates;
        if ((i - begin) % 256 == 255) done.fetch_add(256, std::memory_order_relaxed);
        continue;
      }
      try {
        const Estimate e = estimate(m, l, sys, gpus, &it->second);
        if (out.smallest_peak == 0 || e.peak_memory_bytes < out.smallest_peak) {
          out.smallest_peak = e.peak_memory_bytes;
          out.smallest_peak_layout = l.describe();
        }
        if (e.fits) {
          keep_fitting(m, sys, e, job, out);
        } else {
          reject(out, "memory", [&] { return memory_message(e); });
        }
      } catch (const InfeasibleLayout& err) {
        reject(out, "unsupported", err.what());
      }
    }
    if ((i - begin) % 256 == 255) done.fetch_add(256, std::memory_order_relaxed);
  }
}

// The event-simulated tier's stopping rule: fitting[k..] are unsimulated (sorted by their analytical score), `nth`
// the N-th of the simulated ones. Under the step objective the best of the rest is fitting[k]; under the time to
// train each layout's bound is its plan at its analytical step times min_ratio, and its checkpoint decides too,
// so every unsimulated layout is bounded.
bool simulated_tier_stable(const std::vector<Scored>& fitting, int k, const Scored& nth, double min_ratio,
                           const Options& opt) {
  if (opt.objective == Objective::step) return nth.step_s <= fitting[static_cast<std::size_t>(k)].analytical_step_s * min_ratio;
  for (std::size_t j = static_cast<std::size_t>(k); j < fitting.size(); ++j) {
    const goodput::Plan best_case =
        goodput::with_step_time(*fitting[j].plan, fitting[j].analytical_step_s * min_ratio, *opt.job);
    if (best_case.wall_s < nth.plan->wall_s) return false;
  }
  return true;
}

std::vector<Scored> pareto_front(std::vector<Scored> all) {
  std::sort(all.begin(), all.end(), [](const Scored& a, const Scored& b) {
    if (a.peak_memory_bytes != b.peak_memory_bytes) return a.peak_memory_bytes < b.peak_memory_bytes;
    return better(a, b);
  });
  std::vector<Scored> front;
  double best = std::numeric_limits<double>::infinity();
  for (const auto& s : all)
    if (!s.over_memory && s.step_s < best) {
      front.push_back(s);
      best = s.step_s;
    }
  return front;
}

}  // namespace

std::string memory_message(const Estimate& e) {
  const std::string margin = e.min_headroom_bytes > 0 ? " + " + gib(e.min_headroom_bytes) + " GiB headroom" : "";
  return "needs " + gib(e.peak_memory_bytes) + " GiB" + margin + " on pipeline rank " + std::to_string(e.peak_rank) +
         " of " + gib(e.capacity_bytes) + " GiB (" + e.layout.describe() + ")";
}

Scored scored_of(const Estimate& e) {
  Scored s;
  s.layout = e.layout;
  s.step_s = s.analytical_step_s = e.step_s;
  s.tokens_per_s = e.tokens_per_s;
  s.tflops_per_gpu = e.model_tflops_per_gpu;
  s.mfu = e.mfu;
  s.mfu_causal = e.mfu_causal;
  s.bubble = e.bubble_fraction;
  s.imbalance = stage_imbalance(e);
  // One definition for both tiers: the pipeline and data-parallel communication the busiest rank waits on.
  // TP and CP collectives block the compute stream in the estimate and the engine alike (their time is
  // inside the rank's busy time in both), so neither tier counts them here.
  s.exposed_comm_s = e.pp_exposed_s + e.dp_exposed_s;
  s.peak_memory_bytes = e.peak_memory_bytes;
  s.peak_rank = e.peak_rank;
  s.capacity_bytes = e.capacity_bytes;
  return s;
}

bool better_by(const Scored& a, const Scored& b, Objective objective) {
  if (a.over_memory != b.over_memory) return !a.over_memory;
  if (objective == Objective::time_to_train) {
    TESSEL_CHECK(a.plan && b.plan, "ranking by time to train without a plan");
    if (a.plan->wall_s != b.plan->wall_s) return a.plan->wall_s < b.plan->wall_s;
  }
  return better(a, b);
}

bool better(const Scored& a, const Scored& b) {
  if (a.over_memory != b.over_memory) return !a.over_memory;
  if (a.step_s != b.step_s) return a.step_s < b.step_s;
  if (a.peak_memory_bytes != b.peak_memory_bytes) return a.peak_memory_bytes < b.peak_memory_bytes;
  const int ma = a.layout.tp * a.layout.pp * a.layout.cp, mb = b.layout.tp * b.layout.pp * b.layout.cp;
  if (ma != mb) return ma < mb;
  return a.layout.describe() < b.layout.describe();
}

Space default_space(const Model& m, const System& sys, int gpus, bool tp_inside_node) {
  Space s;
  s.max_tp_inside_node = tp_inside_node;
  const int tp_max = std::min(gpus, tp_inside_node ? sys.node.gpus_per_node : 64);
  for (int t = 1; t <= tp_max; t *= 2)
    if (m.heads % t == 0 && gpus % t == 0) s.tp.push_back(t);
  for (int p : divisors(gpus, std::min(m.layers, 128))) s.pp.push_back(p);
  s.cp = {1};
  if (m.seq_len >= 8192)
    for (int c = 2; c <= 16; c *= 2)
      if (gpus % c == 0) s.cp.push_back(c);
  s.mbs = {1, 2, 3, 4, 6, 8};  // 3 and 6 appear in published runs (Zero Bubble Table 3)
  // Every layout schedule but looped BFS, which interleaved dominates: the same bubble (p-1)/(v m) with m v
  // chunks of activations in flight instead of Megatron's warm-up count (sim/schedule/registry.cpp).
  for (sched::Kind k : sched::layout_kinds())
    if (k != sched::Kind::looped_bfs) s.schedules.push_back(k);
  s.recompute = {Recompute::none, Recompute::selective, Recompute::full};
  s.sp = {0, 1};
  s.zero = {0, 1, 2, 3};
  s.recompute_layers = {0, -2};  // all layers, or half of each stage's layers (block method)
  s.ep = {1};
  s.etp = {0};
  s.deepep = {0, 1};
  s.a2a_overlap = {0, 1};
  if (m.moe.enabled()) {
    // Powers of two that divide the experts (and the GPUs); experts unsplit (etp 1, the usual choice of the
    // published MoE recipes) or split as attention is (etp = tp, Megatron-Core's default).
    for (int e = 2; e <= std::min(m.moe.experts, gpus); e *= 2)
      if (m.moe.experts % e == 0 && gpus % e == 0) s.ep.push_back(e);
    s.etp = {1, 0};
  }
  return s;
}

std::vector<Layout> enumerate(const Model& m, const System& sys, int gpus, int global_batch, const Space& in) {
  Space d = default_space(m, sys, gpus, in.max_tp_inside_node);
  auto pick = [](const auto& given, const auto& dflt) { return given.empty() ? dflt : given; };
  const auto tps = pick(in.tp, d.tp), pps = pick(in.pp, d.pp), mbss = pick(in.mbs, d.mbs);
  const auto rls = pick(in.recompute_layers, d.recompute_layers);
  auto scheds = pick(in.schedules, d.schedules);
  auto recs = pick(in.recompute, d.recompute);
  auto zeros = pick(in.zero, d.zero), sps = pick(in.sp, d.sp), cps = pick(in.cp, d.cp);
  const auto eps = m.moe.enabled() ? pick(in.ep, d.ep) : std::vector<int>{1};
  const auto etps = m.moe.enabled() ? pick(in.etp, d.etp) : std::vector<int>{0};
  auto deepeps = m.moe.enabled() ? pick(in.deepep, d.deepep) : std::vector<int>{0};
  auto overlaps = m.moe.enabled() ? pick(in.a2a_overlap, d.a2a_overlap) : std::vector<int>{0};
  if (in.stack) {
    const Stack& st = *in.stack;
    const auto keep = [](auto& v, const auto& allowed) {
      std::erase_if(v, [&](const auto& x) { return std::find(allowed.begin(), allowed.end(), x) == allowed.end(); });
    };
    keep(scheds, st.schedules);
    if (!st.deepep) std::erase(deepeps, 1);
    if (!st.a2a_overlap) std::erase(overlaps, 1);
    keep(recs, st.recompute);
    keep(zeros, st.zero);
    if (!st.sequence_parallel) sps = {0};
    if (!st.context_parallel) cps = {1};
  }
  const bool both_dispatchers = std::find(deepeps.begin(), deepeps.end(), 0) != deepeps.end() &&
                                std::find(deepeps.begin(), deepeps.end(), 1) != deepeps.end();
  std::vector<Layout> out;
  for (int tp : tps) {
    if (in.max_tp_inside_node && tp > sys.node.gpus_per_node) continue;
    for (int pp : pps)
      for (int cp : cps) {
        const long long mp = static_cast<long long>(tp) * pp * cp;
        if (gpus % mp != 0) continue;
        const int dp = static_cast<int>(gpus / mp);
        for (int mbs : mbss) {
          if (!in.keep_indivisible_batches && global_batch % (static_cast<long long>(mbs) * dp) != 0) continue;
          for (sched::Kind sc : (pp == 1 ? std::vector<sched::Kind>{sched::Kind::one_f_one_b} : scheds)) {
            std::vector<int> vpps;
            if (sched::takes_vpp_range(sc)) {
              // The chunk counts that divide a rank's layers, rounded down or up (126 layers at pp 16: 7 or
              // 8 a rank, vpp 1, 7 or 2, 4, 8: Llama 3's 128 virtual stages).
              std::vector<int> cand = divisors(std::max(1, m.layers / pp), 16);
              for (int c : divisors(std::max(1, (m.layers + pp - 1) / pp), 16))
                if (std::find(cand.begin(), cand.end(), c) == cand.end()) cand.push_back(c);
              std::sort(cand.begin(), cand.end());
              for (int v : (in.vpp.empty() ? cand : in.vpp))
                if (!sched::layout_vpp_problem(sc, v)) vpps.push_back(v);
            } else {
              vpps = {sched::default_vpp(sc, 1)};
            }
            for (int v : vpps) {
              // The even split where the layers divide, and the time-balanced one (the embedding and the
              // head make the end stages heavier: Llama 3's one layer fewer there comes out of the costs),
              // resolved when scored because it depends on the layer's cost (kBalancedSplit).
              std::vector<std::vector<int>> splits;
              const int stages = pp * v;
              if (m.layers % stages == 0) splits.push_back({});
              if (in.uneven && stages > 1 && m.layers >= stages - 2) splits.push_back({kBalancedSplit});
              if (splits.empty()) splits.push_back({});  // kept so the rule rejection is counted
              for (const auto& split : splits)
                for (Recompute rc : recs) {
                  // With flash attention the scores are never stored, so selective recompute (of the attention
                  // core, which Megatron-core still runs again) saves nothing over none and costs a flash
                  // forward: none dominates it, so it is left out where none is enumerated.
                  if (rc == Recompute::selective && in.attention == AttentionImpl::flash &&
                      std::find(recs.begin(), recs.end(), Recompute::none) != recs.end())
                    continue;
                  for (int rl : (rc == Recompute::full ? rls : std::vector<int>{0}))
                    for (int sp : (tp > 1 ? sps : std::vector<int>{0}))
                      for (int z : (dp * cp > 1 ? zeros : std::vector<int>{0}))
                        for (int ep : eps)
                          for (int etp : etps)
                            for (int dpx : deepeps)
                              for (int ov : (ep > 1 && Layout::a2a_overlap_fits(sc, pp, pp == 1 ? 1 : v) &&
                                                     (rc != Recompute::full || sc == sched::Kind::dualpipev)
                                                 ? overlaps
                                                 : std::vector<int>{0})) {
                        // etp 1 and "as tp" are one layout when tp is 1.
                        if (etp == 1 && tp == 1 && std::find(etps.begin(), etps.end(), 0) != etps.end()) continue;
                        if (dpx == 1 && ep == 1) continue;
                        Layout l;
                        l.tp = tp;
                        l.pp = pp;
                        l.dp = dp;
                        l.cp = cp;
                        l.vpp = pp == 1 ? 1 : v;
                        l.micro_batch = mbs;
                        l.global_batch = global_batch;
                        l.schedule = sc;
                        l.recompute = rc;
                        if (rc == Recompute::full && rl != 0) {
                          const int per_stage = m.layers / std::max(1, stages);
                          if (per_stage < 2) continue;
                          l.recompute_method = RecomputeMethod::block;
                          l.recompute_layers = rl < 0 ? per_stage / -rl : rl;
                        }
                        l.sequence_parallel = sp == 1;
                        l.zero_stage = z;
                        l.ep = ep;
                        l.etp = etp;
                        // With both dispatchers listed, DeepEP only where an ep group leaves its NVLink domain
                        // (the groups the cost model prices, ep_group): inside it the two cost alike and would
                        // be one layout twice.
                        if (dpx == 1 && both_dispatchers &&
                            cost::node_split(ep_group(l), sys.node.gpus_per_node).inside_one_node(ep))
                          continue;
                        l.deepep = dpx == 1;
                        l.a2a_overlap = ov == 1;
                        l.stage_layers = split;
                        l.precision = in.precision;
                        l.attention = in.attention;
                        l.overlap_grad_reduce = in.overlap_grad_reduce;
                        l.overlap_param_gather = in.overlap_param_gather;
                        l.overlap_p2p = in.overlap_p2p;
                        if (in.stack) apply_stack(*in.stack, l);
                        l.cross_entropy = in.cross_entropy;  // the stack's unless --cross-entropy (cmd_explore)
                        if (in.fp8_recipe) l.fp8_recipe = *in.fp8_recipe;
                        if (in.fp8_param_gather) l.fp8_param_gather = *in.fp8_param_gather;
                        if (in.unfused) l.unfused = *in.unfused;
                        if (in.flash_kernel) l.flash_kernel = *in.flash_kernel;
                        if (in.fragmentation) l.fragmentation = *in.fragmentation;
                        l.state = in.state;
                        l.tp_comm_overlap = in.tp_comm_overlap && l.sequence_parallel;
                        out.push_back(std::move(l));
                      }
                }
            }
          }
        }
      }
  }
  return out;
}

std::vector<RuleCount> diagnose(const Model& m, const System& sys, int gpus, int global_batch, const Space& space) {
  Space all = space;
  all.keep_indivisible_batches = true;
  std::map<std::string, RuleCount> by_rule;
  for (Layout l : enumerate(m, sys, gpus, global_batch, all)) {
    // The balanced split's rules are the even split's but for its layer counts: counted with the latter.
    if (is_balanced_marker(l)) l.stage_layers = even_split(m.layers, l.num_stages());
    const std::vector<LayoutProblem> broken = layout_problems(l, m, gpus);
    if (broken.empty()) continue;  // well-formed: the memory check decides it
    RuleCount& first = by_rule[broken.front().rule];
    first.rule = broken.front().rule;
    if (first.first++ == 0 && first.example.empty()) first.example = l.describe() + ": " + broken.front().message;
    if (broken.size() == 1 && first.only++ == 0) first.example = l.describe() + ": " + broken.front().message;
  }
  std::vector<RuleCount> out;
  for (auto& [rule, c] : by_rule) out.push_back(std::move(c));
  std::sort(out.begin(), out.end(), [](const RuleCount& a, const RuleCount& b) {
    if (a.only != b.only) return a.only > b.only;
    return a.first != b.first ? a.first > b.first : a.rule < b.rule;
  });
  return out;
}

namespace {

// The analytical tier: every layout scored on every core; what fits comes back, what does not is counted per
// rule in res (with the smallest peak seen).
std::vector<Scored> analytical_tier(const Model& m, const System& sys, int gpus, const std::vector<Layout>& layouts,
                                    int threads, const Options& opt, Result& res) {
  std::vector<ThreadOut> outs(threads);
  std::atomic<std::size_t> done{0};
  {
    std::vector<std::thread> pool;
    const std::size_t n = layouts.size();
    for (int t = 0; t < threads; ++t) {
      const std::size_t b = n * t / threads, e = n * (t + 1) / threads;
      pool.emplace_back([&, b, e, t] { score_range(m, sys, gpus, layouts, b, e, opt.job, outs[t], done); });
    }
    if (opt.progress) {
      while (done.load() + 256 * threads < n) {
        opt.progress("scoring", static_cast<double>(done.load()) / std::max<std::size_t>(1, n));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    for (auto& th : pool) th.join();
    if (opt.progress) opt.progress("scoring", 1.0);
  }
  std::vector<Scored> fitting;
  std::map<std::string, Rejection> rejected;
  for (auto& o : outs) {
    res.enumerated -= o.duplicates;  // distinct layouts: a balanced split that is the even one counts once
    fitting.insert(fitting.end(), o.fitting.begin(), o.fitting.end());
    for (auto& [rule, r] : o.rejected) {
      auto& agg = rejected[rule];
      if (agg.count == 0) {
        agg.rule = rule;
        agg.example = r.example;
      }
      agg.count += r.count;
    }
    if (o.smallest_peak > 0 && (res.smallest_peak == 0 || o.smallest_peak < res.smallest_peak)) {
      res.smallest_peak = o.smallest_peak;
      res.smallest_peak_layout = o.smallest_peak_layout;
    }
  }
  for (auto& [rule, r] : rejected) res.rejected.push_back(r);
  std::sort(res.rejected.begin(), res.rejected.end(),
            [](const Rejection& a, const Rejection& b) { return a.count != b.count ? a.count > b.count : a.rule < b.rule; });
  return fitting;
}

}  // namespace

Result run(const Model& m, const System& sys, int gpus, int global_batch, const Space& space, const Options& opt) {
  TESSEL_CHECK(opt.objective == Objective::step || opt.job, "the time-to-train objective without a job");
  const auto ranks_before = [&opt](const Scored& a, const Scored& b) { return better_by(a, b, opt.objective); };
  const std::vector<Layout> layouts = enumerate(m, sys, gpus, global_batch, space);
  Result res;
  res.enumerated = static_cast<long long>(layouts.size());
  const int threads = std::max(1, opt.threads > 0 ? opt.threads : static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<Scored> fitting = analytical_tier(m, sys, gpus, layouts, threads, opt, res);
  res.scored = static_cast<long long>(fitting.size());
  std::sort(fitting.begin(), fitting.end(), ranks_before);
  res.pareto = pareto_front(fitting);
  if (fitting.empty()) return res;

  const int n = std::min<int>(opt.top_n, static_cast<int>(fitting.size()));
  if (!opt.simulate) {
    res.top.assign(fitting.begin(), fitting.begin() + n);
    return res;
  }
  // Event-simulated tier: re-score the analytical best K; double K until the top N is stable (below), up to
  // the limit.
  const int limit = std::min<int>(opt.simulate_k > 0 ? opt.simulate_k : kMaxSimulated, static_cast<int>(fitting.size()));
  int k = opt.simulate_k > 0 ? opt.simulate_k : std::max(2 * n, 16);
  int simulated = 0;
  while (true) {
    k = std::min(k, limit);
    std::vector<std::thread> pool;
    std::atomic<int> next{simulated};
    std::mutex err_mu;
    std::string first_error;
    std::atomic<long long> too_large{0};
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&] {
        for (int i = next++; i < k; i = next++) {
          try {
            const SimScore sc = opt.simulate(fitting[i].layout);
            fitting[i].step_s = sc.step_s;
            fitting[i].bubble = sc.bubble;
            fitting[i].exposed_comm_s = sc.exposed_comm_s;
            fitting[i].peak_memory_bytes = sc.peak_memory_bytes;
            fitting[i].over_memory = sc.peak_memory_bytes + sys.min_headroom_bytes > fitting[i].capacity_bytes;
            fitting[i].tier = "des";
            if (fitting[i].plan) fitting[i].plan = goodput::with_step_time(*fitting[i].plan, sc.step_s, *opt.job);
          } catch (const TooLargeToSimulate&) {
            ++too_large;  // over simulate()'s size limit (2^22 position-stage-micro-batches): the analytical score stands
          } catch (const std::exception& e) {
            std::lock_guard<std::mutex> g(err_mu);
            if (first_error.empty()) first_error = e.what();
          }
        }
      });
    if (opt.progress) {
      while (next.load() < k) {
        opt.progress("simulating", static_cast<double>(std::min(next.load(), k)) / k);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    for (auto& th : pool) th.join();
    if (opt.progress) opt.progress("simulating", 1.0);
    if (!first_error.empty()) throw InternalError("simulating a candidate failed: " + first_error);
    res.too_large += too_large;
    simulated = k;
    std::vector<int> order(k);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return ranks_before(fitting[a], fitting[b]); });
    // Stable when no unsimulated layout could displace the N-th: its simulated time would have to beat its
    // analytical time by more than the best ratio (simulated / analytical) seen so far.
    double min_ratio = std::numeric_limits<double>::infinity();
    for (int i = 0; i < k; ++i) min_ratio = std::min(min_ratio, fitting[i].step_s / fitting[i].analytical_step_s);
    const bool exhausted = k == limit;
    // An N-th over memory can be displaced by any layout not yet simulated: not stable until all are.
    const Scored& nth = fitting[order[std::min(n, k) - 1]];
    const bool stable = exhausted || opt.simulate_k > 0 || (!nth.over_memory && simulated_tier_stable(fitting, k, nth, min_ratio, opt));
    if (stable) {
      for (int i = 0; i < std::min(n, k); ++i) res.top.push_back(fitting[order[i]]);
      // Past the simulated K, the analytical ranking continues (those rows' tier is "analytical").
      for (int i = k; i < n; ++i) res.top.push_back(fitting[i]);
      break;
    }
    k *= 2;
  }
  res.simulated = simulated - res.too_large;
  // The Pareto front uses simulated times where they exist.
  res.pareto = pareto_front(fitting);
  return res;
}

namespace {

// A row's time to train, briefly: the figures explore's columns show, with the checkpoint behind them.
Json time_to_train_json(const goodput::Plan& p) {
  return {{"days", p.days},
          {"goodput", p.goodput},
          {"wall_s", p.wall_s},
          {"interval_s", p.interval_s},
          {"interval_steps", p.interval_steps},
          {"save_s", p.ckpt.blocking_s},
          {"write_s", p.ckpt.save_s},
          {"load_s", p.ckpt.load_s},
          {"restart_s", p.restart_s},
          {"job_mtbf_s", p.mtbf_s},
          {"checkpoint_bytes", p.bytes.total_write},
          {"gpu_hours", p.gpu_hours},
          {"usd", p.usd ? Json(*p.usd) : Json()}};
}

}  // namespace

Json scored_to_json(const Scored& s) {
  Json j;
  j["layout"] = layout_to_json(s.layout);
  j["describe"] = s.layout.describe();
  j["step_s"] = s.step_s;
  j["analytical_step_s"] = s.analytical_step_s;
  j["over_memory"] = s.over_memory;
  j["tokens_per_s"] = s.tokens_per_s * s.analytical_step_s / s.step_s;
  j["model_tflops_per_gpu"] = s.tflops_per_gpu * s.analytical_step_s / s.step_s;
  j["mfu"] = s.mfu * s.analytical_step_s / s.step_s;
  j["mfu_causal"] = s.mfu_causal * s.analytical_step_s / s.step_s;
  j["bubble_fraction"] = s.bubble;
  j["imbalance"] = s.imbalance;
  j["exposed_comm_s"] = s.exposed_comm_s;
  j["peak_memory_GiB"] = s.peak_memory_bytes / kGiB;
  j["headroom_GiB"] = (s.capacity_bytes - s.peak_memory_bytes) / kGiB;
  j["tier"] = s.tier;
  if (s.plan) j["time_to_train"] = time_to_train_json(*s.plan);  // only when the search was given the job
  return j;
}

Json result_to_json(const Result& r) {
  Json j;
  j["top"] = Json::array();
  for (const auto& s : r.top) j["top"].push_back(scored_to_json(s));
  j["pareto"] = Json::array();
  for (const auto& s : r.pareto) j["pareto"].push_back(scored_to_json(s));
  j["counts"] = {{"enumerated", r.enumerated}, {"scored", r.scored}, {"simulated", r.simulated}, {"too_large_to_simulate", r.too_large}};
  Json rej = Json::array();
  for (const auto& x : r.rejected) rej.push_back({{"rule", x.rule}, {"count", x.count}, {"example", x.example}});
  j["rejected"] = rej;
  if (r.smallest_peak > 0) j["smallest_peak"] = {{"GiB", r.smallest_peak / kGiB}, {"layout", r.smallest_peak_layout}};
  return j;
}

}  // namespace tessel::explore
