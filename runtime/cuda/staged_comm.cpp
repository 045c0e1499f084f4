#include "runtime/cuda/staged_comm.hpp"

#include <cuda_runtime.h>

#include <string>

namespace tessel::rt::cuda {

namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CommError(std::string("staged communicator: ") + what + ": " + cudaGetErrorString(e));
}

// A device buffer for one HostStagedComm call, stream-ordered (cudaFree would synchronise the whole device,
// which can wait forever on a communication kernel whose peers wait for this rank).
struct Scratch {
  float* p = nullptr;
  cudaStream_t s;
  Scratch(std::size_t n, cudaStream_t stream) : s(stream) {
    if (n) ok(cudaMallocAsync(reinterpret_cast<void**>(&p), n * sizeof(float), s), "cudaMallocAsync");
  }
  ~Scratch() {
    if (p) cudaFreeAsync(p, s);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

void to_device(float* d, const float* h, std::size_t n, cudaStream_t s) {
  if (!n) return;
  ok(cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, s), "host to device copy");
}
void to_host(float* h, const float* d, std::size_t n, cudaStream_t s) {
  if (n) ok(cudaMemcpyAsync(h, d, n * sizeof(float), cudaMemcpyDeviceToHost, s), "device to host copy");
  ok(cudaStreamSynchronize(s), "stream synchronise");
}

}  // namespace

// ---- DeviceStagedComm ----

DeviceStagedComm::~DeviceStagedComm() {
  if (!pending_.empty()) cudaStreamSynchronize(stream_);  // the queued copies still read pending_
}

void DeviceStagedComm::down(const float* dev, std::size_t n, std::vector<float>& h) {
  h.resize(n);
  to_host(h.data(), dev, n, stream_);  // after whatever the stream had queued: the data's producers
  pending_.clear();                    // the stream is synchronised: every queued copy has read its source
}

// Not synchronised: the result lands in stream order on the communicator's stream, as an NCCL collective's would.
// Compute that reads it must wait for that stream (the trainer's fence or comm_in_flight's wait); the fake
// CUDA lands the copy only then (NaN before), so a missing wait shows as it would matter under NCCL. The source is kept until the stream is
// next synchronised (an asynchronous copy from pageable memory is not promised to have read it on return).
void DeviceStagedComm::up(std::vector<float>&& h, float* dev) {
  pending_.push_back(std::move(h));
  to_device(dev, pending_.back().data(), pending_.back().size(), stream_);
}

void DeviceStagedComm::all_reduce(float* data, std::size_t count, ReduceOp op) {
  std::vector<float> h;
  down(data, count, h);
  host_->all_reduce(h.data(), count, op);
  up(std::move(h), data);
}

void DeviceStagedComm::all_gather(const float* in, float* out, std::size_t count) {
  std::vector<float> h, all(count * std::size_t(size()));
  down(in, count, h);
  host_->all_gather(h.data(), all.data(), count);
  up(std::move(all), out);
}

void DeviceStagedComm::reduce_scatter(const float* in, float* out, std::size_t count, ReduceOp op) {
  std::vector<float> h, mine(count);
  down(in, count * std::size_t(size()), h);
  host_->reduce_scatter(h.data(), mine.data(), count, op);
  up(std::move(mine), out);
}

void DeviceStagedComm::broadcast(float* data, std::size_t count, int root) {
  std::vector<float> h;
  down(data, count, h);
  host_->broadcast(h.data(), count, root);
  up(std::move(h), data);
}

void DeviceStagedComm::send(const float* data, std::size_t count, int peer, int tag) {
  std::vector<float> h;
  down(data, count, h);
  host_->send(h.data(), count, peer, tag);
}

void DeviceStagedComm::recv(float* data, std::size_t count, int peer, int tag) {
  std::vector<float> h(count);
  host_->recv(h.data(), count, peer, tag);
  up(std::move(h), data);
}

void DeviceStagedComm::barrier() {
  ok(cudaStreamSynchronize(stream_), "stream synchronise");
  pending_.clear();
  host_->barrier();
}

void DeviceStagedComm::set_stream(cudaStream_t s) {
  ok(cudaStreamSynchronize(stream_), "stream synchronise");  // the queued copies still read pending_
  pending_.clear();
  stream_ = s;
}

std::unique_ptr<Comm> DeviceStagedComm::split(int color, int key) {
  std::unique_ptr<Comm> h = host_->split(color, key);
  if (!h) return nullptr;
  return std::make_unique<DeviceStagedComm>(std::move(h), stream_);
}

// ---- HostStagedComm ----

void HostStagedComm::all_reduce(float* data, std::size_t count, ReduceOp op) {
  Scratch d(count, stream_);
  to_device(d.p, data, count, stream_);
  dev_->all_reduce(d.p, count, op);
  to_host(data, d.p, count, stream_);
}

void HostStagedComm::all_gather(const float* in, float* out, std::size_t count) {
  const std::size_t n = count * std::size_t(size());
  Scratch din(count, stream_), dout(n, stream_);
  to_device(din.p, in, count, stream_);
  dev_->all_gather(din.p, dout.p, count);
  to_host(out, dout.p, n, stream_);
}

void HostStagedComm::reduce_scatter(const float* in, float* out, std::size_t count, ReduceOp op) {
  const std::size_t n = count * std::size_t(size());
  Scratch din(n, stream_), dout(count, stream_);
  to_device(din.p, in, n, stream_);
  dev_->reduce_scatter(din.p, dout.p, count, op);
  to_host(out, dout.p, count, stream_);
}

void HostStagedComm::broadcast(float* data, std::size_t count, int root) {
  Scratch d(count, stream_);
  to_device(d.p, data, count, stream_);
  dev_->broadcast(d.p, count, root);
  to_host(data, d.p, count, stream_);
}

void HostStagedComm::send(const float* data, std::size_t count, int peer, int tag) {
  Scratch d(count, stream_);
  to_device(d.p, data, count, stream_);
  dev_->send(d.p, count, peer, tag);
  ok(cudaStreamSynchronize(stream_), "stream synchronise");  // before the scratch is freed
}

void HostStagedComm::recv(float* data, std::size_t count, int peer, int tag) {
  Scratch d(count, stream_);
  dev_->recv(d.p, count, peer, tag);
  to_host(data, d.p, count, stream_);
}

// A real rendezvous: NcclComm::barrier only waits for its own stream.
void HostStagedComm::barrier() {
  float one = 1.0f;
  all_reduce(&one, 1);
}

std::unique_ptr<Comm> HostStagedComm::split(int color, int key) {
  std::unique_ptr<Comm> d = dev_->split(color, key);
  if (!d) return nullptr;
  return std::make_unique<HostStagedComm>(std::move(d), stream_);
}

}  // namespace tessel::rt::cuda
