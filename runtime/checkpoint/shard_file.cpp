#include "runtime/checkpoint/shard_file.hpp"

#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "util/error.hpp"

namespace tessel::rt {

static_assert(std::endian::native == std::endian::little, "the shard format is little-endian; add byte swaps");

namespace {
constexpr char kMagic[8] = {'T', 'S', 'L', 'S', 'H', 'A', 'R', 'D'};

template <class T>
void put(DurableFile& f, T v) {
  f.write(&v, sizeof v);
}

// Reads fixed fields from a shard, turning short reads into InputError naming the file and field.
class Cursor {
 public:
  Cursor(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    if (int e = injected_read_error(path)) throw InputError(path + ": cannot be read: " + std::strerror(e));
    if (!in_) throw InputError(path + ": cannot be read: " + std::strerror(errno));
    in_.seekg(0, std::ios::end);
    size_ = static_cast<std::uint64_t>(in_.tellg());
    in_.seekg(0);
  }
  template <class T>
  T get(const char* field) {
    T v{};
    need(sizeof v, field);
    in_.read(reinterpret_cast<char*>(&v), sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string bytes(std::uint64_t n, const char* field) {
    need(n, field);
    std::string s(n, '\0');
    in_.read(s.data(), static_cast<std::streamsize>(n));
    pos_ += n;
    return s;
  }
  void skip(std::uint64_t n, const char* field) {
    need(n, field);
    pos_ += n;
    in_.seekg(static_cast<std::streamoff>(pos_));
  }
  std::uint64_t pos() const { return pos_; }
  std::uint64_t left() const { return size_ - pos_; }
  [[noreturn]] void fail(const std::string& msg) const {
    throw InputError(path_ + ": byte " + std::to_string(pos_) + ": " + msg);
  }

 private:
  void need(std::uint64_t n, const char* field) {
    if (n > size_ - pos_)
      fail(std::string(field) + " needs " + std::to_string(n) + " bytes, the file has " +
           std::to_string(size_ - pos_) + " left (truncated?)");
  }
  std::string path_;
  std::ifstream in_;
  std::uint64_t size_ = 0, pos_ = 0;
};
std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string t = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
  return t + "]";
}
}  // namespace

std::uint64_t checked_elements(const std::vector<std::uint64_t>& shape, const std::string& what) {
  std::uint64_t n = 1;
  for (auto d : shape) {
    if (d != 0 && n > kMaxTensorElements / d)
      throw InputError(what + ": shape " + shape_text(shape) + " has more than the limit 2^36 elements");
    n *= d;
  }
  if (n > kMaxTensorElements)
    throw InputError(what + ": shape " + shape_text(shape) + " has " + std::to_string(n) +
                     " elements, more than the limit 2^36 elements");
  return n;
}

ShardWriter::ShardWriter(const std::string& path, int rank, int world) : f_(path) {
  f_.write(kMagic, sizeof kMagic);
  put<std::uint32_t>(f_, kShardVersion);
  put<std::uint32_t>(f_, static_cast<std::uint32_t>(rank));
  put<std::uint32_t>(f_, static_cast<std::uint32_t>(world));
  put<std::uint32_t>(f_, 0);
}

void ShardWriter::entry_header(EntryKind kind, std::string_view name, std::uint32_t ndim) {
  put<std::uint32_t>(f_, static_cast<std::uint32_t>(kind));
  put<std::uint32_t>(f_, static_cast<std::uint32_t>(name.size()));
  f_.write(name.data(), name.size());
  put<std::uint32_t>(f_, ndim);
}

void ShardWriter::add_tensor(std::string_view name, const std::vector<std::uint64_t>& full,
                             const std::vector<std::uint64_t>& offset, const std::vector<std::uint64_t>& extent,
                             const float* data) {
  entry_header(EntryKind::tensor, name, static_cast<std::uint32_t>(full.size()));
  std::uint64_t n = 1;
  for (std::size_t d = 0; d < full.size(); ++d) {
    put(f_, full[d]);
    put(f_, offset[d]);
    put(f_, extent[d]);
    n *= extent[d];
  }
  put<std::uint64_t>(f_, n * sizeof(float));
  f_.write(data, n * sizeof(float));
}

void ShardWriter::add_blob(std::string_view name, std::string_view bytes) {
  entry_header(EntryKind::blob, name, 0);
  put<std::uint64_t>(f_, bytes.size());
  f_.write(bytes.data(), bytes.size());
}

void ShardWriter::finish() {
  entry_header(EntryKind::end, "", 0);
  put<std::uint64_t>(f_, 0);
  f_.commit();
}

ShardIndex read_shard_index(const std::string& path) {
  Cursor c(path);
  std::string magic = c.bytes(8, "magic");
  if (std::memcmp(magic.data(), kMagic, 8) != 0) c.fail("not a Tessel shard file (wrong magic)");
  auto version = c.get<std::uint32_t>("version");
  if (version != kShardVersion)
    c.fail("format version " + std::to_string(version) + ", this build reads " + std::to_string(kShardVersion));
  ShardIndex idx;
  idx.rank = static_cast<int>(c.get<std::uint32_t>("rank"));
  idx.world = static_cast<int>(c.get<std::uint32_t>("world"));
  c.get<std::uint32_t>("reserved");
  if (idx.world < 1 || idx.rank < 0 || idx.rank >= idx.world)
    c.fail("rank " + std::to_string(idx.rank) + " of world " + std::to_string(idx.world) + " is impossible");
  for (;;) {
    if (idx.entries.size() >= kMaxEntries) c.fail("more than " + std::to_string(kMaxEntries) + " entries");
    ShardEntry e;
    auto kind = c.get<std::uint32_t>("entry kind");
    if (kind != 1 && kind != 2 && kind != 0xFFFFFFFFu) c.fail("unknown entry kind " + std::to_string(kind));
    e.kind = static_cast<EntryKind>(kind);
    auto name_len = c.get<std::uint32_t>("name length");
    if (name_len > kMaxNameBytes) c.fail("name of " + std::to_string(name_len) + " bytes (limit " + std::to_string(kMaxNameBytes) + ")");
    e.name = c.bytes(name_len, "name");
    auto ndim = c.get<std::uint32_t>("ndim");
    if (ndim > kMaxDims || (e.kind != EntryKind::tensor && ndim != 0))
      c.fail("entry '" + e.name + "': " + std::to_string(ndim) + " dimensions");
    for (std::uint32_t d = 0; d < ndim; ++d) {
      e.full.push_back(c.get<std::uint64_t>("full size"));
      e.offset.push_back(c.get<std::uint64_t>("offset"));
      e.extent.push_back(c.get<std::uint64_t>("extent"));
      if (e.offset[d] > e.full[d] || e.extent[d] > e.full[d] - e.offset[d])
        c.fail("tensor '" + e.name + "' dim " + std::to_string(d) + ": offset " + std::to_string(e.offset[d]) +
               " + extent " + std::to_string(e.extent[d]) + " exceeds the full size " + std::to_string(e.full[d]));
    }
    e.data_bytes = c.get<std::uint64_t>("data size");
    if (e.kind == EntryKind::end) {
      if (!e.name.empty() || e.data_bytes != 0) c.fail("malformed end entry");
      if (c.left() != 0) c.fail(std::to_string(c.left()) + " bytes after the end entry");
      break;
    }
    if (e.kind == EntryKind::tensor) {
      checked_elements(e.full, path + ": tensor '" + e.name + "'");
      std::uint64_t n = checked_elements(e.extent, path + ": tensor '" + e.name + "' shard");
      if (e.data_bytes != n * sizeof(float))
        c.fail("tensor '" + e.name + "': " + std::to_string(e.data_bytes) + " data bytes for " + std::to_string(n) +
               " fp32 elements");
    }
    e.data_pos = c.pos();
    c.skip(e.data_bytes, "tensor data");
    idx.entries.push_back(std::move(e));
  }
  return idx;
}

}  // namespace tessel::rt
