// Recovery checkpoints of a Trainer through runtime/checkpoint (docs/checkpoint-format.md).
// Stored by logical tensor name and full shape, each element once in the world: parameters as
// "<name>", AdamW moments as "optim.exp_avg.<name>" / "optim.exp_avg_sq.<name>" (ZeRO shards are
// all-gathered over dp first), metadata {model, layout, step, seed, data}. The data stream is a pure
// function of (seed, step), so the step number is the data position and there is no other RNG state.
// Loading reads each rank's slices by name, so a checkpoint saved under one layout resumes under another.
#pragma once

#include <string>

#include "runtime/trainer.hpp"

namespace tessel::rt {

// Collective over the world. Writes step folder `steps_done` under dir.
void save_checkpoint(Trainer& t, const std::string& dir, std::uint64_t seed);
// Collective. InputError when the checkpoint is of another model or seed, or unreadable.
void load_checkpoint(Trainer& t, const std::string& dir, std::uint64_t seed);

}  // namespace tessel::rt
