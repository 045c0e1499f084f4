// NCCL behind runtime/comm/comm.hpp's Comm, one process per GPU. Buffers are DEVICE pointers (fp32), and
// collectives are stream-ordered on the stream given at construction (the device's comm stream), not
// host-synchronous: the caller orders its compute stream against it with events (CudaDevice). barrier()
// waits for the stream. NCCL matches point-to-point messages between two ranks in issue order, so `tag`
// is checked by nothing: the executor issues sends and receives in the schedule's order on both sides.
//
// Bootstrap: every rank needs rank 0's ncclUniqueId.
//   - over an existing Comm (MPI under mpirun, or threads): rank 0's id is broadcast through it;
//   - torchrun-style environment: RANK, WORLD_SIZE, and either TESSEL_NCCL_ID_FILE (rank 0 writes the id
//     there atomically, the others poll for it; rank 0 removes it once the communicator is up) or
//     MASTER_ADDR plus TESSEL_NCCL_PORT or MASTER_PORT (rank 0 listens, the others connect and read it).
//     The id travels tagged with the world size, so another service on the port or a stale file of another
//     run is named, not taken. Under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True) MASTER_PORT
//     is torchrun's own, so TESSEL_NCCL_PORT or the file is required. Every wait is bounded by
//     TESSEL_NCCL_TIMEOUT_S seconds (default 120), rank 0's for the others included.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/comm.hpp"

namespace tessel::rt::cuda {

struct NcclBootstrap {
  int rank = 0, world = 1;
  ncclUniqueId id{};
  std::string id_file;  // rank 0 of a file rendezvous: removed once the communicator is up
};

// Rank 0 creates the id; the others receive it through `world` (a collective over it).
NcclBootstrap bootstrap_over(Comm& world);
// From RANK/WORLD_SIZE and a file or TCP rendezvous; InputError naming the variable when one is missing
// or malformed, CommError naming the peer or file when the rendezvous times out.
NcclBootstrap bootstrap_from_env();
// True when RANK and WORLD_SIZE are set (launched by torchrun or a similar launcher).
bool launched_by_torchrun();

class NcclComm final : public Comm {
 public:
  NcclComm(const NcclBootstrap& b, cudaStream_t stream);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  void all_reduce(float* data, std::size_t count, ReduceOp op = ReduceOp::sum) override;
  void all_gather(const float* in, float* out, std::size_t count) override;
  void reduce_scatter(const float* in, float* out, std::size_t count, ReduceOp op = ReduceOp::sum) override;
  void broadcast(float* data, std::size_t count, int root) override;
  void send(const float* data, std::size_t count, int peer, int tag) override;
  void recv(float* data, std::size_t count, int peer, int tag) override;
  void barrier() override;
  std::unique_ptr<Comm> split(int color, int key) override;
  // Every peer's part in one NCCL group (nccl-tests' all-to-all): send_counts[p] floats to peer p from
  // `send` (peer order, contiguous), recv_counts[p] from it into `recv`; this rank's own part copied on the
  // stream. A group's sends and receives cannot wait on each other, as blocking pairs would.
  void all_to_all_v(const float* send, const std::vector<std::size_t>& send_counts, float* recv,
                    const std::vector<std::size_t>& recv_counts);
  // The stream later calls enqueue on (a communicator of its own stream: GpuTrainer's dp group).
  void set_stream(cudaStream_t s) { stream_ = s; }

 private:
  NcclComm(ncclComm_t c, cudaStream_t stream);
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0, size_ = 1;
};

}  // namespace tessel::rt::cuda
