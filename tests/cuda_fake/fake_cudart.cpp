// The fake CUDA runtime (include/cuda_runtime_api.h) on host memory: every stream operation runs when it is
// called; events read the host clock. New allocations are filled with 0xFF bytes (NaN as float and bf16),
// so a read of memory nobody wrote shows.
//
// Because the work runs at once, a missing wait between two streams would change nothing here, yet on a GPU
// it lets a kernel read what a copy on the other stream has not written yet. So the fake checks stream
// order, in two ways.
//
// Strict operations (kernels, GEMMs, memsets, device-to-host copies) are checked by ORDER: each operation
// issued on a stream must be ordered, through events the stream waited for or host synchronisations, after
// every strict operation issued before it on the other streams the same thread created. Vector clocks: a
// stream's clock is what it is ordered after; an event takes its stream's clock when recorded; a wait merges
// it in; a host synchronisation merges it into the thread's clock, which every later operation of that thread
// inherits. A violation throws std::logic_error naming both operations.
//
// Deferred operations (copies into device memory, and the fake NCCL's collectives and point-to-point calls:
// fake_deferred) are what a runtime overlaps with compute, so nothing has to be ordered after them; they are
// checked by DATA instead. Each computes its result when issued (reading its inputs then) but LANDS it only
// once something is ordered after it: another stream or the host that waited for it, or an operation of its
// own stream that touches its memory (or does not say what it touches: a kernel). Until then its output holds NaN bytes, so compute that reads it without waiting reads NaN,
// and its inputs and output are fingerprinted, so anything that writes them while it is in flight (a buffer
// released and reused too early, a result overwritten) throws when it lands, naming the operation. That is
// the hardware's worst case: a collective that runs late.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda_runtime_api.h"

using Clock = std::map<std::uint64_t, std::uint64_t>;  // stream id -> operations of it this is ordered after

namespace {
std::uint64_t next_stream_id = 1;  // ids, not addresses: a new stream may reuse a destroyed one's address
}  // namespace

struct CUstream_st {
  std::uint64_t id = 0;
  std::thread::id owner = std::this_thread::get_id();
  std::uint64_t issued = 0;  // operations, strict and deferred
  std::uint64_t strict = 0;  // the number of the latest strict one
  std::string last;          // its name
  Clock known;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point t{};
  Clock clock;
};

namespace {
std::mutex mu;
std::map<void*, std::size_t> live;
std::mutex order_mu;
std::set<CUstream_st*> streams;
thread_local Clock host_clock;  // what this thread has synchronised with

void merge(Clock& into, const Clock& from) {
  for (const auto& [k, v] : from) into[k] = std::max(into[k], v);
}

std::uint64_t fingerprint(const void* p, std::size_t bytes) {  // FNV-1a
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

struct Region {
  const void* p;
  std::size_t bytes;
  std::uint64_t hash;
};
struct Pending {  // a deferred operation's result, not landed yet
  std::uint64_t stream, seq;
  std::thread::id owner;
  std::string what;
  void* out;
  std::vector<unsigned char> result;
  std::vector<Region> regions;  // its inputs and its (NaN-filled) output, fingerprinted at issue
};
std::vector<Pending> pending;  // under order_mu, in issue order
thread_local std::size_t overlapped = 0;  // this thread's operations issued beside one in flight elsewhere

// A check that fails throws std::logic_error, so the test case running it fails with the message. Found
// while an exception is already unwinding (a destructor synchronising or freeing), a throw would end the
// process mid-run; then the message is printed and the process exits 1 when it ends.
void fail(const std::string& msg) {
  if (std::uncaught_exceptions() == 0) throw std::logic_error(msg);
  std::fprintf(stderr, "%s (found while unwinding another error; the process will exit 1)\n", msg.c_str());
  static std::once_flag once;
  std::call_once(once, [] { std::atexit([] { std::_Exit(1); }); });
}

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

// Lands every pending result that `c` is ordered after (`by`: the operation or wait that orders it). A
// later operation of the pending one's own stream (`own`) is ordered after it on that stream only, not for
// the thread's other streams: when it says what memory it touches (`touches`), only pending results that
// share memory with it land (it reads or replaces them); the rest stay in flight for the other streams.
void land(const Clock& c, const char* by, std::uint64_t own = 0, const Touches* touches = nullptr) {
  for (auto it = pending.begin(); it != pending.end();) {
    const auto k = c.find(it->stream);
    bool now = k != c.end() && k->second >= it->seq;
    if (now && touches && it->stream == own) {
      now = false;
      for (const Region& r : it->regions)
        for (const auto& [p, n] : *touches) now = now || overlaps(r.p, r.bytes, p, n);
    }
    if (!now) {
      ++it;
      continue;
    }
    std::string broken;
    for (const Region& r : it->regions)
      if (broken.empty() && fingerprint(r.p, r.bytes) != r.hash)
        broken = "fake CUDA: '" + it->what + "' was still in flight when its " + (r.p == it->out ? "output" : "input") +
                 " was written (found when '" + by + "' waited for it): a buffer released or reused, or a result "
                 "overwritten, before the stream that touched it waited for the operation";
    if (broken.empty() && !it->result.empty()) std::memcpy(it->out, it->result.data(), it->result.size());
    it = pending.erase(it);  // a broken one is reported once
    if (!broken.empty()) fail(broken);
  }
}
}  // namespace

void fake_stream_op(cudaStream_t s, const char* what) { fake_stream_op(s, what, nullptr, true); }
void fake_stream_op(cudaStream_t s, const char* what, Touches touches) { fake_stream_op(s, what, &touches, false); }

void fake_stream_op(cudaStream_t s, const char* what, const Touches* touches, bool strict) {
  if (!s) return;  // the legacy stream: not used by the runtime (its copies are ordered on its streams)
  std::lock_guard<std::mutex> l(order_mu);
  merge(s->known, host_clock);
  for (CUstream_st* t : streams) {
    if (t == s || t->owner != s->owner) continue;
    const auto it = s->known.find(t->id);
    const std::uint64_t seen = it == s->known.end() ? 0 : it->second;
    if (seen < t->strict)
      throw std::logic_error(std::string("fake CUDA stream order: '") + what + "' is not ordered after '" + t->last +
                             "' on another stream of this thread (" + std::to_string(t->strict - seen) +
                             " operation(s) there unfenced: a missing event wait)");
  }
  for (const Pending& p : pending)
    if (p.stream != s->id && p.owner == s->owner) {
      const auto k = s->known.find(p.stream);
      if (k == s->known.end() || k->second < p.seq) {
        ++overlapped;
        break;
      }
    }
  s->known[s->id] = ++s->issued;
  if (strict) {
    s->strict = s->issued;
    s->last = what;
  }
  land(s->known, what, s->id, touches);
}

std::size_t fake_overlapped_ops() { return overlapped; }

void fake_deferred(cudaStream_t s, const char* what, void* out, const void* result, std::size_t bytes,
                   std::initializer_list<std::pair<const void*, std::size_t>> inputs) {
  std::lock_guard<std::mutex> l(order_mu);
  if (!s) {  // the legacy stream: at once
    if (bytes) std::memmove(out, result, bytes);
    return;
  }
  Pending p{s->id, s->issued, s->owner, what, out, {}, {}};
  p.result.assign(static_cast<const unsigned char*>(result), static_cast<const unsigned char*>(result) + bytes);
  const auto* o = static_cast<const unsigned char*>(out);
  for (const auto& [in, n] : inputs) {
    const auto* i = static_cast<const unsigned char*>(in);
    if (n && !overlaps(i, n, o, bytes)) p.regions.push_back({in, n, fingerprint(in, n)});  // in place: the output's
  }
  if (bytes) {
    std::memset(out, 0xFF, bytes);
    p.regions.push_back({out, bytes, fingerprint(out, bytes)});
  }
  pending.push_back(std::move(p));
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
  land(host_clock, "cudaDeviceSynchronize");
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
    land(s->known, "cudaStreamDestroy");
    streams.erase(s);
  }
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!s) return cudaSuccess;
  std::lock_guard<std::mutex> l(order_mu);
  merge(host_clock, s->known);
  land(host_clock, "cudaStreamSynchronize");
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!s || !e) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> l(order_mu);
  merge(s->known, e->clock);
  land(s->known, "cudaStreamWaitEvent");
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
  land(host_clock, "cudaEventSynchronize");
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
  live[*p] = bytes;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  std::size_t bytes = 0;
  {
    std::lock_guard<std::mutex> l(mu);
    const auto it = live.find(p);
    if (it == live.end()) return cudaErrorInvalidValue;  // not ours, or freed twice
    bytes = it->second;
    live.erase(it);
  }
  {
    std::lock_guard<std::mutex> l(order_mu);
    for (const Pending& q : pending)
      for (const Region& r : q.regions) {
        if (overlaps(r.p, r.bytes, p, bytes)) {
          fail("fake CUDA: memory freed while '" + q.what + "' on it was still in flight");
          return cudaErrorInvalidValue;  // (unwinding: kept, so landing it later writes nothing freed)
        }
      }
  }
  std::free(p);
  return cudaSuccess;
}
// Stream-ordered allocation: the driver's pool never hands a block to another stream before its free on the
// first stream has run, so only the free's own stream matters: what it has queued lands first.
cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  if (s) {
    std::lock_guard<std::mutex> l(order_mu);
    land(s->known, "cudaFreeAsync");
  }
  return cudaFree(p);
}
// Synchronous for the host, but (as the legacy stream's copy and the non-blocking streams the runtime
// creates) not ordered after anything queued on a stream: a result still in flight there is not landed.
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
// A copy into device memory is deferred (it lands when something waits for it); one to the host runs at
// once (the host reads it only after synchronising).
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  const char* what = kind == cudaMemcpyHostToDevice   ? "cudaMemcpyAsync host to device"
                     : kind == cudaMemcpyDeviceToHost ? "cudaMemcpyAsync device to host"
                                                      : "cudaMemcpyAsync";
  const bool to_host = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost;
  const Touches touches{{src, bytes}, {dst, bytes}};
  fake_stream_op(s, what, &touches, /*strict=*/to_host);
  if (to_host) {
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
  }
  // The source is fingerprinted when it is device memory: writing it before the copy ran is the race.
  fake_deferred(s, what, dst, src, bytes, {{src, kind == cudaMemcpyDeviceToDevice ? bytes : 0}});
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t s) {
  fake_stream_op(s, "cudaMemsetAsync");
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}
