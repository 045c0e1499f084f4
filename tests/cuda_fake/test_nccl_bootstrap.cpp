// runtime/cuda/nccl_comm.cpp's environment bootstrap (RANK/WORLD_SIZE with a TCP or file rendezvous) across
// real processes: each rank is a forked child with its own environment that runs bootstrap_from_env() and
// reports the id it got, or its error, through a pipe. On the fake NCCL only ncclGetUniqueId works, which
// is all the bootstrap needs; a multi-GPU machine would otherwise be the first place this code ran.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "util/error.hpp"
#include "runtime/cuda/nccl_comm.hpp"

namespace {

using Env = std::map<std::string, std::string>;
using Clock = std::chrono::steady_clock;

// One rank's report: "id <hex>", or "InputError <message>" / "CommError <message>".
std::string run_bootstrap() {
  try {
    const tessel::rt::cuda::NcclBootstrap b = tessel::rt::cuda::bootstrap_from_env();
    static const char* hex = "0123456789abcdef";
    std::string s = "id ";
    for (char c : b.id.internal) {
      s.push_back(hex[(static_cast<unsigned char>(c) >> 4) & 15]);
      s.push_back(hex[static_cast<unsigned char>(c) & 15]);
    }
    return s;
  } catch (const tessel::InputError& e) {
    return std::string("InputError ") + e.what();
  } catch (const tessel::rt::CommError& e) {
    return std::string("CommError ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other ") + e.what();
  }
}

struct Rank {
  pid_t pid = -1;
  int fd = -1;
  std::string out;
};

// Forks a rank with exactly these rendezvous variables set (the test's own ones cleared first).
Rank spawn(const Env& env) {
  int p[2];
  REQUIRE(pipe(p) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TESSEL_NCCL_PORT", "TESSEL_NCCL_ID_FILE",
                          "TESSEL_NCCL_TIMEOUT_S", "TORCHELASTIC_USE_AGENT_STORE", "TESSEL_RUN_ID", "TORCHELASTIC_RUN_ID",
                          "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID", "SLURM_STEP_ID"})
      unsetenv(v);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    const std::string r = run_bootstrap();
    const ssize_t w = write(p[1], r.data(), r.size());
    _exit(w == static_cast<ssize_t>(r.size()) ? 0 : 1);
  }
  close(p[1]);
  return {pid, p[0], ""};
}

// Reads every rank's report; ranks still silent after `limit` are killed and report "timeout".
void collect(std::vector<Rank>& ranks, double limit = 20.0) {
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
  for (Rank& r : ranks) {
    char buf[4096];
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
      pollfd pf{r.fd, POLLIN, 0};
      if (left <= 0 || poll(&pf, 1, static_cast<int>(left)) <= 0) {
        kill(r.pid, SIGKILL);
        r.out = "timeout";
        break;
      }
      const ssize_t n = read(r.fd, buf, sizeof(buf));
      if (n <= 0) break;
      r.out.append(buf, static_cast<std::size_t>(n));
    }
    close(r.fd);
    waitpid(r.pid, nullptr, 0);
  }
}

std::string one(const Env& env, double limit = 20.0) {
  std::vector<Rank> r{spawn(env)};
  collect(r, limit);
  return r[0].out;
}

int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(s);
  return ntohs(a.sin_port);
}

// World `world` with ranks 1.. started first (they wait for rank 0), rank 0 a moment later.
std::vector<Rank> world_of(int world, const Env& common) {
  std::vector<Rank> ranks(static_cast<std::size_t>(world));
  for (int r = world - 1; r >= 0; --r) {
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Env e = common;
    e["RANK"] = std::to_string(r);
    e["WORLD_SIZE"] = std::to_string(world);
    ranks[static_cast<std::size_t>(r)] = spawn(e);
  }
  collect(ranks);
  return ranks;
}

void check_same_id(const std::vector<Rank>& ranks) {
  for (const Rank& r : ranks) {
    CAPTURE(r.out);
    REQUIRE(r.out.rfind("id ", 0) == 0);
    CHECK(r.out == ranks[0].out);
  }
  CHECK(ranks[0].out.find_first_not_of("0", 3) != std::string::npos);  // not an all-zero id
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A listener on `port` that accepts connections and either answers `reply` or stays silent, until stopped.
struct FakeService {
  int fd = -1;
  std::thread t;
  FakeService(int port, std::string reply) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(listen(fd, 8) == 0);
    t = std::thread([this, reply] {
      std::vector<int> held;
      for (;;) {
        pollfd pf{fd, POLLIN, 0};
        if (poll(&pf, 1, 100) < 0 || (pf.revents & (POLLNVAL | POLLERR))) break;
        if (!(pf.revents & POLLIN)) {
          if (stop) break;
          continue;
        }
        const int c = accept(fd, nullptr, nullptr);
        if (c < 0) break;
        if (reply.empty()) {
          held.push_back(c);  // silent: keep the connection open, never write
        } else {
          (void)!write(c, reply.data(), reply.size());
          close(c);
        }
      }
      for (int c : held) close(c);
    });
  }
  ~FakeService() {
    stop = true;
    t.join();
    close(fd);
  }
  std::atomic<bool> stop{false};
};

}  // namespace

TEST_CASE("TCP rendezvous: three processes get rank 0's id, the others started first") {
  const auto ranks = world_of(3, {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(free_port())}});
  check_same_id(ranks);
}

TEST_CASE("TCP rendezvous: probes that connect and leave are not counted as ranks") {
  const int port = free_port();
  const Env common{{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}, {"TESSEL_NCCL_TIMEOUT_S", "10"}};
  Env e0 = common, e1 = common;
  e0["RANK"] = "0", e0["WORLD_SIZE"] = "2";
  e1["RANK"] = "1", e1["WORLD_SIZE"] = "2";
  std::vector<Rank> ranks{spawn(e0)};
  int probes = 0;  // a health check or port scan: connect, close, before the real rank comes
  for (const auto end = Clock::now() + std::chrono::seconds(5); probes < 3 && Clock::now() < end;) {
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) ++probes;
    else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    close(s);
  }
  REQUIRE(probes == 3);
  ranks.push_back(spawn(e1));
  collect(ranks);
  check_same_id(ranks);
}

TEST_CASE("TCP rendezvous on TESSEL_NCCL_PORT, which also serves torchrun's agent-store launches") {
  const auto ranks = world_of(2, {{"MASTER_ADDR", "localhost"},
                                  {"MASTER_PORT", "1"},
                                  {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                  {"TESSEL_NCCL_PORT", std::to_string(free_port())}});
  check_same_id(ranks);
}

TEST_CASE("file rendezvous: three processes get rank 0's id; a stale file of another world size is named") {
  const auto dir = std::filesystem::temp_directory_path() / ("tessel_nccl_id_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "id").string();
  check_same_id(world_of(3, {{"TESSEL_NCCL_ID_FILE", path}}));

  // The file rank 0 wrote for 3 ranks, read by a rank of a 2-rank run whose rank 0 never comes.
  const std::string r = one({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TESSEL_NCCL_ID_FILE", path}, {"TESSEL_NCCL_TIMEOUT_S", "0.5"}});
  CAPTURE(r);
  CHECK(r.rfind("CommError", 0) == 0);
  CHECK(has(r, "an id for 3 ranks, not WORLD_SIZE=2"));
  CHECK(has(r, "stale"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("file rendezvous: an id file of another launch is refused, naming both launch keys") {
  const auto dir = std::filesystem::temp_directory_path() / ("tessel_nccl_key_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "id").string();
  // Rank 0 of launch a writes the file and stops there (no NCCL on the fake), as a crashed run would.
  const std::string r0 = one({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TESSEL_NCCL_ID_FILE", path}, {"TESSEL_RUN_ID", "a"}});
  REQUIRE(r0.rfind("id ", 0) == 0);
  const std::string other = one({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TESSEL_NCCL_ID_FILE", path},
                                 {"TESSEL_RUN_ID", "b"}, {"TESSEL_NCCL_TIMEOUT_S", "0.5"}});
  CAPTURE(other);
  CHECK(has(other, "an id of another launch ('TESSEL_RUN_ID=a'; this one is 'TESSEL_RUN_ID=b')"));
  const std::string torchrun = one({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TESSEL_NCCL_ID_FILE", path},
                                    {"TORCHELASTIC_RUN_ID", "job7"}, {"TORCHELASTIC_RESTART_COUNT", "1"},
                                    {"TESSEL_NCCL_TIMEOUT_S", "0.5"}});
  CHECK(has(torchrun, "this one is 'torchrun job7 restart 1'"));
  CHECK(one({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TESSEL_NCCL_ID_FILE", path}, {"TESSEL_RUN_ID", "a"}}) == r0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("rendezvous waits end at TESSEL_NCCL_TIMEOUT_S with the rank and the peer named") {
  const std::string port = std::to_string(free_port());
  const auto t0 = Clock::now();
  const std::string r1 = one({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port},
                              {"TESSEL_NCCL_TIMEOUT_S", "0.5"}});
  CAPTURE(r1);
  CHECK(r1.rfind("CommError rank 1: no NCCL id from rank 0 at 127.0.0.1:" + port, 0) == 0);
  const std::string r0 = one({{"RANK", "0"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port},
                              {"TESSEL_NCCL_TIMEOUT_S", "0.5"}});
  CAPTURE(r0);
  CHECK(has(r0, "CommError rank 0: 0 of the 2 other ranks fetched the NCCL id"));
  CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 10.0);
}

TEST_CASE("another service on the port: named at once when it answers, bounded when it says nothing") {
  const int port = free_port();
  const Env env{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)},
                {"TESSEL_NCCL_TIMEOUT_S", "1"}};
  {
    FakeService http(port, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    const std::string r = one(env);
    CAPTURE(r);
    CHECK(has(r, "answered with not a Tessel NCCL id"));
  }
  {
    FakeService silent(port, "");  // accepts and never writes, as a store server waiting for a request does
    const auto t0 = Clock::now();
    const std::string r = one(env);
    CAPTURE(r);
    CHECK(has(r, "no NCCL id from rank 0"));
    CHECK(has(r, "connected, no id"));
    CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 10.0);
  }
}

TEST_CASE("bad rendezvous environments are input errors naming the variable and the value") {
  const Env tcp{{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto with = [&](Env e) {
    for (const auto& [k, v] : tcp) e.emplace(k, v);
    return one(e);
  };
  const std::string r_rank = with({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
  CHECK(has(r_rank, "InputError environment RANK=2: must be an integer in [0, 1]"));
  const std::string r_world = with({{"RANK", "0"}, {"WORLD_SIZE", "two"}});
  CHECK(has(r_world, "InputError environment WORLD_SIZE=two"));
  const std::string r_addr = one({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  CHECK(has(r_addr, "InputError environment MASTER_ADDR: not set"));
  const std::string r_port = with({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}});
  CHECK(has(r_port, "InputError environment MASTER_PORT=70000"));
  const std::string r_agent = with({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  CHECK(has(r_agent, "InputError environment MASTER_PORT=29500: torchrun's own store listens there"));
  const std::string r_timeout = with({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TESSEL_NCCL_TIMEOUT_S", "soon"}});
  CHECK(has(r_timeout, "InputError environment TESSEL_NCCL_TIMEOUT_S=soon"));
  CHECK(one({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).rfind("id ", 0) == 0);  // one rank needs no rendezvous
}
