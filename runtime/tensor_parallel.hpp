// The tensor-parallel group as the model layers see it (Megatron-LM, Shoeybi et al. 2019; sequence
// parallelism: Korthikanti et al. 2022). With size 1 every collective is the identity, so the single-rank
// model runs the same code. Each collective is timed into the rank's trace on the tp stream.
#pragma once

#include <cstddef>

#include "kernels/cpu/cross_entropy.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/recorder.hpp"

namespace tessel::rt {

struct TensorParallel {
  Comm* comm = nullptr;   // nullptr when size == 1
  int size = 1;
  int rank = 0;
  bool sp = false;        // sequence parallel: activations outside attention/MLP are split by token
  Recorder* rec = nullptr;

  // Sum over the group, in place.
  void all_reduce(float* x, std::size_t n) const;
  // in: this rank's `count` values; out: size * count, rank-major (tokens stay in order under SP).
  void all_gather(const float* in, float* out, std::size_t count) const;
  // in: size * count; out: this rank's reduced block.
  void reduce_scatter(const float* in, float* out, std::size_t count) const;
  // Max/sum hooks for the vocab-parallel cross-entropy.
  kernels::cpu::VocabReduce vocab_hooks() const;
};

}  // namespace tessel::rt
