// Durable file operations for checkpoints, each one a numbered "I/O op" that tests can fail or kill at.
//
// A file is durable once DurableFile::commit() returned (data fsync'ed); a rename or a new entry is durable
// once its folder was fsync'ed (durable_rename, make_dir do it).
//
// Fault injection (tests, and `tessel run` through the environment): I/O ops are counted from 1 in each
// process (every write of up to kIoChunk bytes, fsync, rename, mkdir). With kill_at_op = K the process
// raises SIGKILL when op K starts; with fail_at_op = K op K fails as if the disk were full (ENOSPC).
// The environment variables TESSEL_CKPT_KILL_AT_OP and TESSEL_CKPT_FAIL_AT_OP set the plan at first use.
// Reading: with unreadable = P, every open, stat and listing of P or of a path under it fails with EACCES,
// as for a file or folder of another user's; root, whom permission bits do not stop, can test it so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace tessel::rt {

constexpr std::size_t kIoChunk = 64 * 1024;  // a write op's size: fine-grained enough for kill tests

struct FaultPlan {
  long kill_at_op = 0;     // 0: never
  long fail_at_op = 0;     // 0: never
  std::string unreadable;  // empty: none
};
void set_fault_plan(const FaultPlan& plan);  // also resets the op counter
long io_ops_done();

// Writes a new file (created or truncated), with a running CRC32C of what was written. If it is destroyed
// before commit(), the partial file is removed.
class DurableFile {
 public:
  explicit DurableFile(std::string path);
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;
  ~DurableFile();
  void write(const void* data, std::size_t n);  // InputError naming the file on failure (e.g. disk full)
  void commit();                                // fsync and close
  std::uint32_t crc() const { return crc_; }
  std::uint64_t bytes() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint32_t crc_ = 0;
  std::uint64_t bytes_ = 0;
};

// Reading a checkpoint: EACCES when the plan makes `path` unreadable (it, or a folder above it), else 0.
// Readers ask before each stat or listing of a checkpoint path.
int injected_read_error(const std::string& path);
// open(2) for reading through injected_read_error: the descriptor, or -1 with errno set.
int open_for_reading(const std::string& path);
// The whole file; InputError "<path>: cannot be read: <reason>" when it cannot be opened or read.
std::string read_whole_file(const std::string& path);
// Reads `path` from start to end, handing each piece read to `chunk`; InputError "<path>: cannot be read:
// <reason>" when it cannot be opened or read.
void read_file_chunks(const std::string& path, const std::function<void(const char*, std::size_t)>& chunk);

void fsync_dir(const std::string& dir);
void make_dir(const std::string& dir);  // creates it (parents too) and fsyncs its parent
// rename(2) alone (an I/O op); the caller fsyncs the folder when the new name must survive a crash.
void rename_op(const std::string& from, const std::string& to);
// rename(2), then fsync of the target's folder so the new name survives a crash.
void durable_rename(const std::string& from, const std::string& to);
// Writes `content` to path via a temporary name in the same folder and a durable rename.
void write_durable(const std::string& path, const std::string& content);

}  // namespace tessel::rt
