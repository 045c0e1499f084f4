// tessel run's output while it runs: every line reaches stdout as it is printed, so a run killed part-way
// keeps its log; a --trace that names a FIFO is written into it, and the FIFO stays one.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "tests/test_paths.hpp"

namespace fs = std::filesystem;

namespace {

// How long the test waits for the run's lines: a tiny two-step run takes well under a second; this leaves
// room for a loaded CI machine and turns a run whose lines never arrive into a failure, not a hang.
constexpr auto kPatience = std::chrono::seconds(120);

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Reads from `fd` into `out` until `done(out)`, end of file or the deadline; false unless `done`.
template <class Done>
bool read_until(int fd, std::string& out, Done done, std::chrono::steady_clock::time_point deadline) {
  char buf[4096];
  while (!done(out)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return done(out);  // end of file: the run exited
    out.append(buf, static_cast<std::size_t>(n));
  }
  return true;
}

// `tessel run --model tiny --steps 2 --trace FIFO` with stdout into a pipe (its read end returned) and stderr
// into `err`; the run blocks opening the FIFO until someone reads it.
struct Spawned {
  pid_t pid = -1;
  int out = -1;
};

Spawned spawn_run(const fs::path& fifo, const fs::path& err_path) {
  int out[2];
  REQUIRE(::pipe(out) == 0);
  const std::string exe = tessel::test::tessel_exe();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) ::dup2(err, 2);
    ::close(out[0]);
    ::execl(exe.c_str(), exe.c_str(), "run", "--backend", "cpu", "--model", "tiny", "--steps", "2", "--trace",
            fifo.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  return {pid, out[0]};
}

}  // namespace

TEST_CASE("run: each line reaches a piped stdout as it is printed, so a killed run keeps its log") {
  const fs::path dir = fs::temp_directory_path() / ("tessel-runout-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // The run trains its 2 steps, prints them, then opens the trace FIFO for writing, which waits until a
  // reader opens it: this test never does, so the run is held there, alive, with every line printed. A line
  // still in its stdout buffer then never reaches the pipe, and killing the run loses it.
  const fs::path fifo = dir / "trace.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const Spawned run = spawn_run(fifo, dir / "stderr");
  const pid_t pid = run.pid;
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  // "step    2 ..." and the summary line after it, each whole.
  const bool arrived = read_until(run.out, text, [](const std::string& t) {
    return has(t, "\nstep    2 ") && has(t, "\nstate memory on rank 0:") && t.back() == '\n';
  }, deadline);
  int status = 0;
  const bool still_running = ::waitpid(pid, &status, WNOHANG) == 0;
  ::kill(pid, SIGKILL);
  if (still_running) ::waitpid(pid, &status, 0);
  // What the killed run left in the pipe is read too: it must add nothing the test needs.
  read_until(run.out, text, [](const std::string&) { return false; }, std::chrono::steady_clock::now() + kPatience);
  ::close(run.out);
  INFO("stdout: " << text);
  CHECK(arrived);
  CHECK(still_running);
  CHECK(has(text, "tessel run: tiny"));
  CHECK(has(text, "\nstep    1 "));
  CHECK(has(text, "\nstep    2 "));
  struct stat st {};
  CHECK(::lstat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST_CASE("run: a log reader that goes away does not kill the run before it writes its trace") {
  // `tessel run ... | head`: once the reader exits, every later line is a write to a closed pipe, and SIGPIPE
  // would end the run there, before its trace and checkpoints. Made deterministic: the run is held on a
  // --trace FIFO after its last step line; the test closes its end of stdout, then reads the trace, after
  // which the run prints its "trace:" line into the closed pipe.
  const fs::path dir = fs::temp_directory_path() / ("tessel-runpipe-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path fifo = dir / "trace.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const Spawned run = spawn_run(fifo, dir / "stderr");
  const pid_t pid = run.pid;
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  const bool arrived = read_until(run.out, text, [](const std::string& t) {
    return has(t, "\nstate memory on rank 0:") && t.back() == '\n';
  }, deadline);
  ::close(run.out);  // the reader goes away; the run is still held on the FIFO
  // Read the trace: the run then prints its "trace:" line into the closed pipe.
  std::string trace;
  const int fd = arrived ? ::open(fifo.c_str(), O_RDONLY) : -1;
  if (fd >= 0) {
    read_until(fd, trace, [](const std::string&) { return false; }, deadline);
    ::close(fd);
  }
  int status = 0;
  if (!arrived) ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  INFO("stdout: " << text);
  CHECK(arrived);
  CHECK(has(trace, "traceEvents"));
  // Without SIGPIPE ignored the run dies of it here (WIFSIGNALED, SIGPIPE).
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::error_code ec;
  fs::remove_all(dir, ec);
}
