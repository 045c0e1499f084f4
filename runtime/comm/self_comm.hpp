// A communicator of one rank (a one-GPU run, where a collective API is still wanted: the recovery
// checkpoint writer). Reductions, gathers and broadcasts copy or do nothing; there is no peer to send to.
#pragma once

#include <algorithm>

#include "runtime/comm/comm.hpp"

namespace tessel::rt {

class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "self"; }
  void all_reduce(float*, std::size_t, ReduceOp) override {}
  void all_gather(const float* in, float* out, std::size_t count) override { std::copy(in, in + count, out); }
  void reduce_scatter(const float* in, float* out, std::size_t count, ReduceOp) override {
    std::copy(in, in + count, out);
  }
  void broadcast(float*, std::size_t, int) override {}
  void send(const float*, std::size_t, int peer, int) override { no_peer(peer); }
  void recv(float*, std::size_t, int peer, int) override { no_peer(peer); }
  void barrier() override {}
  std::unique_ptr<Comm> split(int color, int) override {
    return color < 0 ? nullptr : std::make_unique<SelfComm>();
  }

 private:
  [[noreturn]] static void no_peer(int peer) {
    throw CommError("communicator of one rank: no peer " + std::to_string(peer));
  }
};

}  // namespace tessel::rt
