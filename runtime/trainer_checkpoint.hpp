// Recovery checkpoints of a Trainer through runtime/checkpoint (docs/checkpoint-format.md).
// Stored by logical tensor name and full shape, each element once in the world: parameters as
// "<name>", AdamW moments as "optim.exp_avg.<name>" / "optim.exp_avg_sq.<name>" (ZeRO shards are
// all-gathered over dp first), metadata {model, layout, step, seed, data}. The data stream is a pure
// function of (seed, step), so the step number is the data position and there is no other RNG state.
// Loading reads each rank's slices by name, so a checkpoint saved under one layout resumes under another.
#pragma once

#include <string>
#include <vector>

#include "runtime/trainer.hpp"

namespace tessel::rt {

// One tensor of a rank as a recovery checkpoint sees it, whichever runtime holds it (the CPU Trainer's
// ParamStore, or the CUDA runtime's device buffers copied to the host): the logical parameter, this
// rank's slice of it, and host buffers of rows * cols floats for the value and the two AdamW moments.
struct CheckpointTensor {
  ParamSpec spec;
  std::int64_t rows = 1, cols = 1, row0 = 0, col0 = 0;
  bool owned = false;  // this rank writes it: each element is written by exactly one rank in the world
  float* data = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
};

// Whether world rank `at` writes parameter `p`: dp rank 0, tp rank 0 for tp-replicated tensors, and for the
// tied embedding (also held by the last stage's rank) only the first stage's rank.
bool checkpoint_owns(const ParamSpec& p, const RankCoords& at, const sched::Schedule& s);
// Collective over `world`: writes step folder `step` under dir. `runtime` ("cpu", "cuda") goes into the
// metadata for the reader's information; the format is the same.
void write_checkpoint(const std::string& dir, int step, std::uint64_t seed, const Model& m, const Layout& l,
                      const std::string& runtime, Comm& world, const std::vector<CheckpointTensor>& tensors);
// Reads every tensor's slice (value and moments) into its buffers and returns the step. InputError when the
// checkpoint is of another model or seed, lacks a tensor, or is unreadable.
int read_checkpoint(const std::string& dir, std::uint64_t seed, const std::vector<CheckpointTensor>& tensors);

// Collective over the world. Writes step folder `steps_done` under dir.
void save_checkpoint(Trainer& t, const std::string& dir, std::uint64_t seed);
// Collective. InputError when the checkpoint is of another model or seed, or unreadable.
void load_checkpoint(Trainer& t, const std::string& dir, std::uint64_t seed);

}  // namespace tessel::rt
