// Analytical tier throughput: layouts scored per second on one core (target >= 100,000; issue 5).
// Rerun: build/tests/explore/bench_explore --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include "sim/explore/explore.hpp"
#include "sim/stage_split.hpp"

using namespace tessel;

static void BM_ExploreAnalyticalOneCore(benchmark::State& state) {
  const Model m = load_model("gpt3-175b");
  const System sys = load_system("dgx-a100");
  explore::Options o;
  o.threads = 1;
  long long layouts = 0;
  for (auto _ : state) {
    const auto r = explore::run(m, sys, 1024, 1536, {}, o);
    layouts += r.enumerated;
    benchmark::DoNotOptimize(r.top.data());
  }
  state.counters["layouts_per_s"] = benchmark::Counter(static_cast<double>(layouts), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ExploreAnalyticalOneCore)->Unit(benchmark::kMillisecond)->UseRealTime();

static void BM_ExploreLlama405bOneCore(benchmark::State& state) {
  Model m = load_model("llama3-405b");
  const System sys = load_system("meta-h100");
  explore::Options o;
  o.threads = 1;
  long long layouts = 0;
  for (auto _ : state) {
    const auto r = explore::run(m, sys, 16384, 2048, {}, o);
    layouts += r.enumerated;
    benchmark::DoNotOptimize(r.top.data());
  }
  state.counters["layouts_per_s"] = benchmark::Counter(static_cast<double>(layouts), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ExploreLlama405bOneCore)->Unit(benchmark::kMillisecond)->UseRealTime();

// A mixture-of-experts space: Qwen3-235B-A22B (94 layers, 128 experts) on 256 H100, ep and etp enumerated
// with the other degrees (target >= 100,000 layouts/s, issue 24).
static void BM_ExploreQwen3MoeOneCore(benchmark::State& state) {
  Model m = load_model("qwen3-235b-a22b");
  const System sys = load_system("dgx-h100");
  explore::Options o;
  o.threads = 1;
  long long layouts = 0;
  for (auto _ : state) {
    const auto r = explore::run(m, sys, 256, 2048, {}, o);
    layouts += r.enumerated;
    benchmark::DoNotOptimize(r.top.data());
  }
  state.counters["layouts_per_s"] = benchmark::Counter(static_cast<double>(layouts), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ExploreQwen3MoeOneCore)->Unit(benchmark::kMillisecond)->UseRealTime();

// The stage partitioner on Llama 3 405B's 126 layers over pp 16 x vpp 8 = 128 virtual stages, memory budgets
// included (the costs built from the cost model each time, as estimate does): target < 10 ms (issue 23).
static void BM_Partition126Into128(benchmark::State& state) {
  const Model m = load_model("llama3-405b");
  const System sys = load_system("meta-h100");
  Layout l;
  l.tp = 8;
  l.pp = 16;
  l.vpp = 8;
  l.dp = 128;
  l.schedule = sched::Kind::interleaved;
  l.global_batch = 2048;
  l.sequence_parallel = true;
  l.zero_stage = 1;
  std::vector<int> split;
  for (auto _ : state) {
    split = balanced_split(m, l, sys, Balance::time);
    benchmark::DoNotOptimize(split.data());
  }
  if (split.size() != 128) state.SkipWithError("not 128 stages");
}
BENCHMARK(BM_Partition126Into128)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
