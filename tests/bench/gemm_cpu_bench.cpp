// CPU GEMM: OpenBLAS (one thread, as each runtime rank runs it) against Tessel's own blocked kernel, at the
// shapes the CPU runtime's tiny and closed-loop models multiply. Rerun:
//   build/tests/bench/gemm_cpu_bench --benchmark_counters_tabular=true
// Results and the choice they justify: docs/runtime.md ("GEMM backend").
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kernels/cpu/gemm.hpp"

namespace {

using GemmFn = void (*)(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*, int);

void run(benchmark::State& state, GemmFn fn) {
  const int M = static_cast<int>(state.range(0)), N = static_cast<int>(state.range(1)), K = static_cast<int>(state.range(2));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> a(static_cast<std::size_t>(M) * K), b(static_cast<std::size_t>(K) * N), c(static_cast<std::size_t>(M) * N);
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  tessel::kernels::cpu::gemm_set_single_thread();
  for (auto _ : state) {
    fn(false, false, M, N, K, 1.f, a.data(), K, b.data(), N, 0.f, c.data(), N);
    benchmark::DoNotOptimize(c.data());
  }
  // FLOPs per iteration / 1e9, as a rate over the measured time: GFLOP/s.
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * N * K / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GemmLibrary(benchmark::State& s) { run(s, &tessel::kernels::cpu::gemm); }
void BM_GemmBlocked(benchmark::State& s) { run(s, &tessel::kernels::cpu::gemm_blocked); }

// tokens x hidden -> qkv / mlp shapes of the tiny model (32 tokens x 64 hidden, ffn 256) and of a 4x larger
// closed-loop model, plus a square 512 for reference.
#define SHAPES ->Args({32, 192, 64})->Args({32, 256, 64})->Args({32, 64, 256})->Args({128, 768, 256})->Args({128, 1024, 256})->Args({512, 512, 512})
BENCHMARK(BM_GemmLibrary) SHAPES;
BENCHMARK(BM_GemmBlocked) SHAPES;

}  // namespace

BENCHMARK_MAIN();
