// explore with the job to train (Options::job) and --objective time-to-train: every fitting layout carries its
// plan, the ranking is by expected wall time, and the event-simulated tier's adaptive stop still returns the
// brute-force top under the simulator.
#include <doctest/doctest.h>

#include <algorithm>

#include "sim/explore/explore.hpp"

using namespace tessel;

namespace {

struct Fixture {
  Model m = load_model("megatron-7.5b");
  System sys = load_system("dgx-a100");
  int gpus = 64;
  int gbs = 256;
  goodput::Job job;
  Fixture() {
    // Failures every 200 GPU-hours (a 64-GPU job's MTBF 3.1 h) on a slow file system (2 GB/s a node and in all),
    // so that checkpoints and restarts differ enough between layouts to reorder them.
    job.steps = 20000;
    job.reliability.gpu_mtbf_s = 200 * 3600.0;
    job.reliability.restart_overhead_s = 300;
    job.storage.node_write_bw = job.storage.node_read_bw = job.storage.aggregate_bw = 2e9;
    job.storage.d2h_bw = 32e9;
  }
};

}  // namespace

TEST_CASE("time-to-train objective: rows ranked by expected wall time, each with the plan at its step") {
  Fixture f;
  explore::Options o;
  o.top_n = 20;
  o.job = f.job;
  o.objective = explore::Objective::time_to_train;
  // ZeRO-0 only: every dp replica reads its whole state on a restart, so the restart differs with dp (under
  // ZeRO-1 every layout of the 64 GPUs shards the same checkpoint evenly and the step time decides).
  explore::Space zero0;
  zero0.zero = {0};
  const explore::Result r = explore::run(f.m, f.sys, f.gpus, f.gbs, zero0, o);
  REQUIRE(r.top.size() == 20);
  bool slower_step_ahead = false;
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    REQUIRE(r.top[i].plan);
    CHECK(r.top[i].plan->step_s == r.top[i].step_s);
    if (i + 1 < r.top.size()) {
      CHECK(r.top[i].plan->wall_s <= r.top[i + 1].plan->wall_s);
      slower_step_ahead = slower_step_ahead || r.top[i].step_s > r.top[i + 1].step_s;
    }
  }
  // The objective is not the step time in disguise: somewhere a slower step ranks ahead.
  CHECK(slower_step_ahead);
  // The step objective with the same job: the plans are there, the order is the step time's.
  o.objective = explore::Objective::step;
  const explore::Result s = explore::run(f.m, f.sys, f.gpus, f.gbs, zero0, o);
  for (std::size_t i = 0; i + 1 < s.top.size(); ++i) CHECK_FALSE(explore::better(s.top[i + 1], s.top[i]));
  CHECK(s.top.front().plan);
}

TEST_CASE("time-to-train objective: the simulated tier's top equals the brute-force top under the simulator") {
  Fixture f;
  explore::Options all;
  all.top_n = 100000;
  all.job = f.job;
  all.objective = explore::Objective::time_to_train;
  const auto everything = explore::run(f.m, f.sys, f.gpus, f.gbs, {}, all);
  // A stand-in simulator that makes the ten favourites by time to train 30% slower per step.
  std::vector<std::string> favourites;
  for (int i = 0; i < 10; ++i) favourites.push_back(everything.top[i].layout.describe());
  auto sim = [&](const Layout& l) {
    const Estimate e = estimate(f.m, l, f.sys, f.gpus);
    explore::SimScore sc;
    const bool fav = std::find(favourites.begin(), favourites.end(), l.describe()) != favourites.end();
    sc.step_s = e.step_s * (fav ? 1.3 : 1.0);
    sc.peak_memory_bytes = e.peak_memory_bytes;
    return sc;
  };
  std::vector<explore::Scored> brute = everything.top;
  for (auto& s : brute) {
    s.step_s = sim(s.layout).step_s;
    s.plan = goodput::with_step_time(*s.plan, s.step_s, f.job);
  }
  std::sort(brute.begin(), brute.end(),
            [](const explore::Scored& a, const explore::Scored& b) { return explore::better_by(a, b, explore::Objective::time_to_train); });
  explore::Options o = all;
  o.top_n = 5;
  o.simulate = sim;
  const auto r = explore::run(f.m, f.sys, f.gpus, f.gbs, {}, o);
  REQUIRE(r.top.size() == 5);
  CHECK(r.simulated < everything.scored);  // it did not need to simulate everything
  for (std::size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(r.top[i].layout.describe() == brute[i].layout.describe());
    CHECK(r.top[i].plan->wall_s == doctest::Approx(brute[i].plan->wall_s));
  }
}

TEST_CASE("a job that cannot finish on a layout rejects it under time-to-train, and every layout is accounted for") {
  Fixture f;
  explore::Options o;
  o.job = f.job;
  o.job->reliability.gpu_mtbf_s = 64;  // a failure a second on 64 GPUs against 300 s restarts
  const explore::Result r = explore::run(f.m, f.sys, f.gpus, f.gbs, {}, o);
  CHECK(r.top.empty());
  long long rejected = 0, by_time = 0;
  for (const auto& x : r.rejected) {
    rejected += x.count;
    if (x.rule == "time-to-train") {
      by_time = x.count;
      CHECK(x.example.find("the job would not finish") != std::string::npos);
    }
  }
  CHECK(by_time > 0);
  CHECK(r.scored == 0);
  CHECK(r.enumerated == rejected);
}
