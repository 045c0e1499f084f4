// tessel bench: microbenchmarks on a backend, printed with nccl-tests' columns and written (--json) as the
// bench document `tessel calibrate` fits (sim/calibrate/bench_data.hpp). The runners live here, above
// runtime/ and kernels/, because sim/ (where the fit lives) may not depend on them.
//
// Timing rule for every kernel: one untimed warm-up call, then repetitions until kMinSampleS has passed
// (at least kMinReps); the row is the median repetition. With --concurrent N (N > 1) the GEMM and memory kernels
// run on N threads at once, each on its own buffers, and the row is the mean over threads of their
// medians: the per-rank rate when N ranks of `tessel run --backend cpu` compute at the same time (flag
// --concurrent N; --ranks lists the collective group sizes).
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>
#include <vector>

#include "kernels/cpu/gemm.hpp"
#include "models/util/error.hpp"
#include "runtime/comm/comm_bench.hpp"
#include "runtime/comm/thread_comm.hpp"
#include "sim/calibrate/bench_data.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"
#ifdef TESSEL_HAVE_MPI
#include "runtime/comm/mpi_comm.hpp"
#endif

namespace tessel::cmd {

namespace {

namespace kc = tessel::kernels::cpu;
using Clock = std::chrono::steady_clock;

constexpr double kMinSampleS = 0.02;  // per shape: long enough to average timer noise (~1 us)
constexpr int kMinReps = 3;

template <class F>
double median_time(F&& f) {
  f();  // warm-up: page faults, BLAS buffers
  std::vector<double> t;
  const auto start = Clock::now();
  while (static_cast<int>(t.size()) < kMinReps || std::chrono::duration<double>(Clock::now() - start).count() < kMinSampleS) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (t.size() >= 1000) break;
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

// Runs `make(thread)` -> kernel on `threads` threads that start each shape together; mean of medians.
template <class Make>
double concurrent_time(int threads, Make&& make) {
  if (threads == 1) return median_time(make(0));
  std::vector<double> t(threads);
  std::barrier sync(threads);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i)
    pool.emplace_back([&, i] {
      auto f = make(i);
      sync.arrive_and_wait();
      t[i] = median_time(f);
    });
  for (auto& th : pool) th.join();
  double s = 0;
  for (double v : t) s += v;
  return s / threads;
}

// Shapes: the GEMMs of a small GPT layer (tokens x hidden x {h, 3h, 4h}) and a grid from 16 to 1024 with
// off-grid sizes, so tile and K overheads are visible; plus batched attention-like GEMMs.
std::vector<calib::GemmRow> gemm_shapes() {
  std::vector<calib::GemmRow> s;
  for (std::int64_t m : {16, 64, 128, 256, 512})
    for (std::int64_t n : {64, 192, 256, 1024})
      for (std::int64_t k : {64, 256, 1024}) s.push_back({m, n, k, 1, 0});
  for (std::int64_t m : {100, 300}) s.push_back({m, 300, 300, 1, 0});
  for (std::int64_t sq : {32, 64, 128}) s.push_back({sq, sq, 64, 8, 0});
  return s;
}

void bench_gemm(calib::BenchData& out, int threads) {
  kc::gemm_set_single_thread();
  for (calib::GemmRow r : gemm_shapes()) {
    r.time_s = concurrent_time(threads, [&](int) {
      auto a = std::make_shared<std::vector<float>>(r.m * r.k * r.batch, 0.5f);
      auto b = std::make_shared<std::vector<float>>(r.k * r.n * r.batch, 0.25f);
      auto c = std::make_shared<std::vector<float>>(r.m * r.n * r.batch, 0.0f);
      return [=] {
        for (std::int64_t i = 0; i < r.batch; ++i)
          kc::gemm(false, false, static_cast<int>(r.m), static_cast<int>(r.n), static_cast<int>(r.k), 1.0f,
                   a->data() + i * r.m * r.k, static_cast<int>(r.k), b->data() + i * r.k * r.n, static_cast<int>(r.n),
                   0.0f, c->data() + i * r.m * r.n, static_cast<int>(r.n));
      };
    });
    out.gemm.push_back(r);
  }
}

// STREAM's copy (a = b: 2 arrays moved) and triad (a = b + s c: 3) (McCalpin, STREAM benchmark), from
// in-cache to DRAM-sized arrays.
void bench_membw(calib::BenchData& out, int threads) {
  for (const char* kernel : {"copy", "triad"}) {
    const bool triad = std::string(kernel) == "triad";
    // 16 KiB .. 4 MiB per array: the range of the runtime's activation tensors (cache-resident, like them).
    for (std::size_t n : {4096u, 16384u, 65536u, 262144u, 1048576u}) {
      calib::MemRow r{kernel, (triad ? 3.0 : 2.0) * 4.0 * n, 0};
      r.time_s = concurrent_time(threads, [&](int) {
        auto a = std::make_shared<std::vector<float>>(n, 0.0f);
        auto b = std::make_shared<std::vector<float>>(n, 1.0f);
        auto c = std::make_shared<std::vector<float>>(n, 2.0f);
        return [=] {
          float* pa = a->data();
          const float *pb = b->data(), *pc = c->data();
          if (triad)
            for (std::size_t i = 0; i < n; ++i) pa[i] = pb[i] + 3.0f * pc[i];
          else
            std::copy(pb, pb + n, pa);
        };
      });
      out.membw.push_back(r);
    }
  }
}

// 1 KiB to 4 MiB per rank block: the sizes of TP activations and pipeline messages of the models the CPU
// runtime trains. Larger buffers leave the caches and follow a different (DRAM) line, which a single
// alpha-beta link cannot also fit; calibrating for GPT-sized CPU runs is the point here.
std::vector<std::size_t> coll_counts() { return {256, 1024, 4096, 16384, 65536, 262144, 1048576}; }

void add_coll_rows(calib::BenchData& out, const std::string& comm, rt::Collective c, int n,
                   const std::vector<rt::BenchRow>& rows) {
  static const cost::Collective map[] = {cost::Collective::all_reduce, cost::Collective::all_gather,
                                         cost::Collective::reduce_scatter, cost::Collective::broadcast,
                                         cost::Collective::send_recv};
  for (const rt::BenchRow& r : rows)
    out.collectives.push_back({comm, map[static_cast<int>(c)], n, static_cast<double>(r.bytes),
                               static_cast<std::int64_t>(r.count), r.time_us * 1e-6});
}

const std::vector<rt::Collective> kColls = {rt::Collective::all_reduce, rt::Collective::all_gather,
                                            rt::Collective::reduce_scatter, rt::Collective::send_recv};

void bench_thread_colls(calib::BenchData& out, const std::vector<std::int64_t>& groups) {
  for (std::int64_t n : groups)
    for (rt::Collective c : kColls) {
      std::vector<rt::BenchRow> rows;
      rt::run_threads(static_cast<int>(n), [&](rt::Comm& comm) {
        auto r = rt::bench_collective(comm, c, coll_counts(), 2, 10);
        if (comm.rank() == 0) rows = r;
      });
      add_coll_rows(out, "thread", c, static_cast<int>(n), rows);
    }
}

void print_tables(const calib::BenchData& b) {
  char line[256];
  if (!b.gemm.empty()) {
    std::printf("# GEMM (fp32, %s)\n#%7s %7s %7s %6s %12s %10s\n", b.gemm_backend.c_str(), "m", "n", "k", "batch", "time (us)", "GFLOP/s");
    for (const auto& r : b.gemm) {
      std::snprintf(line, sizeof line, "%8lld %7lld %7lld %6lld %12.2f %10.2f", static_cast<long long>(r.m),
                    static_cast<long long>(r.n), static_cast<long long>(r.k), static_cast<long long>(r.batch),
                    r.time_s * 1e6, 2.0 * r.m * r.n * r.k * r.batch / r.time_s / 1e9);
      std::printf("%s\n", line);
    }
  }
  if (!b.membw.empty()) {
    std::printf("\n# memory bandwidth\n#%7s %12s %12s %10s\n", "kernel", "size (B)", "time (us)", "GB/s");
    for (const auto& r : b.membw)
      std::printf("%8s %12.0f %12.2f %10.2f\n", r.kernel.c_str(), r.bytes, r.time_s * 1e6, r.bytes / r.time_s / 1e9);
  }
  // nccl-tests' columns (NVIDIA/nccl-tests src/common.cu): size, count, type, redop, time, algbw, busbw.
  std::string last;
  for (const auto& r : b.collectives) {
    const std::string head = std::string(cost::to_string(r.collective)) + " " + r.comm + " " + std::to_string(r.ranks);
    if (head != last) {
      std::printf("\n# %s, %d ranks (%s communicator)\n#%11s %12s %6s %8s %10s %8s %8s\n#%11s %12s %6s %8s %10s %8s %8s\n",
                  cost::to_string(r.collective), r.ranks, r.comm.c_str(), "size", "count", "type", "redop", "time",
                  "algbw", "busbw", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)");
      last = head;
    }
    const bool sum = r.collective == cost::Collective::all_reduce || r.collective == cost::Collective::reduce_scatter;
    const double algbw = r.bytes / r.time_s / 1e9;
    std::printf("%12.0f %12lld %6s %8s %10.2f %8.3f %8.3f\n", r.bytes, static_cast<long long>(r.count), "float",
                sum ? "sum" : "none", r.time_s * 1e6, algbw, algbw * cost::bus_factor(r.collective, r.ranks));
  }
}

}  // namespace

int bench(const Args& args) {
  cli::CommandLine cl("bench", args,
                      {{"--backend", true, "cpu (cuda: not in this build) [cpu]"},
                       {"--what", true, "comma list of gemm, membw, collectives [all three]"},
                       {"--ranks", true, "comma list of collective group sizes on the thread communicator [2]"},
                       {"--concurrent", true, "threads computing at once for gemm/membw (per-rank rate under that load) [1]"},
                       {"--json", false, "print the bench document `tessel calibrate --bench` reads"}},
                      0);
  if (cl.help_requested()) {
    std::cout << cl.usage();
    return 0;
  }
  const std::string backend = cl.get_or("--backend", "cpu");
  if (backend == "cuda" || backend == "nccl")
    throw InputError("--backend " + backend + ": not available in this build (no CUDA runtime compiled in, or no GPU); use --backend cpu");
  if (backend != "cpu") throw InputError("--backend " + backend + ": expected cpu (or cuda where built)");
  std::vector<std::string> what = cl.has("--what") ? cl.get_list("--what") : std::vector<std::string>{"gemm", "membw", "collectives"};
  for (const auto& w : what)
    if (w != "gemm" && w != "membw" && w != "collectives")
      throw InputError("--what " + w + ": expected a comma list of gemm, membw, collectives");
  const auto has = [&](const char* w) { return std::find(what.begin(), what.end(), w) != what.end(); };
  const int concurrent = static_cast<int>(cl.get_int("--concurrent", 1, 256).value_or(1));
  const std::vector<std::int64_t> groups = cl.has("--ranks") ? cl.get_int_list("--ranks", 2, 256) : std::vector<std::int64_t>{2};

  calib::BenchData b;
  b.gemm_backend = kc::gemm_backend();
  b.concurrent = concurrent;
#ifdef TESSEL_HAVE_MPI
  if (rt::launched_by_mpirun()) {
    // Under mpirun: the collectives over MPI_COMM_WORLD only; rank 0 prints.
    rt::run_mpi([&](rt::Comm& comm) {
      for (rt::Collective c : kColls) {
        auto rows = rt::bench_collective(comm, c, coll_counts(), 2, 10);
        if (comm.rank() == 0) add_coll_rows(b, "mpi", c, comm.size(), rows);
      }
      if (comm.rank() != 0) b.collectives.clear();
    });
    if (b.collectives.empty()) return 0;
    if (cl.flag("--json")) std::cout << calib::bench_to_json(b).dump(1) << "\n";
    else print_tables(b);
    return 0;
  }
#endif
  if (has("gemm")) bench_gemm(b, concurrent);
  if (has("membw")) bench_membw(b, concurrent);
  if (has("collectives")) bench_thread_colls(b, groups);
  if (cl.flag("--json")) {
    std::cout << calib::bench_to_json(b).dump(1) << "\n";
  } else {
    print_tables(b);
  }
  return 0;
}

}  // namespace tessel::cmd
