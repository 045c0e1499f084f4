#include "runtime/cuda/nccl_comm.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "kernels/cuda/nvtx.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace tessel::rt::cuda {

namespace {

// NCCL and CUDA failures become CommError naming the call and where (the Comm contract's error type).
void nccl_check(ncclResult_t r, const char* expr, const char* file, int line) {
  if (r == ncclSuccess) return;
  std::ostringstream os;
  os << file << ":" << line << ": " << expr << ": NCCL error " << int(r) << " (" << ncclGetErrorString(r) << ")";
  throw CommError(os.str());
}
#define NCCL_CHECK(expr) nccl_check((expr), #expr, __FILE__, __LINE__)

ncclRedOp_t red_op(ReduceOp op) { return op == ReduceOp::max ? ncclMax : ncclSum; }

int env_int(const char* name, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v) throw InputError(std::string("environment ") + name + ": not set (needed for the NCCL rendezvous)");
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi)
    throw InputError(std::string("environment ") + name + "=" + v + ": must be an integer in [" + std::to_string(lo) +
                     ", " + std::to_string(hi) + "]");
  return static_cast<int>(x);
}

double timeout_s() {
  const char* v = std::getenv("TESSEL_NCCL_TIMEOUT_S");
  if (!v) return 120.0;
  char* end = nullptr;
  const double t = std::strtod(v, &end);
  if (*end != '\0' || !(t > 0.0) || t > 86400.0)
    throw InputError(std::string("environment TESSEL_NCCL_TIMEOUT_S=") + v + ": must be a number of seconds in (0, 86400]");
  return t;
}

using Clock = std::chrono::steady_clock;
Clock::time_point deadline_after(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}
int ms_left(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<long long>(0, std::min<long long>(ms, 1 << 30)));
}

// The launch this process belongs to, when its launcher says: TESSEL_RUN_ID, torchrun's run id and
// restart count, or SLURM's job and step. An id file of another launch (a crashed run's, say) carries
// another key and is refused; without a key only the world size tells launches apart.
std::string launch_key() {
  const auto env = [](const char* v) { const char* x = std::getenv(v); return std::string(x ? x : ""); };
  if (!env("TESSEL_RUN_ID").empty()) return "TESSEL_RUN_ID=" + env("TESSEL_RUN_ID");
  if (!env("TORCHELASTIC_RUN_ID").empty())
    return "torchrun " + env("TORCHELASTIC_RUN_ID") + " restart " + env("TORCHELASTIC_RESTART_COUNT");
  if (!env("SLURM_JOB_ID").empty()) return "slurm " + env("SLURM_JOB_ID") + "." + env("SLURM_STEP_ID");
  return "";
}

// What rank 0 hands out, by file or socket: a tag, the world size, the launch key, then the id; a rank
// that took it over TCP answers with the tag and its rank. The tag, size and key let a reader tell the id
// apart from another service's bytes on the port or a stale file of another run.
constexpr char kTag[8] = {'T', 'E', 'S', 'S', 'E', 'L', 'I', 'D'};
constexpr std::size_t kHeader = sizeof(kTag) + 4 + 2;  // tag, world size, key length
constexpr std::size_t kId = sizeof(ncclUniqueId::internal);

void put_u32(std::string& m, std::uint32_t v, int bytes) {
  for (int k = 0; k < bytes; ++k) m.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
}
std::uint32_t get_u32(const std::string& m, std::size_t at, int bytes) {
  std::uint32_t v = 0;
  for (int k = 0; k < bytes; ++k) v |= std::uint32_t(static_cast<unsigned char>(m[at + k])) << (8 * k);
  return v;
}

std::string id_message(const NcclBootstrap& b, const std::string& key) {
  std::string m(kTag, sizeof(kTag));
  put_u32(m, static_cast<std::uint32_t>(b.world), 4);
  put_u32(m, static_cast<std::uint32_t>(key.size()), 2);
  m += key;
  m.append(b.id.internal, kId);
  return m;
}

// Bytes a whole message has, once its header is in (0 before).
std::size_t message_size(const std::string& m) { return m.size() < kHeader ? 0 : kHeader + get_u32(m, 12, 2) + kId; }

// Takes the id from a whole message; otherwise says what is wrong with it (empty: not complete yet).
std::string take_id(const std::string& m, NcclBootstrap& b, const std::string& key) {
  if (std::memcmp(m.data(), kTag, std::min(m.size(), sizeof(kTag))) != 0) return "not a Tessel NCCL id";
  const std::size_t whole = message_size(m);
  if (whole == 0 || m.size() < whole) return "";  // nothing yet, or cut short: ask again
  if (m.size() > whole) return "not a Tessel NCCL id";
  const std::uint32_t w = get_u32(m, 8, 4);
  if (w != static_cast<std::uint32_t>(b.world))
    return "an id for " + std::to_string(w) + " ranks, not WORLD_SIZE=" + std::to_string(b.world);
  const std::string theirs = m.substr(kHeader, whole - kHeader - kId);
  if (theirs != key)
    return "an id of another launch ('" + theirs + "'; this one is '" + key + "')";
  std::memcpy(b.id.internal, m.data() + whole - kId, kId);
  return "ok";
}

void file_rendezvous(NcclBootstrap& b, const std::string& path) {
  const std::string key = launch_key();
  const double limit = timeout_s();
  if (b.rank == 0) {
    write_file_atomic(path, id_message(b, key));  // readers never see a partial id
    b.id_file = path;                              // removed once every rank has joined (NcclComm), or on failure
    return;
  }
  const auto deadline = deadline_after(limit);
  std::string why;
  while (Clock::now() < deadline) {
    std::ifstream in(path, std::ios::binary);
    const std::string m((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    why = take_id(m, b, key);
    if (why == "ok") return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw CommError("rank " + std::to_string(b.rank) + ": TESSEL_NCCL_ID_FILE=" + path + ": no id for this run within " +
                  std::to_string(limit) + " s (rank 0 writes it" +
                  (why.empty() ? ")" : "; the file holds " + why + ": a stale file of another run?)"));
}

void set_timeouts(int fd, int ms) {  // receive and send on fd give up after ms (at least 1)
  timeval tv{};
  ms = std::max(1, ms);
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}
bool send_all(int fd, const std::string& m) {
  std::size_t done = 0;
  while (done < m.size()) {
    const ssize_t n = send(fd, m.data() + done, m.size() - done, MSG_NOSIGNAL);  // a closed peer: no SIGPIPE
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}
// Reads until m holds `want` bytes, the peer closes, or the receive timeout.
void recv_upto(int fd, std::string& m, std::size_t want) {
  char chunk[256];
  while (m.size() < want) {
    const ssize_t n = read(fd, chunk, std::min(sizeof(chunk), want - m.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    m.append(chunk, static_cast<std::size_t>(n));
  }
}
// A connection to a, given up at the deadline (a host that drops packets would otherwise hold connect()
// for the kernel's two minutes); -1 when refused or out of time.
int connect_until(const addrinfo* a, Clock::time_point deadline) {
  const int s = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
  if (s < 0) return -1;
  const int flags = fcntl(s, F_GETFL, 0);
  fcntl(s, F_SETFL, flags | O_NONBLOCK);
  int rc = connect(s, a->ai_addr, a->ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd pf{s, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof(err);
    rc = poll(&pf, 1, ms_left(deadline)) == 1 && getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0 ? 0 : -1;
  }
  if (rc != 0) {
    close(s);
    return -1;
  }
  fcntl(s, F_SETFL, flags);
  return s;
}

// Rank 0 listens on `port` and hands the id to each of the world - 1 others as they connect, counting a
// rank once it has answered with its rank number (a probe that connects and leaves is not a rank); the
// others connect to addr:port until it answers. Every wait is bounded by TESSEL_NCCL_TIMEOUT_S.
void tcp_rendezvous(NcclBootstrap& b, const std::string& addr, int port, const char* port_var) {
  const std::string where = addr + ":" + std::to_string(port) + " (" + port_var + ")";
  const std::string key = launch_key();
  const double limit = timeout_s();
  const auto deadline = deadline_after(limit);
  if (b.rank == 0) {
    const int srv = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    if (srv >= 0) setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons(static_cast<std::uint16_t>(port));
    if (srv < 0 || bind(srv, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(srv, b.world) != 0) {
      const int err = errno;
      if (srv >= 0) close(srv);
      throw CommError("rank 0: cannot listen on port " + std::to_string(port) + " (" + port_var + "): " +
                      std::strerror(err));
    }
    const std::string m = id_message(b, key);
    std::set<std::uint32_t> served;
    while (served.size() < static_cast<std::size_t>(b.world - 1)) {
      pollfd pf{srv, POLLIN, 0};
      const int ready = poll(&pf, 1, ms_left(deadline));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) {
        close(srv);
        throw CommError("rank 0: " + std::to_string(served.size()) + " of the " + std::to_string(b.world - 1) +
                        " other ranks fetched the NCCL id from port " + std::to_string(port) + " within " +
                        std::to_string(limit) + " s");
      }
      const int c = accept(srv, nullptr, nullptr);
      if (c < 0) continue;
      set_timeouts(c, std::min(5000, ms_left(deadline)));  // one slow or silent peer cannot hold the others
      std::string reply;
      if (send_all(c, m)) recv_upto(c, reply, sizeof(kTag) + 4);
      close(c);
      if (reply.size() == sizeof(kTag) + 4 && std::memcmp(reply.data(), kTag, sizeof(kTag)) == 0) {
        const std::uint32_t r = get_u32(reply, sizeof(kTag), 4);
        if (r >= 1 && r < static_cast<std::uint32_t>(b.world)) served.insert(r);
      }
    }
    close(srv);
    return;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  std::string why;
  while (Clock::now() < deadline) {
    if (!res) {  // a name not resolvable yet (pods still starting) is retried; one that does not exist is not
      const int rc = getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res);
      if (rc == EAI_AGAIN) {
        res = nullptr;
        why = "MASTER_ADDR not resolvable yet";
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
      if (rc != 0 || !res) throw InputError("environment MASTER_ADDR=" + addr + ": cannot resolve (" + gai_strerror(rc) + ")");
    }
    const int s = connect_until(res, deadline);
    if (s >= 0) {
      set_timeouts(s, ms_left(deadline));  // a peer that accepts and says nothing must not hold this rank
      std::string m;
      recv_upto(s, m, kHeader);
      if (const std::size_t whole = message_size(m); whole > 0 && std::memcmp(m.data(), kTag, sizeof(kTag)) == 0)
        recv_upto(s, m, whole);
      why = take_id(m, b, key);
      if (why == "ok") {
        std::string ack(kTag, sizeof(kTag));
        put_u32(ack, static_cast<std::uint32_t>(b.rank), 4);
        const bool acked = send_all(s, ack);
        close(s);
        if (acked) {
          freeaddrinfo(res);
          return;
        }
        why = "rank 0 left before this rank confirmed";
      } else {
        close(s);
        if (!why.empty()) {  // someone else answers on this port: waiting longer will not help
          freeaddrinfo(res);
          throw CommError("rank " + std::to_string(b.rank) + ": " + where + " answered with " + why +
                          " (another service on that port? under torchrun, MASTER_PORT is torchrun's own store)");
        }
        why = "connected, no id";
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (res) freeaddrinfo(res);
  throw CommError("rank " + std::to_string(b.rank) + ": no NCCL id from rank 0 at " + where + " within " +
                  std::to_string(limit) + " s" + (why.empty() ? "" : " (" + why + ")"));
}

// TESSEL_NCCL_PORT, else MASTER_PORT, except under torchrun's agent store, which owns MASTER_PORT.
std::pair<int, const char*> rendezvous_port() {
  if (std::getenv("TESSEL_NCCL_PORT")) return {env_int("TESSEL_NCCL_PORT", 1, 65535), "TESSEL_NCCL_PORT"};
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  if (agent && std::string(agent) == "True") {
    const char* mp = std::getenv("MASTER_PORT");
    throw InputError(std::string("environment MASTER_PORT=") + (mp ? mp : "(unset)") +
                     ": torchrun's own store listens there (TORCHELASTIC_USE_AGENT_STORE=True); set TESSEL_NCCL_PORT "
                     "to a free port on MASTER_ADDR's host, or TESSEL_NCCL_ID_FILE to a path every rank can read");
  }
  return {env_int("MASTER_PORT", 1, 65535), "MASTER_PORT"};
}

}  // namespace

bool launched_by_torchrun() { return std::getenv("RANK") && std::getenv("WORLD_SIZE"); }

NcclBootstrap bootstrap_over(Comm& world) {
  NcclBootstrap b;
  b.rank = world.rank();
  b.world = world.size();
  // 128 id bytes travel as 32 floats: the communicator copies bits, it never does arithmetic on a broadcast.
  static_assert(sizeof(b.id.internal) % sizeof(float) == 0, "ncclUniqueId must be a whole number of floats");
  float buf[sizeof(b.id.internal) / sizeof(float)] = {};
  if (b.rank == 0) {
    NCCL_CHECK(ncclGetUniqueId(&b.id));
    std::memcpy(buf, b.id.internal, sizeof(buf));
  }
  world.broadcast(buf, sizeof(buf) / sizeof(float), 0);
  std::memcpy(b.id.internal, buf, sizeof(buf));
  return b;
}

NcclBootstrap bootstrap_from_env() {
  NcclBootstrap b;
  b.world = env_int("WORLD_SIZE", 1, 1 << 20);
  b.rank = env_int("RANK", 0, b.world - 1);
  if (b.rank == 0) NCCL_CHECK(ncclGetUniqueId(&b.id));
  if (b.world == 1) return b;
  (void)timeout_s();  // a malformed TESSEL_NCCL_TIMEOUT_S is refused on every rank, rank 0 of a file rendezvous too
  if (const char* f = std::getenv("TESSEL_NCCL_ID_FILE")) {
    file_rendezvous(b, f);
    return b;
  }
  const char* addr = std::getenv("MASTER_ADDR");
  if (!addr) throw InputError("environment MASTER_ADDR: not set (or set TESSEL_NCCL_ID_FILE for a file rendezvous)");
  const auto [port, var] = rendezvous_port();
  tcp_rendezvous(b, addr, port, var);
  return b;
}

NcclComm::NcclComm(const NcclBootstrap& b, cudaStream_t stream) : stream_(stream), rank_(b.rank), size_(b.world) {
  kernels::cuda::NvtxRange r("ncclCommInitRank");
  NCCL_CHECK(ncclCommInitRank(&comm_, b.world, b.id, b.rank));
  // Every rank has joined, so every rank has read the id file: rank 0 removes it, and the next run's
  // ranks cannot take this run's id for theirs.
  if (!b.id_file.empty()) std::remove(b.id_file.c_str());
}

NcclComm::NcclComm(ncclComm_t c, cudaStream_t stream) : comm_(c), stream_(stream) {
  NCCL_CHECK(ncclCommUserRank(c, &rank_));
  NCCL_CHECK(ncclCommCount(c, &size_));
}

NcclComm::~NcclComm() {
  if (comm_) ncclCommDestroy(comm_);
}

void NcclComm::all_reduce(float* data, std::size_t count, ReduceOp op) {
  NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat, red_op(op), comm_, stream_));
}

void NcclComm::all_gather(const float* in, float* out, std::size_t count) {
  NCCL_CHECK(ncclAllGather(in, out, count, ncclFloat, comm_, stream_));
}

void NcclComm::reduce_scatter(const float* in, float* out, std::size_t count, ReduceOp op) {
  NCCL_CHECK(ncclReduceScatter(in, out, count, ncclFloat, red_op(op), comm_, stream_));
}

void NcclComm::broadcast(float* data, std::size_t count, int root) {
  NCCL_CHECK(ncclBroadcast(data, data, count, ncclFloat, root, comm_, stream_));
}

void NcclComm::send(const float* data, std::size_t count, int peer, int /*tag*/) {
  NCCL_CHECK(ncclSend(data, count, ncclFloat, peer, comm_, stream_));
}

void NcclComm::recv(float* data, std::size_t count, int peer, int /*tag*/) {
  NCCL_CHECK(ncclRecv(data, count, ncclFloat, peer, comm_, stream_));
}

void NcclComm::all_to_all_v(const float* send, const std::vector<std::size_t>& send_counts, float* recv,
                            const std::vector<std::size_t>& recv_counts) {
  TESSEL_CHECK(send_counts.size() == std::size_t(size_) && recv_counts.size() == std::size_t(size_),
               "all_to_all_v: " << send_counts.size() << " send and " << recv_counts.size() << " receive counts for "
                                << size_ << " ranks");
  std::size_t so = 0, ro = 0;
  NCCL_CHECK(ncclGroupStart());
  for (int p = 0; p < size_; ++p) {
    const std::size_t sn = send_counts[std::size_t(p)], rn = recv_counts[std::size_t(p)];
    if (p == rank_) {
      TESSEL_CHECK(sn == rn, "all_to_all_v: " << sn << " floats to self, " << rn << " expected");
      if (sn > 0) {
        const cudaError_t e = cudaMemcpyAsync(recv + ro, send + so, sn * sizeof(float), cudaMemcpyDeviceToDevice, stream_);
        if (e != cudaSuccess) {
          (void)ncclGroupEnd();
          throw CommError("rank " + std::to_string(rank_) + ": all-to-all self copy: " + cudaGetErrorString(e));
        }
      }
    } else {
      if (sn > 0) NCCL_CHECK(ncclSend(send + so, sn, ncclFloat, p, comm_, stream_));
      if (rn > 0) NCCL_CHECK(ncclRecv(recv + ro, rn, ncclFloat, p, comm_, stream_));
    }
    so += sn;
    ro += rn;
  }
  NCCL_CHECK(ncclGroupEnd());
}

void NcclComm::barrier() {
  const cudaError_t e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess)
    throw CommError("rank " + std::to_string(rank_) + ": NCCL stream failed: " + cudaGetErrorString(e));
}

std::unique_ptr<Comm> NcclComm::split(int color, int key) {
  ncclComm_t c = nullptr;
  NCCL_CHECK(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &c, nullptr));
  if (color < 0) return nullptr;
  return std::unique_ptr<Comm>(new NcclComm(c, stream_));
}

}  // namespace tessel::rt::cuda
