// Fake CUDA runtime API for tests/cuda_fake: the subset runtime/cuda uses, on host memory and synchronous
// streams (every call completes before it returns), so the CUDA runtime's orchestration code runs on the
// CPU. Not NVIDIA's header: only the names and enum members that code uses, with their meanings.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <utility>

using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
constexpr cudaError_t cudaErrorMemoryAllocation = 2;
constexpr cudaError_t cudaErrorInvalidValue = 1;

struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDisableTiming = 2;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaMalloc(void** p, std::size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void* p, cudaStream_t s);
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t s);
// The fake's stream-order check (fake_cudart.cpp): every fake kernel launch and async copy calls it. A
// strict operation (a kernel: the first form) is checked by order; a deferred one (the second form, then
// fake_deferred) by data. An operation that names the memory it touches lands only the pending results of
// its stream it shares memory with; without the list, all of them.
using Touches = std::initializer_list<std::pair<const void*, std::size_t>>;
void fake_stream_op(cudaStream_t s, const char* what);
void fake_stream_op(cudaStream_t s, const char* what, Touches touches);
void fake_stream_op(cudaStream_t s, const char* what, const Touches* touches, bool strict);
// After fake_stream_op for the same operation: its result (`bytes` at `result`, copied now) lands in `out`
// only once something is ordered after it; until then `out` holds NaN bytes, and the inputs and `out` must
// not be written (fake_cudart.cpp).
void fake_deferred(cudaStream_t s, const char* what, void* out, const void* result, std::size_t bytes,
                   std::initializer_list<std::pair<const void*, std::size_t>> inputs);
// Operations this thread has issued while a deferred one of another of its streams was in flight (not
// ordered before them): the work a GPU could overlap with that communication.
std::size_t fake_overlapped_ops();
template <class T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
