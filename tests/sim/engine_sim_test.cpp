// The simulator against the schedule's unit-cost model, the analytical estimate (time and memory), and
// bad input; determinism of the trace bytes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "util/error.hpp"
#include "util/units.hpp"
#include "sim/engine/sim_trace.hpp"
#include "sim/engine/simulate.hpp"
#include "sim/estimate.hpp"
#include "sim/layout_words.hpp"
#include "sim/step_costs.hpp"
#include "traces/chrome.hpp"
#include "traces/compare.hpp"

using namespace tessel;
using namespace tessel::engine;

namespace {

// Stated agreement with the analytical estimate when nothing contends (docs/simulator.md explains the
// differences: the closed forms' DP tail and steady-state p2p accounting vs the played events).
constexpr double kEstimateTol = 0.05;
constexpr double kMemoryTol = 0.01;
constexpr double kExact = 1e-9;

double unit_makespan(const std::string& gen, int pp, int m, int vpp, bool overlap_p2p) {
  Layout l;
  l.pp = pp;
  l.vpp = vpp;
  l.global_batch = m;
  l.schedule = sched::parse_schedule(gen, "case");
  l.overlap_p2p = overlap_p2p;
  sched::GenParams gp;
  gp.pp = pp;
  gp.microbatches = m;
  gp.vpp = vpp;
  const sched::Schedule s = sched::lower(sched::generate(gen, gp));
  System sys;  // no links are used: p2p costs 0
  const Cluster c(l, sys, Fidelity::cluster);
  StepCosts costs;  // unit stages; no transfers, collectives or optimizer
  costs.work.layout = l;
  for (int st = 0; st < s.num_stages; ++st) {
    StageWork sw;
    sw.stage = st;
    sw.f = sw.i = sw.w = 1.0;
    costs.work.stages.push_back(sw);
  }
  costs.ranks.params.assign(static_cast<std::size_t>(pp), 0.0);
  costs.ranks.sp_grad_params.assign(static_cast<std::size_t>(pp), 0.0);
  costs.tail.assign(static_cast<std::size_t>(pp), RankTail{});
  JobSpec spec;
  spec.layout = &l;
  spec.system = &sys;
  spec.schedule = &s;
  spec.costs = &costs;
  const Job job = build_job(spec, c);
  Simulator sim(job.graph);
  return sim.run().makespan;
}

}  // namespace

TEST_CASE("simulator: zero comm and unit costs give the schedule's unit-cost makespan") {
  // Expectation: sched::unit_cost_simulate with F = I = W = 1 and comm 0 under the eager comm model, the
  // engine's transfer semantics (with zero-time transfers the sender's wait without overlap costs nothing).
  struct Case { const char* gen; int pp, m, vpp; };
  const Case cases[] = {{"gpipe", 4, 8, 1}, {"1f1b", 4, 8, 1}, {"1f1b", 8, 3, 1}, {"interleaved", 4, 8, 2},
                        {"zb1p", 4, 8, 1}, {"zbv", 4, 8, 2}, {"dualpipev", 4, 8, 2}, {"zb2p", 4, 12, 1}};
  for (const auto& c : cases)
    for (bool overlap : {true, false}) {
      CAPTURE(c.gen);
      CAPTURE(overlap);
      sched::GenParams gp;
      gp.pp = c.pp;
      gp.microbatches = c.m;
      gp.vpp = c.vpp;
      const auto s = sched::lower(sched::generate(c.gen, gp));
      sched::Costs unit;
      const double expected =
          sched::unit_cost_simulate(s, unit, sched::CommModel::Eager).makespan;
      CHECK(unit_makespan(c.gen, c.pp, c.m, c.vpp, overlap) == doctest::Approx(expected).epsilon(kExact));
    }
}

TEST_CASE("simulator: agrees with the analytical estimate without contention") {
  const System sys = load_system("dgx-a100");
  struct Case { const char* model; int tp, pp, dp, vpp, gbs; const char* sched; int zero; };
  const Case cases[] = {
      {"gpt3-175b", 8, 8, 16, 3, 1536, "interleaved", 0},  // the reference job (Narayanan et al.)
      {"gpt3-175b", 8, 8, 4, 1, 256, "1f1b", 1},
      {"gpt3-175b", 8, 8, 4, 1, 256, "1f1b", 2},
      {"llama2-7b", 2, 4, 2, 1, 64, "1f1b", 0},
      {"llama2-7b", 1, 4, 1, 1, 32, "zb1p", 0},
      {"llama2-7b", 1, 4, 1, 1, 32, "zb2p", 0},
      {"llama2-7b", 8, 1, 4, 1, 64, "1f1b", 0},
  };
  for (const auto& c : cases) {
    CAPTURE(c.model);
    CAPTURE(c.sched);
    const Model m = load_model(c.model);
    Layout l;
    l.tp = c.tp;
    l.pp = c.pp;
    l.dp = c.dp;
    l.vpp = c.vpp;
    l.global_batch = c.gbs;
    l.schedule = sched::parse_schedule(c.sched, "case");
    l.zero_stage = c.zero;
    l.sequence_parallel = c.tp > 1;
    l.recompute = Recompute::selective;
    const Estimate e = estimate(m, l, sys);
    const SimReport r = simulate(m, l, sys);
    // Expectation: |sim - estimate| / estimate <= kEstimateTol.
    CHECK(std::abs(r.step_s - e.step_s) / e.step_s <= kEstimateTol);
    // Memory: the estimate's per-pipeline-rank total (static + inflight_chunks x chunk activations) equals
    // the simulated peak of every position of that pipeline rank, split backward (ZB: activations live until
    // W, p on every rank for ZB-1P) included.
    for (const auto& k : r.ranks)
      CHECK(k.peak_bytes == doctest::Approx(e.memory[static_cast<std::size_t>(k.pp)].total()).epsilon(kMemoryTol));
  }
}

// The allocator's fragmentation (Layout::fragmentation) is one term in both engines: the estimate adds f times
// each pipeline rank's dynamic bytes (activations, extras, ZeRO-3's gathered weights, the recompute transient),
// the simulator f times its played activation peak plus the same transients, and what the tensors take
// (allocated(), validate's max_memory_allocated) does not move. Cases: selective recompute, full recompute (a
// transient), ZeRO-3 (gathered weights), a zero-bubble schedule (activations held until W).
TEST_CASE("fragmentation: the estimate and the simulator add the same allocator term") {
  const System sys = load_system("dgx-a100");
  struct Case { const char* model; int tp, pp, dp, gbs; const char* sched; int zero; Recompute rc; };
  const Case cases[] = {
      {"gpt3-175b", 8, 8, 4, 256, "1f1b", 1, Recompute::selective},
      {"gpt3-175b", 8, 8, 4, 256, "1f1b", 0, Recompute::full},
      {"llama2-7b", 2, 1, 8, 64, "1f1b", 3, Recompute::none},
      {"llama2-7b", 1, 4, 1, 32, "zb1p", 0, Recompute::none},
  };
  for (const auto& c : cases) {
    CAPTURE(c.model);
    CAPTURE(c.sched);
    CAPTURE(c.zero);
    const Model m = load_model(c.model);
    Layout l;
    l.tp = c.tp, l.pp = c.pp, l.dp = c.dp, l.global_batch = c.gbs, l.zero_stage = c.zero, l.recompute = c.rc;
    l.schedule = sched::parse_schedule(c.sched, "case");
    l.sequence_parallel = c.tp > 1;
    const Estimate e0 = estimate(m, l, sys);
    const SimReport r0 = simulate(m, l, sys);
    l.fragmentation = 0.1;
    const Estimate e1 = estimate(m, l, sys);
    const SimReport r1 = simulate(m, l, sys);
    REQUIRE(e1.memory.size() == e0.memory.size());
    for (std::size_t k = 0; k < e1.memory.size(); ++k) {
      const cost::MemoryBreakdown &a = e0.memory[k], &b = e1.memory[k];
      CHECK(a.fragmentation_bytes == 0);
      CHECK(b.dynamic_bytes() > 0);
      CHECK(b.fragmentation_bytes == doctest::Approx(0.1 * b.dynamic_bytes()).epsilon(1e-12));
      CHECK(b.allocated() == doctest::Approx(a.allocated()).epsilon(1e-12));
      CHECK(b.total() == doctest::Approx(a.total() + b.fragmentation_bytes).epsilon(1e-12));
    }
    const StepCosts sc = step_costs(m, l, sys);
    const double transients = sc.zero3_gather_bytes + sc.recompute_transient_bytes;
    if (c.zero == 3) CHECK(sc.zero3_gather_bytes > 0);
    if (c.rc == Recompute::full) CHECK(sc.recompute_transient_bytes > 0);
    REQUIRE(r1.ranks.size() == r0.ranks.size());
    for (std::size_t i = 0; i < r1.ranks.size(); ++i) {
      const RankSummary &a = r0.ranks[i], &b = r1.ranks[i];
      CHECK(b.peak_activation_bytes == doctest::Approx(a.peak_activation_bytes).epsilon(1e-12));
      CHECK(b.peak_bytes == doctest::Approx(a.peak_bytes + 0.1 * (a.peak_activation_bytes + transients)).epsilon(1e-12));
      // And the two engines still agree rank by rank, as without fragmentation.
      CHECK(b.peak_bytes == doctest::Approx(e1.memory[static_cast<std::size_t>(b.pp)].total()).epsilon(kMemoryTol));
    }
  }
}

// An fp8 run's weights, both ways (cached 16-bit weights, fp8 primary weights): the event engine's per-rank
// peak moves with the weights' term exactly as the estimate's, and the two still agree rank by rank. Llama 3
// 70B on H100 (tp 8, pp 4, interleaved, ZeRO-1 and ZeRO-3), where the first and last ranks hold the
// embeddings and the head (16-bit in both ways).
TEST_CASE("simulator: fp8 weights move its peak as they move the estimate's") {
  const System sys = load_system("dgx-h100");
  const Model m = load_model("llama3-70b");
  for (int zero : {1, 3}) {
    CAPTURE(zero);
    Layout l = parse_layout_words("tp8 pp4 dp4 vpp2 mbs1 interleaved sp", 64);
    l.zero_stage = zero;
    l.precision = Precision::fp8;
    const Estimate e0 = estimate(m, l, sys);
    const SimReport r0 = simulate(m, l, sys);
    l.fp8_param_gather = true;
    const Estimate e1 = estimate(m, l, sys);
    const SimReport r1 = simulate(m, l, sys);
    REQUIRE(r1.ranks.size() == r0.ranks.size());
    for (std::size_t i = 0; i < r1.ranks.size(); ++i) {
      const RankSummary &a = r0.ranks[i], &b = r1.ranks[i];
      const auto k = static_cast<std::size_t>(b.pp);
      const double saved = e0.memory[k].weights_bytes - e1.memory[k].weights_bytes;
      CHECK(saved > 0);
      CHECK(a.peak_bytes - b.peak_bytes == doctest::Approx(saved).epsilon(1e-9));
      CHECK(b.peak_bytes == doctest::Approx(e1.memory[k].total()).epsilon(kMemoryTol));
    }
  }
}

// --min-headroom counts in the simulator's verdict as in the estimate's: a layout with less headroom than asked
// does not fit in either.
TEST_CASE("the simulator's fits verdict keeps the asked headroom free") {
  System sys = load_system("dgx-a100");
  const Model m = load_model("gpt3-175b");
  Layout l;
  l.tp = 8, l.pp = 8, l.dp = 4, l.global_batch = 256, l.zero_stage = 1, l.recompute = Recompute::selective;
  l.schedule = sched::Kind::one_f_one_b;
  l.sequence_parallel = true;
  const SimReport r = simulate(m, l, sys);
  REQUIRE(r.fits);
  const double left = r.capacity_bytes - r.peak_bytes;
  REQUIRE(left > 2 * kGiB);
  sys.min_headroom_bytes = left - kGiB;
  CHECK(simulate(m, l, sys).fits);
  CHECK(estimate(m, l, sys).fits);
  sys.min_headroom_bytes = left + kGiB;
  CHECK_FALSE(simulate(m, l, sys).fits);
  CHECK_FALSE(estimate(m, l, sys).fits);
}

// The optimizer step is one cost (cost::adamw_time of the parameters a GPU steps) in both engines: the
// simulator charges each position its pipeline rank's shard, the estimate the largest rank's, so the longest
// simulated optimizer op equals the estimate's optimizer_s. GPT-3 175B on pp 8 holds 12 layers a rank plus
// the embedding (first) and its tied copy (last): those two ranks are the largest. With ZeRO-1 the shard is
// 1/dp of that. (Overlap slowdown off: nothing may stretch the op's played time.)
TEST_CASE("simulator and estimate charge the same optimizer step") {
  System sys = load_system("dgx-a100");
  sys.gpu.overlap_slowdown = 0;
  const Model m = load_model("gpt3-175b");
  for (int zero : {0, 1}) {
    CAPTURE(zero);
    Layout l;
    l.tp = 8, l.pp = 8, l.dp = 2, l.global_batch = 16, l.zero_stage = zero;
    l.schedule = sched::Kind::one_f_one_b;
    const Estimate e = estimate(m, l, sys);
    SimOptions o;
    o.critical_path = false;
    const SimReport r = simulate(m, l, sys, o);
    double longest = 0;
    for (std::uint32_t t = 0; t < r.job.graph.size(); ++t)
      if (r.job.info[t].op == OpKind::optimizer) longest = std::max(longest, r.run.end[t] - r.run.start[t]);
    CHECK(longest == doctest::Approx(e.optimizer_s).epsilon(kExact));
  }
}

// ZeRO-2 keeps no whole gradient to accumulate micro-batches into, so each micro-batch's gradient is
// reduce-scattered after its backward (DeepSpeed stage 2, FSDP SHARD_GRAD_OP, and both Tessel runtimes):
// m reductions a step where ZeRO-1 has one. With one micro-batch the two cost the same; with m, ZeRO-2's
// data-parallel traffic exceeds ZeRO-1's by (m - 1) reductions, in the estimate and the event simulator.
TEST_CASE("ZeRO-2 reduce-scatters every micro-batch's gradient, ZeRO-1 once a step") {
  const System sys = load_system("dgx-a100");
  const Model m = load_model("gpt3-175b");
  const auto layout = [](int zero, int gbs) {
    Layout l;
    l.tp = 8;
    l.pp = 8;
    l.dp = 4;
    l.global_batch = gbs;
    l.schedule = sched::Kind::one_f_one_b;
    l.zero_stage = zero;
    l.sequence_parallel = true;
    l.recompute = Recompute::selective;
    return l;
  };
  const auto run = [&](int zero, int gbs) {
    const Layout l = layout(zero, gbs);
    return std::make_pair(estimate(m, l, sys), simulate(m, l, sys));
  };
  // m = 1 (gbs = dp x mbs): the same single reduction.
  const auto [e1, s1] = run(1, 4);
  const auto [e2, s2] = run(2, 4);
  CHECK(e2.dp_comm_s == doctest::Approx(e1.dp_comm_s).epsilon(kExact));
  // ZeRO-2 holds 1/dp of the gradients, so it zeroes less at the step's end; the rest is the same. (The
  // simulator's last rank to finish need not be the closed form's largest, so its step is bounded, not equated.)
  CHECK(e2.zero_grad_s < e1.zero_grad_s);
  CHECK(e2.step_s - e2.zero_grad_s == doctest::Approx(e1.step_s - e1.zero_grad_s).epsilon(kExact));
  CHECK(s2.step_s <= s1.step_s);
  const StepCosts c1 = step_costs(m, layout(1, 4), sys), c2 = step_costs(m, layout(2, 4), sys);
  double zeroing = 0;  // the most any rank saves
  for (std::size_t r = 0; r < c1.tail.size(); ++r) zeroing = std::max(zeroing, c1.tail[r].zero_grad_s - c2.tail[r].zero_grad_s);
  CHECK(zeroing > 0);
  // The zeroing runs beside the parameter all-gather's later buckets, slowed as overlapped compute is.
  CHECK(s1.step_s - s2.step_s <= zeroing * (1 + sys.gpu.overlap_slowdown) + 1e-12);
  // m = 8 and 32: ZeRO-2's extra traffic is (m - 1) times one reduction, whatever m.
  const auto [e1_8, s1_8] = run(1, 32);
  const auto [e2_8, s2_8] = run(2, 32);
  const auto [e1_32, s1_32] = run(1, 128);
  const auto [e2_32, s2_32] = run(2, 128);
  const double one = (e2_8.dp_comm_s - e1_8.dp_comm_s) / 7.0;
  CHECK(one > 0);
  CHECK((e2_32.dp_comm_s - e1_32.dp_comm_s) == doctest::Approx(31.0 * one).epsilon(1e-9));
  // The reductions cost time the single one did not: more exposed communication, a longer step.
  CHECK(e2_32.dp_exposed_s >= e1_32.dp_exposed_s);
  CHECK(s2_32.step_s > s1_32.step_s);
  CHECK(e2_32.step_s > e1_32.step_s);
  // The event simulator plays m times ZeRO-1's reduce-scatters (its buckets, every micro-batch).
  const auto scatters = [](const SimReport& r) {
    std::size_t n = 0;
    for (const TaskInfo& t : r.job.info) n += t.op == OpKind::dp_reducescatter;
    return n;
  };
  CHECK(scatters(s1_32) > 0);
  CHECK(scatters(s2_32) == 32 * scatters(s1_32));
}

// ZeRO's parameter all-gathers move the weights in the dtype training keeps them: 16-bit under mixed
// precision (half the fp32 gradients' reduce-scatter), 4 bytes under fp32 (QA: the simulator gathered 2
// bytes a parameter under fp32, half of what the CPU runtime's measured trace moved).
TEST_CASE("ZeRO-1 gathers parameters in the weights' dtype") {
  const System sys = load_system("dgx-a100");
  const Model m = load_model("megatron-1.7b");
  const auto bytes = [&](Precision p, OpKind op) {
    Layout l;
    l.tp = 1;
    l.pp = 2;
    l.dp = 4;
    l.global_batch = 16;
    l.schedule = sched::Kind::one_f_one_b;
    l.zero_stage = 1;
    l.precision = p;
    const SimReport r = simulate(m, l, sys);
    double b = 0;
    for (const TaskInfo& t : r.job.info)
      if (t.op == op && t.pos == 0) b += t.bytes;
    return b;
  };
  const double rs32 = bytes(Precision::fp32, OpKind::dp_reducescatter), ag32 = bytes(Precision::fp32, OpKind::dp_allgather);
  const double rs16 = bytes(Precision::bf16, OpKind::dp_reducescatter), ag16 = bytes(Precision::bf16, OpKind::dp_allgather);
  CHECK(rs32 > 0);
  CHECK(ag32 == doctest::Approx(rs32).epsilon(1e-12));        // 4 and 4 bytes a parameter
  CHECK(ag16 == doctest::Approx(rs16 / 2).epsilon(1e-12));    // 2 and 4 (fp32 main_grad)
  CHECK(ag32 == doctest::Approx(2 * ag16).epsilon(1e-12));
  // The estimate prices the same bytes: fp32 gathers take longer than bf16's on the same links.
  Layout l;
  l.tp = 1;
  l.pp = 2;
  l.dp = 4;
  l.global_batch = 16;
  l.schedule = sched::Kind::one_f_one_b;
  l.zero_stage = 1;
  l.precision = Precision::fp32;
  const double dp32 = estimate(m, l, sys).dp_comm_s;
  l.precision = Precision::bf16;
  const double dp16 = estimate(m, l, sys).dp_comm_s;
  CHECK(dp32 > dp16);
  // ZeRO-3's per-layer gathers and reduce-scatters and the tied-embedding all-reduce carry their bytes in
  // the trace (QA: 0 bytes, so compare could not check them against a run).
  l.zero_stage = 3;
  const SimReport z3 = simulate(m, l, sys);
  const double layer = 2.0 * static_cast<double>(m.params_per_layer());  // bf16, tp 1
  std::size_t gathers = 0, scatters = 0, tied = 0;
  for (const TaskInfo& t : z3.job.info) {
    if (t.op == OpKind::zero3_allgather) {
      ++gathers;
      CHECK(t.bytes == doctest::Approx(layer).epsilon(1e-12));
    }
    if (t.op == OpKind::zero3_reducescatter) {
      ++scatters;
      CHECK(t.bytes == doctest::Approx(layer).epsilon(1e-12));
    }
    if (t.op == OpKind::tied_allreduce) {
      ++tied;
      CHECK(t.bytes == doctest::Approx(4.0 * m.vocab * m.hidden).epsilon(1e-12));  // fp32 main_grad, tp 1
    }
  }
  CHECK(gathers > 0);
  CHECK(scatters > 0);
  REQUIRE(m.tied_embeddings);  // the case needs the tied all-reduce (Megatron's models tie by default)
  CHECK(tied == 4u);  // one per data-parallel replica
}

// Stages of one bucket or less (40M parameters) reduce as one piece: with overlap their reductions start
// when their backward ends, in both engines (the event simulator used to put them all after the step's
// last compute, as under --no-overlap). Megatron 1.7B on tp 8 pp 8: about 27M parameters a stage.
TEST_CASE("small stages overlap their gradient reductions in the simulator as in the estimate") {
  const System sys = load_system("dgx-a100");
  const Model m = load_model("megatron-1.7b");
  for (int zero : {0, 1, 2}) {
    CAPTURE(zero);
    Layout l;
    l.tp = 8;
    l.pp = 8;
    l.dp = 2;
    l.global_batch = 64;
    l.schedule = sched::Kind::one_f_one_b;
    l.zero_stage = zero;
    l.sequence_parallel = true;
    l.recompute = Recompute::selective;
    const Estimate e = estimate(m, l, sys);
    const SimReport r = simulate(m, l, sys);
    CHECK(std::abs(r.step_s - e.step_s) / e.step_s <= kEstimateTol);
    // Fenced, nothing is faster; under ZeRO-2 every micro-batch's reduction but the last hides, so the
    // overlapped step is shorter (ZeRO-0/1's one reduction follows rank 0's last backward either way).
    Layout fenced = l;
    fenced.overlap_grad_reduce = fenced.overlap_param_gather = false;
    const double f = simulate(m, fenced, sys).step_s;
    CHECK(r.step_s <= f);
    if (zero == 2) CHECK(r.step_s < 0.9 * f);
  }
}

TEST_CASE("simulator: same inputs give the same trace bytes; replica fidelity gives the cluster's step") {
  const System sys = load_system("dgx-a100");
  const Model m = load_model("llama2-7b");
  Layout l;
  l.tp = 2;
  l.pp = 2;
  l.dp = 4;
  l.global_batch = 32;
  SimOptions o;
  o.memory_timeline = true;
  const SimReport a = simulate(m, l, sys, o), b = simulate(m, l, sys, o);
  CHECK(trace::to_chrome_json(to_trace(a, sys)) == trace::to_chrome_json(to_trace(b, sys)));
  // Symmetric replicas on a full-bisection network: one replica plays the same step (no core link).
  o.fidelity = Fidelity::replica;
  const SimReport c = simulate(m, l, sys, o);
  CHECK(c.step_s == doctest::Approx(a.step_s).epsilon(kExact));
  CHECK(c.positions * l.dp == a.positions);
}

TEST_CASE("simulator: oversubscribed core slows cross-pod DP traffic") {
  // With pod_gpus = 8 and oversubscription 4, the DP group of 8 positions spans 8 pods. With every
  // position's all-reduce crossing at once, each gets 1/4 of its NIC rate; with no overlap of the
  // reduction with the backward (overlap_grad_reduce off) the step grows by ~3x the all-reduce time.
  System sys = load_system("dgx-a100");
  const Model m = load_model("llama2-7b");
  Layout l;
  l.tp = 8;
  l.dp = 8;
  l.global_batch = 8;
  l.overlap_grad_reduce = false;
  const double base = simulate(m, l, sys).step_s;
  sys.net.pod_gpus = 8;
  sys.net.oversubscription = 4;
  const double slow = simulate(m, l, sys).step_s;
  CHECK(slow > base * 1.05);
}

// Flows are priced on the flat system and slowed by the core link, so oversubscription counts once: ZeRO-3's
// per-layer gathers too. Llama 2 7B, tp 8, two data-parallel replicas on two nodes in two pods of 8 GPUs
// under 4:1 oversubscription: each gather is alone on its links (gathers and reduce-scatters are chained),
// and the core link of each pod has capacity 1 / 4 of one position's NIC, so it runs at a quarter of its
// uncontended rate throughout. Uncontended, a flat ring of two over the NICs: one latency step (8 us) +
// (1/2) S / (25 GB/s x 0.85), S = one layer's bf16 weight shard (2 x params_per_layer / 8 bytes).
TEST_CASE("simulator: ZeRO-3 gathers across an oversubscribed core pay the oversubscription once") {
  System sys = load_system("dgx-a100");
  sys.net.pod_gpus = 8;
  sys.net.oversubscription = 4;
  const Model m = load_model("llama2-7b");
  Layout l;
  l.tp = 8, l.pp = 1, l.dp = 2, l.global_batch = 2, l.zero_stage = 3;
  SimOptions o;
  o.critical_path = false;
  const SimReport r = simulate(m, l, sys, o);
  const double S = 2.0 * static_cast<double>(m.params_per_layer()) / 8;
  const double uncontended = 8e-6 + 0.5 * S / (25e9 * 0.85);
  std::size_t gathers = 0;
  for (std::uint32_t t = 0; t < r.job.graph.size(); ++t)
    if (r.job.info[t].op == OpKind::zero3_allgather) {
      ++gathers;
      CHECK(r.run.end[t] - r.run.start[t] == doctest::Approx(4 * uncontended).epsilon(kExact));
    }
  CHECK(gathers == 2u * static_cast<std::size_t>(m.layers));  // forward and backward, one per layer
}

TEST_CASE("simulator: bad input") {
  const System sys = load_system("dgx-a100");
  const Model m = load_model("llama2-7b");
  Layout l;
  l.pp = 4;
  l.global_batch = 8;
  SUBCASE("a schedule that does not match the layout") {
    sched::GenParams gp;
    gp.pp = 2;
    gp.microbatches = 8;
    SimOptions o;
    o.schedule = sched::generate("1f1b", gp);
    CHECK_THROWS_AS(simulate(m, l, sys, o), InputError);
  }
  SUBCASE("an invalid schedule is rejected with the validator's message") {
    sched::GenParams gp;
    gp.pp = 4;
    gp.microbatches = 8;
    sched::Schedule s = sched::generate("1f1b", gp);
    s.ranks[1].erase(s.ranks[1].begin());  // drop rank 1's first forward
    SimOptions o;
    o.schedule = s;
    CHECK_THROWS_WITH_AS(simulate(m, l, sys, o), doctest::Contains("schedule"), InputError);
  }
  SUBCASE("a layout that does not fit is simulated and flagged") {
    Layout big;
    big.pp = 1;
    big.global_batch = 64;
    big.micro_batch = 64;
    big.recompute = Recompute::none;
    const SimReport r = simulate(m, big, sys);
    CHECK_FALSE(r.fits);
    CHECK(r.peak_bytes > sys.gpu.memory_bytes);
    CHECK(r.step_s > 0);
  }
}

// A recv is the consuming stage's action, as the runtime records it (PyTorch's 1RECV_F0 / 0RECV_B0): on
// the receiving rank, with that stage's chunk and layers, so a simulated and a measured trace align op by
// op. Forward activations go from stage s to s + 1, gradients from s + 1 to s; each send has one recv
// (the same flow id) on the rank that holds the other stage.
TEST_CASE("simulated recvs carry the receiving stage, its chunk and layers") {
  const System sys = load_system("dgx-a100");
  const Model m = load_model("llama2-7b");
  Layout l;
  l.tp = 1;
  l.pp = 2;
  l.dp = 1;
  l.vpp = 2;
  l.schedule = sched::Kind::zbv;
  l.global_batch = 8;
  const SimReport r = simulate(m, l, sys);
  const trace::Trace t = to_trace(r, sys);
  std::map<std::int64_t, const trace::OpEvent*> send_of;
  for (const auto& e : t.events)
    if (e.op == "send") send_of[e.flow_id] = &e;
  int recvs = 0;
  for (const auto& e : t.events) {
    if (e.op != "recv") continue;
    ++recvs;
    const trace::OpEvent& s = *send_of.at(e.flow_id);
    CAPTURE(e.name);
    CHECK(std::abs(e.stage - s.stage) == 1);
    CHECK(e.rank == r.schedule.rank_of(e.stage));
    CHECK(e.chunk == r.schedule.chunk_of(e.stage));
    CHECK(e.layer_begin == l.first_layer_of_stage(e.stage, m.layers));
    CHECK(e.layer_end == e.layer_begin + l.layers_of_stage(e.stage, m.layers));
    CHECK(e.mb == s.mb);
  }
  CHECK(recvs == int(send_of.size()));
  CHECK(recvs > 0);
}

// The TP collectives drawn in a simulated trace: each inside one compute op of its rank, one per layer
// collective and edge collective of each forward / input-gradient op, whatever the op was cut into
// (gradient-bucket pieces, ZeRO-3's per-layer pieces); a recompute draws the forward's only under full
// recompute (selective recomputes attention's core, which has none).
TEST_CASE("simulated TP slices sit inside their op, once per collective, recompute only when full") {
  const System sys = load_system("dgx-a100");
  const Model m = load_model("gpt3-175b");
  struct Case {
    const char* what;
    Recompute rc;
    int zero;
    AttentionImpl attention;
    bool sp;
  };
  // SP adds backward edge collectives (the embedding's gradient gather) that must land after the recompute.
  for (const Case& k : {Case{"bucket pieces, selective recompute ops", Recompute::selective, 0, AttentionImpl::unfused, false},
                        Case{"full recompute", Recompute::full, 0, AttentionImpl::flash, false},
                        Case{"full recompute, SP", Recompute::full, 0, AttentionImpl::flash, true},
                        Case{"ZeRO-3 layer pieces, SP", Recompute::selective, 3, AttentionImpl::flash, true}}) {
    const std::string what = k.what;
    CAPTURE(what);
    Layout l;
    l.tp = 8, l.pp = 4, l.dp = 2, l.vpp = 1, l.schedule = sched::Kind::one_f_one_b, l.global_batch = 8;
    l.recompute = k.rc;
    l.zero_stage = k.zero;
    l.attention = k.attention;
    l.sequence_parallel = k.sp;
    SimOptions o;
    o.fidelity = Fidelity::replica;
    const SimReport r = simulate(m, l, sys, o);
    const trace::Trace t = to_trace(r, sys);
    int per_layer = 0;
    for (const auto& w : r.costs.work.layer.ops) per_layer += w.cls == OpClass::collective;
    REQUIRE(per_layer > 0);
    std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> compute;  // (rank, mb) -> spans
    int recomputes = 0, pieces = 0;
    for (const auto& e : t.events) {
      if (e.stream == trace::Stream::compute) compute[{e.rank, e.mb}].push_back({e.start_us, e.start_us + e.dur_us});
      recomputes += e.op == "recompute";
      pieces += e.name.find(" part ") != std::string::npos;
    }
    std::size_t tp = 0, outside = 0;
    for (const auto& e : t.events) {
      if (e.stream != trace::Stream::tp || e.mb < 0) continue;
      ++tp;
      bool in = false;
      for (const auto& s : compute[{e.rank, e.mb}]) in |= s.first <= e.start_us + 1e-6 && e.start_us + e.dur_us <= s.second + 1e-6;
      outside += !in;
    }
    CHECK(outside == 0);
    // Expected count: every stage's forward and backward ops, per micro-batch, per position (replica: one).
    std::size_t want = 0;
    const int mbs = l.num_microbatches();
    for (const auto& st : r.costs.work.stages) {
      const StageEdges* edges = r.costs.work.edges_of(st.stage);
      want += static_cast<std::size_t>(mbs) * (2 * per_layer * st.layers + (edges ? edges->count : 0));
      if (k.rc == Recompute::full) want += static_cast<std::size_t>(mbs) * per_layer * st.recomputed_layers;
    }
    CHECK(tp == want);
    CHECK(pieces > 0);  // the cases draw into cut ops
    CHECK(recomputes > 0);  // selective recomputes the attention core, flash or not (Megatron-core)
    CHECK(!t.other_data.contains("tp_slices"));
    // The size limit counts exactly what would be drawn: at that many the slices are drawn, one fewer
    // leaves them all out and says so.
    TraceOptions at_limit, below;
    at_limit.max_tp_slices = tp;
    below.max_tp_slices = tp - 1;
    std::size_t drawn = 0;
    for (const auto& e : to_trace(r, sys, at_limit).events) drawn += e.stream == trace::Stream::tp && e.mb >= 0;
    CHECK(drawn == tp);
    const trace::Trace none = to_trace(r, sys, below);
    CHECK(none.other_data.contains("tp_slices"));
    CHECK(std::none_of(none.events.begin(), none.events.end(),
                       [](const trace::OpEvent& e) { return e.stream == trace::Stream::tp && e.mb >= 0; }));
  }
}

// `tessel compare` on a simulated trace reports what `tessel simulate` printed for it: per rank the same
// busy time, exposed communication and bubble (idle: neither computing nor waiting on communication).
TEST_CASE("compare's per-rank busy, exposed communication and bubble equal the simulator's") {
  const System sys = load_system("cpu");
  const Model m = load_model("tiny");
  for (const char* schedule : {"1f1b", "zbv"}) {
    CAPTURE(schedule);
    Layout l;
    l.tp = 2, l.pp = 2, l.dp = 2, l.vpp = std::string(schedule) == "zbv" ? 2 : 1, l.global_batch = 16;
    l.schedule = sched::parse_schedule(schedule, "case");
    l.precision = Precision::fp32;
    const SimReport r = simulate(m, l, sys);
    const auto rs = trace::rank_stats(to_trace(r, sys));
    REQUIRE(rs.size() == r.ranks.size());
    for (std::size_t i = 0; i < rs.size(); ++i) {
      CAPTURE(rs[i].rank);
      CHECK(rs[i].rank == r.ranks[i].global_rank);
      // The trace prints times to the nanosecond: a few ns of rounding over a step's ops.
      CHECK(rs[i].busy_us == doctest::Approx(r.ranks[i].busy_s * 1e6).epsilon(1e-5));
      CHECK(rs[i].exposed_comm_us == doctest::Approx(r.ranks[i].exposed_comm_s * 1e6).epsilon(1e-4));
      CHECK(rs[i].bubble_us == doctest::Approx(r.ranks[i].bubble_s * 1e6).epsilon(1e-4));
    }
  }
}

// Under the distributed optimizer the parameter all-gathers past the first bucket belong to the next
// step's forward: the trace says so when its slices outlast step_s, and only then.
TEST_CASE("a simulated trace says when slices run past the step") {
  const System sys = load_system("dgx-a100");
  const Model m = load_model("gpt3-175b");
  for (int zero : {0, 1}) {
    CAPTURE(zero);
    Layout l;
    l.tp = 8, l.pp = 4, l.dp = 4, l.vpp = 1, l.schedule = sched::Kind::one_f_one_b, l.global_batch = 32, l.zero_stage = zero;
    SimOptions o;
    o.fidelity = Fidelity::replica;
    const SimReport r = simulate(m, l, sys, o);
    const trace::Trace t = to_trace(r, sys);
    double end = 0;
    for (const auto& e : t.events) end = std::max(end, e.start_us + e.dur_us);
    const bool past = end > r.step_s * 1e6 * (1 + 1e-9);
    CHECK(past == (zero == 1));
    CHECK(t.other_data.contains("after_step") == past);
  }
}

// The critical path is the path that sets step_s: it ends at the step's last task, so its end is step_s.
// Under ZeRO-1/2 with overlap_param_gather the all-gathers past the first bucket end after step_s (the next
// step's parameters, docs/simulator.md); QA: llama2-7b tp1 pp2 dp4 ZeRO-1 printed step 2.410 s with a
// critical path ending at 2.425 s on a dp_allgather. The path is in time order, each op starting no earlier
// than the previous one ends (within rounding).
TEST_CASE("the critical path ends at step_s for ZeRO 0/1/2/3") {
  const System sys = load_system("dgx-h100");
  const Model m = load_model("llama2-7b");
  for (int zero : {0, 1, 2, 3}) {
    CAPTURE(zero);
    Layout l;
    l.tp = 1, l.pp = 2, l.dp = 4, l.vpp = 1, l.schedule = sched::Kind::one_f_one_b, l.global_batch = 64, l.zero_stage = zero;
    const SimReport r = simulate(m, l, sys);
    REQUIRE(!r.critical_path.empty());
    const double end = r.critical_path.back().end_s;
    CHECK(end == doctest::Approx(r.step_s).epsilon(kExact));
    for (std::size_t i = 1; i < r.critical_path.size(); ++i)
      CHECK(r.critical_path[i].start_s >= r.critical_path[i - 1].end_s - kExact * r.step_s);
    // The trace outlasts the step under ZeRO-1/2 (the case this guards); not under 0 and 3.
    double trace_end = 0;
    for (std::uint32_t t = 0; t < r.job.graph.size(); ++t) trace_end = std::max(trace_end, r.run.end[t]);
    CHECK((trace_end > r.step_s * (1 + 1e-9)) == (zero == 1 || zero == 2));
  }
}

// The critical path comes from the engine's own record of which predecessor released each task. Checked here
// against the longest path computed apart, by one pass over the whole graph in topological order with each
// task weighted by its played time: the same length, and that length is step_s. Mixtral with ep 4 over 4
// pipeline stages: the path runs through expert all-to-all flows (checked below) and pipeline transfers, and
// ZeRO-1's parameter all-gathers run past the step, off the path.
TEST_CASE("the critical path is a longest path of the played graph") {
  const System sys = load_system("dgx-h100");
  const Model m = load_model("mixtral-8x7b");
  Layout l;
  l.tp = 2, l.pp = 4, l.dp = 4, l.ep = 4, l.vpp = 1, l.schedule = sched::Kind::one_f_one_b, l.global_batch = 32;
  l.sequence_parallel = true;
  l.zero_stage = 1;
  const SimReport r = simulate(m, l, sys);
  const TaskGraph& g = r.job.graph;
  const std::uint32_t n = g.size();
  std::vector<double> len(n, 0.0);
  std::vector<std::uint32_t> waiting(g.num_preds.begin(), g.num_preds.end()), order;
  for (std::uint32_t t = 0; t < n; ++t)
    if (waiting[t] == 0) order.push_back(t);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::uint32_t t = order[i];
    len[t] += r.run.end[t] - r.run.start[t];
    for (std::uint32_t s : g.successors(t)) {
      len[s] = std::max(len[s], len[t]);
      if (--waiting[s] == 0) order.push_back(s);
    }
  }
  REQUIRE(order.size() == n);
  double longest_to_step = 0;
  for (std::uint32_t t : r.job.step_end) longest_to_step = std::max(longest_to_step, len[t]);
  REQUIRE(!r.critical_path.empty());
  double on_path = 0;
  for (const auto& op : r.critical_path) on_path += op.end_s - op.start_s;
  CHECK(r.critical_path.front().start_s == 0.0);
  CHECK(on_path == doctest::Approx(longest_to_step).epsilon(kExact));
  CHECK(longest_to_step == doctest::Approx(r.step_s).epsilon(kExact));
  // Consecutive: each op on the path starts the instant the one before it ends (it released it).
  for (std::size_t i = 1; i < r.critical_path.size(); ++i) CHECK(r.critical_path[i].start_s == r.critical_path[i - 1].end_s);
  bool a2a = false;
  for (const auto& op : r.critical_path) a2a = a2a || op.what.find("ep_alltoall") != std::string::npos;
  CHECK(a2a);
}

// A pipeline's transfers are priced by their pair: stages nearer than a node still cross one somewhere when the
// job spans nodes. The closed form prices every transfer as the slowest pair (checked here against an
// enumeration of every pair of adjacent-stage ranks); the event engine prices each flow by its own pair.
TEST_CASE("pipeline transfers: a pair crosses a node wherever the job spans nodes; the engine prices each pair") {
  System sys = load_system("dgx-h100");
  for (int g : {4, 8, 72}) {
    sys.node.gpus_per_node = g;
    for (int d = 1; d <= 80; ++d)
      for (int pp = 2; pp <= 6; ++pp) {
        const long long total = static_cast<long long>(d) * pp;
        bool crosses = false;
        for (long long r = 0; r + d < total && !crosses; ++r) crosses = r / g != (r + d) / g;
        CAPTURE(g);
        CAPTURE(d);
        CAPTURE(pp);
        CHECK(cost::p2p_crosses_nodes(sys, d, total) == crosses);
      }
  }
  sys = load_system("dgx-h100");
  const Model m = load_model("megatron-1.7b");
  Layout l;
  l.tp = 2;
  l.pp = 4;
  l.dp = 2;
  l.global_batch = 16;
  l.schedule = sched::Kind::one_f_one_b;
  const StepCosts c = step_costs(m, l, sys);
  const double near = c.work.p2p.seconds_within_node(sys), far = c.work.p2p.seconds_across_nodes(sys);
  REQUIRE(far > 2 * near);
  CHECK(c.p2p_s == doctest::Approx(far).epsilon(kExact));  // stages 1 and 2 sit on two nodes
  // Stages of 4 GPUs on nodes of 8: stage 0 -> 1 and 2 -> 3 stay on NVLink, 1 -> 2 crosses.
  const SimReport r = simulate(m, l, sys);
  int n_near = 0, n_far = 0;
  for (std::uint32_t t = 0; t < r.job.graph.size(); ++t) {
    const TaskInfo& ti = r.job.info[t];
    if (ti.op != OpKind::transfer) continue;
    const bool crosses = std::min(ti.stage, ti.peer_stage) == 1;
    CHECK(r.job.graph.work[t] == doctest::Approx(crosses ? far : near).epsilon(kExact));
    (crosses ? n_far : n_near) += 1;
  }
  CHECK(n_far > 0);
  CHECK(n_near == 2 * n_far);
}
