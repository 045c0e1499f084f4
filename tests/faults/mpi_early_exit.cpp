// Fault test for the MPI communicator: rank 1 leaves a 4-rank job early while the others wait in a
// collective. `--mode die`: its process ends without MPI_Finalize (a crash, an OOM kill); `--mode return`:
// its work returns without taking part (a clean but early exit). Either way the job must end — not hang —
// within the communicator's timeout (5 s here) with a non-zero status; mpi_early_exit.sh checks the
// message. The thread backend's equivalents are in tests/runtime/comm_thread_test.cpp.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/comm/mpi_comm.hpp"

using namespace tessel::rt;

int main(int argc, char** argv) {
  if (argc != 3 || std::strcmp(argv[1], "--mode") != 0) {
    std::fprintf(stderr, "usage: mpi_early_exit --mode die|return\n");
    return 2;
  }
  const std::string mode = argv[2];
  MpiCommOptions opts;
  opts.timeout = std::chrono::milliseconds(5000);
  run_mpi(
      [&](Comm& comm) {
        if (comm.rank() == 1) {
          if (mode == "die") std::_Exit(3);  // no MPI_Finalize, no destructors: as if killed
          return;                            // leaves without the all_reduce the others enter
        }
        float x = 1;
        comm.all_reduce(&x, 1);
      },
      opts);
  return 0;
}
