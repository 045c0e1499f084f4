// Two adapters between the host-pointer communicators (threads, MPI) and the device-pointer ones (NCCL),
// both synchronous and meant for correctness, not speed:
//
// - DeviceStagedComm: device pointers over a host Comm. Each call waits for `stream` (the device's comm
//   stream, which the trainer has made wait for the compute that produced the data), copies the buffers to
//   the host, runs the host operation and queues the copy of the result back on `stream`, as NCCL would
//   leave it (the host is not synchronised with that copy: readers wait for the stream). With run_threads it
//   lets every rank of a layout run as a thread on ONE GPU (`tessel run --backend cuda --gpu-threads`,
//   tests/cuda/test_gpt_multirank.cpp): tp, pp, dp and the tied-embedding exchange go through the same
//   GpuTrainer code paths as under NCCL, with the thread backend's rank-ordered, bitwise-reproducible sums.
// - HostStagedComm: host pointers over a device Comm (NCCL, or the above), for what runs on the host
//   between steps: the recovery checkpoint writer's status exchange, loss and gradient-norm scalars.
//
// Both forward split() to the wrapped communicator, so make_groups() works through them unchanged.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "runtime/comm/comm.hpp"

namespace tessel::rt::cuda {

class DeviceStagedComm final : public Comm {
 public:
  // host: not owned (e.g. run_threads' world); it must outlive this object.
  DeviceStagedComm(Comm& host, cudaStream_t stream) : host_(&host), stream_(stream) {}
  DeviceStagedComm(std::unique_ptr<Comm> host, cudaStream_t stream)
      : host_(host.get()), owned_(std::move(host)), stream_(stream) {}
  ~DeviceStagedComm() override;
  DeviceStagedComm(const DeviceStagedComm&) = delete;
  DeviceStagedComm& operator=(const DeviceStagedComm&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string backend() const override { return "staged:" + host_->backend(); }
  void all_reduce(float* data, std::size_t count, ReduceOp op = ReduceOp::sum) override;
  void all_gather(const float* in, float* out, std::size_t count) override;
  void reduce_scatter(const float* in, float* out, std::size_t count, ReduceOp op = ReduceOp::sum) override;
  void broadcast(float* data, std::size_t count, int root) override;
  void send(const float* data, std::size_t count, int peer, int tag) override;
  void recv(float* data, std::size_t count, int peer, int tag) override;
  void barrier() override;
  std::unique_ptr<Comm> split(int color, int key) override;
  // The stream later calls stage through; nothing may be queued on the old one (a fresh communicator).
  void set_stream(cudaStream_t s);

 private:
  void down(const float* dev, std::size_t n, std::vector<float>& h);  // waits for stream_, then copies
  void up(std::vector<float>&& h, float* dev);                           // queues the copy; h kept until a sync
  Comm* host_;
  std::unique_ptr<Comm> owned_;
  cudaStream_t stream_;
  std::vector<std::vector<float>> pending_;  // sources of copies queued on stream_, freed once it is synchronised
};

class HostStagedComm final : public Comm {
 public:
  // dev: not owned; collectives on it are ordered on `stream` (NcclComm: the stream it was built with).
  HostStagedComm(Comm& dev, cudaStream_t stream) : dev_(&dev), stream_(stream) {}
  HostStagedComm(std::unique_ptr<Comm> dev, cudaStream_t stream)
      : dev_(dev.get()), owned_(std::move(dev)), stream_(stream) {}

  int rank() const override { return dev_->rank(); }
  int size() const override { return dev_->size(); }
  std::string backend() const override { return "host-staged:" + dev_->backend(); }
  void all_reduce(float* data, std::size_t count, ReduceOp op = ReduceOp::sum) override;
  void all_gather(const float* in, float* out, std::size_t count) override;
  void reduce_scatter(const float* in, float* out, std::size_t count, ReduceOp op = ReduceOp::sum) override;
  void broadcast(float* data, std::size_t count, int root) override;
  void send(const float* data, std::size_t count, int peer, int tag) override;
  void recv(float* data, std::size_t count, int peer, int tag) override;
  void barrier() override;
  std::unique_ptr<Comm> split(int color, int key) override;

 private:
  Comm* dev_;
  std::unique_ptr<Comm> owned_;
  cudaStream_t stream_;
};

}  // namespace tessel::rt::cuda
