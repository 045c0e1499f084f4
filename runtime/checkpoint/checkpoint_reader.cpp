#include "runtime/checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "models/util/error.hpp"
#include "runtime/checkpoint/crc32c.hpp"

namespace tessel::rt {
namespace {

namespace fs = std::filesystem;
constexpr std::int64_t kMaxWorld = 1 << 20;

// Step number of a folder named exactly "step-<digits>", or -1.
std::int64_t step_of(const std::string& name) {
  if (name.size() < 6 || name.size() > 24 || name.compare(0, 5, "step-") != 0) return -1;
  std::int64_t s = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    s = s * 10 + (name[i] - '0');
  }
  return s;
}

void verify_file(const std::string& path, std::uint64_t bytes, const std::string& crc_text) {
  std::error_code ec;
  auto size = fs::file_size(path, ec);
  if (ec) throw InputError(path + ": listed in the manifest but cannot be read: " + ec.message());
  if (size != bytes)
    throw InputError(path + ": " + std::to_string(size) + " bytes, the manifest says " + std::to_string(bytes) +
                     " (truncated or overwritten)");
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buf(1 << 20);
  std::uint32_t crc = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    crc = crc32c_extend(crc, buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  if (crc_hex(crc) != crc_text)
    throw InputError(path + ": CRC32C " + crc_hex(crc) + ", the manifest says " + crc_text + " (the file is corrupted)");
}

// Key path of the first difference between a and b ("" if equal).
std::string first_difference(const Json& a, const Json& b, const std::string& path, std::string& av, std::string& bv) {
  if (a.is_object() && b.is_object()) {
    for (auto& [k, v] : a.items()) {
      if (!b.contains(k)) return av = json_brief(v), bv = "absent", path + "." + k;
      auto d = first_difference(v, b[k], path + "." + k, av, bv);
      if (!d.empty()) return d;
    }
    for (auto& [k, v] : b.items())
      if (!a.contains(k)) return av = "absent", bv = json_brief(v), path + "." + k;
    return "";
  }
  if (a != b) return av = json_brief(a), bv = json_brief(b), path;
  return "";
}

}  // namespace

std::optional<std::int64_t> CheckpointReader::latest_step(const std::string& root) {
  std::error_code ec;
  std::optional<std::int64_t> best;
  if (!fs::is_directory(root, ec)) return best;
  for (auto& e : fs::directory_iterator(root, ec)) {
    std::int64_t s = step_of(e.path().filename().string());
    // A step folder is published by a rename after its manifest is durable, so manifest => complete.
    if (s >= 0 && fs::is_regular_file(e.path() / "manifest.json", ec) && (!best || s > *best)) best = s;
  }
  return best;
}

CheckpointReader::CheckpointReader(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(fs::path(path) / "manifest.json", ec)) {
    folder_ = path;
  } else {
    auto s = latest_step(path);
    if (!s) throw InputError(path + ": no complete checkpoint (no step-* folder with a manifest.json)");
    folder_ = (fs::path(path) / step_folder_name(*s)).string();
  }
  verify_and_index();
}

CheckpointReader::~CheckpointReader() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

void CheckpointReader::verify_and_index() {
  std::string mpath = (fs::path(folder_) / "manifest.json").string();
  Json mj = parse_json_file(mpath);
  JsonObject m(mj, mpath);
  if (m.string("format") != "tessel-checkpoint") m.fail("format", "must be \"tessel-checkpoint\"");
  m.integer("version", 1, 1);
  step_ = m.integer("step", 0, INT64_MAX);
  world_ = static_cast<int>(m.integer("world", 1, kMaxWorld));
  m.choice("checksum", {"crc32c"});
  const Json& files = m.raw("files");
  m.finish();
  if (!files.is_array() || files.size() != static_cast<std::size_t>(world_) + 1)
    m.fail("files", "must list meta.json and one shard per rank (" + std::to_string(world_ + 1) + " files)");
  for (std::size_t i = 0; i < files.size(); ++i) {
    JsonObject f(files[i], mpath, "files[" + std::to_string(i) + "]");
    std::string name = f.string("name");
    char expect[32];
    std::snprintf(expect, sizeof expect, "rank-%05d.shard", static_cast<int>(i) - 1);
    if (name != (i == 0 ? std::string("meta.json") : std::string(expect)))
      f.fail("name", "expected " + std::string(i == 0 ? "meta.json" : expect));
    auto bytes = static_cast<std::uint64_t>(f.integer("bytes", 0, INT64_MAX));
    std::string crc = f.string("crc32c");
    f.finish();
    std::string p = (fs::path(folder_) / name).string();
    verify_file(p, bytes, crc);
    if (i > 0) files_.push_back(p);
  }
  std::string meta_path = (fs::path(folder_) / "meta.json").string();
  Json meta = parse_json_file(meta_path);
  JsonObject mo(meta, meta_path);
  mo.string("format");
  if (mo.integer("step", 0, INT64_MAX) != step_) mo.fail("step", "differs from the manifest's step");
  mo.integer("world", world_, world_);
  meta_ = mo.raw("meta");
  mo.finish();
  for (int r = 0; r < world_; ++r) {
    shards_.push_back(read_shard_index(files_[r]));
    if (shards_.back().rank != r || shards_.back().world != world_)
      throw InputError(files_[r] + ": header says rank " + std::to_string(shards_.back().rank) + " of " +
                       std::to_string(shards_.back().world) + ", the manifest rank " + std::to_string(r) + " of " +
                       std::to_string(world_));
    int fd = ::open(files_[r].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw InputError(files_[r] + ": cannot open: " + std::strerror(errno));
    fds_.push_back(fd);
  }
  for (int r = 0; r < world_; ++r)
    for (const ShardEntry& e : shards_[r].entries) {
      if (e.kind != EntryKind::tensor) continue;
      auto [it, fresh] = tensors_.try_emplace(e.name, Tensor{e.full, {}});
      if (!fresh && it->second.full != e.full)
        throw InputError(files_[r] + ": tensor '" + e.name + "' has a full shape that differs from another shard's");
      it->second.pieces.push_back({r, &e});
    }
}

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> names;
  for (auto& [k, v] : tensors_) names.push_back(k);
  return names;
}

bool CheckpointReader::has_tensor(const std::string& name) const { return tensors_.count(name) > 0; }

const CheckpointReader::Tensor& CheckpointReader::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw InputError(folder_ + ": the checkpoint has no tensor '" + name + "'");
  return it->second;
}

const Shape& CheckpointReader::shape(const std::string& name) const { return tensor(name).full; }

std::vector<float> CheckpointReader::read_tensor(const std::string& name) const {
  const Shape& full = shape(name);
  return read_slice(name, Shape(full.size(), 0), full);
}

std::string CheckpointReader::read_blob(const std::string& name, int rank) const {
  if (rank < 0 || rank >= world_)
    throw InputError(folder_ + ": blob '" + name + "' of rank " + std::to_string(rank) + ": the checkpoint has " +
                     std::to_string(world_) + " ranks");
  for (const ShardEntry& e : shards_[rank].entries)
    if (e.kind == EntryKind::blob && e.name == name) {
      std::string out(e.data_bytes, '\0');
      if (::pread(fds_[rank], out.data(), out.size(), static_cast<off_t>(e.data_pos)) != static_cast<ssize_t>(out.size()))
        throw InputError(files_[rank] + ": cannot read blob '" + name + "'");
      return out;
    }
  throw InputError(files_[rank] + ": no blob '" + name + "'");
}

void CheckpointReader::check_model(const Json& expected, const std::string& key) const {
  if (!meta_.is_object() || !meta_.contains(key))
    throw InputError(folder_ + ": the checkpoint metadata has no '" + key + "' to compare with");
  std::string in_ckpt, here;
  std::string d = first_difference(meta_[key], expected, key, in_ckpt, here);
  if (!d.empty())
    throw InputError(folder_ + ": checkpoint of another model: " + d + " is " + in_ckpt + " in the checkpoint, " +
                     here + " here");
}

}  // namespace tessel::rt
