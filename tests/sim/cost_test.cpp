// Cost model: GEMM quantization, collectives, activation memory (Korthikanti et al. Table 2, exactly), the
// step costs' communication work and prices,
// FLOP conventions (Narayanan eq. 3, Korthikanti eq. 7); the estimate's ZeRO-3 layer count and GPipe logits
// against the event simulator.
#include <doctest/doctest.h>

#include <cmath>
#include <optional>
#include <string_view>

#include "sim/cost/comm.hpp"
#include "sim/cost/compute.hpp"
#include "sim/cost/memory.hpp"
#include "sim/engine/simulate.hpp"
#include "sim/estimate.hpp"
#include "sim/layout_words.hpp"
#include "sim/stack.hpp"
#include "sim/step_costs.hpp"
#include "sim/workload.hpp"
#include "util/json_reader.hpp"

using namespace tessel;

namespace {
constexpr double kExact = 1e-12;   // formulas evaluated two ways: equal up to rounding
constexpr double kTight = 1e-9;
constexpr double kQuantTol = 0.08;  // the 4 us launch overhead on a ~60 us kernel
// Agreement of the estimate with the event simulator when nothing contends: the bounds of
// tests/sim/engine_sim_test.cpp ("agrees with the analytical estimate"), docs/simulator.md.
constexpr double kEstimateTol = 0.05;
constexpr double kMemoryTol = 0.01;

// One micro-batch of one sequence on two tensor-parallel GPUs in bf16: the layout the per-op tests lower.
Layout tp2_one_micro_batch() {
  Layout l;
  l.tp = 2;
  l.dp = 1;
  l.global_batch = 1;
  l.precision = Precision::bf16;
  return l;
}

// The flash attention op of one layer of `m` under `l` on `sys`, priced.
cost::WorkOp flash_of(const System& sys, const Layout& l, const Model& m) {
  for (const cost::WorkOp& op : lower_layer(m, l, sys).ops)
    if (op.cls == cost::OpClass::attention) return op;
  FAIL("no flash attention op");
  return cost::WorkOp{};
}
}  // namespace

TEST_CASE("GEMM: wave and tile quantization, roofline") {
  const System sys = load_system("dgx-a100");
  const GpuSpec& g = sys.gpu;
  // A large square GEMM fills every wave: time = 2 m n (k + k_overhead) / (peak * eff) per tile row, i.e.
  // flops * (1 + k_overhead / k) / (peak * eff), up to the last wave's rounding (< 1% for 8192^2 / 256x128 tiles).
  const cost::GemmShape big{8192, 8192, 8192, 1};
  const double ideal = cost::gemm_flops(big) * (1 + g.gemm_k_overhead / 8192.0) / (g.peak(Precision::bf16) * g.gemm_efficiency);
  CHECK(cost::gemm_time(g, Precision::bf16, big) == doctest::Approx(ideal + g.kernel_overhead_s).epsilon(0.01));
  // 108 SMs: a GEMM of exactly 108 output tiles (128x128) runs in one wave; one more tile needs a second wave.
  // Candidates also include 128x64 tiles, so compare against the best possible: 129 wide is never 1% dearer.
  const double t128 = cost::gemm_time(g, Precision::bf16, {128 * 108, 128, 4096, 1});
  const double t129 = cost::gemm_time(g, Precision::bf16, {128 * 108, 129, 4096, 1});
  // 128 wide: 108 tiles of 128x128 = one wave (T). 129 wide: the best candidate is 128x64 tiles, 324 of
  // them = 3 waves of half-size tiles = 1.5 T; a 1% wider GEMM costs 50% more (launch overhead aside).
  CHECK(t129 / t128 == doctest::Approx(1.5).epsilon(kQuantTol));
  // Many tiny GEMMs (64^3, batched) have low arithmetic intensity: memory-bound, bytes / (bw * efficiency).
  const cost::GemmShape tiny{64, 64, 64, 100000};
  const double bytes = 2.0 * 3 * 64 * 64 * 100000.0;
  CHECK(cost::gemm_time(g, Precision::bf16, tiny) ==
        doctest::Approx(bytes / (g.memory_bw_Bps * g.memory_efficiency) + g.kernel_overhead_s).epsilon(kTight));
}

TEST_CASE("collectives: nccl-tests bus factors and the placement of a group") {
  const System sys = load_system("dgx-a100");
  CHECK(cost::bus_factor(cost::Collective::all_reduce, 8) == doctest::Approx(2.0 * 7 / 8));
  CHECK(cost::bus_factor(cost::Collective::all_gather, 4) == doctest::Approx(0.75));
  CHECK(cost::bus_factor(cost::Collective::send_recv, 2) == 1.0);
  // 8 GPUs of one node: ring all-reduce of S bytes = min(ring, tree) latency + 2 (n-1)/n S / (intra_bw_Bps eff).
  const double S = 100e6;
  const double bw = sys.node.intra_bw_Bps * sys.node.intra_efficiency;
  const double lat = std::min(14.0, 6.0) * sys.node.intra_latency_s;  // 2(n-1) ring steps vs 2 log2 n tree steps
  const auto t = cost::collective_time(sys, cost::Collective::all_reduce, S, {8, 1});
  CHECK_FALSE(t.inter_node);
  CHECK(t.seconds == doctest::Approx(lat + 1.75 * S / bw).epsilon(kTight));
  // A DP group of stride 8 (one member per node) crosses nodes: each member's NIC carries the ring.
  const auto dp = cost::collective_time(sys, cost::Collective::all_reduce, S, {16, 8});
  CHECK(dp.inter_node);
  const double net = sys.net.nic_bw_Bps * sys.net.efficiency;
  CHECK(dp.seconds == doctest::Approx(8 * sys.net.latency_s + 2.0 * 15 / 16 * S / net).epsilon(kTight));
  // A stride-1 group over 4 nodes is hierarchical: intra-node phase, then 1/8 of the buffer per NIC.
  const auto h = cost::collective_time(sys, cost::Collective::all_reduce, S, {32, 1});
  const double expect = 6 * sys.node.intra_latency_s + 1.75 * S / bw + 4 * sys.net.latency_s + 1.5 * (S / 8) / net;
  CHECK(h.seconds == doctest::Approx(expect).epsilon(kTight));
}

TEST_CASE("activation memory reproduces Korthikanti et al. Table 2 exactly") {
  // GPT-3 175B: s = 2048, h = 12288, a = 96; b = 1, t = 8.
  const Model m = load_model("gpt3-175b");
  const double s = 2048, b = 1, h = 12288, a = 96, t = 8;
  const double sbh = s * b * h;
  Layout l;
  l.tp = 8;
  l.micro_batch = 1;
  l.global_batch = 8;
  l.attention = AttentionImpl::unfused;
  struct Row {
    bool sp;
    Recompute rc;
    double expect;
  };
  const Row rows[] = {
      {false, Recompute::none, sbh * (10 + 24 / t + 5 * a * s / (h * t))},
      {true, Recompute::none, sbh * (34 / t + 5 * a * s / (h * t))},
      {false, Recompute::selective, sbh * (10 + 24 / t)},
      {true, Recompute::selective, sbh * 34 / t},
      {false, Recompute::full, 2 * sbh},
  };
  for (const auto& r : rows) {
    l.sequence_parallel = r.sp;
    l.recompute = r.rc;
    CAPTURE(r.sp);
    CAPTURE(to_string(r.rc));
    CHECK(cost::layer_activation_bytes(m, l) == doctest::Approx(r.expect).epsilon(kExact));
  }
  // No parallelism at all (t = 1): s b h (34 + 5 a s / h).
  l.tp = 1;
  l.sequence_parallel = false;
  l.recompute = Recompute::none;
  CHECK(cost::layer_activation_bytes(m, l) == doctest::Approx(sbh * (34 + 5 * a * s / h)).epsilon(kExact));
}

TEST_CASE("first-stage activations: Korthikanti eq. 5 (1F1B) and the interleaved factor") {
  // Eq. 5 with TP + SP (the 34/t form): (s b h L / t)(34 + 5 a s / h) on stage 0 of a 1F1B pipeline with
  // m >= p, because stage 0 keeps p micro-batches of L/p layers. Interleaved: times (1 + (p-1)/(p v)).
  const Model m = load_model("gpt3-175b");
  const System sys = load_system("dgx-a100");
  Layout l;
  l.tp = 8;
  l.pp = 8;
  l.dp = 1;
  l.micro_batch = 1;
  l.global_batch = 64;
  l.schedule = sched::Kind::one_f_one_b;
  l.sequence_parallel = true;
  l.attention = AttentionImpl::unfused;
  const double s = 2048, h = 12288, a = 96, L = 96, t = 8;
  const double eq5 = s * h * L / t * (34 + 5 * a * s / h);
  const Estimate e = estimate(m, l, sys);
  CHECK(e.memory[0].activations_bytes == doctest::Approx(eq5).epsilon(kExact));
  l.schedule = sched::Kind::interleaved;
  l.vpp = 3;
  const Estimate ei = estimate(m, l, sys);
  CHECK(ei.memory[0].activations_bytes == doctest::Approx(eq5 * (1 + 7.0 / (8 * 3))).epsilon(kExact));
}

TEST_CASE("FLOP conventions: Narayanan eq. 3 and Korthikanti eq. 7") {
  const Model m = load_model("gpt3-175b");
  const System sys = load_system("dgx-a100");
  Layout l;
  l.tp = 8;
  l.pp = 8;
  l.dp = 16;
  l.vpp = 3;
  l.schedule = sched::Kind::interleaved;
  l.micro_batch = 1;
  l.global_batch = 1536;
  l.recompute = Recompute::full;
  l.attention = AttentionImpl::unfused;
  const Estimate e = estimate(m, l, sys);
  const double B = 1536, s = 2048, L = 96, h = 12288, V = 51200;
  const double eq3 = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h));
  const double eq7 = 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L));
  CHECK(e.tflops_eq3_per_gpu * 1e12 * e.step_s * 1024 == doctest::Approx(eq3).epsilon(kTight));
  CHECK(e.model_tflops_per_gpu * 1e12 * e.step_s * 1024 == doctest::Approx(eq7).epsilon(kTight));
  // Full recompute: hardware FLOPs = model + one more forward of the layers = eq. 3's layer term.
  CHECK(e.hfu > e.mfu);
  // Causal convention: eq. 7's attention term is 72 B L s h^2 * s/(6h) = 12 B L s^2 h (QK^T and AV, forward and
  // backward, counted full); a causal model computes half of it.
  const double attention = 12 * B * L * s * s * h;
  CHECK(e.model_tflops_per_gpu_causal * 1e12 * e.step_s * 1024 == doctest::Approx(eq7 - attention / 2).epsilon(kTight));
  CHECK(e.mfu_causal / e.mfu == doctest::Approx((eq7 - attention / 2) / eq7).epsilon(kTight));
  // The same under flash attention, which prices half the work but counts the model's FLOPs alike.
  l.attention = AttentionImpl::flash;
  const Estimate f = estimate(m, l, sys);
  CHECK(f.model_tflops_per_gpu_causal * 1e12 * f.step_s * 1024 == doctest::Approx(eq7 - attention / 2).epsilon(kTight));
}

TEST_CASE("pipeline closed forms with uniform stages") {
  // 1F1B: (m + p - 1) C; interleaved: m C + (p - 1) C / v; ZB-1P bubble (p-1)(F + B - 2W) with B = I + W.
  Layout l;
  l.pp = 4;
  l.dp = 1;
  l.micro_batch = 1;
  l.global_batch = 8;
  const std::vector<double> f(4, 1.0), i(4, 1.0), w(4, 1.0);
  l.schedule = sched::Kind::one_f_one_b;
  CHECK(pipeline_time(l, f, i, w) == doctest::Approx((8 + 3) * 3.0));
  l.schedule = sched::Kind::interleaved;
  l.vpp = 2;
  CHECK(pipeline_time(l, f, i, w) == doctest::Approx(8 * 3.0 + 3 * 3.0 / 2));
  l.schedule = sched::Kind::zb1p;
  l.vpp = 1;
  CHECK(pipeline_time(l, f, i, w) == doctest::Approx(8 * 3.0 + 3 * 1.0));
  l.schedule = sched::Kind::zb2p;
  CHECK(pipeline_time(l, f, i, w) == doctest::Approx(8 * 3.0));
}

TEST_CASE("overlapped communication slows compute, unless it outlasts the compute it overlaps") {
  // Compute running beside communication is slowed by s (0.189 for the A100: Lee et al. 2025,
  // arXiv:2507.03114, mean compute slowdown under overlap): in the time t it does t / (1 + s) of work.
  // A reduction of length C starting a window W of compute before the end: if C <= W (1 + s) it hides and
  // the step grows by C s / (1 + s); if it outlasts the slowed window, the step ends when it does, C - W
  // after the window's start, slowdown or not. The estimate charges the overlapped part t_o s / (1 + s)
  // and widens the window by (1 + s) before taking what is exposed; these cases hold it to both ends.
  const Model m = load_model("gpt3-175b");
  const auto pair = [&](Layout l) {
    System sys = load_system("dgx-a100");
    REQUIRE(sys.gpu.overlap_slowdown == doctest::Approx(0.189));
    const Estimate with = estimate(m, l, sys);
    sys.gpu.overlap_slowdown = 0;
    return std::make_pair(with, estimate(m, l, sys));
  };
  Layout l;
  l.tp = 8;
  l.pp = 8;
  l.dp = 16;
  l.micro_batch = 1;
  l.global_batch = 1536;
  l.sequence_parallel = true;
  l.recompute = Recompute::selective;
  {  // Megatron's overlapped gradient reduction: part hidden, part exposed
    const auto [with, without] = pair(l);
    CHECK(with.overlapped_comm_s > 0);
    CHECK(without.overlap_slowdown_s == 0);
    const double grew = with.step_s - without.step_s;
    CHECK(grew > 0);
    CHECK(grew <= with.overlapped_comm_s * 0.189 / 1.189 + 1e-12);  // at most the overlapped part's slowdown
  }
  {  // Llama 2 7B on two GPUs of one node, one micro-batch each: the NVLink all-reduce (about 0.1 s) is the
     // only overlapped communication and hides inside the last backward; the step grows by its slowdown
    const Model small = load_model("llama2-7b");
    Layout h;
    h.dp = 2;
    h.micro_batch = 1;
    h.global_batch = 2;
    h.recompute = Recompute::selective;
    System sys = load_system("dgx-a100");
    const Estimate with = estimate(small, h, sys);
    sys.gpu.overlap_slowdown = 0;
    const Estimate without = estimate(small, h, sys);
    CHECK(with.overlapped_comm_s > 0);
    CHECK(with.dp_exposed_s == doctest::Approx(without.dp_exposed_s).epsilon(1e-12));
    CHECK(with.step_s - without.step_s == doctest::Approx(with.overlapped_comm_s * 0.189 / 1.189).epsilon(1e-9));
  }
  {  // GPT-3 on two 8-GPU nodes, tp 8 dp 2, one micro-batch each: the all-reduce over InfiniBand outlasts
     // the last backward even slowed, so the step ends with it, slowdown or not
    Layout z = l;
    z.pp = 1;
    z.dp = 2;
    z.global_batch = 2;
    const auto [with, without] = pair(z);
    CHECK(with.overlapped_comm_s > 0);
    CHECK(with.dp_exposed_s > 0);
    CHECK(with.step_s == doctest::Approx(without.step_s).epsilon(1e-9));
  }
  l.overlap_grad_reduce = false;
  l.overlap_param_gather = false;
  CHECK(estimate(m, l, load_system("dgx-a100")).overlapped_comm_s == 0);
}

TEST_CASE("GEMM: fp8 has its own ceiling when the system gives one") {
  // Same shape and tiles: time is inversely proportional to peak x efficiency (plus the kernel overhead), so
  // with gemm_fp8 = gemm / 2 an fp8 GEMM takes twice as long (minus overhead) as with the shared number.
  System sys = load_system("dgx-h100");
  sys.gpu.gemm_efficiency_fp8 = 0;  // the shared number first (the preset measures fp8 apart)
  const cost::GemmShape g{8192, 8192, 8192, 1};
  const double shared = cost::gemm_time(sys.gpu, Precision::fp8, g) - sys.gpu.kernel_overhead_s;
  sys.gpu.gemm_efficiency_fp8 = sys.gpu.gemm_efficiency / 2;
  const double own = cost::gemm_time(sys.gpu, Precision::fp8, g) - sys.gpu.kernel_overhead_s;
  CHECK(own == doctest::Approx(2 * shared).epsilon(1e-12));
  // bf16 is untouched.
  const double bf16 = cost::gemm_time(sys.gpu, Precision::bf16, g);
  sys.gpu.gemm_efficiency_fp8 = 0;
  CHECK(cost::gemm_time(sys.gpu, Precision::bf16, g) == bf16);
}

TEST_CASE("ZeRO-3: every layer a pipeline rank holds is gathered and reduced, whatever vpp") {
  // ZeRO-3 all-gathers each layer's weights for forward and backward and reduce-scatters its gradients, per
  // micro-batch: dp time = m x L_rank x (2 AG + RS), with L_rank the layers of all the rank's chunks. GPT-3
  // 175B on pp 8 holds 96 / 8 = 12 layers per rank at vpp 1, 2, 3 and 4 alike, so the data-parallel time and
  // its exposed part are the same at every vpp (the interleaved schedule changes the bubble, not the layers).
  const System sys = load_system("dgx-a100");
  const Model m = load_model("gpt3-175b");
  Layout l;
  l.tp = 8;
  l.pp = 8;
  l.dp = 16;
  l.global_batch = 1536;
  l.zero_stage = 3;
  l.sequence_parallel = true;
  l.recompute = Recompute::selective;
  l.schedule = sched::Kind::one_f_one_b;
  const Estimate one = estimate(m, l, sys);
  REQUIRE(one.dp_comm_s > 0);
  l.schedule = sched::Kind::interleaved;
  for (int v : {2, 3, 4}) {
    CAPTURE(v);
    l.vpp = v;
    const Estimate e = estimate(m, l, sys);
    CHECK(e.dp_comm_s == doctest::Approx(one.dp_comm_s).epsilon(kExact));
    CHECK(e.dp_exposed_s == doctest::Approx(one.dp_exposed_s).epsilon(kExact));
    // The event simulator plays the per-layer collectives of every chunk.
    const engine::SimReport r = engine::simulate(m, l, sys);
    CHECK(std::abs(r.step_s - e.step_s) / e.step_s <= kEstimateTol);
  }
  // Uneven split: ranks hold 10, 12 x 6 and 14 layers, as one chunk (vpp 1) or two (vpp 2, 5 + 5 ... 7 + 7).
  // The rank with 14 layers stalls longest: dp time = 14 / 12 of the even split's, at vpp 1 and 2 alike.
  l.schedule = sched::Kind::one_f_one_b;
  l.vpp = 1;
  l.stage_layers = {10, 12, 12, 12, 12, 12, 12, 14};
  const Estimate uneven1 = estimate(m, l, sys);
  // The tied embedding's all-reduce between the first and last rank is in the DP row too, whatever the split.
  const double tied = step_costs(m, l, sys).tied_s;
  REQUIRE(tied > 0);
  CHECK(uneven1.dp_comm_s - tied == doctest::Approx((one.dp_comm_s - tied) * 14 / 12).epsilon(kExact));
  l.schedule = sched::Kind::interleaved;
  l.vpp = 2;
  l.stage_layers = {5, 6, 6, 6, 6, 6, 6, 7, 5, 6, 6, 6, 6, 6, 6, 7};
  const Estimate uneven2 = estimate(m, l, sys);
  CHECK(uneven2.dp_comm_s == doctest::Approx(uneven1.dp_comm_s).epsilon(kExact));
  CHECK(uneven2.dp_exposed_s == doctest::Approx(uneven1.dp_exposed_s).epsilon(kExact));
  const engine::SimReport r = engine::simulate(m, l, sys);
  CHECK(std::abs(r.step_s - uneven2.step_s) / uneven2.step_s <= kEstimateTol);
}

TEST_CASE("GPipe and looped BFS keep every micro-batch's logits on the last stage, as the simulator does") {
  // The fp32 logits of a micro-batch live from the last stage's forward to its input-grad backward. GPipe
  // and looped BFS run all m forwards of the last stage before its first backward, so m logits buffers are
  // alive on the last pipeline rank at its peak (1F1B: one). Expectation: the estimate's total per pipeline
  // rank equals the simulated peak of every position of that rank within kMemoryTol, as for 1F1B.
  const System sys = load_system("dgx-a100");
  const Model m = load_model("gpt3-175b");
  struct Case { const char* sched; int vpp; };
  for (const Case c : {Case{"gpipe", 1}, Case{"looped-bfs", 2}, Case{"1f1b", 1}}) {
    CAPTURE(c.sched);
    Layout l;
    l.tp = 8;
    l.pp = 8;
    l.dp = 16;
    l.vpp = c.vpp;
    l.global_batch = 1536;
    l.schedule = sched::parse_schedule(c.sched, "case");
    l.recompute = Recompute::full;
    const Estimate e = estimate(m, l, sys);
    const engine::SimReport r = engine::simulate(m, l, sys);
    for (const auto& k : r.ranks) {
      CAPTURE(k.pp);
      CHECK(k.peak_bytes == doctest::Approx(e.memory[static_cast<std::size_t>(k.pp)].total()).epsilon(kMemoryTol));
    }
    CHECK(e.peak_memory_bytes == doctest::Approx(r.peak_bytes).epsilon(kMemoryTol));
  }
  // Without a pipeline the name does not apply: one micro-batch at a time (Megatron's no-pipelining path),
  // so "gpipe" at pp 1 holds one micro-batch's activations in both, as "1f1b" does.
  Layout l;
  l.tp = 8;
  l.pp = 1;
  l.dp = 1;
  l.global_batch = 8;
  l.schedule = sched::Kind::gpipe;
  const Model llama = load_model("llama2-7b");
  const engine::SimReport gp = engine::simulate(llama, l, sys);
  CHECK(gp.peak_bytes == doctest::Approx(estimate(llama, l, sys).peak_memory_bytes).epsilon(kMemoryTol));
  l.schedule = sched::Kind::one_f_one_b;
  CHECK(gp.peak_bytes == doctest::Approx(engine::simulate(llama, l, sys).peak_bytes).epsilon(1e-12));
}

// The estimate's table accounts for the step: compute, the exposed TP, CP, PP and DP communication, the
// optimizer, the compute lost to overlapped communication and the idle bubble add up to the step time, and
// no exposed figure exceeds its total (PP's total counts the fill and drain; DP's the rank with the tail and
// the tied embedding's all-reduce).
TEST_CASE("estimate: the rows add up to the step, and exposed never exceeds total") {
  struct Case {
    const char* model;
    const char* system;
    int tp, pp, dp, cp, vpp, gbs, zero;
    const char* schedule;
    bool overlap;
  };
  const Case cases[] = {
      {"gpt3-175b", "dgx-a100", 8, 8, 16, 1, 3, 1536, 0, "interleaved", true},
      {"gpt3-175b", "dgx-a100", 8, 8, 16, 1, 3, 1536, 0, "interleaved", false},
      {"llama3-70b", "dgx-h100", 4, 4, 2, 2, 2, 128, 1, "zbv", true},
      {"llama2-7b", "dgx-h100", 1, 4, 1, 1, 1, 16, 0, "1f1b", true},
      {"llama2-7b", "dgx-h100", 2, 2, 4, 1, 1, 64, 3, "1f1b", false},
      {"llama2-7b", "dgx-h100", 1, 1, 8, 1, 1, 64, 2, "1f1b", true},
  };
  for (const Case& k : cases) {
    CAPTURE(k.model);
    CAPTURE(k.schedule);
    CAPTURE(k.overlap);
    Layout l;
    l.tp = k.tp, l.pp = k.pp, l.dp = k.dp, l.cp = k.cp, l.vpp = k.vpp, l.global_batch = k.gbs;
    l.zero_stage = k.zero;
    l.schedule = sched::parse_schedule(k.schedule, "case");
    l.sequence_parallel = k.tp > 1;
    l.overlap_grad_reduce = l.overlap_param_gather = k.overlap;
    const Model m = load_model(k.model);
    const System sys = load_system(k.system);
    const Estimate e = estimate(m, l, sys);
    const double rows = e.compute_s + e.tp_exposed_s + e.cp_exposed_s + e.pp_exposed_s + e.dp_exposed_s +
                        e.grad_norm_s + e.optimizer_s + e.zero_grad_s + e.overlap_slowdown_s + e.bubble_fraction * e.step_s;
    CHECK(e.grad_norm_s > 0);
    CHECK(e.zero_grad_s > 0);
    CHECK(rows == doctest::Approx(e.step_s).epsilon(1e-9));
    CHECK(e.tp_exposed_s <= e.tp_comm_s * (1 + 1e-12));
    CHECK(e.pp_exposed_s <= e.pp_comm_s * (1 + 1e-12));
    CHECK(e.dp_exposed_s <= e.dp_comm_s * (1 + 1e-12));
    CHECK(e.cp_exposed_s <= e.cp_comm_s * (1 + 1e-12));
    CHECK((e.cp_comm_s > 0) == (k.cp > 1));
    CHECK(e.bubble_fraction >= 0);
    CHECK(e.compute_s > 0);
  }
}

// The data-parallel communication of Llama 2 7B on 8 H100s (dp 8, not overlapped) under `change`'s
// precision and gradient dtype.
namespace {
double dp_comm_s(const Layout& change) {
  Layout l = change;
  l.tp = 1, l.pp = 1, l.dp = 8, l.global_batch = 64;
  l.overlap_grad_reduce = false;
  return estimate(load_model("llama2-7b"), l, load_system("dgx-h100")).dp_comm_s;
}
}  // namespace

// Megatron-LM keeps fp16 gradients under fp16 (--accumulate-allreduce-grads-in-fp32 is off by default; bf16
// forces it on): 2 bytes per gradient and half the data-parallel bytes of bf16's fp32 main_grad.
TEST_CASE("fp16 keeps 2-byte gradients, bf16 fp32 ones") {
  Layout l;
  l.precision = Precision::bf16;
  CHECK(cost::state_bytes_per_param(l).total() == 18);
  l.precision = Precision::fp16;
  CHECK(cost::state_bytes_per_param(l).grads == 2);
  CHECK(cost::state_bytes_per_param(l).total() == 16);
  l.precision = Precision::bf16;
  const double bf16 = dp_comm_s(l);
  l.precision = Precision::fp16;
  const double fp16 = dp_comm_s(l);
  CHECK(fp16 < 0.6 * bf16);  // half the bytes, the same latency terms
  CHECK(fp16 > 0.4 * bf16);
}

// The state dtypes (Megatron-Core --main-grads-dtype / --exp-avg-dtype, NeMo's distributed Adam): bytes a
// parameter from their definitions, sharded as the ZeRO stage says, and the DP reduction moving the gradient
// buffer's dtype.
TEST_CASE("state dtypes: gradient, moment and master bytes a parameter, and the gradient reduction's bytes") {
  Layout l;
  l.precision = Precision::bf16;
  CHECK(cost::state_bytes_per_param(l).optimizer == 12);  // fp32 master + two fp32 moments
  l.state.master_weights = MasterWeights::remainder;
  CHECK(cost::state_bytes_per_param(l).optimizer == 10);  // 16-bit remainder + two fp32 moments
  l.state.master_weights = MasterWeights::none;
  l.state.moments = StateDtype::bf16;
  CHECK(cost::state_bytes_per_param(l).optimizer == 4);  // two bf16 moments
  l.state.main_grads = StateDtype::bf16;
  CHECK(cost::state_bytes_per_param(l).grads == 2);
  CHECK(cost::state_bytes_per_param(l).total() == 2 + 2 + 4);
  l.dp = 4;
  l.zero_stage = 1;
  CHECK(cost::state_bytes_per_param(l).optimizer == 1);
  CHECK(cost::state_bytes_per_param(l).grads == 2);
  l.zero_stage = 2;
  CHECK(cost::state_bytes_per_param(l).grads == 0.5);
  // fp8 training keeps its gradient buffer like bf16 training.
  Layout f8;
  f8.precision = Precision::fp8;
  f8.state.main_grads = StateDtype::bf16;
  CHECK(cost::grad_bytes(f8) == 2);
  f8.state.main_grads = StateDtype::fp32;
  CHECK(cost::grad_bytes(f8) == 4);
  Layout d;
  const double fp32_grads = dp_comm_s(d);
  d.state.main_grads = StateDtype::bf16;
  const double bf16_grads = dp_comm_s(d);
  CHECK(bf16_grads < 0.6 * fp32_grads);  // half the bytes, the same latency terms
  CHECK(bf16_grads > 0.4 * fp32_grads);
}

// NVIDIA's recipe for Nemotron-4 340B on 128 H100 (dgxc-benchmarking v24.11.1, nemotron/nemotron4-340b-synth.yaml:
// tp 8, pp 8, vpp 12, mbs 1, gbs 32, selective recompute, distributed_fused_adam with dtype bf16 and
// grad_sync_dtype bf16, i.e. bf16 gradients and moments and no master copy) ran on 80 GiB GPUs at 3.16 s a step
// in fp8 (its README). With fp32 state the memory model puts it at 88.6 GiB; with the recipe's it must fit.
TEST_CASE("state dtypes: NVIDIA's Nemotron-4 340B recipe fits on 80 GiB with its bf16 optimizer state") {
  const Model m = load_model("nemotron-340b");
  const System sys = load_system("dgx-h100");
  Layout l = parse_layout_words("tp8 pp8 dp2 vpp12 mbs1 interleaved selective sp zero1", 32);
  l.precision = Precision::fp8;
  apply_stack(stack_preset("megatron-core-2024"), l);
  const Estimate fp32_state = estimate(m, l, sys);
  CHECK_FALSE(fp32_state.fits);
  l.state.main_grads = StateDtype::bf16;
  l.state.moments = StateDtype::bf16;
  l.state.master_weights = MasterWeights::none;
  const Estimate recipe = estimate(m, l, sys);
  CHECK(recipe.fits);
  // Gradients 4 -> 2 bytes a parameter, optimizer state 12 -> 4 sharded over dp 2 (ZeRO-1): 2 + 4 = 6 bytes less
  // on each of the 341B / 64 parameters a GPU holds, about 32 GiB.
  const double saved_GiB = (fp32_state.peak_memory_bytes - recipe.peak_memory_bytes) / (1024.0 * 1024 * 1024);
  MESSAGE("peak " << fp32_state.peak_memory_bytes / (1024.0 * 1024 * 1024) << " -> "
                  << recipe.peak_memory_bytes / (1024.0 * 1024 * 1024) << " GiB, step " << recipe.step_s << " s");
  CHECK(saved_GiB > 30);
  CHECK(saved_GiB < 34);
  CHECK(std::fabs(recipe.step_s / 3.16 - 1) < 0.1);  // the README's fp8 step on 128 H100
}

// fp8 weights, counted by hand from the two ways Megatron-Core holds them (Transformer Engine's Float8Tensor
// weights with --fp8-param-gather; otherwise 16-bit weights whose fp8 cast and its Hopper transpose TE caches
// over a step's micro-batches):
// - per GEMM weight: Hopper 1 + 1 with fp8 primary weights, 2 + 1 + 1 without; Blackwell (no transpose) 1 and
//   2 + 1; MXFP8 two copies of 1 + 1/32 either way, plus the 16-bit weight without;
// - the norms, embeddings and head stay 16-bit: switching fp8 primary weights on saves 2 bytes exactly on
//   each GEMM weight and nothing on the rest, and leaves the Hopper weights where bf16 training has them;
// - the distributed optimizer gathers the GEMM weights at 1 byte, the rest at 2.
TEST_CASE("fp8 primary weights: 16-bit weights plus the cached cast, or fp8 copies alone") {
  Layout l;
  l.precision = Precision::fp8;
  l.dp = 8;
  l.zero_stage = 1;
  CHECK(cost::fp8_gemm_weight_bytes(l, GpuArch::hopper) == 4);
  CHECK(cost::fp8_gemm_weight_bytes(l, GpuArch::blackwell) == 3);
  CHECK(cost::state_bytes_per_param(l, GpuArch::hopper).weights == 2);  // a norm's or the embedding's
  CHECK(cost::fp8_gemm_gather_bytes(l) == 2);
  l.fp8_param_gather = true;
  CHECK(l.fp8_params());
  CHECK(cost::fp8_gemm_weight_bytes(l, GpuArch::hopper) == 2);
  CHECK(cost::fp8_gemm_weight_bytes(l, GpuArch::blackwell) == 1);
  CHECK(cost::fp8_gemm_gather_bytes(l) == 1);
  l.fp8_recipe = Fp8Recipe::mxfp8;
  CHECK(cost::fp8_gemm_weight_bytes(l, GpuArch::blackwell) == doctest::Approx(2.0625));
  CHECK(cost::fp8_gemm_gather_bytes(l) == 2);  // gathered 16-bit, quantized after
  l.fp8_param_gather = false;
  CHECK(cost::fp8_gemm_weight_bytes(l, GpuArch::blackwell) == doctest::Approx(4.0625));
  l.fp8_recipe = Fp8Recipe::delayed;
  // ZeRO-3: a shard holds what is gathered (the 16-bit weight; fp8 with fp8 primary weights), and the casts
  // live with the gathered weights.
  l.zero_stage = 3;
  CHECK(cost::state_bytes_per_param(l, GpuArch::hopper).gemm_weights == doctest::Approx(2.0 / 8));
  CHECK(cost::fp8_gemm_gathered_bytes(l, GpuArch::hopper) == 4);
  CHECK(cost::fp8_gemm_gathered_bytes(l, GpuArch::blackwell) == 3);
  l.fp8_param_gather = true;
  CHECK(cost::state_bytes_per_param(l, GpuArch::hopper).gemm_weights == doctest::Approx(1.0 / 8));
  CHECK(cost::fp8_gemm_gathered_bytes(l, GpuArch::hopper) == 2);
  CHECK(cost::fp8_gemm_gathered_bytes(l, GpuArch::blackwell) == 1);
  l.fp8_param_gather = false;
  // Without ZeRO (Megatron-Core asserts the distributed optimizer) or without fp8, the flag changes nothing.
  l.fp8_param_gather = true;
  l.zero_stage = 0;
  CHECK_FALSE(l.fp8_params());
  CHECK(cost::fp8_gemm_weight_bytes(l, GpuArch::hopper) == 4);
  l.zero_stage = 1;
  l.precision = Precision::bf16;
  CHECK_FALSE(l.fp8_params());
  CHECK(cost::state_bytes_per_param(l, GpuArch::hopper).gemm_weights == 2);

  const Model m = load_model("llama3-70b");
  const System sys = load_system("dgx-h100");
  Layout f = parse_layout_words("tp4 pp4 dp16 cp2 vpp5 mbs1 interleaved sp zero1", 512);
  f.precision = Precision::fp8;
  const StepCosts cached = step_costs(m, f, sys);
  f.fp8_param_gather = true;
  const StepCosts fp8w = step_costs(m, f, sys);
  Layout b = f;
  b.precision = Precision::bf16;
  const StepCosts bf16 = step_costs(m, b, sys);
  for (int r = 0; r < f.pp; ++r) {
    // The wide parameters: 2 norms of 8192 a layer split over tp (as the memory model counts them), and the
    // embedding on the first rank, the final norm and the head on the last.
    const double layers = cached.ranks.layers[static_cast<std::size_t>(r)];
    double wide = layers * 2 * 8192 / 4.0;
    if (r == 0) wide += 128256.0 * 8192 / 4;
    if (r == f.pp - 1) wide += 128256.0 * 8192 / 4 + 8192 / 4.0;
    CHECK(cached.ranks.wide_params[static_cast<std::size_t>(r)] == doctest::Approx(wide));
    const double gemm = cached.gemm_params(r);
    CHECK(gemm == doctest::Approx(cached.ranks.params[static_cast<std::size_t>(r)] - wide));
    CHECK(cached.weight_bytes(r) - fp8w.weight_bytes(r) == doctest::Approx(2 * gemm));
    CHECK(fp8w.weight_bytes(r) == doctest::Approx(bf16.weight_bytes(r)));
    CHECK(cached.state_bytes(r) - fp8w.state_bytes(r) == doctest::Approx(2 * gemm));
  }
  const double share = fp8_gemm_share(fp8w.work);
  CHECK(share > 0.9);
  CHECK(share < 1);
  CHECK(fp8w.work.sync.param_gather.bytes_per_param == doctest::Approx((1 - share) * 2 + share * 1));
  CHECK(cached.work.sync.param_gather.bytes_per_param == 2);
  // The weights' casts, once a step on the rank: 4 bytes a held GEMM weight cached (read 2, write the copy and
  // its transpose), against 1 a stepped weight plus 2 a held one for the transpose rebuilt with fp8 weights.
  const double held = cached.gemm_params(1), stepped = held / (16 * 2);
  const double cast_cached = cached.tail[1].optimizer_s - bf16.tail[1].optimizer_s;
  const double cast_fp8w = fp8w.tail[1].optimizer_s - bf16.tail[1].optimizer_s;
  const double rate = sys.gpu.memory_bw_Bps * sys.gpu.memory_efficiency;
  const double launches = 4 * cached.ranks.layers[1] * sys.gpu.kernel_overhead_s;
  CHECK(cast_cached == doctest::Approx(4 * held / rate + launches).epsilon(1e-6));
  CHECK(cast_fp8w == doctest::Approx((stepped + 2 * held) / rate + launches).epsilon(1e-6));
  // The memory the estimate reports is the step costs' (the event engine takes the same state_bytes).
  const Estimate e_cached = estimate(m, parse_layout_words("tp4 pp4 dp16 cp2 vpp5 mbs1 interleaved sp zero1", 512), sys);
  CHECK(e_cached.memory.size() == 4);
  Layout g = f;
  g.fp8_param_gather = false;
  const Estimate ec = estimate(m, g, sys), ef = estimate(m, f, sys);
  for (int r = 0; r < f.pp; ++r)
    CHECK(ec.memory[static_cast<std::size_t>(r)].weights_bytes - ef.memory[static_cast<std::size_t>(r)].weights_bytes ==
          doctest::Approx(2 * cached.gemm_params(r)));
}

// torchao's fp8 weights (torchtitan: Float8Linear, pytorch/ao torchao/float8/float8_linear.py), counted by hand:
// - no fp8 copy outlives a micro-batch: 2 bytes a GEMM weight (16-bit) whatever the arch, with FSDP2's float8
//   all-gather too (the shard is cast before each gather), where Transformer Engine keeps 2 + 2 on Hopper;
// - each fp8 linear layer casts its weight in the forward and again in the backward, every micro-batch: a
//   current-scaling cast to one copy reads the weight twice (amax, then the cast) and writes 1 byte, in two
//   kernels: 5 bytes an element; Transformer Engine's once-a-step cast leaves the step's optimizer time;
// - with the float8 all-gather the GEMMs cast nothing, Hopper's backward copies the gathered weight transposed
//   (1 + 1 bytes), and each gather casts the shard (read 2, write 1) after an amax pass a step (2);
// - ZeRO-3 gathers a layer's GEMM weights at 1 byte with fp8 weights, its two norms at 2.
TEST_CASE("fp8 weights under torchao: cast every micro-batch, no copy kept") {
  Layout l;
  l.precision = Precision::fp8;
  l.fp8_recipe = Fp8Recipe::current;
  l.fp8_weight_cast = Fp8WeightCast::per_microbatch;
  l.dp = 8;
  l.zero_stage = 2;
  CHECK(cost::fp8_gemm_weight_bytes(l, GpuArch::hopper) == 2);
  CHECK(cost::fp8_gemm_weight_bytes(l, GpuArch::blackwell) == 2);
  CHECK(cost::fp8_gemm_gathered_bytes(l, GpuArch::hopper) == 3);  // the gathered weight and its one-copy cast
  l.fp8_param_gather = true;
  CHECK(cost::fp8_gemm_weight_bytes(l, GpuArch::hopper) == 2);
  CHECK(cost::fp8_gemm_gather_bytes(l) == 1);
  CHECK(cost::fp8_gemm_gathered_bytes(l, GpuArch::hopper) == 2);
  l.zero_stage = 3;
  CHECK(cost::state_bytes_per_param(l, GpuArch::hopper).gemm_weights == doctest::Approx(2.0 / 8));
  CHECK(cost::fp8_cast_one_copy(Fp8Recipe::current).bytes == 5);
  CHECK(cost::fp8_cast_one_copy(Fp8Recipe::current).kernels == 2);
  CHECK(cost::fp8_cast_one_copy(Fp8Recipe::delayed).bytes == 3);
  CHECK(cost::fp8_cast_one_copy(Fp8Recipe::mxfp8).bytes == doctest::Approx(3.03125));

  const Model m = load_model("llama3-8b");
  const System sys = load_system("dgx-h100");
  const double rate = sys.gpu.memory_bw_Bps * sys.gpu.memory_efficiency, launch = sys.gpu.kernel_overhead_s;
  Layout te = parse_layout_words("tp1 pp1 dp8 mbs1 zero2", 8);
  te.global_batch = 64;
  te.precision = Precision::fp8;
  te.fp8_recipe = Fp8Recipe::current;
  Layout ao = te;
  ao.fp8_weight_cast = Fp8WeightCast::per_microbatch;
  const LayerWork lte = lower_layer(m, te, sys), lao = lower_layer(m, ao, sys);
  REQUIRE(lte.ops.size() == lao.ops.size());
  int weights = 0;
  for (std::size_t i = 0; i < lte.ops.size(); ++i) {
    const WorkOp &a = lao.ops[i], &t = lte.ops[i];
    if (a.cls != OpClass::gemm || !a.has_weights || a.precision != Precision::fp8) {
      CHECK(a.t_f == t.t_f);
      CHECK(a.t_i == t.t_i);
      continue;
    }
    ++weights;
    const double kn = static_cast<double>(a.gemm.k) * a.gemm.n * a.gemm.batch;
    CHECK(a.t_f - t.t_f == doctest::Approx(5 * kn / rate + 2 * launch).epsilon(1e-9));
    CHECK(a.t_i - t.t_i == doctest::Approx(5 * kn / rate + 2 * launch).epsilon(1e-9));
    CHECK(a.t_w == t.t_w);
  }
  CHECK(weights == 4);  // QKV, projection, the SwiGLU's fused up-projection, down-projection
  const StepCosts cte = step_costs(m, te, sys), cao = step_costs(m, ao, sys);
  const double held = cte.gemm_params(0);
  Layout b = te;
  b.precision = Precision::bf16;
  const StepCosts cbf = step_costs(m, b, sys);
  CHECK(cte.tail[0].optimizer_s - cbf.tail[0].optimizer_s ==
        doctest::Approx(6 * held / rate + 2 * 4 * m.layers * launch).epsilon(1e-6));
  CHECK(cao.tail[0].optimizer_s == doctest::Approx(cbf.tail[0].optimizer_s));
  CHECK(cte.weight_bytes(0) - cao.weight_bytes(0) == doctest::Approx(2 * held));
  CHECK(cao.weight_bytes(0) == doctest::Approx(cbf.weight_bytes(0)));

  // FSDP2's float8 all-gather under ZeRO-3: 8 micro-batches, two gathers each.
  Layout z = ao;
  z.zero_stage = 3;
  z.fp8_param_gather = true;
  const LayerWork lz = lower_layer(m, z, sys);
  for (std::size_t i = 0; i < lz.ops.size(); ++i) {
    const WorkOp& a = lz.ops[i];
    if (a.cls != OpClass::gemm || !a.has_weights || a.precision != Precision::fp8) continue;
    const double kn = static_cast<double>(a.gemm.k) * a.gemm.n * a.gemm.batch;
    CHECK(a.t_f == lte.ops[i].t_f);
    CHECK(a.t_i - lte.ops[i].t_i == doctest::Approx(2 * kn / rate + launch).epsilon(1e-9));
  }
  Layout zb = z;
  zb.precision = Precision::bf16;
  const StepCosts cz = step_costs(m, z, sys), czb = step_costs(m, zb, sys);
  const double shard = cz.gemm_params(0) / 8;
  CHECK(cz.tail[0].optimizer_s - czb.tail[0].optimizer_s ==
        doctest::Approx((3 * 16 + 2) * shard / rate + 4 * m.layers * 17 * launch).epsilon(1e-6));
  const double layer = static_cast<double>(m.params_per_layer()), norms = 2.0 * m.hidden;
  CHECK(cz.work.sync.zero3_gather.bytes == doctest::Approx(2 * norms + (layer - norms)).epsilon(1e-12));
  CHECK(czb.work.sync.zero3_gather.bytes == doctest::Approx(2 * layer).epsilon(1e-12));
  // The gathered working set: two of the largest matrices, the embedding (128,256 x 4,096 at 2 bytes) above
  // the SwiGLU's 2 x 14,336 x 4,096 at 2 (fp8 and its transpose).
  CHECK(cz.zero3_gather_bytes == doctest::Approx(2.0 * 128256 * 4096 * 2));
}

// The step costs hold each communication of the step once, as work (kind, group, bytes) and its price, for
// both engines. GPT-3 175B, tp 8 pp 8 dp 16 (one DP member per node: stride 8 on 8-GPU nodes), bf16 on the
// A100 preset (NIC 25 GB/s at 0.85, 8 us latency). Expectations from the definitions, not from the code:
// - DP: the distributed optimizer (ZeRO-1) reduce-scatters fp32 main gradients (4 bytes a parameter) and
//   all-gathers bf16 weights (2) over the 16 replicas; a group of 16 with one member a node is one ring over
//   the NICs: min(15 ring, 4 tree) latency steps + (15/16) S / (25e9 x 0.85).
// - A middle rank holds 12 layers' shards: 12 x params_per_layer / 8 parameters, in ceil(P / 40M) buckets.
// - The optimizer steps P / 16 of them (ZeRO-1): 30 bytes each at the preset's memory bandwidth x its
//   efficiency, 4 launches of its kernel overhead.
// - Tied embeddings: the table's gradient shard S = 4 V h / 8 bytes, two transfers of S / 2 between ranks
//   7 x 8 x 16 = 896 apart (different nodes): 2 (8 us + S / 2 / (25e9 x 0.85)).
TEST_CASE("step costs: one home for the step's communication, optimizer and memory") {
  const System sys = load_system("dgx-a100");
  const Model m = load_model("gpt3-175b");
  Layout l;
  l.tp = 8, l.pp = 8, l.dp = 16, l.global_batch = 1536, l.zero_stage = 1;
  l.schedule = sched::Kind::one_f_one_b;
  const StepCosts c = step_costs(m, l, sys);
  const StepSync& s = c.work.sync;
  const double net = 25e9 * 0.85, lat = 8e-6;
  CHECK(s.grad.kind == cost::Collective::reduce_scatter);
  CHECK(s.grad.group.size == 16);
  CHECK(s.grad.group.stride == 8);
  CHECK(s.grad.bytes_per_param == 4);
  CHECK(s.grad_reductions == 1);
  CHECK(s.param_gather.kind == cost::Collective::all_gather);
  CHECK(s.param_gather.bytes_per_param == 2);
  CHECK_FALSE(s.sp_grad.runs());  // no SP
  const double P = 12.0 * static_cast<double>(m.params_per_layer()) / 8;
  CHECK(c.ranks.params[3] == doctest::Approx(P).epsilon(kExact));
  CHECK(c.tail[3].grad_s == doctest::Approx(4 * lat + 15.0 / 16 * 4 * P / net).epsilon(kTight));
  CHECK(c.tail[3].gather_s == doctest::Approx(4 * lat + 15.0 / 16 * 2 * P / net).epsilon(kTight));
  CHECK(grad_buckets(P) == static_cast<int>(std::ceil(P / 40e6)));
  CHECK(grad_buckets(1.0) == 1);
  CHECK(c.tail[3].optimizer_s == doctest::Approx(30 * (P / 16) / (sys.gpu.memory_bw_Bps * sys.gpu.memory_efficiency) +
                                            4 * sys.gpu.kernel_overhead_s).epsilon(kTight));
  const double S = 4.0 * m.vocab * m.hidden / 8;
  CHECK(s.tied.bytes * s.tied.times == doctest::Approx(S).epsilon(kExact));
  CHECK(s.tied.distance == 896);
  CHECK(c.tied_s == doctest::Approx(2 * (lat + S / 2 / net)).epsilon(kTight));
  // Memory: bf16 weights (2), fp32 main_grad (4) and fp32 master + moments (12) sharded 16 ways by ZeRO-1.
  CHECK(c.state.total() == doctest::Approx(2 + 4 + 12.0 / 16).epsilon(kExact));
  CHECK(c.fixed_bytes() == doctest::Approx(sys.memory_reserved_bytes).epsilon(kExact));  // no ZeRO-3, no full recompute
  // ZeRO-2 reduces every micro-batch's gradient (m = 1536 / 16 = 96); ZeRO-3 none whole, but one layer's
  // weights per gather and scatter, bf16, in flat rings.
  l.zero_stage = 2;
  CHECK(step_costs(m, l, sys).work.sync.grad_reductions == 96);
  l.zero_stage = 3;
  const StepCosts z3 = step_costs(m, l, sys);
  CHECK_FALSE(z3.work.sync.grad.runs());
  CHECK_FALSE(z3.work.sync.param_gather.runs());
  CHECK(z3.work.sync.zero3_gather.bytes == doctest::Approx(2.0 * m.params_per_layer() / 8).epsilon(kExact));
  CHECK(z3.work.sync.zero3_gather.group.flat);
  CHECK(z3.zero3_gather_s == doctest::Approx(4 * lat + 15.0 / 16 * 2.0 * m.params_per_layer() / 8 / net).epsilon(kTight));
}

// The runtime's activation model (cost::runtime_activation_peak) walks a schedule over per-stage bytes.
// Expectations from its definition: under 1F1B with m >= p, rank 0 holds p - 0 = 2 micro-batches of stage 0
// at its peak (no recompute: nothing transient); SP adds, per layer, the two norm outputs kept whole beside
// their shard: 2 (T - T/t) h elements of 4 bytes (fp32), T = b s tokens; and the norm statistics shrink with
// the shard from 4 x 4 T to 4 x 4 T / t bytes.
TEST_CASE("the runtime's activation model: a 1F1B peak and SP's gathered norm outputs") {
  const Model m = load_model("tiny");
  Layout l;
  l.tp = 2, l.pp = 2, l.global_batch = 4, l.precision = Precision::fp32, l.attention = AttentionImpl::unfused;
  l.schedule = sched::Kind::one_f_one_b;
  sched::GenParams gp;
  gp.pp = 2;
  gp.microbatches = l.num_microbatches();
  const sched::Schedule s = sched::generate(sched::Kind::one_f_one_b, gp);
  const cost::RuntimeActivations a = cost::runtime_stage_activations(m, l, 0);
  CHECK(a.transient == 0);
  CHECK(cost::runtime_activation_peak(m, l, s, 0) == doctest::Approx(2 * a.held).epsilon(kExact));
  Layout sp = l;
  sp.sequence_parallel = true;
  const double T = static_cast<double>(m.seq_len), h = m.hidden, layers = l.layers_of_stage(0, m.layers);
  const double gathered = 4.0 * 2 * (T - T / 2) * h, stats = 4.0 * 4 * (T - T / 2);
  const double korthikanti = cost::stage_activation_bytes(m, sp, static_cast<int>(layers), 0) -
                             cost::stage_activation_bytes(m, l, static_cast<int>(layers), 0);
  CHECK(cost::runtime_stage_activations(m, sp, 0).held - a.held ==
        doctest::Approx(korthikanti + layers * (gathered - stats)).epsilon(kTight));
}

// TP communication overlap (Layout::tp_comm_overlap, sim/workload.cpp overlap_tp_comm): each SP all-gather
// hides behind the GEMM after it and each reduce-scatter behind the GEMM before it, all but one of tp chunks;
// the GEMM's slowdown is charged. Checked op by op against that rule, then the step's rows: the TP time is
// the same with and without (only its exposure changes), compute is unchanged, the step is shorter, and the
// event engine agrees with the closed form within its usual bound.
TEST_CASE("TP communication overlap: hidden behind the adjacent GEMM, slowdown charged, same total") {
  const Model m = load_model("gpt3-175b");
  const System sys = load_system("dgx-a100");
  Layout l;
  l.tp = 8, l.pp = 8, l.dp = 16, l.vpp = 3, l.global_batch = 1536;
  l.schedule = sched::Kind::interleaved;
  l.recompute = Recompute::selective;
  l.sequence_parallel = true;
  Layout o = l;
  o.tp_comm_overlap = true;
  const Workload plain = lower(m, l, sys), over = lower(m, o, sys);
  REQUIRE(plain.layer.ops.size() == over.layer.ops.size());
  const double keep = 7.0 / 8.0, s = sys.gpu.overlap_slowdown, slow = s / (1 + s);
  REQUIRE(s > 0);
  int paired = 0;
  for (std::size_t k = 0; k < over.layer.ops.size(); ++k) {
    const WorkOp& a = plain.layer.ops[k];
    const WorkOp& b = over.layer.ops[k];
    CAPTURE(a.name);
    if (a.cls != OpClass::collective) {
      CHECK(b.t_f == a.t_f);  // compute ops are priced alike
      continue;
    }
    const bool gather = a.coll == cost::Collective::all_gather;
    const WorkOp& g = plain.layer.ops[gather ? k + 1 : k - 1];
    REQUIRE(g.cls == OpClass::gemm);
    const double hf = std::min(a.t_f, g.t_f) * keep, hb = std::min(a.t_i, g.t_i + g.t_w) * keep;
    CHECK(b.hidden_f == doctest::Approx(hf).epsilon(kExact));
    CHECK(b.hidden_i == doctest::Approx(hb).epsilon(kExact));
    CHECK(b.t_f == doctest::Approx(a.t_f - hf + hf * slow).epsilon(kExact));
    CHECK(b.t_i == doctest::Approx(a.t_i - hb + hb * slow).epsilon(kExact));
    CHECK(b.t_f >= a.t_f / 8 * (1 - kExact));  // one chunk's transfer is never hidden
    ++paired;
  }
  CHECK(paired == 4);  // two all-gathers, two reduce-scatters per layer
  const Estimate ep = estimate(m, l, sys), eo = estimate(m, o, sys);
  CHECK(eo.tp_comm_s == doctest::Approx(ep.tp_comm_s).epsilon(kTight));
  CHECK(eo.compute_s == doctest::Approx(ep.compute_s).epsilon(kTight));
  CHECK(eo.tp_exposed_s < 0.5 * ep.tp_exposed_s);
  CHECK(eo.step_s < ep.step_s);
  const double rows = eo.compute_s + eo.tp_exposed_s + eo.cp_exposed_s + eo.pp_exposed_s + eo.dp_exposed_s +
                      eo.grad_norm_s + eo.optimizer_s + eo.zero_grad_s + eo.overlap_slowdown_s + eo.bubble_fraction * eo.step_s;
  CHECK(rows == doctest::Approx(eo.step_s).epsilon(1e-9));
  engine::SimOptions so;
  so.critical_path = false;
  const double des_plain = engine::simulate(m, l, sys, so).step_s, des_over = engine::simulate(m, o, sys, so).step_s;
  CHECK(des_over < des_plain);
  CHECK(des_over == doctest::Approx(eo.step_s).epsilon(kEstimateTol));
}

// Context parallelism's ring: each of the cp - 1 steps sends a KV block forward (twice that backward: the KV
// blocks and their gradients) while the attention computes on the block it holds. What hides slows the
// attention as every other overlap does: the exposed CP time is the part not hidden plus hidden x s / (1 + s).
// Llama 2 7B at 128k on tp4 cp4 (NeMo's long-sequence layout): the exchange crosses InfiniBand and hides whole.
TEST_CASE("CP ring exchange: hidden behind the attention, the attention's slowdown charged") {
  const Model m = load_model("llama2-7b", 131072);
  Layout l;
  l.tp = 4, l.cp = 4, l.dp = 8, l.micro_batch = 1, l.global_batch = 32;
  l.sequence_parallel = true;
  l.recompute = Recompute::none;
  l.precision = Precision::fp8;
  System sys = load_system("dgx-h100");
  const double s = sys.gpu.overlap_slowdown, slow = s / (1 + s);
  REQUIRE(s == doctest::Approx(0.189));
  const Workload w = lower(m, l, sys);
  double attn_f = 0, attn_b = 0;
  for (const WorkOp& op : w.layer.ops)
    if (op.attention_core) attn_f += op.t_f, attn_b += op.t_i;
  const LayerWork& lw = w.layer;
  REQUIRE(lw.cp_comm_f > 0);
  CHECK(lw.cp_comm_b == doctest::Approx(2 * lw.cp_comm_f).epsilon(kExact));
  REQUIRE(lw.cp_comm_f < attn_f);  // hides whole: only the slowdown is exposed
  CHECK(lw.t_cp_f == doctest::Approx(lw.cp_comm_f * slow).epsilon(kExact));
  CHECK(lw.t_cp_b == doctest::Approx(lw.cp_comm_b * slow).epsilon(kExact));
  sys.gpu.overlap_slowdown = 0;
  const Workload free = lower(m, l, sys);
  CHECK(free.layer.t_cp_f == 0);
  CHECK(free.layer.t_cp_b == 0);
  CHECK(free.layer.t_f == doctest::Approx(lw.t_f).epsilon(kExact));  // the ops are priced alike
  // The CP row: one layer's (t_cp_f + t_cp_b) per layer and micro-batch, and the pipeline's span longer by as
  // much (the step's other overlap, the data-parallel reduction's, takes the slowdown apart).
  const Estimate e = estimate(m, l, load_system("dgx-h100")), e0 = estimate(m, l, sys);
  const double cp = m.layers * e.microbatches * (lw.t_cp_f + lw.t_cp_b);
  CHECK(e.cp_exposed_s == doctest::Approx(cp).epsilon(1e-9));
  CHECK(e0.cp_exposed_s == 0);
  CHECK(e.cp_comm_s == doctest::Approx(e0.cp_comm_s).epsilon(kExact));
  CHECK(e.pipeline_s - e0.pipeline_s == doctest::Approx(cp).epsilon(1e-9));
}

// fp8 GEMMs pay Transformer Engine's quantization of their 16-bit inputs: under delayed scaling on Hopper, read
// 2 bytes, write the fp8 copy and its transpose, 4 bytes per element of the activation [m, k] forward and of the
// output gradient [m, n] in the input-gradient pass; the weight gradient reuses both.
TEST_CASE("GEMM: an fp8 linear layer pays its cast-transpose traffic, forward and backward") {
  System sys = load_system("dgx-h100");
  cost::WorkOp op;
  op.cls = cost::OpClass::gemm;
  op.precision = Precision::fp8;
  op.gemm = {4096, 12288, 4096, 1};
  op.has_weights = true;
  const Layout delayed;  // fp8_recipe delayed, the default
  cost::price(op, sys, delayed);
  const double mk = 4096.0 * 4096, mn = 4096.0 * 12288;
  const double fwd = cost::gemm_time(sys.gpu, Precision::fp8, op.gemm) + cost::memory_time(sys.gpu, 4.0 * mk, 1);
  const double ig = cost::gemm_time(sys.gpu, Precision::fp8, {4096, 4096, 12288, 1}) * sys.gpu.gemm_dgrad_factor +
                    cost::memory_time(sys.gpu, 4.0 * mn, 1);
  CHECK(op.t_f == doctest::Approx(fwd).epsilon(1e-12));
  CHECK(op.t_i == doctest::Approx(ig).epsilon(1e-12));
  // A bf16 GEMM of the same shape pays no cast.
  cost::WorkOp b = op;
  b.precision = Precision::bf16;
  cost::price(b, sys, delayed);
  CHECK(b.t_f == doctest::Approx(cost::gemm_time(sys.gpu, Precision::bf16, op.gemm)).epsilon(1e-12));
}

// The fp8 recipes (Layout::fp8_recipe) differ in how a GEMM's 16-bit input is quantized and in the amaxes the
// GPUs share: per element, delayed reads 2 bytes and writes the fp8 copy and, on Hopper, its transpose;
// current reads the tensor once more for its amax, in a kernel of its own; MXFP8 (Blackwell) writes row- and
// column-wise copies with a 1-byte scale per 32 elements each. Current scaling all-reduces a 4-byte amax over tp
// before each sequence-parallel gather; delayed scaling all-reduces every fp8 GEMM's amaxes over tp x cp x dp
// once a micro-batch, forward and backward.
TEST_CASE("fp8 recipes: cast traffic by recipe and GPU, and the amax reductions each one makes") {
  const System h100 = load_system("dgx-h100"), b200 = load_system("dgx-b200");
  REQUIRE(h100.gpu.arch == GpuArch::hopper);
  REQUIRE(b200.gpu.arch == GpuArch::blackwell);
  CHECK(cost::fp8_cast(Fp8Recipe::delayed, h100.gpu).bytes == 4.0);
  CHECK(cost::fp8_cast(Fp8Recipe::delayed, h100.gpu).kernels == 1);
  CHECK(cost::fp8_cast(Fp8Recipe::current, h100.gpu).bytes == 6.0);
  CHECK(cost::fp8_cast(Fp8Recipe::current, h100.gpu).kernels == 2);
  CHECK(cost::fp8_cast(Fp8Recipe::delayed, b200.gpu).bytes == 3.0);
  CHECK(cost::fp8_cast(Fp8Recipe::current, b200.gpu).bytes == 5.0);
  CHECK(cost::fp8_cast(Fp8Recipe::mxfp8, b200.gpu).bytes == doctest::Approx(2.0 + 2.0 * 33.0 / 32.0));

  const Model m = load_model("llama2-7b");
  Layout l;
  l.tp = 2;
  l.sequence_parallel = true;
  l.precision = Precision::fp8;
  l.micro_batch = 1;
  l.global_batch = 8;
  const auto amax_ops = [&](const Layout& x) {
    const LayerWork lw = lower_layer(m, x, h100);
    int n = 0;
    for (std::size_t k = 0; k < lw.ops.size(); ++k)
      if (std::string_view(lw.ops[k].name) == "fp8_amax") {
        ++n;
        CHECK(lw.ops[k].coll == cost::Collective::all_reduce);
        CHECK(lw.ops[k].comm_bytes == 4.0);
        REQUIRE(k + 1 < lw.ops.size());
        CHECK(lw.ops[k + 1].coll == cost::Collective::all_gather);  // right before the gather it scales
        CHECK(lw.ops[k].t_f > 0);
      }
    return n;
  };
  CHECK(amax_ops(l) == 0);  // delayed: none in the layer
  Layout cur = l;
  cur.fp8_recipe = Fp8Recipe::current;
  CHECK(amax_ops(cur) == 2);  // the gathers before qkv and mlp_up
  Layout nosp = cur;
  nosp.sequence_parallel = false;
  CHECK(amax_ops(nosp) == 0);  // nothing gathered, nothing to agree on
  // Current scaling's layer costs more than delayed's (the second read, the amax all-reduces).
  const LayerWork dl = lower_layer(m, l, h100), cl = lower_layer(m, cur, h100);
  CHECK(cl.t_f > dl.t_f);
  CHECK(cl.t_tp_f > dl.t_tp_f);

  // Delayed scaling's per-micro-batch reduction: the same stage on 1 and on 8 data-parallel ranks differs by
  // it alone (tp 1: the amax group is the dp ranks).
  Layout one;
  one.precision = Precision::fp8;
  one.micro_batch = 1;
  one.global_batch = 8;
  Layout eight = one;
  eight.dp = 8;
  const Workload w1 = lower(m, one, h100), w8 = lower(m, eight, h100);
  const double gemms = 4.0 * m.layers;  // qkv, proj, mlp_up, mlp_down a layer; the head stays bf16
  const cost::GroupPlacement group{8, 1, false, 8};
  CHECK(w8.stages[0].f - w1.stages[0].f ==
        doctest::Approx(cost::collective_time(h100, cost::Collective::all_reduce, 12.0 * gemms, group).seconds).epsilon(1e-9));
  CHECK(w8.stages[0].i - w1.stages[0].i ==
        doctest::Approx(cost::collective_time(h100, cost::Collective::all_reduce, 8.0 * gemms, group).seconds).epsilon(1e-9));
  Layout eight_cur = eight;
  eight_cur.fp8_recipe = Fp8Recipe::current;
  Layout one_cur = one;
  one_cur.fp8_recipe = Fp8Recipe::current;
  // Current scaling shares no amax history: the dp ranks add nothing.
  CHECK(lower(m, eight_cur, h100).stages[0].f == doctest::Approx(lower(m, one_cur, h100).stages[0].f).epsilon(1e-12));
}

// The weight gradient written into fp32 main grads costs gemm_fp32_out times the 16-bit-output GEMM (the
// Hopper presets' 1.05, measured on the H200); bf16 main grads, an fp32 GEMM, the forward and the input
// gradient pay nothing extra, and a preset without the figure (the A100's fit absorbed it) none either.
TEST_CASE("GEMM: the weight gradient into fp32 main grads pays the fp32 output, nothing else does") {
  const System h100 = load_system("dgx-h100");
  REQUIRE(h100.gpu.gemm_fp32_out == doctest::Approx(1.05));
  cost::WorkOp op;
  op.cls = cost::OpClass::gemm;
  op.precision = Precision::bf16;
  op.gemm = {8192, 12288, 4096, 1};
  op.has_weights = true;
  Layout grads32, grads16;
  grads16.state.main_grads = StateDtype::bf16;
  cost::WorkOp fp32_grads = op, bf16_grads = op;
  cost::price(fp32_grads, h100, grads32);
  cost::price(bf16_grads, h100, grads16);
  const double wgrad = cost::gemm_time(h100.gpu, Precision::bf16, {4096, 12288, 8192, 1});
  CHECK(bf16_grads.t_w == doctest::Approx(wgrad).epsilon(1e-12));
  CHECK(fp32_grads.t_w == doctest::Approx(1.05 * wgrad).epsilon(1e-12));
  CHECK(fp32_grads.t_f == bf16_grads.t_f);
  CHECK(fp32_grads.t_i == bf16_grads.t_i);
  // fp8 linear layers accumulate their weight gradient into the same buffer.
  cost::WorkOp f8 = op, f8b = op;
  f8.precision = f8b.precision = Precision::fp8;
  cost::price(f8, h100, grads32);
  cost::price(f8b, h100, grads16);
  CHECK(f8.t_w == doctest::Approx(1.05 * f8b.t_w).epsilon(1e-12));
  // A GEMM without weights (attention's batched GEMMs) has no weight gradient.
  cost::WorkOp batched = op;
  batched.has_weights = false;
  cost::price(batched, h100, grads32);
  CHECK(batched.t_w == 0);
  // fp32 GEMMs write fp32 anyway.
  cost::WorkOp f32 = op, f32b = op;
  f32.precision = f32b.precision = Precision::fp32;
  cost::price(f32, h100, grads32);
  cost::price(f32b, h100, grads16);
  CHECK(f32.t_w == f32b.t_w);
  // The A100 preset's efficiencies were fitted to per-layer times that include it: no separate charge.
  const System a100 = load_system("dgx-a100");
  CHECK(a100.gpu.gemm_fp32_out == 1.0);
}

// Under an fp8 recipe only the GEMMs' inputs are quantized (Transformer Engine): the norms, residuals and
// activation functions read and write 16-bit tensors and the TP and pipeline transfers move them, so their
// bytes equal a bf16 run's; the GEMMs alone differ.
TEST_CASE("fp8 layouts keep 16-bit activations between ops: element-wise and transfer bytes as bf16") {
  const Model m = load_model("llama2-7b");
  const System sys = load_system("dgx-h100");
  Layout l;
  l.tp = 2;
  l.pp = 2;
  l.dp = 1;
  l.global_batch = 8;
  l.sequence_parallel = true;
  l.precision = Precision::bf16;
  const LayerWork b = lower_layer(m, l, sys);
  const Workload wb = lower(m, l, sys);
  l.precision = Precision::fp8;
  const LayerWork f = lower_layer(m, l, sys);
  const Workload wf = lower(m, l, sys);
  REQUIRE(b.ops.size() == f.ops.size());
  for (std::size_t k = 0; k < b.ops.size(); ++k) {
    CAPTURE(b.ops[k].name);
    CHECK(f.ops[k].bytes_f == b.ops[k].bytes_f);
    CHECK(f.ops[k].bytes_b == b.ops[k].bytes_b);
    CHECK(f.ops[k].comm_bytes == b.ops[k].comm_bytes);
  }
  CHECK(wf.p2p.bytes == wb.p2p.bytes);
  CHECK(wb.p2p.bytes == doctest::Approx(2.0 * 4096 * 4096 / 2));  // [b s, h] bf16 over tp 2
}

// Rotary models rotate this rank's queries and keys after their projection: one fused kernel per tensor, each
// element read and written forward, its gradient likewise backward. GQA's keys are kv_heads wide (replicated up
// to one head per rank when tp exceeds them); MLA rotates only the rope dims of each query head and the one
// shared rotary key; learned positions have no such op.
TEST_CASE("RoPE: queries and keys rotated forward and backward, rotary models only") {
  const System sys = load_system("dgx-h100");
  const Layout l = tp2_one_micro_batch();
  // The layer's rope op (nullopt without one), checked to be the only one and to sit between the
  // projections and the attention core.
  const auto rope_of = [&](const Model& m) -> std::optional<cost::WorkOp> {
    const LayerWork lw = lower_layer(m, l, sys);
    std::optional<cost::WorkOp> found;
    for (std::size_t k = 0; k < lw.ops.size(); ++k) {
      if (std::string_view(lw.ops[k].name) != "rope") continue;
      CHECK(!found.has_value());
      found = lw.ops[k];
      REQUIRE(k >= 1);
      REQUIRE(k + 1 < lw.ops.size());
      CHECK(lw.ops[k - 1].cls == cost::OpClass::gemm);
      CHECK(lw.ops[k + 1].attention_core);
    }
    return found;
  };
  const auto r = rope_of(load_model("llama3-8b"));  // 32 query heads, 8 kv heads of 128, seq 8192
  REQUIRE(r.has_value());
  const double width = (32.0 * 128 + 8.0 * 128) / 2;  // this tp rank's query and key columns
  CHECK(r->cls == cost::OpClass::elementwise);
  CHECK(r->bytes_f == doctest::Approx(2 * 2 * 8192.0 * width).epsilon(kExact));
  CHECK(r->bytes_b == r->bytes_f);
  CHECK(r->kernels == 2);
  CHECK(r->t_f == doctest::Approx(cost::memory_time(sys.gpu, r->bytes_f, 2)).epsilon(kTight));
  CHECK(r->t_i == doctest::Approx(cost::memory_time(sys.gpu, r->bytes_b, 2, CostKind::memory, true)).epsilon(kTight));

  Model ds = load_model("deepseek-v3");  // MLA: 128 heads, 64 rope dims each, one shared rotary key
  ds.seq_len = 4096;
  const auto q = rope_of(ds);
  REQUIRE(q.has_value());
  CHECK(q->bytes_f == doctest::Approx(2 * 2 * 4096.0 * (128.0 / 2 + 1) * 64).epsilon(kExact));

  CHECK(!rope_of(load_model("gpt3-175b")).has_value());  // learned positions
}

// The element-wise kernels fused or as PyTorch eager runs them (Layout::unfused; sim/workload.cpp norm_work,
// act_work, rope_work), bytes per element of the tensor they pass over at bf16 (e = 2) and launches:
//  - RMSNorm fused 2e / 3e in one kernel; unfused (upcast, square, mean, eps, rsqrt, scale, downcast, weight)
//    4e + 28 = 36 in 8 kernels forward, 8e + 76 = 92 in 15 backward; in fp32 the casts are no-ops: 28 in 6, 92
//    in 13. A LayerNorm is one kernel either way.
//  - SwiGLU fused 3e / 5e (backward: read dy, gate and up, write both gradients); unfused (silu, product) 5e in
//    2, 9e in 3. GELU with a bias: the bias added apart, 4e in 2 forward, 3e backward as fused; without one
//    nothing changes.
//  - RoPE fused 2e / 2e, a kernel per tensor; unfused (rotate_half) 10e in 5 and 15e in 9 per tensor.
TEST_CASE("fused-kernel sets: norm, activation and RoPE fused or op by op, priced by their passes") {
  const System sys = load_system("dgx-h100");
  const Layout l = tp2_one_micro_batch();
  const auto op_of = [&](const Model& m, const Layout& x, std::string_view name) {
    const LayerWork lw = lower_layer(m, x, sys);
    for (const cost::WorkOp& op : lw.ops)
      if (name == op.name) return op;
    FAIL("no op " << name);
    return cost::WorkOp{};
  };
  const Model llama = load_model("llama3-8b");  // RMSNorm, SwiGLU, RoPE, no biases; h 4096, ffn 14336, seq 8192
  Layout un = l;
  un.unfused = Unfused{true, true, true};
  const double xs = 8192.0 * 4096, act = 8192.0 * 14336 / 2, rot = 8192.0 * (32.0 * 128 + 8 * 128) / 2;
  const auto check = [&](std::string_view name, double el, double ff, double fb, double uf, double ub, int kf, int kb) {
    CAPTURE(name);
    const cost::WorkOp f = op_of(llama, l, name), u = op_of(llama, un, name);
    CHECK(f.bytes_f == doctest::Approx(ff * el).epsilon(kExact));
    CHECK(f.bytes_b == doctest::Approx(fb * el).epsilon(kExact));
    CHECK(u.bytes_f == doctest::Approx(uf * el).epsilon(kExact));
    CHECK(u.bytes_b == doctest::Approx(ub * el).epsilon(kExact));
    CHECK(u.kernels == kf);
    CHECK(u.kernels_b == kb);
    const CostKind kind = name == "act" ? CostKind::activation : name == "rope" ? CostKind::memory : CostKind::norm;
    CHECK(u.t_f == doctest::Approx(cost::memory_time(sys.gpu, u.bytes_f, kf, kind, false)).epsilon(kTight));
    CHECK(u.t_i == doctest::Approx(cost::memory_time(sys.gpu, u.bytes_b, kb, kind, true)).epsilon(kTight));
    CHECK(u.t_f > f.t_f);
    CHECK(u.t_i > f.t_i);
  };
  check("norm1", xs, 4, 6, 36, 92, 8, 15);
  check("norm2", xs, 4, 6, 36, 92, 8, 15);
  check("act", act, 6, 10, 10, 18, 2, 3);
  check("rope", rot, 4, 4, 20, 30, 10, 18);
  // The step pays the difference, the final norm included.
  CHECK(estimate(llama, un, sys).step_s > estimate(llama, l, sys).step_s);
  // fp32: the norm's casts are no-ops.
  Layout f32 = un;
  f32.precision = Precision::fp32;
  const cost::WorkOp n32 = op_of(llama, f32, "norm1");
  CHECK(n32.bytes_f == doctest::Approx(28 * xs).epsilon(kExact));
  CHECK(n32.bytes_b == doctest::Approx(92 * xs).epsilon(kExact));
  CHECK(n32.kernels == 6);
  CHECK(n32.kernels_b == 13);
  // GPT-3: LayerNorm (one kernel in PyTorch too), GELU with a bias, learned positions.
  Model gpt = load_model("gpt3-175b");
  gpt.seq_len = 2048;
  const double gact = 2048.0 * 4 * 12288 / 2;
  const cost::WorkOp gn = op_of(gpt, un, "norm1"), gnf = op_of(gpt, l, "norm1");
  CHECK(gn.bytes_f == gnf.bytes_f);
  CHECK(gn.bytes_b == gnf.bytes_b);
  CHECK(gn.kernels == 1);
  const cost::WorkOp ga = op_of(gpt, un, "act"), gaf = op_of(gpt, l, "act");
  CHECK(gaf.bytes_f == doctest::Approx(4 * gact).epsilon(kExact));
  CHECK(ga.bytes_f == doctest::Approx(8 * gact).epsilon(kExact));
  CHECK(ga.bytes_b == gaf.bytes_b);
  CHECK(ga.kernels == 2);
  gpt.mlp_bias = false;  // a GELU without a bias is one kernel either way
  CHECK(op_of(gpt, un, "act").bytes_f == doctest::Approx(4 * gact).epsilon(kExact));
  CHECK(op_of(gpt, un, "act").kernels == 1);
}

// FlashAttention-2 (Layout::flash_kernel fa2, PyTorch SDPA's first choice) against the fused kernel Transformer
// Engine runs (cuDNN's on Hopper): on the Hopper presets at 0.62 of its rate (the FlashAttention-3 paper's H100
// figures, head dim 128, 2k-16k: 0.61-0.63 forward and backward), so the compute-bound attention op takes 1 / 0.62
// as long, forward and backward; where the system does not tell them apart (the A100 preset: FA2 is the
// fused kernel there) nothing changes, and the unfused attention has no flash kernel to choose.
TEST_CASE("flash kernels: FlashAttention-2 at its measured share of the fused kernel's rate") {
  const Model m = load_model("llama3-8b");
  Layout l = tp2_one_micro_batch();
  const System h100 = load_system("dgx-h100");
  CHECK(h100.gpu.attention_fa2 == 0.62);
  Layout fa2 = l;
  fa2.flash_kernel = FlashKernel::fa2;
  const cost::WorkOp c = flash_of(h100, l, m), f = flash_of(h100, fa2, m);
  const double over = h100.gpu.kernel_overhead_s;
  CHECK(f.t_f - over == doctest::Approx((c.t_f - over) / 0.62).epsilon(kTight));
  CHECK(f.t_i - over == doctest::Approx((c.t_i - over) / 0.62).epsilon(kTight));
  CHECK(estimate(m, fa2, h100).step_s > estimate(m, l, h100).step_s);
  const System a100 = load_system("dgx-a100");
  CHECK(a100.gpu.attention_fa2 == 1.0);
  CHECK(flash_of(a100, fa2, m).t_f == flash_of(a100, l, m).t_f);
  // A system file's attention_fa2 reads back.
  CHECK(parse_system(system_to_json(h100), "roundtrip").gpu.attention_fa2 == 0.62);
}

// The fused attention kernel's rate by key length and head dim (GpuSpec::attention_curve): the Hopper presets
// carry cuDNN's H100 curve from the FlashAttention-3 paper (forward, causal: 315 / 410 / 484 / 518 / 529 / 539
// TFLOP/s at 512 .. 16k with head dim 128; 388 at 16k with 64, 509 with 256) as a shape around `attention`, the
// rate at head dim 128 and 16k. So a 2k-token kernel runs at 484 / 539 of it, a 16k one at the full rate, and
// a length past the table at the last point's. The A100 preset has no curve: every shape at its one rate.
TEST_CASE("attention curve: the fused kernel's rate by key length and head dim, as a shape around `attention`") {
  const System h100 = load_system("dgx-h100");
  REQUIRE_FALSE(h100.gpu.attention_curve.empty());
  const auto fwd = [&](double s, double hd) { return cost::attention_curve_factor(h100.gpu, false, s, hd); };
  const auto bwd = [&](double s, double hd) { return cost::attention_curve_factor(h100.gpu, true, s, hd); };
  CHECK(fwd(16384, 128) == doctest::Approx(1.0).epsilon(kExact));
  CHECK(fwd(65536, 128) == doctest::Approx(1.0).epsilon(kExact));
  CHECK(fwd(2048, 128) == doctest::Approx(484.0 / 539).epsilon(kExact));
  CHECK(fwd(256, 128) == doctest::Approx(315.0 / 539).epsilon(kExact));  // shorter than the table: its first point
  CHECK(bwd(2048, 128) == doctest::Approx(465.0 / 516).epsilon(kExact));  // the reference is the longest length's
  CHECK(bwd(16384, 128) == doctest::Approx(1.0).epsilon(kExact));  // 516, below 8k's 518: still the reference
  // Log-linear between the points, in length and in head dim.
  const double t = std::log(3000.0 / 2048) / std::log(2.0);
  CHECK(fwd(3000, 128) == doctest::Approx((484 + t * (518 - 484)) / 539).epsilon(kExact));
  const double u = std::log(192.0 / 128) / std::log(2.0);
  CHECK(fwd(16384, 192) == doctest::Approx((539 + u * (509 - 539)) / 539).epsilon(kExact));
  CHECK(fwd(8192, 64) == doctest::Approx(379.0 / 539).epsilon(kExact));
  CHECK(bwd(16384, 256) == doctest::Approx(bwd(16384, 128)).epsilon(kExact));  // past the backward's head dims
  CHECK(fwd(0, 128) == 1.0);  // no shape given

  // The flash op carries its key length: the sequence, or a context-parallel rank's chunk of it.
  const Model m = load_model("llama3-8b", 2048);  // head dim 128
  const Layout l = tp2_one_micro_batch();
  const cost::WorkOp a = flash_of(h100, l, m);
  CHECK(a.attn_seq == 2048);
  CHECK(a.attn_head_dim == 128);
  const double rate = h100.gpu.peak(Precision::bf16) * h100.gpu.attention_efficiency;
  REQUIRE(a.exec_flops_f / (rate * 484.0 / 539) > a.bytes_f / (h100.gpu.memory_bw_Bps * h100.gpu.memory_efficiency));
  CHECK(a.t_f == doctest::Approx(a.exec_flops_f / (rate * 484.0 / 539) + h100.gpu.kernel_overhead_s).epsilon(kTight));
  CHECK(a.t_i == doctest::Approx(a.exec_flops_b / (rate * 465.0 / 516) + h100.gpu.kernel_overhead_s).epsilon(kTight));
  Layout cp = l;
  cp.cp = 2;
  CHECK(flash_of(h100, cp, load_model("llama3-8b", 8192)).attn_seq == 4096);
  // Without a curve the shape changes nothing.
  const System a100 = load_system("dgx-a100");
  REQUIRE(a100.gpu.attention_curve.empty());
  const cost::WorkOp b = flash_of(a100, l, m);
  const double a100_rate = a100.gpu.peak(Precision::bf16) * a100.gpu.attention_efficiency;
  CHECK(b.t_f == doctest::Approx(std::max(b.exec_flops_f / a100_rate, b.bytes_f / (a100.gpu.memory_bw_Bps * a100.gpu.memory_efficiency)) +
                                 a100.gpu.kernel_overhead_s).epsilon(kTight));
  // A system file's curve reads back.
  const System back = parse_system(system_to_json(h100), "roundtrip");
  CHECK(cost::attention_curve_factor(back.gpu, false, 3000, 192) == doctest::Approx(fwd(3000, 192)).epsilon(kExact));
  CHECK(cost::attention_curve_factor(back.gpu, true, 1000, 64) == doctest::Approx(bwd(1000, 64)).epsilon(kExact));
}

// A flash attention kernel's tiles against the GPU's SMs (cost::attention_occupancy): one tile a head's block
// of 128 queries. Causal, run longest first: min(1, batch_heads x (n + 1) / (2 x SMs)), n the query blocks;
// without a mask the tiles cost alike and run in waves. Against the curve's measured shape (16k tokens of
// hidden 2048: 16 heads of 128; forward causal, backward unmasked) the H100 forward was fully occupied
// (16 x 129 / 264 > 1) and the backward's 2,048 tiles took 16 waves of 132 (0.9697), so a shape's factor is
// its occupancy over those, at most 1.
TEST_CASE("attention occupancy: a few heads of a short sequence leave SMs idle") {
  CHECK(cost::attention_occupancy(132, 4, 2048, true) == doctest::Approx(4.0 * 17 / 264).epsilon(kExact));
  CHECK(cost::attention_occupancy(132, 32, 8192, true) == 1.0);  // 32 x 65 / 264 > 1
  CHECK(cost::attention_occupancy(132, 4, 4096, false) == doctest::Approx(128.0 / 132).epsilon(kExact));  // one wave
  CHECK(cost::attention_occupancy(132, 5, 4096, false) == doctest::Approx(160.0 / 264).epsilon(kExact));  // a second, 28 of 132
  CHECK(cost::attention_occupancy(132, 4, 2000, false) == doctest::Approx(64.0 / 132).epsilon(kExact));  // 16 blocks, the last partial
  CHECK(cost::attention_occupancy(1, 4, 2048, true) == 1.0);  // one slot (the CPU preset) is always busy
  CHECK(cost::attention_occupancy(1, 3, 300, false) == 1.0);
  CHECK(cost::attention_occupancy(132, 0, 2048, true) == 1.0);  // tiles not given

  const System h100 = load_system("dgx-h100");
  REQUIRE(h100.gpu.sms == 132);
  const auto kernel = [](bool backward, double bh, double q, bool causal) {
    cost::AttentionKernel k;
    k.backward = backward, k.seq = q, k.head_dim = 128, k.batch_heads = bh, k.queries = q, k.causal = causal;
    return k;
  };
  CHECK(cost::attention_wave_factor(h100.gpu, kernel(false, 4, 2048, true)) == doctest::Approx(68.0 / 264).epsilon(kExact));
  CHECK(cost::attention_wave_factor(h100.gpu, kernel(true, 4, 2048, true)) ==
        doctest::Approx((68.0 / 264) / (2048.0 / 2112)).epsilon(kExact));
  CHECK(cost::attention_wave_factor(h100.gpu, kernel(true, 64, 8192, true)) == 1.0);  // not above the measurement
  CHECK(cost::attention_wave_factor(h100.gpu, kernel(true, 4, 4096, false)) == 1.0);  // 128 / 132, as measured
  CHECK(cost::attention_wave_factor(h100.gpu, kernel(false, 4, 4096, false)) == doctest::Approx(128.0 / 132).epsilon(kExact));

  // The lowering gives the flash op its tiles: Llama 3 8B (32 heads of 128) at tp 8 holds 4 heads a rank, one
  // sequence of 2,048 a micro-batch: 64 tiles for 132 SMs, the longest row 16 blocks.
  const Model m = load_model("llama3-8b", 2048);
  Layout l;
  l.tp = 8, l.dp = 1, l.global_batch = 1, l.precision = Precision::bf16;
  const cost::WorkOp a = flash_of(h100, l, m);
  CHECK(a.attn_batch_heads == 4);
  CHECK(a.attn_queries == 2048);
  CHECK(a.attn_causal);
  const double rate = h100.gpu.peak(Precision::bf16) * h100.gpu.attention_efficiency;
  const double fwd = rate * 484.0 / 539 * 68.0 / 264, bwd = rate * 465.0 / 516 * (68.0 / 264) / (2048.0 / 2112);
  REQUIRE(a.exec_flops_f / fwd > a.bytes_f / (h100.gpu.memory_bw_Bps * h100.gpu.memory_efficiency));
  CHECK(a.t_f == doctest::Approx(a.exec_flops_f / fwd + h100.gpu.kernel_overhead_s).epsilon(kTight));
  CHECK(a.t_i == doctest::Approx(a.exec_flops_b / bwd + h100.gpu.kernel_overhead_s).epsilon(kTight));
  // Four sequences a micro-batch fill the SMs (16 x 17 / 264 > 1): the curve's rate alone.
  Layout mb4 = l;
  mb4.micro_batch = 4, mb4.global_batch = 4;
  const cost::WorkOp full = flash_of(h100, mb4, m);
  CHECK(full.attn_batch_heads == 16);
  CHECK(full.t_f == doctest::Approx(full.exec_flops_f / (rate * 484.0 / 539) + h100.gpu.kernel_overhead_s).epsilon(kTight));
  // Context parallelism: a rank's ring steps run its 4,096 queries against whole key chunks, unmasked tiles:
  // 4 x 32 = 128 in one wave of 132.
  Layout cp = l;
  cp.cp = 2;
  const cost::WorkOp c = flash_of(h100, cp, load_model("llama3-8b", 8192));
  CHECK(c.attn_queries == 4096);
  CHECK_FALSE(c.attn_causal);
  CHECK(cost::attention_wave_factor(h100.gpu, cost::attention_kernel(c, false, false)) == doctest::Approx(128.0 / 132).epsilon(kExact));
  CHECK(cost::attention_wave_factor(h100.gpu, cost::attention_kernel(c, false, true)) == 1.0);
  // Without a curve (the A100 preset) the rate is taken as measured fully occupied: 68 / 216 on 108 SMs.
  const System a100 = load_system("dgx-a100");
  const cost::WorkOp b = flash_of(a100, l, m);
  const double a100_rate = a100.gpu.peak(Precision::bf16) * a100.gpu.attention_efficiency * 68.0 / 216;
  CHECK(b.t_f == doctest::Approx(b.exec_flops_f / a100_rate + a100.gpu.kernel_overhead_s).epsilon(kTight));
  // A curve read back from a system file keeps its measured shape, so the factor too.
  const System back = parse_system(system_to_json(h100), "roundtrip");
  CHECK(cost::attention_wave_factor(back.gpu, kernel(true, 4, 2048, true)) ==
        doctest::Approx(cost::attention_wave_factor(h100.gpu, kernel(true, 4, 2048, true))).epsilon(kExact));
}

// PyTorch on one H200 (bench/h200/torch.log, 2026-11-29, tools/device-check.sh's torch_gpt.py): the 1.3B GPT of
// the device check (24 layers, hidden 2048, 16 heads, seq 1024, LayerNorm, GELU, biases, tied embeddings),
// batch 8, bf16 autocast, SDPA, fused AdamW, no recompute: median step 157.5 ms eager, 137.4 ms under
// torch.compile. Tessel prices it with PyTorch SDPA's FlashAttention-2 (the layout's flash_kernel) on the
// h200 preset: 131.1 ms, 4.6% below compile. Compile fuses the element-wise work as Tessel's fused kernels
// price it, so the bound is on compile's step. Eager is 16.8% slower than predicted: of its 26 ms, the autocast
// weight casts (6 bytes a parameter), the bf16 gradients accumulated into fp32 ones (6) and the gradient clipping
// (12), none of them in Tessel's step, are 31 GB, about 7 ms at the preset's 4.3 TB/s.
TEST_CASE("PyTorch on an H200: the 1.3B GPT's step against torch.compile's measured one") {
  const Model m = parse_model(parse_json_text(R"({"name": "gpt-1.3b", "params_b": 1.31, "layers": 24, "hidden": 2048,
      "heads": 16, "kv_heads": 16, "ffn": 8192, "vocab": 50304, "seq_len": 1024, "activation": "gelu",
      "norm": "layernorm", "position": "learned", "tied_embeddings": true, "bias": true, "dropout": false})", "gpt-1b"),
                              "gpt-1b");
  Layout l;
  l.micro_batch = 8;
  l.global_batch = 8;
  l.recompute = Recompute::none;
  l.zero_stage = 0;
  l.precision = Precision::bf16;
  l.flash_kernel = FlashKernel::fa2;
  const double step = estimate(m, l, load_system("h200")).step_s;
  MESSAGE("1.3B GPT on an H200: predicted " << step * 1e3 << " ms, torch.compile 137.4 ms, eager 157.5 ms");
  CHECK(std::fabs(step / 0.1374 - 1) <= 0.10);
  CHECK(step < 0.1575);  // eager runs passes Tessel's fused step does not
}

// An independent measurement of what the fused-kernel sets price: torchtitan's docs/performance.md, Table 1
// (Llama 3.1 8B, 8 H100s of 96 GB HBM2e at 2.4 TB/s, FSDP, local batch 2, global 16, sequence 8192 by its
// llama3_8b.toml, selective activation checkpointing): 5,762 tokens/s a GPU eager, 6,667 under torch.compile,
// which fuses the RMSNorms, the SwiGLU and the complex-number RoPE. The steps differ by 16 x 8192 / 8 x (1/5762 -
// 1/6667) = 0.386 s. Tessel's steps with the three unfused and fused differ by 0.396 s (+2.6%) on a dgx-h100
// with that bandwidth. Only the difference is compared: the absolute steps are 25-30% faster than measured
// (those GPUs ran at a 500 W power limit, not modelled), and the difference is memory-bound work that the
// power limit slows little. torchtitan's selective checkpointing (per op) also recomputes the
// element-wise ops, which Tessel's (the attention core's) does not, and compile fuses more than these three
// (the residual adds into the norms): two effects of opposite sign the tolerance has to hold.
TEST_CASE("fused-kernel sets: the eager - compiled step difference of torchtitan's Llama 3.1 8B run") {
  System sys = load_system("dgx-h100");
  sys.gpu.memory_bw_Bps = 2.4e12;
  const Model m = load_model("llama3-8b");
  Layout l;
  apply_stack(stack_preset("torchtitan-2025"), l);
  l.tp = 1, l.pp = 1, l.dp = 8, l.micro_batch = 2, l.global_batch = 16;
  l.recompute = Recompute::selective;
  l.zero_stage = 3;
  REQUIRE(l.unfused == Unfused{true, true, true});
  const double eager = estimate(m, l, sys, 8).step_s;
  l.unfused = Unfused{};
  const double compiled = estimate(m, l, sys, 8).step_s;
  const double measured = 16.0 * 8192 / 8 * (1 / 5762.0 - 1 / 6667.0);
  MESSAGE("eager - compiled: predicted " << eager - compiled << " s, measured " << measured << " s");
  CHECK(eager - compiled == doctest::Approx(measured).epsilon(0.20));
}

// Under an fp8 recipe Transformer Engine's linear layers keep the fp8 cast of their input for the backward (1
// byte an element, not 2): the QKV input, the MLP input and the activation output. The projection's input
// is flash attention's output, which the attention keeps in 16-bit besides the projection's fp8 copy. Full
// recompute keeps the layer's 16-bit input only, as in bf16.
TEST_CASE("fp8 activation memory: the linear layers keep their inputs in fp8") {
  const Model m = load_model("llama2-7b");  // h 4096, 32 heads of 128, ffn 11008, seq 4096
  Layout l;
  l.tp = 2;
  l.dp = 1;
  l.global_batch = 1;
  l.sequence_parallel = true;
  l.precision = Precision::bf16;
  const double bf16 = cost::layer_activation_bytes(m, l);
  l.precision = Precision::fp8;
  const double fp8 = cost::layer_activation_bytes(m, l);
  const double s = 4096, h = 4096, f = 11008, t = 2;
  const double saved = s * h / t + s * h / t + s * f / t - s * h / t;  // QKV in, MLP in, act out; + proj copy
  CHECK(bf16 - fp8 == doctest::Approx(saved).epsilon(kExact));
  l.attention = AttentionImpl::unfused;  // the projection's input kept as its fp8 copy alone
  const double fp8_unfused = cost::layer_activation_bytes(m, l);
  l.precision = Precision::bf16;
  CHECK(cost::layer_activation_bytes(m, l) - fp8_unfused == doctest::Approx(saved + 2 * s * h / t).epsilon(kExact));
  l.recompute = Recompute::full;
  const double ckpt_bf16 = cost::layer_activation_bytes(m, l);
  l.precision = Precision::fp8;
  CHECK(cost::layer_activation_bytes(m, l) == ckpt_bf16);
}

// The LM loss per implementation (Layout::cross_entropy, sim/workload.cpp add_head), bytes per logit and
// kernels: Megatron's unfused vocab-parallel cross-entropy 38 forward (upcast 6, max 4, subtract 8, exp 8, sum
// 4, normalise 8) in 6 kernels and 14 backward (scale 8, cast 6) in 2; Megatron's fused one 26 forward (upcast
// with the max 6, subtract with exp 8, sum 4, normalise 8) in 4, the same backward; Transformer Engine's
// 2 forward (an online softmax over the bf16 logits) in 2 and 4 backward in 1. With one GPU and one
// micro-batch the step differs between two of them by exactly those bytes and launches over the logits
// (Llama 3 8B's 128,256-token vocabulary: 1.05e9 logits at seq 8192).
TEST_CASE("the LM loss: Megatron unfused, Megatron fused and Transformer Engine priced by their passes") {
  const Model m = load_model("llama3-8b");
  const System sys = load_system("dgx-h100");
  Layout l;
  l.micro_batch = 1, l.global_batch = 1, l.recompute = Recompute::none;
  const double logits = 8192.0 * m.vocab, norm_f = 2.0 * 2 * 8192 * m.hidden, norm_b = 3.0 * 2 * 8192 * m.hidden;
  const auto step = [&](CrossEntropyImpl c) {
    Layout x = l;
    x.cross_entropy = c;
    return estimate(m, x, sys).step_s;
  };
  const auto loss = [&](double fwd, int kf, double bwd, int kb) {
    return cost::memory_time(sys.gpu, fwd * logits + norm_f, kf + 1) + cost::memory_time(sys.gpu, bwd * logits + norm_b, kb + 1);
  };
  const double megatron = step(CrossEntropyImpl::megatron), fused = step(CrossEntropyImpl::megatron_fused),
               te = step(CrossEntropyImpl::te);
  CHECK(te < fused);
  CHECK(fused < megatron);
  CHECK(megatron - fused == doctest::Approx(loss(38, 6, 14, 2) - loss(26, 4, 14, 2)).epsilon(1e-9));
  CHECK(megatron - te == doctest::Approx(loss(38, 6, 14, 2) - loss(2, 2, 4, 1)).epsilon(1e-9));
  // In fp32 nothing is cast: 32 and 8 bytes unfused.
  Layout f32 = l;
  f32.precision = Precision::fp32;
  f32.cross_entropy = CrossEntropyImpl::te;
  const double te32 = estimate(m, f32, sys).step_s;
  f32.cross_entropy = CrossEntropyImpl::megatron;
  const double mg32 = estimate(m, f32, sys).step_s;
  const double nf32 = 2.0 * norm_f, nb32 = 2.0 * norm_b;
  const double want = cost::memory_time(sys.gpu, 32 * logits + nf32, 6) + cost::memory_time(sys.gpu, 8 * logits + nb32, 2) -
                      cost::memory_time(sys.gpu, 4 * logits + nf32, 3) - cost::memory_time(sys.gpu, 8 * logits + nb32, 2);
  CHECK(mg32 - te32 == doctest::Approx(want).epsilon(1e-9));
}

// lower() builds a middle stage once per layer count and copies it to the next middle stage of as many layers
// (a one-kind model). Every stage must still be its own: an uneven split, where middle stages differ, has each
// stage's forward, parameters and activations in proportion to its layers, its index its own, and a full
// recompute of the first 2 layers (block method) recomputing 2 of each stage's layers, whatever its count.
TEST_CASE("lowering: middle stages of equal layers share their work, of other counts do not") {
  const System sys = load_system("dgx-h100");
  const Model m = load_model("llama2-7b");  // 32 layers, one kind
  Layout l;
  l.tp = 2, l.pp = 6, l.dp = 1, l.vpp = 1, l.schedule = sched::Kind::one_f_one_b, l.global_batch = 12;
  l.stage_layers = {3, 4, 4, 6, 4, 11};
  l.recompute = Recompute::full, l.recompute_method = RecomputeMethod::block, l.recompute_layers = 2;
  const Workload w = lower(m, l, sys);
  REQUIRE(w.stages.size() == 6);
  const StageWork& four = w.stages[1];
  for (std::size_t s = 1; s + 1 < w.stages.size(); ++s) {
    CAPTURE(s);
    const StageWork& st = w.stages[s];
    const double k = st.layers / 4.0;
    CHECK(st.stage == static_cast<int>(s));
    CHECK(st.layers == l.stage_layers[s]);
    CHECK(st.recomputed_layers == 2);
    CHECK(st.f == doctest::Approx(k * four.f).epsilon(1e-12));
    CHECK(st.params == doctest::Approx(k * four.params).epsilon(1e-12));
    CHECK(st.w == doctest::Approx(k * four.w).epsilon(1e-12));
    // Two layers recomputed and the rest kept whole: activations are not proportional to the layers.
    CHECK(st.act_bytes == doctest::Approx(four.act_bytes + (st.layers - 4) * cost::layer_activation_bytes(m, [&] {
                                            Layout none = l;
                                            none.recompute = Recompute::none;
                                            return none;
                                          }())).epsilon(1e-12));
  }
  CHECK(w.stages[3].f > w.stages[2].f);
}
