#include "runtime/checkpoint/checkpoint.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "util/error.hpp"
#include "runtime/checkpoint/crc32c.hpp"

namespace tessel::rt {
namespace {

namespace fs = std::filesystem;
constexpr int kStatusFloats = 7;  // ok, bytes as 4 x 16 bits, crc as 2 x 16 bits

// Status travels through the fp32 Comm: 16-bit pieces are exact in fp32 (24-bit mantissa).
void encode(float* out, bool ok, std::uint64_t bytes, std::uint32_t crc) {
  out[0] = ok ? 1.0f : 0.0f;
  for (int i = 0; i < 4; ++i) out[1 + i] = static_cast<float>((bytes >> (16 * i)) & 0xFFFFu);
  for (int i = 0; i < 2; ++i) out[5 + i] = static_cast<float>((crc >> (16 * i)) & 0xFFFFu);
}
void decode(const float* in, bool& ok, std::uint64_t& bytes, std::uint32_t& crc) {
  ok = in[0] == 1.0f;
  bytes = 0;
  crc = 0;
  for (int i = 0; i < 4; ++i) bytes |= static_cast<std::uint64_t>(in[1 + i]) << (16 * i);
  for (int i = 0; i < 2; ++i) crc |= static_cast<std::uint32_t>(in[5 + i]) << (16 * i);
}

std::string shard_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.shard", rank);
  return buf;
}

// Runs f, turning any exception into a message in `error` (kept for commit()); does nothing once failed.
template <class F>
void deferred(std::string& error, F&& f) {
  if (!error.empty()) return;
  try {
    f();
  } catch (const std::exception& e) {
    error = e.what();
  }
}

}  // namespace

// The Comm moves fp32, so the length and each byte travel as floats (exact: both are far below 2^24).
std::string broadcast_text(Comm& comm, std::string text, int root) {
  float len = static_cast<float>(std::min<std::size_t>(text.size(), 4096));
  comm.broadcast(&len, 1, root);
  std::vector<float> chars(static_cast<std::size_t>(len));
  if (comm.rank() == root)
    for (std::size_t i = 0; i < chars.size(); ++i) chars[i] = static_cast<unsigned char>(text[i]);
  comm.broadcast(chars.data(), chars.size(), root);
  std::string out(chars.size(), '\0');
  for (std::size_t i = 0; i < chars.size(); ++i) out[i] = static_cast<char>(static_cast<int>(chars[i]));
  return out;
}

std::string step_folder_name(std::int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

CheckpointWriter::CheckpointWriter(std::string dir, std::int64_t step, Comm& comm)
    : dir_(std::move(dir)), step_(step), comm_(comm) {
  if (step < 0 || step > kMaxStep)
    throw InputError("checkpoint step " + std::to_string(step) + ": must be in [0, " + std::to_string(kMaxStep) + "]");
  final_ = (fs::path(dir_) / step_folder_name(step)).string();
  staging_ = (fs::path(dir_) / ("." + step_folder_name(step) + ".staging")).string();
  float ok = 1;
  if (comm_.rank() == 0) {
    deferred(error_, [&] {
      if (!fs::is_directory(dir_)) make_dir(dir_);
      prepare_final();
      fs::remove_all(staging_);  // left by a save that was killed
      make_dir(staging_);
    });
    ok = error_.empty() ? 1.0f : 0.0f;
  }
  comm_.broadcast(&ok, 1, 0);
  if (ok != 1.0f) throw InputError(broadcast_text(comm_, error_, 0));
  deferred(error_, [&] {
    shard_ = std::make_unique<ShardWriter>((fs::path(staging_) / shard_name(comm_.rank())).string(), comm_.rank(),
                                           comm_.size());
  });
}

// Rank 0: refuses to overwrite a published step or to move `latest` back; an unpublished folder of this
// step (above `latest`: its save stopped between the rename and `latest`) is no checkpoint and goes.
void CheckpointWriter::prepare_final() {
  const auto published = CheckpointReader::latest_step(dir_);  // InputError if `latest` is not the saver's file
  if (published && *published >= step_) {
    if (fs::exists(final_))
      throw InputError(final_ + ": a checkpoint of step " + std::to_string(step_) + " exists; not overwriting it");
    if (*published == step_)
      throw InputError(dir_ + "/latest: publishes " + step_folder_name(step_) + ", which does not exist (removed?); "
                       "not saving over a damaged checkpoint folder");
    throw InputError(dir_ + "/latest: publishes step " + std::to_string(*published) + "; a save of step " +
                     std::to_string(step_) + " would move it back (save into an empty folder instead)");
  }
  if (!fs::exists(final_)) return;
  const std::string aside = (fs::path(dir_) / ("." + step_folder_name(step_) + ".unpublished")).string();
  fs::remove_all(aside);  // left by a replacement that was killed
  rename_op(final_, aside);  // the step name goes at once; the removal below may be cut short harmlessly
  fsync_dir(dir_);
  fs::remove_all(aside);
}

CheckpointWriter::~CheckpointWriter() = default;  // an uncommitted shard file removes itself (DurableFile)

void CheckpointWriter::check_entry(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameBytes)
    throw InputError("checkpoint entry name '" + name + "': must have 1 to " + std::to_string(kMaxNameBytes) + " bytes");
  if (std::find(names_.begin(), names_.end(), name) != names_.end())
    throw InputError("checkpoint entry '" + name + "' added twice on rank " + std::to_string(comm_.rank()));
  if (committed_) throw InputError("checkpoint entry '" + name + "' added after commit()");
  names_.push_back(name);
}

void CheckpointWriter::add_tensor(const std::string& name, const Shape& full, const Shape& offset,
                                  const Shape& extent, const float* data) {
  deferred(error_, [&] {
    check_entry(name);
    if (full.size() > kMaxDims || offset.size() != full.size() || extent.size() != full.size())
      throw InputError("checkpoint tensor '" + name + "': full shape, offsets and extents need the same rank <= 8");
    for (std::size_t d = 0; d < full.size(); ++d)
      if (offset[d] > full[d] || extent[d] > full[d] - offset[d])
        throw InputError("checkpoint tensor '" + name + "' dim " + std::to_string(d) + ": offset " +
                         std::to_string(offset[d]) + " + extent " + std::to_string(extent[d]) + " > " +
                         std::to_string(full[d]));
    checked_elements(full, "checkpoint tensor '" + name + "'");
    shard_->add_tensor(name, full, offset, extent, data);
  });
}

void CheckpointWriter::add_blob(const std::string& name, std::string_view bytes) {
  deferred(error_, [&] {
    check_entry(name);
    shard_->add_blob(name, bytes);
  });
}

void CheckpointWriter::set_metadata(const Json& meta) { meta_ = meta; }

void CheckpointWriter::commit() {
  if (committed_) throw InputError("checkpoint step " + std::to_string(step_) + ": commit() called twice");
  deferred(error_, [&] { shard_->finish(); });
  const int n = comm_.size();
  float mine[kStatusFloats];
  encode(mine, error_.empty(), shard_ && error_.empty() ? shard_->bytes() : 0, shard_ ? shard_->crc() : 0);
  std::vector<float> all(static_cast<std::size_t>(kStatusFloats) * n);
  comm_.all_gather(mine, all.data(), kStatusFloats);
  int failed = -1;
  for (int r = 0; r < n && failed < 0; ++r)
    if (all[r * kStatusFloats] != 1.0f) failed = r;
  std::string rank0_error;
  if (comm_.rank() == 0) {
    if (failed < 0) deferred(rank0_error, [&] { finish_on_rank0(all); });
    if (failed >= 0 || !rank0_error.empty()) {
      std::error_code ec;
      fs::remove_all(staging_, ec);  // best effort: a leftover staging folder is also removed by the next save
    }
  }
  // 1: saved; 0: rank 0 failed before publishing; 2: it failed after the rename published the step.
  float ok = rank0_error.empty() ? 1.0f : (published_ ? 2.0f : 0.0f);
  comm_.broadcast(&ok, 1, 0);
  committed_ = true;
  // Every rank throws the same message: the failed rank's own error, sent to all.
  if (failed >= 0) {
    std::string why = broadcast_text(comm_, error_, failed);
    throw InputError(dir_ + ": checkpoint step " + std::to_string(step_) + " not saved (the previous ones are intact): rank " +
                     std::to_string(failed) + ": " + why);
  }
  if (ok != 1.0f) {
    std::string why = broadcast_text(comm_, rank0_error, 0);
    throw InputError(dir_ + ": checkpoint step " + std::to_string(step_) +
                     (ok == 2.0f ? " was published but not confirmed durable: " : " not saved (the previous ones are intact): ") + why);
  }
}

// Rank 0, after every shard is durable: metadata, then the manifest (its presence marks the folder
// complete), then the rename of the folder into place, then the `latest` pointer, whose rename publishes it.
void CheckpointWriter::finish_on_rank0(const std::vector<float>& status) {
  const int n = comm_.size();
  Json meta = {{"format", "tessel-checkpoint"}, {"step", step_}, {"world", n}, {"meta", meta_}};
  std::string meta_text = meta.dump(2) + "\n";
  DurableFile mf((fs::path(staging_) / "meta.json").string());
  mf.write(meta_text.data(), meta_text.size());
  mf.commit();
  Json files = Json::array();
  files.push_back({{"name", "meta.json"}, {"bytes", mf.bytes()}, {"crc32c", crc_hex(mf.crc())}});
  for (int r = 0; r < n; ++r) {
    bool ok;
    std::uint64_t bytes;
    std::uint32_t crc;
    decode(&status[r * kStatusFloats], ok, bytes, crc);
    files.push_back({{"name", shard_name(r)}, {"bytes", bytes}, {"crc32c", crc_hex(crc)}});
  }
  Json manifest = {{"format", "tessel-checkpoint"}, {"version", 1}, {"step", step_}, {"world", n},
                   {"checksum", "crc32c"}, {"files", files}};
  std::string text = manifest.dump(2) + "\n";
  DurableFile man((fs::path(staging_) / "manifest.json").string());
  man.write(text.data(), text.size());
  man.commit();
  fsync_dir(staging_);
  if (fs::exists(final_)) throw InputError(final_ + ": appeared during the save; not overwriting it");
  rename_op(staging_, final_);
  fsync_dir(dir_);  // the folder's entry is durable before `latest` may name it
  const std::string latest = (fs::path(dir_) / "latest").string(), pointer = step_folder_name(step_) + "\n";
  DurableFile tmp((fs::path(dir_) / ".latest.tmp").string());
  tmp.write(pointer.data(), pointer.size());
  tmp.commit();
  rename_op(tmp.path(), latest);
  published_ = true;  // from here on `latest` names the step (once the entry reaches the disk)
  fsync_dir(dir_);
}

}  // namespace tessel::rt
