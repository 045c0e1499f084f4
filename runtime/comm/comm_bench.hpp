// Collective microbenchmark over any Comm, reporting what nccl-tests reports, so `tessel bench` rows can be
// read beside nccl-tests output and fed to calibration.
//
// Definitions (NVIDIA/nccl-tests doc/PERFORMANCE.md; ../shared/reference/formulas.md "Collective bandwidth"):
//   S = bytes of the operation: all_reduce count*4; all_gather and reduce_scatter count*4*n (count is the
//   per-rank block); broadcast and send_recv count*4.
//   algbw = S / t (GB/s, GB = 1e9); busbw = algbw * factor, factor = 2(n-1)/n for all_reduce, (n-1)/n for
//   all_gather and reduce_scatter, 1 for broadcast and send_recv.
//   t = mean time of one operation over `iters` timed calls after `warmup` untimed ones, averaged over
//   ranks (nccl-tests reports the average operation time).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "runtime/comm/comm.hpp"

namespace tessel::rt {

enum class Collective { all_reduce, all_gather, reduce_scatter, broadcast, send_recv };

// "all_reduce", ... ; parse_collective throws InputError naming the accepted names.
std::string collective_name(Collective c);
Collective parse_collective(const std::string& name);

struct BenchRow {
  std::size_t bytes = 0;   // S above
  std::size_t count = 0;   // fp32 elements per rank block, as the Comm call takes it
  double time_us = 0;
  double algbw_GBps = 0;
  double busbw_GBps = 0;
};

// busbw / algbw for `c` on n ranks (the factor above).
double busbw_factor(Collective c, int n);

// Every rank of `comm` calls this with the same arguments; all ranks return the same rows (rank-averaged
// times). send_recv pairs rank 2i with 2i+1 (an odd last rank idles) and needs size() >= 2.
std::vector<BenchRow> bench_collective(Comm& comm, Collective c, const std::vector<std::size_t>& counts,
                                       int warmup = 2, int iters = 10);

}  // namespace tessel::rt
