// What the host's scheduler gave the calling thread: its CPU time (the thread's CPU clock) and the time it
// was runnable but waited for a core (Linux's per-thread schedstat, /proc/thread-self/schedstat: run time,
// run-queue delay and time slices, in nanoseconds since the thread started).
//
// The CPU runtime's ranks share the host's cores; when they outnumber them, a rank's step holds three kinds of
// time: computing, waiting for a peer (asleep), and waiting for a core although it could run. The host model
// of the simulator (sim/engine/host_model.hpp) shares the cores fluidly among the runnable ranks; a real
// scheduler keeps a run queue per core and can leave a core idle while a woken rank waits on the other's
// queue. Summed over the ranks for each step (Trainer::step), these counters say how much of that happened.
#pragma once

#include <optional>

namespace tessel::rt {

struct ThreadSched {
  double cpu_s = 0;        // time on a CPU
  double run_delay_s = 0;  // time runnable, waiting on a run queue
};

// The calling thread's counters; nullopt where the kernel does not provide them (not Linux, schedstats off).
// The run-queue delay is as of the scheduler's last update of it (it grows only while the thread waits, and
// is brought up to date when the thread runs again), so the difference of two readings by a running thread is
// exact; the CPU time is the thread's CPU clock, exact when read.
std::optional<ThreadSched> thread_sched();

}  // namespace tessel::rt
