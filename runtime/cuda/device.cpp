#include "runtime/cuda/device.hpp"

#include <limits>
#include <stdexcept>

#include <cuda_runtime.h>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/nvtx.hpp"

namespace tessel::rt::cuda {

namespace kg = kernels::cuda;

namespace {
// Checks a CUDA call where the caller expects an exception (constructors, the step loop).
Status wrap(cudaError_t e, const char* expr, const char* file, int line) {
  return e == cudaSuccess ? Status{} : kg::detail::cuda_status(e, expr, file, line);
}
}  // namespace
#define RT_CUDA(expr) throw_if_failed(wrap((expr), #expr, __FILE__, __LINE__))

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw kg::DeviceError(std::string(what) + ": " + cudaGetErrorString(e));
}

// 512 B granules below 1 MiB (PyTorch's small-block rounding), 2 MiB above, so tensors of nearby sizes
// share blocks and fragmentation stays bounded.
std::size_t CachingAllocator::round(std::size_t bytes) {
  const std::size_t g = bytes < (std::size_t(1) << 20) ? 512 : (std::size_t(2) << 20);
  return std::max<std::size_t>(g, (bytes + g - 1) / g * g);
}

void* CachingAllocator::allocate(std::size_t bytes) {
  const std::size_t size = round(bytes);
  void* p = nullptr;
  // Best fit among cached blocks no more than twice the request (bounded waste).
  if (auto it = free_.lower_bound(size); it != free_.end() && it->first <= 2 * size) {
    p = it->second;
    live_[p] = it->first;
    in_use_ += it->first;
    free_.erase(it);
  } else {
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation && !free_.empty()) {  // give the cache back and try once more
      (void)cudaGetLastError();
      empty_cache();
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess)
      throw kg::DeviceError("device allocation of " + std::to_string(size) + " bytes failed (" +
                            cudaGetErrorString(e) + "); in use " + std::to_string(in_use_) + " bytes");
    live_[p] = size;
    in_use_ += size;
    reserved_ += size;
  }
  peak_ = std::max(peak_, in_use_);
  return p;
}

void CachingAllocator::release(void* p) {
  auto it = live_.find(p);
  if (it == live_.end()) return;  // not ours: nothing to give back (never happens through DeviceBlock)
  in_use_ -= it->second;
  free_.emplace(it->second, p);
  live_.erase(it);
}

void CachingAllocator::empty_cache() {
  for (auto& [s, q] : free_) cudaFree(q), reserved_ -= s;
  free_.clear();
}

CachingAllocator::~CachingAllocator() {
  for (auto& [s, p] : free_) cudaFree(p);
  for (auto& [p, s] : live_) cudaFree(p);
}

CudaDevice::CudaDevice(int device) : device_(device) {
  const int n = kg::device_count();
  if (n == 0) throw kg::DeviceError("no CUDA device is present");
  if (device >= n)
    throw kg::DeviceError("CUDA device " + std::to_string(device) + " requested, " + std::to_string(n) + " present");
  RT_CUDA(cudaSetDevice(device));
  RT_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  RT_CUDA(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
  RT_CUDA(cudaStreamCreateWithFlags(&dp_, cudaStreamNonBlocking));
  RT_CUDA(cudaEventCreate(&base_));
  RT_CUDA(cudaEventCreateWithFlags(&sync_, cudaEventDisableTiming));
  throw_if_failed(gemm_.init());
}

CudaDevice::~CudaDevice() {
  cudaDeviceSynchronize();
  abandon_in_flight();
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  if (sync_) cudaEventDestroy(sync_);
  if (base_) cudaEventDestroy(base_);
  if (dp_) cudaStreamDestroy(dp_);
  if (comm_) cudaStreamDestroy(comm_);
  if (compute_) cudaStreamDestroy(compute_);
}

cudaEvent_t CudaDevice::event() {
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    RT_CUDA(cudaEventCreate(&e));
    events_.push_back(e);
  }
  return events_[used_++];
}

void CudaDevice::start_step(Recorder& rec) {
  TESSEL_NVTX_FN();
  RT_CUDA(cudaDeviceSynchronize());
  used_ = 0;
  ops_.clear();
  scopes_.clear();
  RT_CUDA(cudaEventRecord(base_, compute_));
  RT_CUDA(cudaEventSynchronize(base_));
  anchor_us_ = rec.now_us();
}

std::size_t CudaDevice::begin_op(trace::Stream lane, const OpIdentity& id, std::string name, double flops,
                                 double bytes, std::int64_t flow) {
  Op op{lane, id, std::move(name), flops, bytes, flow, event(), nullptr};
  RT_CUDA(cudaEventRecord(op.begin, stream_of(lane)));
  ops_.push_back(std::move(op));
  return ops_.size() - 1;
}

void CudaDevice::end_op(std::size_t i) {
  Op& op = ops_.at(i);
  op.end = event();
  RT_CUDA(cudaEventRecord(op.end, stream_of(op.lane)));
}

void CudaDevice::collect(Recorder& rec) {
  TESSEL_NVTX_FN();
  if (!in_flight_.empty())
    throw std::logic_error("CudaDevice: " + std::to_string(in_flight_.size()) +
                           " communication op(s) still in flight at the end of the step (compute never waited for them)");
  RT_CUDA(cudaDeviceSynchronize());
  for (const Op& op : ops_) {
    float t0 = 0, t1 = 0;  // milliseconds since base_
    RT_CUDA(cudaEventElapsedTime(&t0, base_, op.begin));
    RT_CUDA(cudaEventElapsedTime(&t1, base_, op.end));
    rec.record(op.lane, op.id, op.name, anchor_us_ + 1e3 * t0, anchor_us_ + 1e3 * t1, op.flops, op.bytes, op.flow);
  }
  for (const Scope& sc : scopes_) {
    float ms = 0;
    RT_CUDA(cudaEventElapsedTime(&ms, sc.begin, sc.end));
    KernelTotal& k = totals_[sc.name];
    ++k.calls;
    k.ms += ms;
    k.flops += sc.flops;
    k.bytes += sc.bytes;
  }
  ops_.clear();
  scopes_.clear();
  used_ = 0;
}

std::size_t CudaDevice::scope_begin(const char* name, double flops, double bytes) {
  if (!profile_) return static_cast<std::size_t>(-1);
  Scope sc{name, event(), nullptr, flops, bytes};
  RT_CUDA(cudaEventRecord(sc.begin, compute_));
  scopes_.push_back(sc);
  return scopes_.size() - 1;
}

void CudaDevice::scope_end(std::size_t i) {
  if (i == static_cast<std::size_t>(-1)) return;
  Scope& sc = scopes_.at(i);
  sc.end = event();
  // A destructor: a failed record must not throw (the scope's time is then simply missing).
  if (cudaEventRecord(sc.end, compute_) != cudaSuccess) sc.end = sc.begin;
}

void CudaDevice::compute_waits_comm(Lane l) {
  RT_CUDA(cudaEventRecord(sync_, stream(l)));
  RT_CUDA(cudaStreamWaitEvent(compute_, sync_, 0));
  complete_through(l, std::numeric_limits<Ticket>::max());
}

void CudaDevice::comm_waits_compute(Lane l) {
  RT_CUDA(cudaEventRecord(sync_, compute_));
  RT_CUDA(cudaStreamWaitEvent(stream(l), sync_, 0));
}

void CudaDevice::compute_waits_all() {
  compute_waits_comm(Lane::comm);
  compute_waits_comm(Lane::dp);
}

CudaDevice::Ticket CudaDevice::comm_in_flight(std::vector<DBuf> keep, std::function<void()> done, Lane l) {
  cudaEvent_t e = nullptr;
  if (!spare_events_.empty()) {
    e = spare_events_.back();
    spare_events_.pop_back();
  } else {
    RT_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  RT_CUDA(cudaEventRecord(e, stream(l)));
  in_flight_.push_back({next_ticket_, l, e, std::move(keep), std::move(done)});
  return next_ticket_++;
}

void CudaDevice::compute_waits(Ticket t) {
  for (const InFlight& f : in_flight_)
    if (f.ticket == t) {
      RT_CUDA(cudaStreamWaitEvent(compute_, f.done_event, 0));
      complete_through(f.lane, t);
      return;
    }
}

void CudaDevice::abandon_in_flight() {
  if (in_flight_.empty()) return;
  cudaDeviceSynchronize();  // its buffers may go only once the comm stream is done with them
  for (InFlight& f : in_flight_) spare_events_.push_back(f.done_event);
  in_flight_.clear();
}

// Compute has waited for ticket t of lane l (and so for every earlier one of that lane): their follow-up
// work is queued after that wait, in issue order, and their buffers go back to the allocator, safe for
// later compute work.
void CudaDevice::complete_through(Lane l, Ticket t) {
  std::vector<InFlight> done;
  for (auto it = in_flight_.begin(); it != in_flight_.end();)
    if (it->lane == l && it->ticket <= t) {
      done.push_back(std::move(*it));
      it = in_flight_.erase(it);
    } else {
      ++it;
    }
  for (InFlight& f : done) spare_events_.push_back(f.done_event);  // before a follow-up can throw
  for (InFlight& f : done)
    if (f.done) f.done();
}

}  // namespace tessel::rt::cuda
