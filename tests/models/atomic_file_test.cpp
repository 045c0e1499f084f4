// Output files (util/atomic_file): a file is replaced whole by a rename; a character device or a FIFO
// is written into and stays what it was; a block device or a socket is refused; a link to a file is kept.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "util/atomic_file.hpp"
#include "util/error.hpp"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

fs::path base_dir() { return fs::temp_directory_path() / ("tessel-atomic-" + std::to_string(::getpid())); }

// Removes this process's directory of test nodes at exit (FIFOs, sockets, devices and files).
struct RemoveAtExit {
  ~RemoveAtExit() {
    std::error_code ec;
    fs::remove_all(base_dir(), ec);
  }
} remove_at_exit;

// A fresh directory of this process for the nodes a case makes.
fs::path fresh_dir(const std::string& name) {
  fs::path d = base_dir() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

mode_t type_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_mode & S_IFMT;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("a file is replaced whole and no temporary file is left") {
  fs::path d = fresh_dir("file");
  std::string p = (d / "out.json").string();
  write_file_atomic(p, "old contents, longer than the new\n");
  write_file_atomic(p, "new\n");
  CHECK(slurp(p) == "new\n");
  CHECK(std::distance(fs::directory_iterator(d), fs::directory_iterator()) == 1);
}

TEST_CASE("a FIFO is written into and stays a FIFO") {
  fs::path d = fresh_dir("fifo");
  fs::path fifo = d / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // The reader opens first without blocking, so the writer's open finds it; the content fits the pipe's
  // buffer (64 KiB on Linux), so the write completes with no reader thread, and a write that went elsewhere
  // leaves the pipe empty instead of hanging the test.
  int rd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  REQUIRE(rd >= 0);
  const std::string content = "{\"traceEvents\":[]}\n";
  CHECK_NOTHROW(check_writable(fifo.string(), "--trace"));
  write_file_atomic(fifo.string(), content);
  char buf[256];
  ssize_t n = ::read(rd, buf, sizeof buf);
  ::close(rd);
  CHECK(std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0) == content);
  CHECK(type_of(fifo) == S_IFIFO);
  CHECK(std::distance(fs::directory_iterator(d), fs::directory_iterator()) == 1);
}

TEST_CASE("a character device is written into and stays a device") {
  fs::path d = fresh_dir("chr");
  fs::path dev = d / "nulldev";
  // The null device (major 1, minor 3 on Linux); making one needs CAP_MKNOD, so without it this case says
  // so and checks the machine's own /dev/null only through check_writable, which writes nothing.
  if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) {
    MESSAGE("mknod of a character device not permitted (" << std::strerror(errno)
                                                          << "): checking /dev/null through check_writable only");
    CHECK_NOTHROW(check_writable("/dev/null", "--trace"));
    return;
  }
  // On a file system mounted nodev the node exists but cannot be opened (EACCES, even for root).
  if (const int fd = ::open(dev.c_str(), O_WRONLY | O_CLOEXEC); fd < 0) {
    MESSAGE("the character device made here cannot be opened (" << std::strerror(errno) << "; a nodev mount?): skipped");
    return;
  } else {
    ::close(fd);
  }
  CHECK_NOTHROW(check_writable(dev.string(), "--trace"));
  write_file_atomic(dev.string(), "discarded\n");
  CHECK(type_of(dev) == S_IFCHR);
  CHECK(std::distance(fs::directory_iterator(d), fs::directory_iterator()) == 1);
}

TEST_CASE("a socket is refused with the path and the rule, and left in place") {
  fs::path d = fresh_dir("sock");
  fs::path sock = d / "s";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(sock.string().size() < sizeof addr.sun_path);
  std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const std::string refused = sock.string() + ": is a socket; only a file, a character device or a FIFO";
  const std::string flagged = "--trace " + sock.string() + ": is a socket";
  CHECK_THROWS_WITH_AS(write_file_atomic(sock.string(), "x"), doctest::Contains(refused.c_str()), InputError);
  CHECK_THROWS_WITH_AS(check_writable(sock.string(), "--trace"), doctest::Contains(flagged.c_str()), InputError);
  ::close(fd);
  CHECK(type_of(sock) == S_IFSOCK);
}

TEST_CASE("a symbolic link to a file is kept and the file it names is replaced") {
  fs::path d = fresh_dir("link");
  fs::create_directories(d / "runs");
  fs::path file = d / "runs" / "trace.json";
  fs::path link = d / "trace.json";
  write_file_atomic(file.string(), "old\n");
  fs::create_symlink(fs::path("runs") / "trace.json", link);
  CHECK_NOTHROW(check_writable(link.string(), "--trace"));
  write_file_atomic(link.string(), "new\n");
  CHECK(type_of(link) == S_IFLNK);
  CHECK(slurp(file) == "new\n");
  CHECK(std::distance(fs::directory_iterator(d / "runs"), fs::directory_iterator()) == 1);
}

TEST_CASE("a descriptor path (/dev/stdout, /proc/self/fd/N) is written into, appending, never renamed over") {
  // `--svg /dev/stdout >> log.txt`: the path leads to the user's log file through the process's descriptor.
  // A rename over it replaced the log (what was in it was lost) and left the descriptor on an unlinked file.
  fs::path d = fresh_dir("fd");
  fs::path log = d / "log.txt";
  write_file_atomic(log.string(), "PRE\n");
  const int fd = ::open(log.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  REQUIRE(fd >= 0);
  struct stat before {};
  REQUIRE(::stat(log.c_str(), &before) == 0);
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  CHECK_NOTHROW(check_writable(path, "--svg"));
  write_file_atomic(path, "<svg/>\n");
  ::close(fd);
  struct stat after {};
  REQUIRE(::stat(log.c_str(), &after) == 0);
  CHECK(after.st_ino == before.st_ino);  // the same file, not a renamed one
  CHECK(slurp(log) == "PRE\n<svg/>\n");
  CHECK(std::distance(fs::directory_iterator(d), fs::directory_iterator()) == 1);
}
