// sim/goodput and sim/goodput_mc: the intervals and the expected wall time against numbers derived by hand,
// checkpoint bytes per rank and node under each ZeRO stage, the Monte Carlo against the closed form, and the
// system file's reliability and storage objects.
#include <doctest/doctest.h>

#include <cmath>

#include "sim/goodput.hpp"
#include "sim/goodput_mc.hpp"
#include "util/error.hpp"

using namespace tessel;

namespace {

constexpr double kRel = 1e-9;  // formulas evaluated twice the same way: rounding only

Layout layout(int tp, int pp, int dp, int zero, Precision p = Precision::bf16) {
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.vpp = 1;
  l.schedule = sched::Kind::one_f_one_b;
  l.micro_batch = 1;
  l.global_batch = dp * 2 * pp;
  l.zero_stage = zero;
  l.precision = p;
  l.recompute = Recompute::full;
  return l;
}

}  // namespace

TEST_CASE("goodput: Young's and Daly's intervals, hand-derived") {
  // delta = 60 s, M = 3 h = 10,800 s. Young: sqrt(2 x 60 x 10,800) = sqrt(1,296,000) = 1,138.41996 s.
  // Daly: x = delta / 2M = 60 / 21,600 = 0.00277778, sqrt(x) = 0.0527046; the bracket is
  // 1 + 0.0527046 / 3 + 0.00277778 / 9 = 1.0178769; tau = 1,138.41996 x 1.0178769 - 60 = 1,098.7713 s.
  CHECK(goodput::young_interval_s(60, 10800) == doctest::Approx(1138.41996).epsilon(1e-8));
  CHECK(goodput::daly_interval_s(60, 10800) == doctest::Approx(1098.77132).epsilon(1e-8));
  // delta >= 2M: Daly's estimate is M itself (checkpointing cannot pay off faster than failures arrive).
  CHECK(goodput::daly_interval_s(30000, 10000) == 10000);
  // Daly's correction shortens Young's interval when delta << M (the -delta term dominates the bracket).
  CHECK(goodput::daly_interval_s(60, 10800) < goodput::young_interval_s(60, 10800));
}

TEST_CASE("goodput: Daly's expected wall time, hand-derived") {
  // 100 h of work checkpointed every tau = 1 h, delta = 0.1 h, restart R = 0.2 h, M = 10 h:
  // T_w = M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau = 10 x e^0.02 x (e^0.11 - 1) x 100
  //     = 10 x 1.0202013 x 0.1162781 x 100 = 118.62704 h, goodput 100 / 118.627 = 84.30%.
  const double h = 3600;
  CHECK(goodput::expected_wall_s(100 * h, 1 * h, 0.1 * h, 0.2 * h, 10 * h) == doctest::Approx(118.62704 * h).epsilon(1e-7));
  // Without failures (M -> infinity) the wall time tends to work + checkpoints: 100 + 100 x 0.1 = 110 h.
  CHECK(goodput::expected_wall_s(100 * h, 1 * h, 0.1 * h, 0.2 * h, 1e12 * h) == doctest::Approx(110 * h).epsilon(1e-6));
}

TEST_CASE("goodput: the job's MTBF adds the GPUs' and the nodes' rates") {
  ReliabilitySpec r;
  r.gpu_mtbf_s = 50677 * 3600.0;
  // Llama 3's 16,384 GPUs at 50,677 h each: 50,677 / 16,384 = 3.093079 h (54 days x 24 h / 419 interruptions).
  CHECK(goodput::job_mtbf_s(r, 16384, 8) == doctest::Approx(3.093079 * 3600).epsilon(1e-6));
  // Adding RSC-1's 3,692 h per node over 2,048 nodes: 1 / (16,384 / 50,677 + 2,048 / 3,692) = 1.138932 h.
  r.node_mtbf_s = 3692 * 3600.0;
  CHECK(goodput::job_mtbf_s(r, 16384, 8) == doctest::Approx(1.138932 * 3600).epsilon(1e-6));
  // A partly filled last node still counts as a node: 9 GPUs on 8-GPU nodes are 2 nodes.
  r.gpu_mtbf_s = 0;
  CHECK(goodput::job_mtbf_s(r, 9, 8) == doctest::Approx(3692 * 3600.0 / 2).epsilon(kRel));
}

TEST_CASE("goodput: checkpoint bytes per rank and node under each ZeRO stage") {
  // Llama-2 7B has untied embeddings and no learned positions, so the stored parameters are the model's
  // exactly; tp8 dp2 on two 8-GPU nodes: node 0 is dp rank 0, node 1 dp rank 1 (tp fastest, then dp).
  const Model m = load_model("llama2-7b", 4096);
  const System sys = load_system("dgx-a100");
  const double P = static_cast<double>(m.total_params());
  const double blob = 16384;  // per rank: RNG streams and data position
  const Estimate z0 = estimate(m, layout(8, 1, 2, 0), sys);
  const goodput::CheckpointBytes b0 = goodput::checkpoint_bytes(m, z0, 8);
  // Every element once: 12 bytes (fp32 value + two fp32 moments) x P, plus 16 ranks' blobs.
  CHECK(b0.total_write == doctest::Approx(12 * P + 16 * blob).epsilon(kRel));
  // ZeRO-0: dp rank 0 writes all of it, so node 0 holds the whole checkpoint and one GPU an eighth.
  CHECK(b0.max_node_write == doctest::Approx(12 * P + 8 * blob).epsilon(kRel));
  CHECK(b0.max_rank_write == doctest::Approx(12 * P / 8 + blob).epsilon(kRel));
  // A restart: each of the two replicas reads its whole state: 2 x 12 P.
  CHECK(b0.total_read == doctest::Approx(2 * 12 * P + 16 * blob).epsilon(kRel));
  // ZeRO-1 under bf16 shards the fp32 master value and the moments over dp: each node writes half.
  const goodput::CheckpointBytes b1 = goodput::checkpoint_bytes(m, estimate(m, layout(8, 1, 2, 1), sys), 8);
  CHECK(b1.total_write == doctest::Approx(b0.total_write).epsilon(kRel));
  CHECK(b1.max_node_write == doctest::Approx(6 * P + 8 * blob).epsilon(kRel));
  CHECK(b1.total_read == doctest::Approx(12 * P + 16 * blob).epsilon(kRel));
  // fp32 training keeps the value as the weight, replicated under ZeRO-1: node 0 writes the 4 P of values and
  // half of the 8 P of moments, 8 P in all; ZeRO-3 shards the value too: 6 P per node.
  const goodput::CheckpointBytes f1 =
      goodput::checkpoint_bytes(m, estimate(m, layout(8, 1, 2, 1, Precision::fp32), sys), 8);
  CHECK(f1.max_node_write == doctest::Approx(8 * P + 8 * blob).epsilon(kRel));
  const goodput::CheckpointBytes f3 =
      goodput::checkpoint_bytes(m, estimate(m, layout(8, 1, 2, 3, Precision::fp32), sys), 8);
  CHECK(f3.max_node_write == doctest::Approx(6 * P + 8 * blob).epsilon(kRel));
}

TEST_CASE("goodput: the tied head's second copy is stored once") {
  // tiny ties its embeddings: with pp 2 the last stage holds the table again for the head (the memory model
  // counts it), but the checkpoint stores it once, from the first stage (checkpoint_owns): still 12 x P.
  const Model m = load_model("tiny");
  REQUIRE(m.tied_embeddings);
  const System sys = load_system("cpu");
  Layout l = layout(1, 2, 1, 0, Precision::fp32);
  l.attention = AttentionImpl::unfused;
  const goodput::CheckpointBytes b = goodput::checkpoint_bytes(m, estimate(m, l, sys), 64);
  CHECK(b.total_write == doctest::Approx(12.0 * static_cast<double>(m.total_params()) + 2 * 16384).epsilon(kRel));
}

TEST_CASE("goodput: save and load times on a storage path, hand-derived") {
  goodput::CheckpointBytes b;
  b.total_write = 1e12;
  b.max_node_write = 100e9;
  b.max_rank_write = 16e9;
  b.total_read = 2e12;
  b.max_node_read = 100e9;
  StorageSpec s;
  s.node_write_bw = s.node_read_bw = 10e9;
  s.aggregate_bw = 200e9;
  s.d2h_bw = 32e9;
  // Synchronous: the busiest node, 100 GB / 10 GB/s = 10 s, binds before the cap, 1 TB / 200 GB/s = 5 s.
  goodput::CheckpointTimes t = goodput::checkpoint_times(b, s);
  CHECK(t.save_s == doctest::Approx(10));
  CHECK(t.blocking_s == doctest::Approx(10));
  CHECK(t.lag_s == 0);
  // Loading reads 2 TB: the cap binds, 2 TB / 200 GB/s = 10 s, equal to the node's 100 GB / 10 GB/s.
  CHECK(t.load_s == doctest::Approx(10));
  // A cap of 50 GB/s: 1 TB / 50 GB/s = 20 s > 10 s.
  s.aggregate_bw = 50e9;
  CHECK(goodput::checkpoint_times(b, s).save_s == doctest::Approx(20));
  // Asynchronous: training waits for the busiest GPU's copy, 16 GB / 32 GB/s = 0.5 s; durable 20 s later.
  s.async = true;
  t = goodput::checkpoint_times(b, s);
  CHECK(t.blocking_s == doctest::Approx(0.5));
  CHECK(t.lag_s == doctest::Approx(20));
}

TEST_CASE("goodput: the Monte Carlo agrees with Daly's closed form, synchronous and asynchronous") {
  // 1,000 h of work, M = 10 h: about 110 failures a run, each costing ~0.8 h give or take as much, so a run's
  // wall time spreads by ~sqrt(110) x 0.8 = 8.4 h of ~1,190 (0.7%); over 2,000 runs the mean's error is 0.016%,
  // so 0.2 points of goodput is over ten standard errors.
  const double h = 3600;
  goodput::McJob j;
  j.work_s = 1000 * h;
  j.interval_s = 1 * h;
  j.blocking_s = 0.05 * h;
  j.restart_s = 0.2 * h;
  j.mtbf_s = 10 * h;
  const goodput::McResult sync = goodput::monte_carlo(j, 2000, 7);
  const double cf_sync = j.work_s / goodput::expected_wall_s(j.work_s, j.interval_s, j.blocking_s, j.restart_s, j.mtbf_s);
  CHECK(std::abs(sync.goodput - cf_sync) < 0.002);
  CHECK(sync.p10_s <= sync.p50_s);
  CHECK(sync.p50_s <= sync.p90_s);
  // Wall = work + checkpoints + restarts + lost work, run by run and so on average.
  CHECK(sync.mean_lost_s > 0);
  // Asynchronous: the checkpoint is durable 0.5 h after its copy. The closed form charges each restart that lag
  // (docs/goodput.md derives the equivalence); the Monte Carlo plays the window itself.
  j.lag_s = 0.5 * h;
  const goodput::McResult async = goodput::monte_carlo(j, 2000, 7);
  const double cf_async =
      j.work_s / goodput::expected_wall_s(j.work_s, j.interval_s, j.blocking_s, j.restart_s + j.lag_s, j.mtbf_s);
  CHECK(std::abs(async.goodput - cf_async) < 0.002);
  // The lag costs goodput: 0.5 h more lost per failure, about 110 failures: ~5 points.
  CHECK(cf_sync - cf_async > 0.03);
}

TEST_CASE("goodput: the Monte Carlo is deterministic for a seed") {
  goodput::McJob j;
  j.work_s = 500;
  j.interval_s = 10;
  j.blocking_s = 1;
  j.restart_s = 5;
  j.mtbf_s = 50;
  const goodput::McResult a = goodput::monte_carlo(j, 100, 42), b = goodput::monte_carlo(j, 100, 42);
  CHECK(a.mean_wall_s == b.mean_wall_s);
  CHECK(a.p90_s == b.p90_s);
  CHECK(goodput::monte_carlo(j, 100, 43).mean_wall_s != a.mean_wall_s);
}

TEST_CASE("goodput: a plan's interval is Daly's in whole steps, and its wall time Daly's") {
  const Model m = load_model("llama2-7b", 4096);
  const System sys = load_system("dgx-h100");
  const Estimate e = estimate(m, layout(8, 1, 2, 1), sys);
  goodput::Job job;
  job.steps = 100000;
  job.reliability = *sys.reliability;
  job.storage = *sys.storage;
  job.usd_per_gpu_hour = 2.0;
  const goodput::Plan p = goodput::plan(m, e, sys, job);
  CHECK(p.daly_s == doctest::Approx(goodput::daly_interval_s(p.ckpt.blocking_s, p.mtbf_s)).epsilon(kRel));
  CHECK(std::abs(p.interval_s - p.daly_s) <= p.step_s / 2 + 1e-9);
  CHECK(p.wall_s == doctest::Approx(goodput::expected_wall_s(p.work_s, p.interval_s, p.ckpt.blocking_s, p.restart_s,
                                                             p.mtbf_s)).epsilon(kRel));
  CHECK(p.goodput == doctest::Approx(p.work_s / p.wall_s).epsilon(kRel));
  CHECK(*p.usd == doctest::Approx(p.gpu_hours * 2.0).epsilon(kRel));
  // A slower step: the same checkpoint, so the same Daly interval in seconds, more wall time.
  const goodput::Plan slow = goodput::with_step_time(p, 2 * p.step_s, job);
  CHECK(slow.daly_s == p.daly_s);
  CHECK(slow.wall_s > p.wall_s);
}

TEST_CASE("goodput: a job that cannot finish is refused, not given an infinite time") {
  const Model m = load_model("llama2-7b", 4096);
  const System sys = load_system("dgx-h100");
  goodput::Job job;
  job.steps = 1000;
  job.reliability.gpu_mtbf_s = 60;  // 16 GPUs: a failure every 3.75 s against a 600 s restart
  job.reliability.restart_overhead_s = 600;
  job.storage = *sys.storage;
  CHECK_THROWS_AS(goodput::plan(m, estimate(m, layout(8, 1, 2, 1), sys), sys, job), InfeasibleLayout);
}

TEST_CASE("system: reliability and storage objects, strict keys and round trip") {
  for (const std::string& name : system_preset_names()) {
    const System s = load_system(name);
    INFO(name);
    CHECK(s.reliability);  // every preset states its failure model and checkpoint path (docs/goodput.md)
    CHECK(s.storage);
    const System back = parse_system(system_to_json(s), "round trip");
    CHECK(system_to_json(back) == system_to_json(s));
  }
  Json j = system_to_json(load_system("dgx-a100"));
  j["reliability"] = {{"restart_overhead_s", 60}};
  CHECK_THROWS_WITH_AS(parse_system(j, "sys.json"), doctest::Contains("needs gpu_mtbf_hours or node_mtbf_hours"), InputError);
  j["reliability"] = {{"gpu_mtbf_hours", 1000}, {"restart_overhead_s", 60}, {"mtbf_days", 3}};
  CHECK_THROWS_WITH_AS(parse_system(j, "sys.json"), doctest::Contains("mtbf_days"), InputError);
  j["reliability"] = {{"gpu_mtbf_hours", -5}, {"restart_overhead_s", 60}};
  CHECK_THROWS_WITH_AS(parse_system(j, "sys.json"), doctest::Contains("gpu_mtbf_hours"), InputError);
  j.erase("reliability");
  j["storage"] = {{"node_write_GBps", 10}, {"node_read_GBps", 10}, {"d2h_GBps", 32}};
  CHECK_THROWS_WITH_AS(parse_system(j, "sys.json"), doctest::Contains("async"), InputError);
  j.erase("storage");
  CHECK_FALSE(parse_system(j, "sys.json").reliability);  // both objects are optional
}
