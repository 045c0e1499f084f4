// Fake NCCL (tests/cuda_fake): the names runtime/cuda/nccl_comm.cpp uses.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstddef>

#include "cuda_runtime_api.h"

using ncclResult_t = int;
constexpr ncclResult_t ncclSuccess = 0;
constexpr ncclResult_t ncclInvalidUsage = 5;
struct ncclComm;
using ncclComm_t = ncclComm*;
struct ncclUniqueId {
  char internal[128];
};
enum ncclDataType_t { ncclFloat = 7 };
enum ncclRedOp_t { ncclSum = 0, ncclMax = 2 };
constexpr int NCCL_SPLIT_NOCOLOR = -1;

inline const char* ncclGetErrorString(ncclResult_t r) {
  return r == 2 ? "fake NCCL: a wait timed out or the ranks disagreed (see stderr)" : "fake NCCL: invalid usage";
}
// A fresh id each call (the bootstrap's rendezvous is tested across processes on the fake): bytes from the
// process id, a counter and the clock, none of them zero.
inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static unsigned long long calls = 0;
  unsigned long long z = 0x9e3779b97f4a7c15ull * (++calls) ^ (static_cast<unsigned long long>(getpid()) << 32) ^
                         static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count());
  for (char& c : id->internal) {
    z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull + 1;
    c = static_cast<char>((z >> 56) | 1);
  }
  return ncclSuccess;
}
// The rest: an in-process NCCL over threads (fake_nccl.cpp), one rank per thread, with NCCL's blocking
// semantics: a collective returns once every rank of the communicator has issued it, a send once its
// receive has been issued (ncclSend/ncclRecv block the GPU stream; the fake's streams run at issue, so the
// host waits instead, and a schedule that would hang on GPUs hangs here). Every wait gives up after
// TESSEL_FAKE_NCCL_TIMEOUT_S seconds (default 60) with ncclSystemError and a line on stderr naming the call,
// the ranks and what it waited for. Ranks in other processes never join (ncclCommInitRank times out).
constexpr ncclResult_t ncclSystemError = 2;
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank);
ncclResult_t ncclCommCount(ncclComm_t comm, int* count);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, void* config);
ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* send, void* recv, std::size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* send, void* recv, std::size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclSend(const void* send, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recv, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream);
// Grouped point-to-point (an all-to-all's sends and receives): between ncclGroupStart and ncclGroupEnd on a
// thread, sends are posted without waiting and receives are deferred; ncclGroupEnd completes the receives,
// then waits for every send to be taken, so a group's sends and receives cannot wait on each other.
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
