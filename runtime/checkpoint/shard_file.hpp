// One rank's shard file of a recovery checkpoint (format: docs/checkpoint-format.md).
//
//   header  : magic "TSLSHARD" (8 bytes), u32 version (1), u32 rank, u32 world, u32 reserved (0)
//   entries : u32 kind (1 tensor fp32, 2 blob, 0xFFFFFFFF end), u32 name length, name bytes,
//             u32 ndim, ndim x {u64 full, u64 offset, u64 extent}, u64 data bytes, data
//   the end entry (kind 0xFFFFFFFF, empty name, ndim 0, 0 bytes) closes the file.
// All integers little-endian; tensor data fp32 little-endian, row-major over the shard's extents.
//
// Reading checks every header field against limits and against the bytes the file holds before anything
// is allocated, so a hostile header (a 2^40-element tensor, a 4 GB name) is an InputError, not an
// allocation.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/checkpoint/durable_io.hpp"

namespace tessel::rt {

constexpr std::uint32_t kShardVersion = 1;
constexpr std::uint32_t kMaxNameBytes = 1024;
constexpr std::uint32_t kMaxDims = 8;
// Largest logical tensor: 2^36 elements (256 GiB of fp32), 32x the largest weight of a 405B-parameter model
// (128256 x 16384 embedding = 2.1e9 elements).
constexpr std::uint64_t kMaxTensorElements = std::uint64_t{1} << 36;
constexpr std::uint64_t kMaxEntries = 1'000'000;

enum class EntryKind : std::uint32_t { tensor = 1, blob = 2, end = 0xFFFFFFFFu };

struct ShardEntry {
  EntryKind kind = EntryKind::tensor;
  std::string name;
  std::vector<std::uint64_t> full, offset, extent;  // tensors only
  std::uint64_t data_pos = 0;                        // byte position of the data in the file
  std::uint64_t data_bytes = 0;
};

class ShardWriter {
 public:
  ShardWriter(const std::string& path, int rank, int world);
  void add_tensor(std::string_view name, const std::vector<std::uint64_t>& full,
                  const std::vector<std::uint64_t>& offset, const std::vector<std::uint64_t>& extent,
                  const float* data);
  void add_blob(std::string_view name, std::string_view bytes);
  void finish();  // writes the end entry and makes the file durable
  std::uint32_t crc() const { return f_.crc(); }
  std::uint64_t bytes() const { return f_.bytes(); }

 private:
  void entry_header(EntryKind kind, std::string_view name, std::uint32_t ndim);
  DurableFile f_;
};

struct ShardIndex {
  int rank = 0;
  int world = 0;
  std::vector<ShardEntry> entries;
};

// Reads and checks the header and entry headers of `path` (of `file_bytes` bytes), seeking past the data.
ShardIndex read_shard_index(const std::string& path);

// Elements in a shape; InputError (naming `what`) if it exceeds kMaxTensorElements.
std::uint64_t checked_elements(const std::vector<std::uint64_t>& shape, const std::string& what);

}  // namespace tessel::rt
