#include "util/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "util/error.hpp"

namespace tessel {

namespace fs = std::filesystem;

namespace {

// Writes all of `content` to `fd`; errno of the first failed write, 0 on success.
int write_all(int fd, std::string_view content) {
  std::size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    off += static_cast<std::size_t>(n);
  }
  return 0;
}

// What `path` names when it exists and is neither a regular file nor a directory: a renamed temporary file
// would replace the node itself (as root, a device such as /dev/null for the whole machine), so a character
// device or a FIFO is written into directly; a block device or a socket is refused. Empty kind otherwise.
struct Special {
  std::string kind;
  bool direct = false;
};

Special special_node(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};  // absent (or a dangling link): created by the rename
  if (S_ISCHR(st.st_mode)) return {"a character device", true};
  if (S_ISFIFO(st.st_mode)) return {"a FIFO", true};
  if (S_ISBLK(st.st_mode)) return {"a block device", false};
  if (S_ISSOCK(st.st_mode)) return {"a socket", false};
  return {};
}

std::string refusal(const Special& s) {
  return "is " + s.kind + "; only a file, a character device or a FIFO can be written";
}

// The file a write to `path` replaces: a symbolic link to a regular file is followed, so the link stays and
// the file it names is replaced (in the folder that file lies in).
fs::path replaced_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    fs::path resolved = fs::canonical(path, ec);
    if (!ec && fs::is_regular_file(resolved, ec)) return resolved;
  }
  return fs::path(path);
}

// /dev/stdout, /dev/stderr, /dev/fd/N and /proc/<pid>/fd/N name a descriptor the process already holds (a
// shell's redirection, `--svg /dev/stdout >> log.txt`): what they lead to is written into, never replaced by
// a renamed file (that would replace the user's log and leave the descriptor on an unlinked file).
bool descriptor_path(const std::string& path) { return path.rfind("/dev/", 0) == 0 || path.rfind("/proc/", 0) == 0; }

void write_directly(const std::string& path, std::string_view content) {
  // No O_CREAT and no O_TRUNC: the node exists; opening a FIFO waits for its reader. O_APPEND: through
  // /dev/stdout a regular file is reopened at offset 0, and appending keeps what is already there.
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) throw InputError(path + ": cannot write file: " + std::strerror(errno));
  int e = write_all(fd, content);
  if (::close(fd) != 0 && e == 0) e = errno;
  if (e != 0) throw InputError(path + ": write failed: " + std::strerror(e));
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view content) {
  Special special = special_node(path);
  std::error_code ec;
  if (special.direct || (descriptor_path(path) && fs::exists(path, ec))) return write_directly(path, content);
  if (!special.kind.empty()) throw InputError(path + ": " + refusal(special));
  fs::path target = replaced_file(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string tmp = (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError(path + ": cannot write file: " + std::strerror(errno));
  if (int e = write_all(fd, content); e != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw InputError(path + ": write failed: " + std::strerror(e));
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw InputError(path + ": write failed: " + std::strerror(e));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw InputError(path + ": cannot rename into place: " + std::strerror(e));
  }
}

void check_writable(const std::string& path, const std::string& flag) {
  Special special = special_node(path);
  if (special.direct) {
    if (::access(path.c_str(), W_OK) != 0)
      throw InputError(flag + " " + path + ": is " + special.kind + " that is not writable");
    return;
  }
  if (!special.kind.empty()) throw InputError(flag + " " + path + ": " + refusal(special));
  std::error_code ec;
  if (descriptor_path(path) && fs::exists(path, ec)) {
    if (::access(path.c_str(), W_OK) != 0) throw InputError(flag + " " + path + ": is not writable");
    return;
  }
  fs::path target = replaced_file(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec))
    throw InputError(flag + " " + path + ": folder " + dir.string() + " does not exist");
  if (fs::is_directory(target, ec)) throw InputError(flag + " " + path + ": is a directory, not a file");
  if (::access(dir.c_str(), W_OK) != 0)
    throw InputError(flag + " " + path + ": folder " + dir.string() + " is not writable");
}

}  // namespace tessel
