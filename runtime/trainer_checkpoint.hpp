// Recovery checkpoints of a Trainer through runtime/checkpoint (docs/checkpoint-format.md).
// Stored by logical tensor name and full shape, each element once in the world: parameters as
// "<name>", AdamW moments as "optim.exp_avg.<name>" / "optim.exp_avg_sq.<name>" (ZeRO shards are
// all-gathered over dp first), metadata {format, step, seed, runtime, model, layout, consumed_samples, data}.
// The data position is the number of samples consumed (Megatron's consumed_train_samples): the next step
// starts at that sample, whatever its global batch, and there is no other RNG state. `data` names the
// source (synthetic tokens of `seed`, or a file by name and size), which a resumed run must share.
// Loading reads each rank's slices by name, so a checkpoint saved under one layout resumes under another
// (expert parallelism included: experts are reassigned to ep ranks by name).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.hpp"
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

// Where a run stands: optimizer steps done and training samples consumed by them.
struct DataPosition {
  int step = 0;
  std::int64_t consumed_samples = 0;
};

// One save or load as `tessel run` reports it: the step, its folder, the bytes of every file in it on disk
// (shards, meta.json, manifest.json), and the seconds this rank spent in the collective call (gathering
// sharded state, writing or reading, and waiting for the other ranks).
struct CheckpointIo {
  int step = 0;
  std::string folder;
  std::int64_t bytes = 0;
  double seconds = 0;
};

// The bytes of the regular files under a step folder.
std::int64_t step_folder_bytes(const std::string& folder);

// The `data` object of the metadata for a run on `data_file` (empty: synthetic tokens):
// {"source": "synthetic"} or {"source": "file", "name": <file name without folder>, "bytes": <size>}.
Json data_source_json(const std::string& data_file);

// Checks the runtime metadata of the checkpoint `r` opened strictly (every key typed and in range, nothing
// unknown, meta.step equal to the manifest's) and that it continues this run: the same model, seed and
// data source. Returns its position. InputError naming meta.json and the key, or both values.
DataPosition check_resume(const CheckpointReader& r, const Model& m, std::uint64_t seed, const std::string& data_file);

// Whether world rank `at` writes parameter `p`: dp rank 0, tp rank 0 for tp-replicated tensors, and for the
// tied embedding (also held by the last stage's rank) only the first stage's rank. A routed expert's tensor
// (held by one ep rank, replicated over edp): edp rank 0. Experts are stored whole under their logical
// names, so a checkpoint saved at one ep resumes at another (each rank reads the experts it owns there).
bool checkpoint_owns(const ParamSpec& p, const RankCoords& at, const sched::Schedule& s);
// Collective over `world`: writes step folder `at.step` under dir and returns its path. `runtime` ("cpu",
// "cuda") goes into the metadata for the reader's information; the format is the same.
std::string write_checkpoint(const std::string& dir, const DataPosition& at, std::uint64_t seed, const std::string& data_file,
                      const Model& m, const Layout& l, const std::string& runtime, Comm& world,
                      const std::vector<CheckpointTensor>& tensors);
// What read_checkpoint found: the position it continues from, and the step folder it read.
struct LoadedCheckpoint {
  DataPosition at;
  std::string folder;
};

// Collective over `world`: reads every tensor's slice (value and moments) into its buffers and returns the
// position, once every rank has read its part. InputError on every rank when any rank fails (check_resume's
// refusals, a missing tensor, an unreadable file), with the first failed rank's message.
LoadedCheckpoint read_checkpoint(const std::string& dir, std::uint64_t seed, const std::string& data_file, const Model& m,
                             Comm& world, const std::vector<CheckpointTensor>& tensors);

// Collective over the world. Writes step folder `steps_done` under dir.
CheckpointIo save_checkpoint(Trainer& t, const std::string& dir, std::uint64_t seed);
// Collective; returns once every rank loaded. InputError when the checkpoint is of another model, seed or
// data source, or unreadable.
CheckpointIo load_checkpoint(Trainer& t, const std::string& dir, std::uint64_t seed);

}  // namespace tessel::rt
