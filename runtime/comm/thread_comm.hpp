// In-process communicator: N ranks as threads of one process, exchanging data through shared memory.
//
// Semantics (shared with MpiComm, so the CPU runtime gives the same bits on either backend):
// - Reductions add in rank order: out[i] = ((in_0[i] op in_1[i]) op in_2[i]) ..., whatever the thread timing,
//   so results are bitwise reproducible for a seed.
// - send() is buffered: it copies the data and returns without waiting for the receiver, so any order of
//   sends and recvs that a schedule produces completes. Messages are matched by (peer, tag), FIFO per pair.
// - Every blocking wait gives up with CommError when a peer failed (its function threw), exited while others
//   still wait for it, or did not arrive within the timeout. A collective whose members called different
//   operations (or counts) fails with CommError naming both calls instead of corrupting memory.
#pragma once

#include <chrono>
#include <functional>

#include "runtime/comm/comm.hpp"

namespace tessel::rt {

struct ThreadCommOptions {
  // Longest wait for peers inside one operation. A deadlocked schedule becomes a CommError after this; a
  // failed or exited peer is reported at once, without waiting for the timeout.
  std::chrono::milliseconds timeout{60'000};
};

// Runs fn(comm) on `world` threads, one per rank, each with a world communicator (rank 0..world-1), and
// waits for all of them. If a rank throws, the others stop at their next communication with CommError
// ("rank R failed: ..."); after every thread has stopped, run_threads rethrows the first exception (the
// original one, not the CommErrors it caused). world must be >= 1.
void run_threads(int world, const std::function<void(Comm&)>& fn, const ThreadCommOptions& opts = {});

}  // namespace tessel::rt
