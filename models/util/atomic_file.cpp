#include "models/util/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "models/util/error.hpp"

namespace tessel {

namespace fs = std::filesystem;

void write_file_atomic(const std::string& path, std::string_view content) {
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string tmp = (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError(path + ": cannot write file: " + std::strerror(errno));
  std::size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw InputError(path + ": write failed: " + std::strerror(e));
    }
    off += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw InputError(path + ": write failed: " + std::strerror(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw InputError(path + ": cannot rename into place: " + std::strerror(e));
  }
}

void check_writable(const std::string& path, const std::string& flag) {
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InputError(flag + " " + path + ": folder " + dir.string() + " does not exist");
  if (fs::is_directory(target, ec)) throw InputError(flag + " " + path + ": is a directory, not a file");
  if (::access(dir.c_str(), W_OK) != 0)
    throw InputError(flag + " " + path + ": folder " + dir.string() + " is not writable");
}

}  // namespace tessel
