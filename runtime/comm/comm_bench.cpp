#include "runtime/comm/comm_bench.hpp"

#include <chrono>

#include "util/error.hpp"

namespace tessel::rt {

namespace {
const char* const kNames[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"};

void run_once(Comm& comm, Collective c, std::vector<float>& a, std::vector<float>& b, std::size_t count) {
  int n = comm.size(), r = comm.rank();
  switch (c) {
    case Collective::all_reduce: comm.all_reduce(a.data(), count); break;
    case Collective::all_gather: comm.all_gather(a.data(), b.data(), count); break;
    case Collective::reduce_scatter: comm.reduce_scatter(a.data(), b.data(), count); break;
    case Collective::broadcast: comm.broadcast(a.data(), count, 0); break;
    case Collective::send_recv:
      // Even ranks send to the next odd rank, which receives: one unidirectional transfer per pair.
      if (r % 2 == 0 && r + 1 < n) comm.send(a.data(), count, r + 1, 0);
      if (r % 2 == 1) comm.recv(b.data(), count, r - 1, 0);
      break;
  }
}
}  // namespace

std::string collective_name(Collective c) { return kNames[static_cast<int>(c)]; }

Collective parse_collective(const std::string& name) {
  for (int i = 0; i < 5; ++i)
    if (name == kNames[i]) return static_cast<Collective>(i);
  throw InputError("collective '" + name + "': expected all_reduce, all_gather, reduce_scatter, broadcast or send_recv");
}

double busbw_factor(Collective c, int n) {
  switch (c) {
    case Collective::all_reduce: return 2.0 * (n - 1) / n;
    case Collective::all_gather:
    case Collective::reduce_scatter: return static_cast<double>(n - 1) / n;
    default: return 1.0;
  }
}

std::vector<BenchRow> bench_collective(Comm& comm, Collective c, const std::vector<std::size_t>& counts,
                                       int warmup, int iters) {
  const int n = comm.size();
  if (iters < 1 || warmup < 0) throw InputError("bench: iters must be >= 1 and warmup >= 0");
  if (c == Collective::send_recv && n < 2) throw InputError("bench send_recv: needs at least 2 ranks");
  std::vector<BenchRow> rows;
  for (std::size_t count : counts) {
    bool gathered = c == Collective::all_gather || c == Collective::reduce_scatter;
    std::size_t big = gathered ? count * n : count;
    std::vector<float> a(big, 1.0f), b(big, 0.0f);
    for (int i = 0; i < warmup; ++i) run_once(comm, c, a, b, count);
    comm.barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) run_once(comm, c, a, b, count);
    // No closing barrier: like nccl-tests, each rank times its own calls; the mean over ranks follows.
    float t = std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    comm.all_reduce(&t, 1);
    BenchRow row;
    row.count = count;
    row.bytes = big * sizeof(float);
    row.time_us = t / n;
    row.algbw_GBps = row.time_us > 0 ? row.bytes / (row.time_us * 1e-6) / 1e9 : 0.0;
    row.busbw_GBps = row.algbw_GBps * busbw_factor(c, n);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace tessel::rt
