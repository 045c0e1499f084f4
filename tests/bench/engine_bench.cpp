// Google Benchmark programs for the event simulator (built, not run by `meson test`):
//   BM_EngineCore     events/s of the engine core on one core (fixed tasks on 128 streams, cross edges)
//   BM_EngineFlows    the same with every task a flow on shared links (re-rating on each start and end)
//   BM_Simulate       GPT-3 175B, tp8 pp8, interleaved vpp 3, whole-cluster fidelity, by dp and micro-batches
//                     (dp 16 / 96 micro-batches = 1,024 A100s; dp 64 = 4,096)
// Results are recorded in docs/simulator.md.
#include <benchmark/benchmark.h>

#include "models/model.hpp"
#include "sim/engine/simulate.hpp"

using namespace tessel;
using namespace tessel::engine;

namespace {

// `streams` chains of `per` tasks; task k of stream s also waits for task k-1 of stream s-1 (a pipeline
// dependency), so the queue always holds ~`streams` tasks.
TaskGraph synthetic(int streams, int per, bool flows) {
  std::vector<double> caps(static_cast<std::size_t>(streams), 2.0);
  GraphBuilder b(streams, caps);
  b.reserve(static_cast<std::size_t>(streams) * per, 2 * static_cast<std::size_t>(streams) * per);
  for (int s = 0; s < streams; ++s)
    for (int k = 0; k < per; ++k) {
      const double d = 1.0 + 0.001 * ((s * 7 + k * 13) % 17);
      if (flows) {
        const std::uint32_t links[] = {static_cast<std::uint32_t>(s), static_cast<std::uint32_t>((s + 1) % streams)};
        b.add_flow(d, links);
      } else {
        b.add_fixed(d);
      }
    }
  for (int s = 0; s < streams; ++s)
    for (int k = 1; k < per; ++k) {
      const auto id = static_cast<std::uint32_t>(s * per + k);
      b.edge(id - 1, id);
      if (s > 0) b.edge(static_cast<std::uint32_t>((s - 1) * per + k - 1), id);
    }
  return b.finish();
}

void run_graph(benchmark::State& state, bool flows) {
  const TaskGraph g = synthetic(128, static_cast<int>(state.range(0)), flows);
  std::uint64_t events = 0;
  for (auto _ : state) {
    Simulator sim(g);
    const RunResult r = sim.run();
    events += r.events;
    benchmark::DoNotOptimize(r.makespan);
  }
  state.counters["events/s"] = benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
  state.counters["tasks"] = static_cast<double>(g.size());
  state.counters["graph_bytes/task"] = static_cast<double>(g.bytes_used()) / g.size();
}

void BM_EngineCore(benchmark::State& state) { run_graph(state, false); }
void BM_EngineFlows(benchmark::State& state) { run_graph(state, true); }

void BM_Simulate(benchmark::State& state) {
  const Model m = load_model("gpt3-175b");
  const System sys = load_system("dgx-a100");
  Layout l;
  l.tp = 8;
  l.pp = 8;
  l.vpp = 3;
  l.dp = static_cast<int>(state.range(0));
  l.global_batch = static_cast<int>(state.range(1)) * l.dp;
  l.schedule = sched::Kind::interleaved;
  l.sequence_parallel = true;
  l.recompute = Recompute::selective;
  SimOptions o;
  o.critical_path = false;
  double run_s = 0, build_s = 0;
  std::uint64_t events = 0;
  std::size_t bytes = 0;
  for (auto _ : state) {
    const SimReport r = simulate(m, l, sys, o);
    run_s += r.run_s;
    build_s += r.build_s;
    events = r.events;
    bytes = r.job.graph.bytes_used();
    benchmark::DoNotOptimize(r.step_s);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["gpus"] = l.gpus();
  state.counters["events"] = static_cast<double>(events);
  state.counters["engine_ms"] = 1e3 * run_s / n;
  state.counters["build_ms"] = 1e3 * build_s / n;
  state.counters["graph_MB"] = static_cast<double>(bytes) / 1e6;
}

}  // namespace

BENCHMARK(BM_EngineCore)->Arg(1000)->Arg(8000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EngineFlows)->Arg(1000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Simulate)
    ->Args({16, 96})   // the 1,024-GPU job
    ->Args({64, 96})   // 4,096 GPUs
    ->Args({4, 96})->Args({8, 96})->Args({32, 96})
    ->Args({16, 24})->Args({16, 48})->Args({16, 192})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
