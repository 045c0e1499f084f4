// Does a core shared by two compute threads deliver half its rate to each, as the host model assumes
// (sim/engine/host_model.hpp: 1/crowd of the core), or less? T threads each run the same fixed work (single-
// threaded OpenBLAS sgemm, or a streaming axpy over 4 MiB) from a common start; the wall time until all finish
// is the measure. On a C-core machine the sharing factor is wall(2C) / (2 wall(C)): 1 when sharing is free,
// above 1 when the threads on one core slow each other (cache thrashing, switches). Five repetitions of each,
// the median ratio printed with its range. Build and run (docs/calibration.md, "The host model"):
//   g++ -O2 -std=c++20 bench/host_sharing.cpp -o /tmp/host_sharing -lopenblas -pthread && /tmp/host_sharing
#include <cblas.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

extern "C" void openblas_set_num_threads(int);

namespace {

double wall(int threads, int reps, int m, int n, int k, bool stream) {
  std::barrier sync(threads + 1);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      std::vector<float> a(static_cast<std::size_t>(m) * k, 0.5f), b(static_cast<std::size_t>(k) * n, 0.25f),
          c(static_cast<std::size_t>(m) * n, 0.f), x(1 << 20, 1.f), y(1 << 20, 2.f);
      sync.arrive_and_wait();
      for (int r = 0; r < reps; ++r) {
        if (stream)
          for (std::size_t i = 0; i < x.size(); ++i) y[i] += 0.5f * x[i];
        else
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c.data(), n);
      }
      sync.arrive_and_wait();
    });
  sync.arrive_and_wait();
  const auto t0 = std::chrono::steady_clock::now();
  sync.arrive_and_wait();
  const auto t1 = std::chrono::steady_clock::now();
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(t1 - t0).count();
}

}  // namespace

int main() {
  openblas_set_num_threads(1);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::printf("%d cores; sharing factor wall(%d threads) / (2 wall(%d threads)), median of 5 [min, max]\n", cores,
              2 * cores, cores);
  struct Case {
    const char* name;
    int m, n, k, reps;
    bool stream;
  };
  for (const Case& c : {Case{"sgemm 256x1024x256", 256, 1024, 256, 150, false}, Case{"sgemm 512x256x1024", 512, 256, 1024, 150, false},
                        Case{"sgemm 128x256x256", 128, 256, 256, 1500, false}, Case{"axpy 4 MiB", 0, 0, 0, 300, true}}) {
    std::array<double, 5> f{};
    for (double& v : f) v = wall(2 * cores, c.reps, c.m, c.n, c.k, c.stream) / (2 * wall(cores, c.reps, c.m, c.n, c.k, c.stream));
    std::sort(f.begin(), f.end());
    std::printf("%-20s %.3f [%.3f, %.3f]\n", c.name, f[2], f[0], f[4]);
  }
}
