// MPI communicator (one process per rank, `mpirun -np N tessel run ...`): the same semantics as the thread
// backend (thread_comm.hpp), including the rank-order reduction, so both give the same bits.
//
// Built only when Meson finds MPI; the macro TESSEL_HAVE_MPI (carried by runtime_dep) says so.
// Every wait polls a non-blocking MPI request against a timeout, so a lost peer is a CommError, not a hang.
// A rank whose work throws ends the whole job through run_mpi (MPI_Abort after printing the rank and the
// error): MPI cannot interrupt peers blocked in it any other way.
#pragma once

#include <chrono>
#include <functional>

#include "runtime/comm/comm.hpp"

namespace tessel::rt {

struct MpiCommOptions {
  std::chrono::milliseconds timeout{60'000};  // longest wait inside one operation
};

// True when this process was started by mpirun/mpiexec (Open MPI, MPICH or PMI variables are set).
bool launched_by_mpirun();

// Initializes MPI (if not yet), runs fn with a communicator over MPI_COMM_WORLD, finalizes MPI.
// If fn throws on a job of more than one rank, prints "tessel: rank R of N failed: <what>" to stderr and
// calls MPI_Abort(MPI_COMM_WORLD, exit_code) with exit_code = 2 for tessel::InputError and 1 otherwise, which
// ends every rank. On a job of one rank the exception is rethrown after MPI_Finalize.
void run_mpi(const std::function<void(Comm&)>& fn, const MpiCommOptions& opts = {});

}  // namespace tessel::rt
