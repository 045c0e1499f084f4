// The fake CUDA runtime (include/cuda_runtime_api.h) on host memory: every stream operation runs when it is
// called, so stream order, events and synchronisation are trivially satisfied; events read the host clock.
// New allocations are filled with 0xFF bytes (NaN as float and bf16), so a read of memory nobody wrote shows.
//
// Because the work runs at once, a missing wait between two streams changes nothing here, yet on a GPU it
// lets a kernel read what a copy on the other stream has not written yet. So the fake also checks stream
// ORDER, with the runtime's own rule (runtime/cuda/device.hpp: compute and communication streams fence each
// other around every communication op): each operation issued on a stream must be ordered, through events
// the stream waited for or host synchronisations, after every operation issued before it on the other
// streams the same thread created. Vector clocks: a stream's clock is what it is ordered after; an event
// takes its stream's clock when recorded; a wait merges it in; a host synchronisation merges it into the
// thread's clock, which every later operation of that thread inherits. A violation throws
// std::logic_error naming both operations (a test then fails with that message).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "cuda_runtime_api.h"

using Clock = std::map<std::uint64_t, std::uint64_t>;  // stream id -> operations of it this is ordered after

namespace {
std::uint64_t next_stream_id = 1;  // ids, not addresses: a new stream may reuse a destroyed one's address
}  // namespace

struct CUstream_st {
  std::uint64_t id = 0;
  std::thread::id owner = std::this_thread::get_id();
  std::uint64_t issued = 0;
  std::string last;  // the latest operation's name
  Clock known;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point t{};
  Clock clock;
};

namespace {
std::mutex mu;
std::set<void*> live;
std::mutex order_mu;
std::set<CUstream_st*> streams;
thread_local Clock host_clock;  // what this thread has synchronised with

void merge(Clock& into, const Clock& from) {
  for (const auto& [k, v] : from) into[k] = std::max(into[k], v);
}
}  // namespace

void fake_stream_op(cudaStream_t s, const char* what) {
  if (!s) return;  // the legacy stream: not used by the runtime (its copies are ordered on its streams)
  std::lock_guard<std::mutex> l(order_mu);
  merge(s->known, host_clock);
  for (CUstream_st* t : streams) {
    if (t == s || t->owner != s->owner) continue;
    const auto it = s->known.find(t->id);
    const std::uint64_t seen = it == s->known.end() ? 0 : it->second;
    if (seen < t->issued)
      throw std::logic_error(std::string("fake CUDA stream order: '") + what + "' is not ordered after '" + t->last +
                             "' on another stream of this thread (" + std::to_string(t->issued - seen) +
                             " operation(s) there unfenced: a missing event wait)");
  }
  s->known[s->id] = ++s->issued;
  s->last = what;
}

const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : e == cudaErrorMemoryAllocation ? "out of memory (fake)" : "invalid value (fake)";
}
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaDeviceSynchronize() {
  std::lock_guard<std::mutex> l(order_mu);
  for (CUstream_st* t : streams)
    if (t->owner == std::this_thread::get_id()) merge(host_clock, t->known);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = new CUstream_st;
  std::lock_guard<std::mutex> l(order_mu);
  (*s)->id = next_stream_id++;
  streams.insert(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  {
    std::lock_guard<std::mutex> l(order_mu);
    streams.erase(s);
  }
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!s) return cudaSuccess;
  std::lock_guard<std::mutex> l(order_mu);
  merge(host_clock, s->known);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!s || !e) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> l(order_mu);
  merge(s->known, e->clock);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return cudaErrorInvalidValue;
  e->t = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> l(order_mu);
  e->clock = s ? s->known : Clock{};
  if (s) merge(e->clock, host_clock);  // recorded after what this thread has already waited for
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> l(order_mu);
  merge(host_clock, e->clock);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end) return cudaErrorInvalidValue;
  *ms = std::chrono::duration<float, std::milli>(end->t - start->t).count();
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  *p = std::malloc(bytes ? bytes : 1);
  if (!*p) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xFF, bytes);
  std::lock_guard<std::mutex> l(mu);
  live.insert(*p);
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard<std::mutex> l(mu);
    if (!live.erase(p)) return cudaErrorInvalidValue;  // not ours, or freed twice
  }
  std::free(p);
  return cudaSuccess;
}
// Stream-ordered allocation is not checked: the driver's pool never hands a block to another stream before
// its free on the first stream has run.
cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  fake_stream_op(s, kind == cudaMemcpyHostToDevice   ? "cudaMemcpyAsync host to device"
                    : kind == cudaMemcpyDeviceToHost ? "cudaMemcpyAsync device to host"
                                                     : "cudaMemcpyAsync");
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t s) {
  fake_stream_op(s, "cudaMemsetAsync");
  std::memset(p, value, bytes);
  return cudaSuccess;
}
