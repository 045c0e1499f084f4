#include "runtime/checkpoint/durable_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include "util/error.hpp"
#include "runtime/checkpoint/crc32c.hpp"

namespace tessel::rt {
namespace {

namespace fs = std::filesystem;

std::atomic<long> g_ops{0};
std::atomic<long> g_kill_at{0};
std::atomic<long> g_fail_at{0};
std::once_flag g_env_once;
std::mutex g_unreadable_mu;
std::string g_unreadable;  // FaultPlan::unreadable, lexically normal

long env_long(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0) throw InputError(std::string(name) + "=" + v + ": expected a non-negative integer");
  return x;
}

// Counts one I/O op; kills the process or returns true ("fail it") when the plan says so.
bool fault_point() {
  std::call_once(g_env_once, [] {
    if (long k = env_long("TESSEL_CKPT_KILL_AT_OP")) g_kill_at = k;
    if (long f = env_long("TESSEL_CKPT_FAIL_AT_OP")) g_fail_at = f;
  });
  long op = ++g_ops;
  if (op == g_kill_at) std::raise(SIGKILL);
  return op == g_fail_at;
}

[[noreturn]] void io_fail(const std::string& path, const char* what, int err) {
  throw InputError(path + ": " + what + " failed: " + std::strerror(err));
}

std::string parent_of(const std::string& path) {
  fs::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

}  // namespace

void set_fault_plan(const FaultPlan& plan) {
  std::call_once(g_env_once, [] {});  // an explicit plan wins over the environment
  g_kill_at = plan.kill_at_op;
  g_fail_at = plan.fail_at_op;
  g_ops = 0;
  std::lock_guard<std::mutex> lk(g_unreadable_mu);
  g_unreadable = plan.unreadable.empty() ? "" : fs::path(plan.unreadable).lexically_normal().string();
}

int injected_read_error(const std::string& path) {
  std::lock_guard<std::mutex> lk(g_unreadable_mu);
  if (g_unreadable.empty()) return 0;
  const std::string p = fs::path(path).lexically_normal().string();
  const bool under = p.size() > g_unreadable.size() && p.compare(0, g_unreadable.size(), g_unreadable) == 0 &&
                     p[g_unreadable.size()] == '/';
  return p == g_unreadable || under ? EACCES : 0;
}

int open_for_reading(const std::string& path) {
  if (int e = injected_read_error(path)) {
    errno = e;
    return -1;
  }
  return ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
}

void read_file_chunks(const std::string& path, const std::function<void(const char*, std::size_t)>& chunk) {
  int fd = open_for_reading(path);
  if (fd < 0) throw InputError(path + ": cannot be read: " + std::strerror(errno));
  std::vector<char> buf(1 << 20);
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      throw InputError(path + ": cannot be read: " + std::strerror(e));
    }
    if (n == 0) break;
    chunk(buf.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
}

std::string read_whole_file(const std::string& path) {
  std::string out;
  read_file_chunks(path, [&](const char* p, std::size_t n) { out.append(p, n); });
  return out;
}

long io_ops_done() { return g_ops; }

DurableFile::DurableFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) io_fail(path_, "create", errno);
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
}

void DurableFile::write(const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  crc_ = crc32c_extend(crc_, p, n);
  bytes_ += n;
  while (n > 0) {
    std::size_t chunk = std::min(n, kIoChunk);
    if (fault_point()) io_fail(path_, "write", ENOSPC);
    ssize_t w = ::write(fd_, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      io_fail(path_, "write", errno);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void DurableFile::commit() {
  if (fault_point()) io_fail(path_, "fsync", ENOSPC);
  if (::fsync(fd_) != 0) io_fail(path_, "fsync", errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) io_fail(path_, "close", errno);
}

void fsync_dir(const std::string& dir) {
  if (fault_point()) io_fail(dir, "fsync of the folder", EIO);
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail(dir, "open of the folder", errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) io_fail(dir, "fsync of the folder", err);
}

void make_dir(const std::string& dir) {
  if (fault_point()) io_fail(dir, "mkdir", ENOSPC);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError(dir + ": cannot create the folder: " + ec.message());
  fsync_dir(parent_of(dir));
}

void rename_op(const std::string& from, const std::string& to) {
  if (fault_point()) io_fail(to, "rename", EIO);
  if (::rename(from.c_str(), to.c_str()) != 0) io_fail(to, "rename", errno);
}

void durable_rename(const std::string& from, const std::string& to) {
  rename_op(from, to);
  fsync_dir(parent_of(to));
}

void write_durable(const std::string& path, const std::string& content) {
  std::string tmp = parent_of(path) + "/." + fs::path(path).filename().string() + ".tmp";
  DurableFile f(tmp);
  f.write(content.data(), content.size());
  f.commit();
  durable_rename(tmp, path);
}

}  // namespace tessel::rt
