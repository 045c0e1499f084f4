// The host model: the ranks of a CPU runtime (threads of one process, or processes under mpirun) share the
// host's cores, so how fast a rank computes depends on how many others compute at the same moment.
//
// Fluid processor sharing (the model of Linux's CFS, which gives runnable threads equal shares of the
// cores; a rank waiting on a receive or a collective sleeps and takes no share, as the thread and MPI
// communicators do): with n threads computing on C cores, each progresses at min(1, C/n) of a core. A core's
// speed depends on how many cores are busy (they share caches and memory bandwidth): an op takes `alone`
// seconds on one busy core and `busy` seconds with all C busy, linearly between, the two measured per kind
// of work (sim/system.hpp HostSpec::contention, fitted by tessel calibrate from `tessel bench --concurrent`).
// So an op of n threads' rank progresses at
//     rate = min(1, C/n) / (alone + (busy - alone) (min(n, C) - 1) / (C - 1))     (fraction of the op per second)
// and every compute op is re-rated when any starts or ends (sim/engine/stream_model.cpp). A position of the
// engine stands for its tp ranks (TP folding), so it counts as tp threads. The waits that follow are the
// engine's own: a pipeline stage slowed by its neighbours' share delivers later and its consumer waits.
// Communication flows do not take a share (their time is the link model's).
#pragma once

#include "sim/engine/job.hpp"
#include "sim/system.hpp"

namespace tessel::engine {

// Fraction of an op per second for `threads` threads computing on `cores` cores (formula above); a very
// large finite rate for an op of no work (it ends at once without a 0 x infinity in the settling).
double host_rate(double alone_s, double busy_s, int threads, int cores);

// `s` with every kind's time multiplied by its host contention: what each op costs while all cores are busy.
System busy_system(const System& s);

// Attaches the host model of `sys` to `job`, built on `sys`, from `busy`: the same job built on
// busy_system(sys) (the same schedule, so the same tasks in the same order). `threads_per_position`: the
// ranks one position stands for (tp).
void attach_host(Job& job, const Job& busy, const System& sys, int threads_per_position);

}  // namespace tessel::engine
