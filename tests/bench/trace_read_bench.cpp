// Chrome trace reading speed (traces/chrome.hpp): 300,000 op events on 64 ranks, as a simulated 1,024-GPU
// step produces. Rerun: build/tests/bench/trace_read_bench
#include <benchmark/benchmark.h>

#include "traces/chrome.hpp"

using namespace tessel::trace;

static void BM_ReadChromeTrace(benchmark::State& state) {
  Trace t;
  const int n = static_cast<int>(state.range(0));
  for (int i = 0; i < n; ++i) {
    OpEvent e;
    e.rank = i % 64;
    e.op = i % 2 ? "forward" : "backward";
    e.name = e.op;
    e.stage = i % 8;
    e.mb = i / 64;
    e.start_us = i * 1.5;
    e.dur_us = 1.0;
    t.events.push_back(e);
  }
  const std::string text = to_chrome_json(t);
  for (auto _ : state) {
    Trace r = parse_chrome_trace(text, "bench.json");
    benchmark::DoNotOptimize(r.events.data());
  }
  state.counters["events_per_s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["MB_per_s"] = benchmark::Counter(text.size() / 1e6, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ReadChromeTrace)->Arg(100000)->Arg(300000)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
