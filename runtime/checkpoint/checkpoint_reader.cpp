#include "runtime/checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "util/error.hpp"
#include "runtime/checkpoint/crc32c.hpp"

namespace tessel::rt {
namespace {

namespace fs = std::filesystem;
constexpr std::int64_t kMaxWorld = 1 << 20;

// The folder's own name, also when the path ends in a slash ("D/step-00000004/").
std::string folder_name(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

// `text` for a one-line message: control and non-ASCII bytes as '?'.
std::string printable(const std::string& text) {
  std::string out;
  for (char c : text) out += c >= 0x20 && c < 0x7f ? c : '?';
  return out;
}

// Complete step folders under root that `latest` does not publish, for the message when it is absent.
std::string unpublished_hint(const std::string& root) {
  std::error_code ec;
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(root, ec))
    if (parse_step_folder_name(e.path().filename().string()) && fs::is_regular_file(e.path() / "manifest.json", ec))
      names.push_back(e.path().filename().string());
  if (names.empty()) return "";
  std::sort(names.begin(), names.end());
  return "; " + names.back() + " there is complete but unpublished (its save stopped before writing `latest`): "
         "to load it anyway, name that folder itself";
}

void verify_file(const std::string& path, std::uint64_t bytes, const std::string& crc_text) {
  std::error_code ec;
  auto size = fs::file_size(path, ec);
  if (ec) throw InputError(path + ": listed in the manifest but cannot be read: " + ec.message());
  if (size != bytes)
    throw InputError(path + ": " + std::to_string(size) + " bytes, the manifest says " + std::to_string(bytes) +
                     " (truncated or overwritten)");
  // A file that cannot be opened or read (another user's, mode 600) says so, not that its checksum is wrong.
  std::uint32_t crc = 0;
  read_file_chunks(path, [&](const char* p, std::size_t n) { crc = crc32c_extend(crc, p, n); });
  if (crc_hex(crc) != crc_text)
    throw InputError(path + ": CRC32C " + crc_hex(crc) + ", the manifest says " + crc_text + " (the file is corrupted)");
}

// Whether `folder` holds a manifest.json file: false when none is there (or `folder` is no folder); an
// InputError when that cannot be told, as for a folder that cannot be searched (another user's, mode 700).
bool holds_manifest(const std::string& folder) {
  const std::string m = (fs::path(folder) / "manifest.json").string();
  struct stat st {};
  int err = injected_read_error(m);
  if (err == 0 && ::stat(m.c_str(), &st) != 0) err = errno;
  if (err == ENOENT || err == ENOTDIR) return false;
  if (err != 0) throw InputError(m + ": cannot be read: " + std::strerror(err));
  return S_ISREG(st.st_mode);
}

Json parse_checkpoint_json(const std::string& path) { return parse_json_text(read_whole_file(path), path); }

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

std::optional<std::int64_t> parse_step_folder_name(std::string_view name) {
  // The writer's "%08lld": 8 digits zero-padded, more without a leading zero; 18 at most (kMaxStep).
  if (name.size() < 13 || name.size() > 23 || name.substr(0, 5) != "step-") return std::nullopt;
  if (name.size() > 13 && name[5] == '0') return std::nullopt;
  std::int64_t s = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    s = s * 10 + (name[i] - '0');
  }
  return s;
}

std::optional<std::int64_t> CheckpointReader::latest_step(const std::string& root) {
  std::error_code ec;
  const fs::path p = fs::path(root) / "latest";
  if (int e = injected_read_error(p.string())) ec.assign(e, std::generic_category());
  const auto st = ec ? fs::file_status{} : fs::symlink_status(p, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
    throw InputError(p.string() + ": cannot be read: " + ec.message());
  if (ec || !fs::exists(st)) return std::nullopt;
  const std::string rule = "must be a file holding the name of the published step folder, as the saver writes it "
                           "(\"step-00000004\\n\")";
  if (!fs::is_regular_file(st))
    throw InputError(p.string() + ": " + (fs::is_directory(st) ? "is a directory" : "is not a regular file") + "; it " + rule);
  const auto bytes = fs::file_size(p, ec);
  if (ec || bytes > 64) throw InputError(p.string() + ": has " + std::to_string(bytes) + " bytes; it " + rule);
  const std::string text = read_whole_file(p.string());
  std::string name = !text.empty() && text.back() == '\n' ? text.substr(0, text.size() - 1) : text;
  auto step = parse_step_folder_name(name);
  if (!step) throw InputError(p.string() + ": holds \"" + printable(text) + "\"; it " + rule);
  return step;
}

std::vector<std::string> CheckpointReader::checkpoint_entries(const std::string& root) {
  std::error_code ec;
  std::vector<std::string> names;
  if (!fs::is_directory(root, ec)) return names;
  if (int e = injected_read_error(root)) ec.assign(e, std::generic_category());
  fs::directory_iterator it = ec ? fs::directory_iterator{} : fs::directory_iterator(root, ec);
  for (; !ec && it != fs::directory_iterator{}; it.increment(ec)) {
    std::string n = it->path().filename().string();
    if (n == "latest" || n.compare(0, 5, "step-") == 0) names.push_back(n);
  }
  if (ec) throw InputError(root + ": cannot be read: " + ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

CheckpointReader::CheckpointReader(const std::string& path) {
  std::error_code ec;
  if (holds_manifest(path)) {
    folder_ = path;
  } else if (fs::is_directory(path, ec)) {
    auto s = latest_step(path);
    if (!s) throw InputError(path + ": no published checkpoint (no " + path + "/latest)" + unpublished_hint(path));
    folder_ = (fs::path(path) / step_folder_name(*s)).string();
    if (!holds_manifest(folder_))
      throw InputError(path + "/latest: publishes " + step_folder_name(*s) + ", which is not a complete checkpoint (no " +
                       folder_ + "/manifest.json)");
  } else {
    throw InputError(path + (fs::exists(path, ec) ? ": is a file, not a checkpoint folder" : ": no such checkpoint folder"));
  }
  // A folder named like a step must be named as the saver names it, for its own step: a copy under another
  // step's name would otherwise load as a step it is not.
  const std::string name = folder_name(folder_);
  const bool step_named = name.compare(0, 5, "step-") == 0;
  const auto named = parse_step_folder_name(name);
  if (step_named && !named)
    throw InputError(folder_ + ": the folder name '" + name + "' is not one the saver writes (\"step-\" and the step, "
                     "zero-padded to 8 digits, at most " + std::to_string(kMaxStep) + ")");
  verify_and_index();
  if (named && *named != step_)
    throw InputError(folder_ + ": the folder is named for step " + std::to_string(*named) + " but its manifest.json "
                     "says step " + std::to_string(step_));
}

CheckpointReader::~CheckpointReader() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

void CheckpointReader::verify_and_index() {
  std::string mpath = (fs::path(folder_) / "manifest.json").string();
  Json mj = parse_checkpoint_json(mpath);
  JsonObject m(mj, mpath);
  if (m.string("format") != "tessel-checkpoint") m.fail("format", "must be \"tessel-checkpoint\"");
  m.integer("version", 1, 1);
  step_ = m.integer("step", 0, kMaxStep);
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
  Json meta = parse_checkpoint_json(meta_path);
  JsonObject mo(meta, meta_path);
  mo.string("format");
  // Both files name the step and the world: a difference names both files and both values.
  auto agree = [&](const std::string& key, std::int64_t here, std::int64_t in_manifest) {
    if (here != in_manifest)
      mo.fail(key, "value " + std::to_string(here) + " differs from the " + key + " of " + mpath + ", " +
                       std::to_string(in_manifest) + " (the two files must agree)");
  };
  agree("step", mo.integer("step", 0, kMaxStep), step_);
  agree("world", mo.integer("world", 1, kMaxWorld), world_);
  meta_ = mo.raw("meta");
  mo.finish();
  for (int r = 0; r < world_; ++r) {
    shards_.push_back(read_shard_index(files_[r]));
    if (shards_.back().rank != r || shards_.back().world != world_)
      throw InputError(files_[r] + ": header says rank " + std::to_string(shards_.back().rank) + " of " +
                       std::to_string(shards_.back().world) + ", the manifest rank " + std::to_string(r) + " of " +
                       std::to_string(world_));
    int fd = open_for_reading(files_[r]);
    if (fd < 0) throw InputError(files_[r] + ": cannot be read: " + std::strerror(errno));
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
