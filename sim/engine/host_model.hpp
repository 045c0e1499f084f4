// The host model: the ranks of a CPU runtime (threads of one process, or processes under mpirun) share the
// host's cores, so how fast a rank computes depends on which others compute at the same moment, and where.
//
// Per-core processor sharing. Linux keeps a run queue per core and gives the threads runnable on one core
// equal shares of it (CFS). Where a thread runs is decided when it is created (fork balancing: the idlest
// core) and, when it wakes, in favour of the core it last ran on; so ranks created in rank order settle
// round-robin on the cores and mostly stay there: rank r on core r mod C (home_core). A rank waiting on a
// receive or a collective sleeps and takes no share, as the thread and MPI communicators do. Measured on the
// closed loop's 2-core machine (docs/calibration.md, "The host model"): pinning the runtime's rank threads
// round-robin gave the step times Linux's own placement gives (pp4 1F1B 292-301 against 294-296 ms), pinning
// them in blocks (ranks 0 and 1 on core 0) 6% longer; and one pool of cores for all ranks (the model before)
// left pp4 1F1B 8% fast, its idle cores unseen.
// A thread on a core where `crowd` threads compute progresses at 1/crowd of it. A core's speed depends on how
// many cores are busy (they share caches and memory bandwidth): an op takes `alone` seconds on one busy core
// and `busy` seconds with all C busy, linearly between, the two measured per kind of work
// (sim/system.hpp HostSpec::contention, fitted by tessel calibrate from `tessel bench --concurrent`). So
//     rate = (1 / crowd) / (alone + (busy - alone) (busy_cores - 1) / (C - 1))     (fraction of the op per second)
// and every compute op is re-rated when any starts or ends (sim/engine/stream_model.cpp). A position of the
// engine stands for its tp ranks (TP folding): tp threads, each on its own rank's home core, and the position
// progresses at the rate of its most crowded one (its TP collectives keep them in step). The waits that follow
// are the engine's own: a pipeline stage slowed by its core's other rank delivers later and its consumer
// waits. Communication flows do not take a share (their time is the link model's).
#pragma once

#include <vector>

#include "sim/engine/job.hpp"
#include "sim/system.hpp"

namespace tessel::engine {

// Fraction of an op per second for a thread on a core where `crowd` threads compute while `busy_cores` of the
// `cores` cores compute (formula above); a very large finite rate for an op of no work (it ends at once
// without a 0 x infinity in the settling).
double host_rate(double alone_s, double busy_s, int crowd, int busy_cores, int cores);

// The core rank `rank` computes on: r mod C (above).
int home_core(int rank, int cores);

// `s` with every kind's time multiplied by its host contention: what each op costs while all cores are busy.
System busy_system(const System& s);

// Attaches the host model of `sys` to `job`, built on `sys`, from `busy`: the same job built on
// busy_system(sys) (the same schedule, so the same tasks in the same order). `threads_per_position`: the
// ranks one position stands for (tp); `first_rank[p]`: the global rank of position p's first (its tp ranks
// follow it), whose home cores the position's threads take.
void attach_host(Job& job, const Job& busy, const System& sys, int threads_per_position, const std::vector<int>& first_rank);

}  // namespace tessel::engine
