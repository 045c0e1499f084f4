// One GPU as the CUDA runtime uses it: a compute stream and two communication streams, the cuBLASLt GEMM
// handle, a caching allocator whose peak is reported, and CUDA events around every op, turned into trace
// events (traces/trace.hpp) when the step's work is done.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/status.hpp"
#include "runtime/recorder.hpp"

namespace tessel::rt::cuda {

using kernels::cuda::Status;
using kernels::cuda::throw_if_failed;

// Device memory by size class, never returned to the driver until the allocator dies: cudaMalloc/cudaFree
// synchronise the device, which a training step must not do per tensor (PyTorch's CUDA caching allocator
// is the model). Reuse is ordered on the compute stream: a freed block is safe to hand out again to work
// queued later on it. Communication on the other streams waits for the compute queued before it, and a
// block it still uses when compute goes on is held until compute has waited for it (comm_in_flight).
class CachingAllocator {
 public:
  CachingAllocator() = default;
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(std::size_t bytes);  // throws DeviceError naming the size when the device is full
  void release(void* p);
  // Returns the cached free blocks to the driver. cudaFree synchronises the device: not inside a step.
  void empty_cache();
  std::size_t in_use() const { return in_use_; }
  std::size_t peak() const { return peak_; }
  std::size_t reserved() const { return reserved_; }
  void reset_peak() { peak_ = in_use_; }
  static std::size_t round(std::size_t bytes);  // the block size a request of `bytes` takes

 private:
  std::multimap<std::size_t, void*> free_;
  std::map<void*, std::size_t> live_;
  std::size_t in_use_ = 0, peak_ = 0, reserved_ = 0;
};

// A block of device memory from the allocator, released when the last owner lets go.
class DeviceBlock {
 public:
  DeviceBlock(CachingAllocator& a, std::size_t bytes) : a_(&a), p_(a.allocate(bytes)), bytes_(bytes) {}
  ~DeviceBlock() { a_->release(p_); }
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  void* get() const { return p_; }
  std::size_t bytes() const { return bytes_; }

 private:
  CachingAllocator* a_;
  void* p_;
  std::size_t bytes_;
};
using DBuf = std::shared_ptr<DeviceBlock>;
inline float* f32(const DBuf& b) { return b ? static_cast<float*>(b->get()) : nullptr; }

// Throws kernels::cuda::DeviceError("what: CUDA's message") unless e is cudaSuccess: the runtime's CUDA
// calls outside CudaDevice (which checks its own with file and line).
void cuda_ok(cudaError_t e, const char* what);

class CudaDevice {
 public:
  // Selects `device` and creates the streams and the GEMM handle. Throws DeviceError when there is no GPU.
  explicit CudaDevice(int device);
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  cudaStream_t compute() const { return compute_; }
  // Two communication streams: `comm` for tensor and pipeline parallelism (and the tied and
  // sequence-parallel sums), `dp` for the data-parallel reductions and ZeRO gathers, so a reduction
  // overlapping the backward does not hold up a pipeline send queued after it (separate NCCL
  // communicators, as Megatron's process groups).
  enum class Lane { comm, dp };
  cudaStream_t comm() const { return comm_; }
  cudaStream_t dp() const { return dp_; }
  cudaStream_t stream(Lane l) const { return l == Lane::dp ? dp_ : comm_; }
  kernels::cuda::Gemm& gemm() { return gemm_; }
  CachingAllocator& memory() { return alloc_; }
  DBuf alloc(std::size_t bytes) { return std::make_shared<DeviceBlock>(alloc_, bytes); }
  DBuf alloc_f32(std::size_t n) { return alloc(n * sizeof(float)); }
  int device() const { return device_; }

  // Trace: begin_op/end_op put events on `lane`'s stream (compute; comm for tp/pp; dp); collect() waits
  // for the device and turns every pair into a Recorder event, in microseconds since `anchor_us`, the
  // host clock reading taken when the step's first event completed.
  void start_step(Recorder& rec);
  std::size_t begin_op(trace::Stream lane, const OpIdentity& id, std::string name, double flops, double bytes,
                       std::int64_t flow = -1);
  void end_op(std::size_t op);
  void collect(Recorder& rec);
  // Makes the compute stream wait for what is queued on a communication stream now (and the reverse). The
  // first also completes everything in flight on it (below); compute_waits_all, on both.
  void compute_waits_comm(Lane l = Lane::comm);
  void comm_waits_compute(Lane l = Lane::comm);
  void compute_waits_all();

  // Communication that compute does not wait for yet: the overlap of a data-parallel reduction with the
  // backward, of a ZeRO-3 gather with the layer before it, of a pipeline send with the next op.
  // comm_in_flight() marks what a lane's stream has queued now with an event and keeps `keep` alive: the
  // buffers that work reads or writes, which the allocator (ordered on the compute stream alone) must not
  // hand out again before compute has waited for it. compute_waits(t) makes compute wait for ticket t and
  // every earlier one of its lane (whose stream runs them in order), then runs their `done` in issue order
  // (work to queue on compute once the result is there, such as adding it to an accumulator) and lets
  // their buffers go. compute_waits_comm(lane) completes all of that lane's. Nothing may be in flight when
  // a step ends.
  using Ticket = std::uint64_t;
  Ticket comm_in_flight(std::vector<DBuf> keep, std::function<void()> done = {}, Lane l = Lane::comm);
  void compute_waits(Ticket t);
  std::size_t in_flight() const { return in_flight_.size(); }
  // After a failed step: waits for the device and drops what is in flight without its `done` work (which
  // may refer to an owner that is going away).
  void abandon_in_flight();

  // Kernel-level profile (`tessel run --backend cuda --profile-kernels`): named scopes of launches on the
  // compute stream (KernelScope), each timed by an event pair and summed per name by collect(). Off by
  // default: then a scope records nothing. A scope may say the work it does (FLOPs, and the bytes it must
  // move to and from device memory at least), so the profile can set its time against the roofline.
  struct KernelTotal {
    std::int64_t calls = 0;
    double ms = 0;
    double flops = 0, bytes = 0;  // summed over the calls
  };
  void set_kernel_profile(bool on) { profile_ = on; }
  bool kernel_profile() const { return profile_; }
  std::size_t scope_begin(const char* name, double flops = 0, double bytes = 0);  // npos when profiling is off
  void scope_end(std::size_t scope);
  const std::map<std::string, KernelTotal>& kernel_totals() const { return totals_; }
  void reset_kernel_totals() { totals_.clear(); }

 private:
  struct Op {
    trace::Stream lane;
    OpIdentity id;
    std::string name;
    double flops, bytes;
    std::int64_t flow;
    cudaEvent_t begin, end;
  };
  cudaEvent_t event();
  cudaStream_t stream_of(trace::Stream lane) const {
    return lane == trace::Stream::compute ? compute_ : lane == trace::Stream::dp ? dp_ : comm_;
  }

  int device_ = 0;
  cudaStream_t compute_ = nullptr, comm_ = nullptr, dp_ = nullptr;
  kernels::cuda::Gemm gemm_;
  CachingAllocator alloc_;
  std::vector<cudaEvent_t> events_;  // pool; events_[0..used_) are in use this step
  std::size_t used_ = 0;
  cudaEvent_t base_ = nullptr, sync_ = nullptr;
  double anchor_us_ = 0;
  std::vector<Op> ops_;
  struct Scope {
    const char* name;
    cudaEvent_t begin, end;
    double flops, bytes;
  };
  struct InFlight {
    Ticket ticket;
    Lane lane;
    cudaEvent_t done_event;
    std::vector<DBuf> keep;
    std::function<void()> done;
  };
  std::deque<InFlight> in_flight_;
  std::vector<cudaEvent_t> spare_events_;  // of completed in-flight work, for the next
  Ticket next_ticket_ = 0;
  void complete_through(Lane l, Ticket t);
  bool profile_ = false;
  std::vector<Scope> scopes_;
  std::map<std::string, KernelTotal> totals_;
};

// RAII kernel scope on the device's compute stream (see CudaDevice::set_kernel_profile); `name` must
// outlive the step (a string literal).
class KernelScope {
 public:
  KernelScope(CudaDevice& d, const char* name, double flops = 0, double bytes = 0)
      : d_(d), i_(d.scope_begin(name, flops, bytes)) {}
  ~KernelScope() { d_.scope_end(i_); }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  CudaDevice& d_;
  std::size_t i_;
};

}  // namespace tessel::rt::cuda
