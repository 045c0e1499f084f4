// Measured per-kind rates in a System (gpu.kernels, node.collectives, host): strict parsing and the round
// trip, and how the cost model uses them: each element-wise kind at its own rate, the attention core
// measured as one kernel priced alike on both attention paths, a collective on its own link.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "util/error.hpp"
#include "sim/cost/comm.hpp"
#include "sim/cost/compute.hpp"
#include "sim/system.hpp"
#include "sim/workload.hpp"

using namespace tessel;

namespace {
constexpr double kRel = 1e-12;

// The cpu preset with every measured section set (rates in the file's units).
Json measured_cpu() {
  Json j = system_to_json(load_system("cpu"));
  j["gpu"]["kernels"] = {{"norm", {{"fwd_GBps", 4.0}, {"bwd_GBps", 2.0}}},
                         {"activation", {{"fwd_GBps", 1.0}, {"bwd_GBps", 0.5}}},
                         {"softmax", {{"fwd_GBps", 3.0}}},
                         {"cross_entropy", {{"fwd_GBps", 5.0}, {"bwd_GBps", 6.0}}},
                         {"embedding", {{"fwd_GBps", 100.0}, {"bwd_GBps", 50.0}}},
                         {"optimizer", {{"GBps", 10.0}}},
                         {"glue", {{"fwd_GBps", 2.5}, {"bwd_GBps", 1.25}}},
                         {"attention", {{"fwd_GFLOPs", 8.0}, {"bwd_GFLOPs", 16.0}}},
                         {"gemm_dgrad", 1.1},
                         {"gemm_wgrad", 1.3}};
  j["node"]["collectives"] = {{"all_reduce", {{"latency_us", 5.0}, {"GBps", 2.0}}},
                              {"send_recv", {{"latency_us", 1.0}, {"GBps", 8.0}}}};
  j["host"] = {{"cores", 2}, {"contention", {{"gemm", 1.05}, {"norm", 1.4}}}};
  return j;
}

std::string parse_error(const Json& j) {
  try {
    parse_system(j, "p.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

const WorkOp& op_named(const LayerWork& lw, const std::string& name) {
  for (const WorkOp& op : lw.ops)
    if (name == op.name) return op;
  FAIL("no op " << name);
  return lw.ops.front();
}
}  // namespace

TEST_CASE("measured sections parse strictly and round-trip; the presets measure none") {
  const System s = parse_system(measured_cpu(), "p.json");
  CHECK(s.gpu.kernel_Bps[idx(CostKind::norm)].fwd == doctest::Approx(4e9).epsilon(kRel));
  CHECK(s.gpu.kernel_Bps[idx(CostKind::softmax)].bwd == 0);  // not given: falls back (below)
  CHECK(s.gpu.kernel_Bps[idx(CostKind::optimizer)].fwd == doctest::Approx(10e9).epsilon(kRel));
  CHECK(s.gpu.attention_flops.bwd == doctest::Approx(16e9).epsilon(kRel));
  CHECK(s.gpu.gemm_wgrad_factor == doctest::Approx(1.3).epsilon(kRel));
  CHECK(s.node.collective[static_cast<int>(cost::Collective::all_reduce)].latency_s == doctest::Approx(5e-6).epsilon(kRel));
  CHECK(s.host.cores == 2);
  CHECK(s.host.contention[idx(CostKind::norm)] == doctest::Approx(1.4).epsilon(kRel));
  CHECK(s.host.contention[idx(CostKind::glue)] == 1.0);
  CHECK(s.gpu.kind_rates());
  // Written back, read again: the same numbers (the JSON holds full doubles).
  const System t = parse_system(system_to_json(s), "again");
  CHECK(system_to_json(t) == system_to_json(s));
  for (const std::string& name : system_preset_names()) {
    CAPTURE(name);
    const System p = load_system(name);
    CHECK(!p.gpu.kind_rates());
    CHECK(!cost::measured_attention_core(p.gpu));
  }
}

TEST_CASE("measured sections: bad values name the key, the value and the rule") {
  struct Case {
    const char* what;
    std::function<void(Json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"zero rate", [](Json& j) { j["gpu"]["kernels"]["norm"]["fwd_GBps"] = 0; }, "gpu.kernels.norm.fwd_GBps"},
      {"unknown kind", [](Json& j) { j["gpu"]["kernels"]["gelu"] = {{"fwd_GBps", 1}}; }, "gpu.kernels.gelu"},
      {"attention half", [](Json& j) { j["gpu"]["kernels"]["attention"].erase("bwd_GFLOPs"); }, "gpu.kernels.attention.bwd_GFLOPs"},
      {"optimizer direction", [](Json& j) { j["gpu"]["kernels"]["optimizer"] = {{"fwd_GBps", 1}}; }, "gpu.kernels.optimizer"},
      {"class factor", [](Json& j) { j["gpu"]["kernels"]["gemm_wgrad"] = 50; }, "gpu.kernels.gemm_wgrad"},
      {"collective name", [](Json& j) { j["node"]["collectives"]["allreduce"] = {{"latency_us", 1}, {"GBps", 1}}; },
       "node.collectives.allreduce"},
      {"optimizer sizes without rates", [](Json& j) { j["gpu"]["kernels"]["optimizer"]["params"] = {1e6, 2e6}; },
       "gpu.kernels.optimizer.params"},
      {"optimizer rates without sizes", [](Json& j) { j["gpu"]["kernels"]["optimizer"]["by_params_GBps"] = {1, 2}; },
       "gpu.kernels.optimizer.by_params_GBps"},
      {"optimizer sizes unequal", [](Json& j) {
         j["gpu"]["kernels"]["optimizer"]["params"] = {1e6, 2e6};
         j["gpu"]["kernels"]["optimizer"]["by_params_GBps"] = {1, 2, 3};
       }, "one rate per entry"},
      {"optimizer sizes descending", [](Json& j) {
         j["gpu"]["kernels"]["optimizer"]["params"] = {2e6, 1e6};
         j["gpu"]["kernels"]["optimizer"]["by_params_GBps"] = {1, 2};
       }, "strictly ascending"},
      {"cores", [](Json& j) { j["host"]["cores"] = 0; }, "host.cores"},
      {"contention", [](Json& j) { j["host"]["contention"]["norm"] = 0.01; }, "host.contention.norm"},
      {"large regime without its rate", [](Json& j) { j["node"]["collectives"]["all_reduce"]["large_from_MB"] = 4; },
       "node.collectives.all_reduce.large_from_MB"},
      {"large rate without its size", [](Json& j) { j["node"]["collectives"]["all_reduce"]["large_GBps"] = 1; },
       "node.collectives.all_reduce.large_GBps"},
      {"large regime at zero bytes", [](Json& j) {
         j["node"]["collectives"]["all_reduce"]["large_from_MB"] = 0;
         j["node"]["collectives"]["all_reduce"]["large_GBps"] = 1;
       }, "node.collectives.all_reduce.large_from_MB"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    Json j = measured_cpu();
    c.edit(j);
    const std::string msg = parse_error(j);
    CAPTURE(msg);
    CHECK(msg.find("p.json") != std::string::npos);
    CHECK(msg.find(c.expect) != std::string::npos);
  }
}

TEST_CASE("each element-wise kind runs at its own rate, forward and backward, and falls back when unmeasured") {
  const System s = parse_system(measured_cpu(), "p.json");
  // memory_time = bytes / rate (+ kernels x overhead; the cpu preset's overhead is 0): 1e6 bytes of norm
  // forward at 4 GB/s = 250 us, backward at 2 GB/s = 500 us; softmax backward is unmeasured, so it takes the
  // general rate memory_GBps x memory_efficiency = 200e9 x 0.052 = 10.4 GB/s: 1e6 / 10.4e9 s.
  CHECK(s.gpu.kernel_overhead_s == 0);
  CHECK(cost::memory_time(s.gpu, 1e6, 1, CostKind::norm, false) == doctest::Approx(250e-6).epsilon(kRel));
  CHECK(cost::memory_time(s.gpu, 1e6, 1, CostKind::norm, true) == doctest::Approx(500e-6).epsilon(kRel));
  CHECK(cost::memory_time(s.gpu, 1e6, 1, CostKind::softmax, true) ==
        doctest::Approx(1e6 / (200e9 * 0.052)).epsilon(kRel));
  // AdamW: 30 bytes per parameter at the optimizer's 10 GB/s: 1e6 parameters -> 3 ms.
  CHECK(cost::adamw_time(s.gpu, 1e6) == doctest::Approx(30e6 / 10e9).epsilon(kRel));
  // In a lowered layer: norm1's forward is its charged bytes (2 e x, e = 4, x = tokens x hidden) at 4 GB/s,
  // the activation's backward (3 e t f) at 0.5 GB/s, the residual (glue) forward at 2.5 GB/s.
  const Model m = load_model("tiny");
  Layout l;
  l.tp = l.pp = l.dp = 1;
  l.global_batch = 2;
  l.precision = Precision::fp32;
  l.recompute = Recompute::none;
  l.attention = AttentionImpl::unfused;
  l.sequence_parallel = false;
  const LayerWork lw = lower_layer(m, l, s);
  const double x = double(m.seq_len) * m.hidden, tf = double(m.seq_len) * m.ffn;
  CHECK(op_named(lw, "norm1").t_f == doctest::Approx(2 * 4 * x / 4e9).epsilon(kRel));
  CHECK(op_named(lw, "act").t_i == doctest::Approx(3 * 4 * tf / 0.5e9).epsilon(kRel));
  CHECK(op_named(lw, "residual1").t_f == doctest::Approx(op_named(lw, "residual1").runtime_bytes_f / 2.5e9).epsilon(kRel));
  // The GEMM classes: the input gradient 1.1x and the weight gradient 1.3x the tile model's time of their shapes.
  const WorkOp& up = op_named(lw, "mlp_up");
  const cost::GemmShape g = up.gemm;
  CHECK(up.t_i == doctest::Approx(1.1 * cost::gemm_time(s.gpu, Precision::fp32, {g.m, g.k, g.n, g.batch})).epsilon(kRel));
  CHECK(up.t_w == doctest::Approx(1.3 * cost::gemm_time(s.gpu, Precision::fp32, {g.k, g.n, g.m, g.batch})).epsilon(kRel));
}

TEST_CASE("a measured attention core costs the same on both attention paths") {
  // F = 4 b h s^2 d per layer; the core forward is F/2 at 8 GFLOP/s, the backward 2.5 F/2 at 16 GFLOP/s, on
  // the flash op or on the unfused path's two batched GEMMs (the softmax inside the kernel costs nothing of
  // its own). So the layers' compute times agree to rounding, while activation memory still differs (the
  // unfused path keeps the s^2 probabilities).
  const System s = parse_system(measured_cpu(), "p.json");
  const Model m = load_model("tiny");
  Layout l;
  l.tp = l.pp = l.dp = 1;
  l.global_batch = 2;
  l.precision = Precision::fp32;
  l.recompute = Recompute::none;
  l.sequence_parallel = false;
  l.attention = AttentionImpl::flash;
  const LayerWork flash = lower_layer(m, l, s);
  l.attention = AttentionImpl::unfused;
  const LayerWork unfused = lower_layer(m, l, s);
  const double F = 4.0 * m.heads * double(m.seq_len) * m.seq_len * m.head_dim;
  CHECK(op_named(flash, "flash_attn").t_f == doctest::Approx(F / 2 / 8e9).epsilon(kRel));
  CHECK(op_named(flash, "flash_attn").t_i == doctest::Approx(2.5 * F / 2 / 16e9).epsilon(kRel));
  CHECK(op_named(unfused, "softmax_dropout").t_f == 0);
  // The unfused path's one difference in time: the runtime zero-fills its scores buffer (4 bytes x heads x
  // s^2), a glue pass forward at 2.5 GB/s (the test below counts every glue pass).
  const double scores = 4.0 * m.heads * double(m.seq_len) * m.seq_len;
  CHECK(unfused.t_f - scores / 2.5e9 == doctest::Approx(flash.t_f).epsilon(1e-12));
  CHECK(unfused.t_i == doctest::Approx(flash.t_i).epsilon(1e-12));
  CHECK(unfused.act_bytes > flash.act_bytes);
}

TEST_CASE("a collective with its own measured link uses it; the others keep the node's") {
  const System s = parse_system(measured_cpu(), "p.json");
  // All-reduce of 1 MB over 2 ranks: 2 steps (ring 2(n-1) = 2, tree 2 log2 2 = 2) x 5 us + 2(n-1)/n x 1e6 / 2e9
  // = 10 us + 500 us. All-gather has no link of its own: the node's 8.4 us per step and 6 GB/s x efficiency 1.
  const cost::GroupPlacement two{2, 1};
  CHECK(cost::collective_time(s, cost::Collective::all_reduce, 1e6, two).seconds == doctest::Approx(10e-6 + 500e-6).epsilon(kRel));
  CHECK(cost::collective_time(s, cost::Collective::all_gather, 1e6, two).seconds ==
        doctest::Approx(8.4e-6 + 0.5 * 1e6 / 6e9).epsilon(kRel));
  // send/recv: 1 us + 1e6 / 8e9.
  CHECK(cost::p2p_time(s, 1e6, 1).seconds == doctest::Approx(1e-6 + 1e6 / 8e9).epsilon(kRel));
}

TEST_CASE("a link with a second regime: the bytes past its size at its second rate; it round-trips") {
  Json j = measured_cpu();
  j["node"]["collectives"]["all_reduce"]["large_from_MB"] = 4.0;
  j["node"]["collectives"]["all_reduce"]["large_GBps"] = 0.5;
  j["node"]["collectives"]["send_recv"]["large_from_MB"] = 1.0;
  j["node"]["collectives"]["send_recv"]["large_GBps"] = 2.0;
  const System s = parse_system(j, "p.json");
  const cost::GroupPlacement two{2, 1};
  // Up to 4 MB the line alone: 2 x 5 us + 1 x 1e6 / 2e9 (bus factor 1 on two ranks).
  CHECK(cost::collective_time(s, cost::Collective::all_reduce, 1e6, two).seconds == doctest::Approx(10e-6 + 500e-6).epsilon(kRel));
  CHECK(cost::collective_time(s, cost::Collective::all_reduce, 4e6, two).seconds == doctest::Approx(10e-6 + 2e-3).epsilon(kRel));
  // 13 MB: 4 MB at 2 GB/s, 9 MB at 0.5 GB/s.
  CHECK(cost::collective_time(s, cost::Collective::all_reduce, 13e6, two).seconds ==
        doctest::Approx(10e-6 + 2e-3 + 18e-3).epsilon(kRel));
  // Four ranks: the bus factor 2(n-1)/n = 1.5 on both parts; 4 latency steps (the tree's 2 log2 4, fewer
  // than the ring's 6).
  CHECK(cost::collective_time(s, cost::Collective::all_reduce, 13e6, {4, 1}).seconds ==
        doctest::Approx(4 * 5e-6 + 1.5 * (2e-3 + 18e-3)).epsilon(kRel));
  // send/recv of 3 MB: 1 MB at 8 GB/s, 2 MB at 2 GB/s.
  CHECK(cost::p2p_time(s, 3e6, 1).seconds == doctest::Approx(1e-6 + 1e6 / 8e9 + 1e-3).epsilon(kRel));
  const System t = parse_system(system_to_json(s), "again");
  CHECK(t.node.collective[static_cast<int>(cost::Collective::all_reduce)].large_bytes == doctest::Approx(4e6).epsilon(kRel));
  CHECK(t.node.collective[static_cast<int>(cost::Collective::all_reduce)].large_bw_Bps == doctest::Approx(0.5e9).epsilon(kRel));
  CHECK(system_to_json(t) == system_to_json(s));
}

TEST_CASE("AdamW by size: the measured rate at each size, log-log between them, the nearest outside") {
  Json j = measured_cpu();
  j["gpu"]["kernels"]["optimizer"]["params"] = {1e6, 4e6};
  j["gpu"]["kernels"]["optimizer"]["by_params_GBps"] = {16.0, 4.0};
  const System s = parse_system(j, "p.json");
  // Round trip with the sizes.
  CHECK(system_to_json(parse_system(system_to_json(s), "again")) == system_to_json(s));
  // At 1e6 parameters: 16 GB/s, 30e6 B -> 1.875 ms (the cpu preset's kernel overhead is 0); at 4e6: 4 GB/s,
  // 120e6 B -> 30 ms. At 2e6, halfway in log size: 16 x (4/16)^0.5 = 8 GB/s, 60e6 B -> 7.5 ms. Below the
  // smallest size its rate (0.5e6: 15e6 / 16e9), above the largest its rate (8e6: 240e6 / 4e9).
  CHECK(cost::adamw_rate(s.gpu, 2e6) == doctest::Approx(8e9).epsilon(kRel));
  CHECK(cost::adamw_time(s.gpu, 1e6) == doctest::Approx(30e6 / 16e9).epsilon(kRel));
  CHECK(cost::adamw_time(s.gpu, 2e6) == doctest::Approx(60e6 / 8e9).epsilon(kRel));
  CHECK(cost::adamw_time(s.gpu, 4e6) == doctest::Approx(120e6 / 4e9).epsilon(kRel));
  CHECK(cost::adamw_time(s.gpu, 0.5e6) == doctest::Approx(15e6 / 16e9).epsilon(kRel));
  CHECK(cost::adamw_time(s.gpu, 8e6) == doctest::Approx(240e6 / 4e9).epsilon(kRel));
  // Without sizes the optimizer's one rate (10 GB/s) prices every size, as before.
  const System one = parse_system(measured_cpu(), "p.json");
  CHECK(cost::adamw_rate(one.gpu, 2e6) == 0);
  CHECK(cost::adamw_time(one.gpu, 2e6) == doctest::Approx(60e6 / 10e9).epsilon(kRel));
}

TEST_CASE("a profile of Tessel's runtime prices the runtime's glue passes, which shrink with tensor-parallel shards") {
  // tiny: hidden 64, 4 heads of 16, ffn 256, GELU, biases everywhere; fp32, one sequence of 32 tokens, no SP.
  // The passes runtime/gpt_layer.cpp makes beside its kernels, counted there by hand, in elements:
  // x = xs = 32 x 64 (no SP), q/k/v = 32 x 192 / t, attention output 32 x 64 / t, scores 4/t x 32 x 32, MLP
  // 32 x 256 / t. Forward, attention half: copy of the input (2 xs), norm output and the x2 buffer zeroed
  // (2 xs), residual add with bias (3 xs), the copy out of reduce_tokens (2 xs); y1 and partial zeroed (2 x),
  // gather_tokens' copy (2 x); q/k/v zeroed and their bias added (3 q); scores and attention output zeroed.
  // MLP half: residual (3 xs), reduce copy (2 xs); y2 zeroed (x), gather copy (2 x); h1 and act zeroed, bias
  // added to h1 (4 f). Backward, attention half: bias column sum (xs), dy1l zeroed (xs), reduce copy (2 xs),
  // residual (3 xs); dpf and dy1 zeroed (2 x), gather copy (2 x); dq/dk/dv zeroed and their bias sums (2 q),
  // da zeroed (a). MLP half: dy2l and dx2 zeroed (2 xs), bias sum (xs), reduce copy (2 xs), residual (3 xs);
  // dmf and dy2 zeroed (2 x), gather copy (2 x); dact and dh1 zeroed, b1's sum (3 f).
  const System s = parse_system(measured_cpu(), "p.json");
  const Model m = load_model("tiny");
  Layout l;
  l.pp = l.dp = 1;
  l.global_batch = 2;
  l.precision = Precision::fp32;
  l.recompute = Recompute::none;
  l.attention = AttentionImpl::unfused;
  l.sequence_parallel = false;
  const double x = 32.0 * 64;
  for (int t : {1, 2, 4}) {
    CAPTURE(t);
    l.tp = t;
    const LayerWork lw = lower_layer(m, l, s);
    const double q = 32.0 * 192 / t, a = 32.0 * 64 / t, sc = 4.0 / t * 32 * 32, f = 32.0 * 256 / t;
    const WorkOp &r1 = op_named(lw, "residual1"), &r2 = op_named(lw, "residual2");
    CHECK(r1.runtime_priced);
    CHECK(r1.runtime_bytes_f == doctest::Approx(4 * (9 * x + 4 * x + 3 * q + sc + a)).epsilon(kRel));
    CHECK(r2.runtime_bytes_f == doctest::Approx(4 * (5 * x + 3 * x + 4 * f)).epsilon(kRel));
    CHECK(r1.runtime_bytes_b == doctest::Approx(4 * (7 * x + 4 * x + 2 * q + a)).epsilon(kRel));
    CHECK(r2.runtime_bytes_b == doctest::Approx(4 * (8 * x + 4 * x + 3 * f)).epsilon(kRel));
    CHECK(r1.t_f == doctest::Approx(r1.runtime_bytes_f / 2.5e9).epsilon(kRel));
    CHECK(r2.t_i == doctest::Approx(r2.runtime_bytes_b / 1.25e9).epsilon(kRel));
  }
  // Under SP the token tensors are shards and the copies are collectives: only the shard passes remain.
  l.tp = 2;
  l.sequence_parallel = true;
  const LayerWork sp = lower_layer(m, l, s);
  CHECK(op_named(sp, "residual2").runtime_bytes_f ==
        doctest::Approx(4 * (3 * x / 2 + x + 4 * 32.0 * 256 / 2)).epsilon(kRel));
  // A preset (no measured kind) keeps Megatron's fused bias-dropout-add: read two, write one, a 1-byte mask.
  const System h100 = load_system("dgx-h100");
  l.sequence_parallel = false;
  const LayerWork g = lower_layer(m, l, h100);
  CHECK_FALSE(op_named(g, "residual1").runtime_priced);
  CHECK(op_named(g, "residual1").t_f == doctest::Approx(cost::memory_time(h100.gpu, (3 * 4 + 1) * x, 1)).epsilon(kRel));
}
