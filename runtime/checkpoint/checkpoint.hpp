// Recovery checkpoints: one shard file per rank plus metadata, saved atomically across ranks, loadable under
// another layout. Format and guarantees: docs/checkpoint-format.md.
//
// Saving (every rank of `comm`, the same calls in the same order):
//   CheckpointWriter w(dir, step, comm);           // collective: rank 0 prepares the staging folder
//   w.add_tensor("layers.0.attn.qkv.weight", {3*h, h}, {row0, 0}, {rows, h}, ptr);  // this rank's piece
//   w.add_tensor("optim.exp_avg.layers.0.attn.qkv.weight", ...);  // optimizer state: tensors too
//   w.add_blob("rng", bytes);                       // per-rank opaque bytes (RNG state, ...)
//   w.set_metadata(json);                           // rank 0's is stored: model spec, layout, data position
//   w.commit();                                     // collective; returns once the checkpoint is durable
// A replicated tensor (same piece on several DP ranks) should be added by one of them only; if several add
// it, the reader takes any (they must be equal).
// Every rank throws InputError if any rank's write failed (disk full, ...); the previous checkpoints are
// never touched, and a save killed at any point leaves them loadable. A step is published when `latest`
// names it: a published step is never overwritten and `latest` never moves back; a step folder above the
// published step (a save that stopped before `latest`) is no checkpoint, and a save of that step replaces it.
//
// Loading (any process, any layout):
//   CheckpointReader r(dir);            // the step dir/latest publishes (or dir is one step folder)
//   r.check_model(model_json);          // InputError naming the first difference
//   auto w = r.read_slice("layers.0.attn.qkv.weight", {row0, 0}, {rows, h});  // assembled from any shards
// Opening verifies every file against the manifest's size and CRC32C; a mismatch is an InputError naming it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/json_reader.hpp"
#include "runtime/checkpoint/shard_file.hpp"
#include "runtime/comm/comm.hpp"

namespace tessel::rt {

using Shape = std::vector<std::uint64_t>;

// Steps are bounded so that a folder name has at most 18 digits and parses without overflow.
constexpr std::int64_t kMaxStep = 999'999'999'999'999'999;

// "step-00000010": the folder of one step under the checkpoint root.
std::string step_folder_name(std::int64_t step);
// The step of a name exactly as step_folder_name writes it ("step-", at least 8 digits, zero-padded to 8 and
// no other leading zero, at most kMaxStep), or nullopt for any other name.
std::optional<std::int64_t> parse_step_folder_name(std::string_view name);

// Collective: rank `root`'s text (up to 4096 bytes: an error message) on every rank of `comm`.
std::string broadcast_text(Comm& comm, std::string text, int root);

class CheckpointWriter {
 public:
  CheckpointWriter(std::string dir, std::int64_t step, Comm& comm);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // This rank's piece of logical tensor `name` (full shape `full`), starting at `offset` with `extent`
  // elements per dim; `data` is row-major over the extent.
  void add_tensor(const std::string& name, const Shape& full, const Shape& offset, const Shape& extent,
                  const float* data);
  void add_blob(const std::string& name, std::string_view bytes);
  void set_metadata(const Json& meta);
  void commit();

 private:
  void check_entry(const std::string& name);
  void prepare_final();
  void finish_on_rank0(const std::vector<float>& status);
  std::string dir_, staging_, final_;
  std::int64_t step_;
  Comm& comm_;
  std::unique_ptr<ShardWriter> shard_;
  Json meta_ = Json::object();
  std::vector<std::string> names_;
  std::string error_;  // first failure on this rank; reported by commit() so all ranks agree on the outcome
  bool committed_ = false;
  bool published_ = false;  // rank 0: `latest` was renamed to name this step
};

class CheckpointReader {
 public:
  // `path`: a checkpoint root (the step its `latest` file publishes is loaded) or one step folder. A step
  // folder named "step-..." must be named as the saver names it, for the step its manifest holds.
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  // The step root/latest publishes; nullopt when root or its `latest` does not exist. InputError naming
  // root/latest when it is not a regular file holding one step folder name (as the saver writes it).
  static std::optional<std::int64_t> latest_step(const std::string& root);
  // What under root belongs to checkpoints: `latest` and every entry whose name begins with "step-"
  // (sorted). Empty when root does not exist. A run that saves into root must not meet these unless it
  // continues them.
  static std::vector<std::string> checkpoint_entries(const std::string& root);

  std::int64_t step() const { return step_; }
  int world() const { return world_; }  // ranks that saved it
  const std::string& folder() const { return folder_; }
  const Json& metadata() const { return meta_; }  // what set_metadata stored
  std::vector<std::string> tensor_names() const;  // sorted
  bool has_tensor(const std::string& name) const;
  const Shape& shape(const std::string& name) const;
  std::vector<float> read_slice(const std::string& name, const Shape& offset, const Shape& extent) const;
  std::vector<float> read_tensor(const std::string& name) const;
  std::string read_blob(const std::string& name, int rank) const;
  // InputError naming the first key where metadata()[key] and `expected` differ.
  void check_model(const Json& expected, const std::string& key = "model") const;

 private:
  struct Piece {
    int file;
    const ShardEntry* entry;
  };
  struct Tensor {
    Shape full;
    std::vector<Piece> pieces;
  };
  const Tensor& tensor(const std::string& name) const;
  void verify_and_index();

  std::string folder_;
  std::int64_t step_ = 0;
  int world_ = 0;
  Json meta_;
  std::vector<std::string> files_;  // shard paths by rank
  std::vector<ShardIndex> shards_;
  std::vector<int> fds_;
  std::map<std::string, Tensor> tensors_;
};

}  // namespace tessel::rt
