// Fake NCCL (tests/cuda_fake): the names runtime/cuda/nccl_comm.cpp uses, every call but ncclGetUniqueId
// failing with ncclInvalidUsage, so the code links and a path that reaches NCCL on the fake says so
// (CommError).
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

inline const char* ncclGetErrorString(ncclResult_t) { return "fake NCCL: no communication on the fake CUDA runtime"; }
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
inline ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int) { return ncclInvalidUsage; }
inline ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclSuccess; }
inline ncclResult_t ncclCommUserRank(ncclComm_t, int*) { return ncclInvalidUsage; }
inline ncclResult_t ncclCommCount(ncclComm_t, int*) { return ncclInvalidUsage; }
inline ncclResult_t ncclCommSplit(ncclComm_t, int, int, ncclComm_t*, void*) { return ncclInvalidUsage; }
inline ncclResult_t ncclAllReduce(const void*, void*, std::size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
  return ncclInvalidUsage;
}
inline ncclResult_t ncclAllGather(const void*, void*, std::size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
  return ncclInvalidUsage;
}
inline ncclResult_t ncclReduceScatter(const void*, void*, std::size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                      cudaStream_t) {
  return ncclInvalidUsage;
}
inline ncclResult_t ncclBroadcast(const void*, void*, std::size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return ncclInvalidUsage;
}
inline ncclResult_t ncclSend(const void*, std::size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return ncclInvalidUsage;
}
inline ncclResult_t ncclRecv(void*, std::size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return ncclInvalidUsage;
}
