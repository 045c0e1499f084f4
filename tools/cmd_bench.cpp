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
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <cstdio>
#include <iostream>
#include <thread>
#include <vector>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/optimizer.hpp"
#include "util/error.hpp"
#include "runtime/comm/comm_bench.hpp"
#include "runtime/comm/thread_comm.hpp"
#include "runtime/host_allocator.hpp"
#include "runtime/init.hpp"
#include "sim/calibrate/bench_data.hpp"
#include "sim/cost/compute.hpp"
#include "tools/cli.hpp"
#include "tools/commands.hpp"
#ifdef TESSEL_HAVE_MPI
#include "runtime/comm/mpi_comm.hpp"
#endif
#ifdef TESSEL_HAVE_CUDA
#include "tools/bench_cuda.hpp"
#endif

namespace tessel::cmd {

namespace {

namespace kc = tessel::kernels::cpu;
using Clock = std::chrono::steady_clock;

constexpr double kMinSampleS = 0.02;  // per shape: long enough to average timer noise (~1 us)
constexpr int kMinReps = 3;

// A row's time and its repeat variation: the median repetition and the interquartile range over it (the
// "spread" of the bench document, which calibrate reports as the fit's noise).
struct Timing {
  double time_s = 0, spread = 0;
};

template <class F>
Timing median_time(F&& f) {
  f();  // warm-up: page faults, BLAS buffers
  std::vector<double> t;
  const auto start = Clock::now();
  while (static_cast<int>(t.size()) < kMinReps || std::chrono::duration<double>(Clock::now() - start).count() < kMinSampleS) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (t.size() >= 1000) break;
  }
  std::sort(t.begin(), t.end());
  const double med = t[t.size() / 2];
  return {med, med > 0 ? (t[(3 * t.size()) / 4] - t[t.size() / 4]) / med : 0.0};
}

// Runs `make(thread)` -> kernel on `threads` threads that start each shape together; mean of medians (and of
// their spreads).
template <class Make>
Timing concurrent_time(int threads, Make&& make) {
  if (threads == 1) return median_time(make(0));
  std::vector<Timing> t(threads);
  std::barrier sync(threads);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i)
    pool.emplace_back([&, i] {
      auto f = make(i);
      sync.arrive_and_wait();
      t[i] = median_time(f);
    });
  for (auto& th : pool) th.join();
  Timing m;
  for (const Timing& v : t) {
    m.time_s += v.time_s / threads;
    m.spread += v.spread / threads;
  }
  return m;
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
  // The gradient classes of a linear layer of T tokens, in -> out features (the closed-loop GPT's T of 128,
  // 256, 512 and its 256/1024 widths): input gradient dX[T, in] = dY[T, out] W^T (runtime/gpt_layer.cpp
  // linear_dx) and weight gradient dW[in, out] = X^T dY (run_weight_grad). Their forward GEMMs are in the grid.
  for (std::int64_t t : {128, 256, 512})
    for (auto [in, out] : {std::pair<std::int64_t, std::int64_t>{256, 256}, {256, 1024}, {1024, 256}}) {
      s.push_back({t, in, out, 1, 0, calib::GemmClass::dgrad});
      s.push_back({in, out, t, 1, 0, calib::GemmClass::wgrad});
    }
  return s;
}

void bench_gemm(calib::BenchData& out, int threads) {
  kc::gemm_set_single_thread();
  for (calib::GemmRow r : gemm_shapes()) {
    // Row-major operands as the runtime passes them: dgrad's B is W[n, k] read transposed, wgrad's A is X[k, m].
    const bool ta = r.cls == calib::GemmClass::wgrad, tb = r.cls == calib::GemmClass::dgrad;
    const Timing tm = concurrent_time(threads, [&](int) {
      auto a = std::make_shared<std::vector<float>>(r.m * r.k * r.batch, 0.5f);
      auto b = std::make_shared<std::vector<float>>(r.k * r.n * r.batch, 0.25f);
      auto c = std::make_shared<std::vector<float>>(r.m * r.n * r.batch, 0.0f);
      return [=] {
        for (std::int64_t i = 0; i < r.batch; ++i)
          kc::gemm(ta, tb, static_cast<int>(r.m), static_cast<int>(r.n), static_cast<int>(r.k), 1.0f,
                   a->data() + i * r.m * r.k, static_cast<int>(ta ? r.m : r.k), b->data() + i * r.k * r.n,
                   static_cast<int>(tb ? r.k : r.n), 0.0f, c->data() + i * r.m * r.n, static_cast<int>(r.n));
      };
    });
    r.time_s = tm.time_s;
    r.spread = tm.spread;
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
      const Timing tm = concurrent_time(threads, [&](int) {
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
      r.time_s = tm.time_s;
      r.spread = tm.spread;
      out.membw.push_back(r);
    }
  }
}

// The runtime's own non-GEMM kernels (kernels/cpu) at the shapes of the closed-loop GPT (tools/closed_loop.cpp:
// hidden 256, ffn 1024, 8 heads of 32, seq 128, vocab 512; 1 or 2 sequences; tp 1 or 2 halves heads, ffn
// and vocab). Each row carries the bytes (and, for attention, the FLOPs) the cost model charges for that op,
// so `calibrate` fits the rate of the path the simulator puts it on:
//   norm:          2e x fwd, 3e x bwd                       (sim/workload.cpp, norm1/norm2)
//   GELU:          2e t f fwd, 3e t f bwd                   ("act", gate = 1)
//   cross-entropy: 3 ce fwd, 2 ce bwd, ce = 4 t V           (add_head)
//   embedding:     3e x fwd, 3e x + 4x bwd                  (add_embedding)
//   AdamW:         kAdamWBytesPerParam (30) bytes per parameter (sim/cost/compute.hpp)
//   attention:     attention_time(F/2, io) fwd, attention_time(2.5 F/2, 2 io) bwd, F = 4 b h s^2 d,
//                  io = e t 4 h_local                       (the flash path: the runtime's attention core is
//                  one fused scalar loop; its rate is attention_efficiency, see docs/calibration.md)
// with e = 4 (fp32), t tokens, x = t h. per_step: occurrences in the reference step, a held-out layout's
// rank of the closed loop (4 layers x 4 micro-batches of layer kernels over the 4 shapes, so 4 per shape and
// 8 for the two norms; head and embedding once per micro-batch, 1 per shape; AdamW once, 0.5 per size).
struct KernelShape {
  int tokens, hidden, ffn, heads, head_dim, seq, vocab;
};

std::vector<KernelShape> kernel_shapes() {
  std::vector<KernelShape> v;
  for (int seqs : {1, 2})
    for (int tp : {1, 2}) v.push_back({128 * seqs, 256, 1024 / tp, 8 / tp, 32, 128, 512 / tp});
  return v;
}

using Buf = std::shared_ptr<std::vector<float>>;
Buf buf(std::size_t n, float x) { return std::make_shared<std::vector<float>>(n, x); }

// Inputs like the run's. A kernel's time can depend on its data: glibc's tanhf and expm1f branch on the sign
// and size of their argument, so the tanh GELU on a constant input (every branch predicted) ran 1.3-1.5x
// faster than on the closed-loop GPT's pre-activations, and the trace fit priced the difference as glue
// (docs/calibration.md, "Kernel inputs"). Each input is Gaussian noise (rt::init_normal, seeded per buffer,
// so every bench draws the same values) of the spread the closed-loop GPT has at initialisation: normalised
// activations 1, pre-activations and logits 0.02 sqrt(hidden) (0.32 at hidden 256: a unit-variance input
// through weights of std 0.02, Megatron's init), weights 0.02, gradients 0.01.
Buf noise(std::size_t n, double stddev, std::uint64_t seed) {
  auto v = std::make_shared<std::vector<float>>(n);
  const std::uint64_t key = rt::mix64(seed);
  for (std::size_t i = 0; i < n; ++i) (*v)[i] = rt::init_normal(key, static_cast<std::int64_t>(i), stddev);
  return v;
}
constexpr double kInitStd = 0.02, kGradStd = 0.01;
double preact_std(int hidden) { return kInitStd * std::sqrt(static_cast<double>(hidden)); }

void add_kernel(calib::BenchData& out, int threads, const char* name, const char* path, double bytes, double flops,
                double per_step, const std::function<std::function<void()>()>& make) {
  calib::KernelRow r{name, path, bytes, flops, per_step, 0};
  const Timing tm = concurrent_time(threads, [&](int) { return make(); });
  r.time_s = tm.time_s;
  r.spread = tm.spread;
  out.kernels.push_back(r);
}

void bench_norm_act(calib::BenchData& out, int threads, const KernelShape& s) {
  const double e = 4, x = static_cast<double>(s.tokens) * s.hidden, tf = static_cast<double>(s.tokens) * s.ffn;
  const int T = s.tokens, H = s.hidden;
  add_kernel(out, threads, "layernorm_fwd", "memory", 2 * e * x, 0, 8, [=] {
    Buf in = noise(T * H, 1.0, 1), g = buf(H, 1.0f), b = buf(H, 0.0f), y = buf(T * H, 0), m = buf(T, 0), r = buf(T, 0);
    return std::function<void()>([=] { kc::layernorm_fwd(in->data(), g->data(), b->data(), y->data(), m->data(), r->data(), T, H, 1e-5f); });
  });
  add_kernel(out, threads, "layernorm_bwd", "memory", 3 * e * x, 0, 8, [=] {
    Buf dy = noise(T * H, kGradStd, 2), in = noise(T * H, 1.0, 1), g = buf(H, 1.0f), m = buf(T, 0), r = buf(T, 1.0f),
        dx = buf(T * H, 0), dg = buf(H, 0), db = buf(H, 0);
    return std::function<void()>([=] {
      kc::layernorm_bwd(dy->data(), in->data(), g->data(), m->data(), r->data(), dx->data(), dg->data(), db->data(), T, H);
    });
  });
  const std::size_t n = static_cast<std::size_t>(T) * s.ffn;
  add_kernel(out, threads, "gelu_fwd", "memory", 2 * e * tf, 0, 4, [=] {
    Buf in = noise(n, preact_std(H), 3), y = buf(n, 0);
    return std::function<void()>([=] { kc::gelu_fwd(in->data(), y->data(), n); });
  });
  add_kernel(out, threads, "gelu_bwd", "memory", 3 * e * tf, 0, 4, [=] {
    Buf dy = noise(n, kGradStd, 4), in = noise(n, preact_std(H), 3), dx = buf(n, 0);
    return std::function<void()>([=] { kc::gelu_bwd(dy->data(), in->data(), dx->data(), n); });
  });
}

void bench_head_embed(calib::BenchData& out, int threads, const KernelShape& s) {
  const int T = s.tokens, V = s.vocab, H = s.hidden;
  const double ce = 4.0 * T * V, e = 4, x = static_cast<double>(T) * H;
  auto targets = std::make_shared<std::vector<std::int32_t>>(T);
  for (int i = 0; i < T; ++i) (*targets)[i] = (i * 7) % V;
  add_kernel(out, threads, "cross_entropy_fwd", "memory", 3 * ce, 0, 1, [=] {
    Buf z = noise(static_cast<std::size_t>(T) * V, preact_std(H), 5), loss = buf(T, 0), mx = buf(T, 0), sm = buf(T, 0);
    return std::function<void()>([=] {
      kc::cross_entropy_fwd(z->data(), T, V, 0, targets->data(), loss->data(), mx->data(), sm->data(), nullptr);
    });
  });
  add_kernel(out, threads, "cross_entropy_bwd", "memory", 2 * ce, 0, 1, [=] {
    Buf z = noise(static_cast<std::size_t>(T) * V, preact_std(H), 5), loss = buf(T, 0), mx = buf(T, 0), sm = buf(T, 0),
        dl = buf(T, 1.0f / T), dz = buf(static_cast<std::size_t>(T) * V, 0);
    kc::cross_entropy_fwd(z->data(), T, V, 0, targets->data(), loss->data(), mx->data(), sm->data(), nullptr);  // real max, sum
    return std::function<void()>([=] {
      kc::cross_entropy_bwd(z->data(), T, V, 0, targets->data(), mx->data(), sm->data(), dl->data(), dz->data());
    });
  });
  add_kernel(out, threads, "embedding_fwd", "memory", 3 * e * x, 0, 1, [=] {
    Buf table = noise(static_cast<std::size_t>(V) * H, kInitStd, 6), y = buf(T * H, 0);
    return std::function<void()>([=] { kc::embedding_fwd(table->data(), V, 0, H, targets->data(), T, y->data()); });
  });
  add_kernel(out, threads, "embedding_bwd", "memory", 3 * e * x + 4 * x, 0, 1, [=] {
    Buf dy = noise(T * H, kGradStd, 7), dt = buf(static_cast<std::size_t>(V) * H, 0);
    return std::function<void()>([=] { kc::embedding_bwd(dy->data(), V, 0, H, targets->data(), T, dt->data()); });
  });
}

void bench_attention(calib::BenchData& out, int threads, const KernelShape& s) {
  kc::AttentionShape a{s.tokens / s.seq, s.seq, s.heads, s.heads, s.head_dim};
  const int ld = s.heads * s.head_dim;
  const std::size_t tq = static_cast<std::size_t>(s.tokens) * ld, np = static_cast<std::size_t>(a.batch) * a.hq * a.seq * a.seq;
  const double full = 4.0 * a.batch * a.hq * static_cast<double>(a.seq) * a.seq * a.d;
  const double io = 4.0 * s.tokens * 4.0 * ld;
  add_kernel(out, threads, "attention_fwd", "attention", io, full / 2, 4, [=] {
    Buf q = noise(tq, preact_std(s.hidden), 8), k = noise(tq, preact_std(s.hidden), 9),
        v = noise(tq, preact_std(s.hidden), 10), o = buf(tq, 0), p = buf(np, 0);
    return std::function<void()>([=] {
      kc::attention_fwd(a, q->data(), ld, k->data(), ld, v->data(), ld, o->data(), ld, p->data());
    });
  });
  add_kernel(out, threads, "attention_bwd", "attention", 2 * io, 2.5 * full / 2, 4, [=] {
    Buf q = noise(tq, preact_std(s.hidden), 8), k = noise(tq, preact_std(s.hidden), 9),
        v = noise(tq, preact_std(s.hidden), 10), o = buf(tq, 0), p = buf(np, 0), d = noise(tq, kGradStd, 11),
        dq = buf(tq, 0), dk = buf(tq, 0), dv = buf(tq, 0);
    kc::attention_fwd(a, q->data(), ld, k->data(), ld, v->data(), ld, o->data(), ld, p->data());  // real probs
    return std::function<void()>([=] {
      kc::attention_bwd(a, q->data(), ld, k->data(), ld, v->data(), ld, p->data(), d->data(), ld, dq->data(), ld,
                        dk->data(), ld, dv->data(), ld);
    });
  });
}

void bench_adamw(calib::BenchData& out, int threads) {
  // The closed-loop GPT has ~3.3 M parameters: one rank (or dp without ZeRO) steps them all, 2 ranks of tp or
  // pp half, 4 ranks about a quarter. AdamW's rate depends on that size (its state leaves the caches), so the
  // sizes span them and calibrate fits a rate for each (gpu.kernels.optimizer.params); together one step.
  for (std::size_t n : {std::size_t{1} << 19, std::size_t{1} << 20, std::size_t{2} << 20, std::size_t{3} << 20}) {
    add_kernel(out, threads, "adamw", "memory", cost::kAdamWBytesPerParam * n, 0, 0.25, [=] {
      Buf p = noise(n, kInitStd, 12), g = noise(n, kGradStd, 13), m = buf(n, 0), v = buf(n, 0);
      auto step = std::make_shared<int>(0);
      return std::function<void()>([=] { kc::adamw_step(p->data(), g->data(), m->data(), v->data(), n, kc::AdamW{}, ++*step); });
    });
  }
}

// The kernel rows are timed in kKernelRounds passes over the whole set, and each row keeps the median of its
// passes' medians (and of their spreads). A row's samples span about 20 ms, so a neighbour on a shared VM
// that takes a core for that long slowed every sample of a row: one pass of the closed loop's two-thread
// bench (2026-12-05 12:19) timed the GELU and attention rows of one shape 1.27-1.98x their alone times where
// the passes before and after gave 0.99-1.05, and that pass's contention factors (activation 1.32, attention
// 1.12) moved every 2-rank prediction of the repeat 5-7% slow. Passes are seconds apart, so one disturbance
// reaches one of them; the median keeps what is there in most passes (a core's steady contention, the
// machine's usual background), where the fastest pass would keep only a quiet moment.
constexpr int kKernelRounds = 3;

void bench_kernels_once(calib::BenchData& out, int threads) {
  for (const KernelShape& s : kernel_shapes()) {
    bench_norm_act(out, threads, s);
    bench_head_embed(out, threads, s);
    bench_attention(out, threads, s);
  }
  bench_adamw(out, threads);
}

void bench_kernels(calib::BenchData& out, int threads) {
  std::vector<calib::BenchData> passes(kKernelRounds);
  for (calib::BenchData& p : passes) bench_kernels_once(p, threads);
  for (std::size_t i = 0; i < passes[0].kernels.size(); ++i) {
    calib::KernelRow r = passes[0].kernels[i];
    std::vector<double> times, spreads;
    for (const calib::BenchData& p : passes) {
      times.push_back(p.kernels[i].time_s);
      spreads.push_back(p.kernels[i].spread);
    }
    std::sort(times.begin(), times.end());
    std::sort(spreads.begin(), spreads.end());
    r.time_s = times[times.size() / 2];
    r.spread = spreads[spreads.size() / 2];
    out.kernels.push_back(r);
  }
}

// 1 KiB to 16 MiB per rank block: the sizes of TP activations and pipeline messages of the models the CPU
// runtime trains (up to 4 MiB), and of a data-parallel gradient all-reduce (the closed-loop GPT's 3.3 M
// parameters: 13 MB). Buffers past a few MiB leave the caches and follow a slower line, which calibrate fits
// as the link's second regime (calib::fit_link_regimes).
std::vector<std::size_t> coll_counts() { return {256, 1024, 4096, 16384, 65536, 262144, 1048576, 2097152, 4194304}; }

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
    std::printf("# GEMM (%s, %s)\n#%7s %7s %7s %6s %6s %12s %10s\n", b.precision.c_str(), b.gemm_backend.c_str(), "m", "n", "k",
                "batch", "class", "time (us)", "GFLOP/s");
    for (const auto& r : b.gemm) {
      std::snprintf(line, sizeof line, "%8lld %7lld %7lld %6lld %6s %12.2f %10.2f", static_cast<long long>(r.m),
                    static_cast<long long>(r.n), static_cast<long long>(r.k), static_cast<long long>(r.batch),
                    calib::to_string(r.cls), r.time_s * 1e6, 2.0 * r.m * r.n * r.k * r.batch / r.time_s / 1e9);
      std::printf("%s\n", line);
    }
  }
  if (!b.membw.empty()) {
    std::printf("\n# memory bandwidth\n#%7s %12s %12s %10s\n", "kernel", "size (B)", "time (us)", "GB/s");
    for (const auto& r : b.membw)
      std::printf("%8s %12.0f %12.2f %10.2f\n", r.kernel.c_str(), r.bytes, r.time_s * 1e6, r.bytes / r.time_s / 1e9);
  }
  if (!b.kernels.empty()) {
    std::printf("\n# runtime kernels (kernels/%s), bytes/FLOPs as the cost model charges them\n#%17s %10s %12s %12s %10s %10s\n",
                b.backend.c_str(), "kernel", "path", "bytes", "time (us)", "GB/s", "GFLOP/s");
    for (const auto& r : b.kernels)
      std::printf("%18s %10s %12.0f %12.2f %10.2f %10.2f\n", r.kernel.c_str(), r.path.c_str(), r.bytes, r.time_s * 1e6,
                  r.bytes / r.time_s / 1e9, r.flops / r.time_s / 1e9);
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

// --backend cuda: the GPU's rows (tools/bench_cuda.cpp) in a CUDA build, else refused.
void bench_gpu(const cli::CommandLine& cl, const std::vector<std::string>& what) {
#ifdef TESSEL_HAVE_CUDA
  const auto has = [&](const char* w) { return std::find(what.begin(), what.end(), w) != what.end(); };
  CudaBenchOptions o;
  o.gemm = has("gemm"), o.membw = has("membw"), o.kernels = has("kernels"), o.collectives = has("collectives");
  o.precision = cl.get_or("--precision", "bf16");
  if (o.precision != "bf16" && o.precision != "fp32")
    throw InputError("--precision " + o.precision + ": expected bf16 or fp32 (TF32 GEMMs)");
  o.attention_kernel = cl.get_or("--attention-kernel", "");
  o.quick = cl.flag("--quick");
  calib::BenchData b;
  bench_cuda(b, o);
  if (cl.flag("--json")) std::cout << calib::bench_to_json(b).dump(1) << "\n";
  else print_tables(b);
#else
  (void)cl, (void)what;
  throw InputError("--backend cuda: not available in this build (built without CUDA); use --backend cpu");
#endif
}

}  // namespace

int bench(const Args& args) {
  cli::CommandLine cl("bench", args,
                      {{"--backend", true, "cpu or cuda (CUDA builds) [cpu]"},
                       {"--what", true, "comma list of gemm, membw, kernels, collectives [all four]"},
                       {"--ranks", true, "cpu: comma list of collective group sizes on the thread communicator [2]"},
                       {"--concurrent", true, "cpu: threads computing at once for gemm/membw (per-rank rate under that load) [1]"},
                       {"--precision", true, "cuda: bf16 (bf16 GEMMs) or fp32 (TF32 GEMMs) [bf16]"},
                       {"--attention-kernel", true, "cuda: the attention variant the kernels rows time (fp32, tc, cudnn, ...) [the default]"},
                       {"--quick", false, "cuda: small shapes (checks the command; not for calibration)"},
                       {"--json", false, "print the bench document `tessel calibrate --bench` reads"}},
                      0);
  if (cl.print_help()) return 0;
  const std::string backend = cl.get_or("--backend", "cpu");
  if (backend != "cpu" && backend != "cuda") throw InputError("--backend " + backend + ": expected cpu or cuda");
  std::vector<std::string> what = cl.has("--what") ? cl.get_list("--what") : std::vector<std::string>{"gemm", "membw", "kernels", "collectives"};
  for (const auto& w : what)
    if (w != "gemm" && w != "membw" && w != "kernels" && w != "collectives")
      throw InputError("--what " + w + ": expected a comma list of gemm, membw, kernels, collectives");
  if (backend == "cuda") {
    for (const char* f : {"--ranks", "--concurrent"})
      if (cl.has(f)) throw InputError(std::string(f) + ": a --backend cpu flag (cuda's collectives run on every visible GPU)");
    bench_gpu(cl, what);
    return 0;
  }
  rt::keep_freed_memory();  // the heap the CPU runtime runs on (runtime/host_allocator.hpp)
  for (const char* f : {"--precision", "--attention-kernel", "--quick"})
    if (cl.has(f)) throw InputError(std::string(f) + ": a --backend cuda flag");
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
  if (has("kernels")) bench_kernels(b, concurrent);
  if (has("collectives")) bench_thread_colls(b, groups);
  if (cl.flag("--json")) {
    std::cout << calib::bench_to_json(b).dump(1) << "\n";
  } else {
    print_tables(b);
  }
  return 0;
}

}  // namespace tessel::cmd
