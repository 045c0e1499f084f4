// One communicator interface for the in-process thread backend, MPI and NCCL. Collectives are
// synchronous from the caller's view on CPU backends; a backend reports a peer that failed or timed out
// as CommError naming the rank, never a hang.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessel::rt {

struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ReduceOp { sum, max };

// A communicator over a group of ranks (world or a sub-group). Buffers are fp32 on CPU backends.
class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;   // rank inside this group
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "threads", "mpi", "nccl"

  virtual void all_reduce(float* data, std::size_t count, ReduceOp op = ReduceOp::sum) = 0;
  // Each rank contributes `count` elements; out holds size()*count, rank-major.
  virtual void all_gather(const float* in, float* out, std::size_t count) = 0;
  // in holds size()*count (rank-major blocks); each rank receives the reduced block of its own rank.
  virtual void reduce_scatter(const float* in, float* out, std::size_t count, ReduceOp op = ReduceOp::sum) = 0;
  virtual void broadcast(float* data, std::size_t count, int root) = 0;
  virtual void send(const float* data, std::size_t count, int peer, int tag) = 0;
  virtual void recv(float* data, std::size_t count, int peer, int tag) = 0;
  virtual void barrier() = 0;
  // MPI_Comm_split semantics: collective over this communicator; members with the same color form one
  // sub-communicator, ranked by (key, rank here); color < 0 joins none and returns nullptr. Every member
  // calls split in the same order as every other collective. Implementations: thread_comm.hpp (run_threads),
  // mpi_comm.hpp (run_mpi).
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;
};

}  // namespace tessel::rt
