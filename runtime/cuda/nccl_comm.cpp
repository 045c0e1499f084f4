#include "runtime/cuda/nccl_comm.hpp"

#include <arpa/inet.h>
#include <netdb.h>
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
#include <sstream>
#include <thread>
#include <utility>

#include "kernels/cuda/nvtx.hpp"
#include "models/util/atomic_file.hpp"
#include "models/util/error.hpp"

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

// What rank 0 hands out, by file or socket: a tag, the world size, then the id. The tag and size let a
// reader tell the id apart from another service's bytes on the port or a stale file of another run.
constexpr char kTag[8] = {'T', 'E', 'S', 'S', 'E', 'L', 'I', 'D'};
constexpr std::size_t kMessage = sizeof(kTag) + 4 + sizeof(ncclUniqueId::internal);

std::string id_message(const NcclBootstrap& b) {
  std::string m(kTag, sizeof(kTag));
  const auto w = static_cast<std::uint32_t>(b.world);
  for (int k = 0; k < 4; ++k) m.push_back(static_cast<char>((w >> (8 * k)) & 0xff));
  m.append(b.id.internal, sizeof(b.id.internal));
  return m;
}

// Takes the id from a whole message; otherwise says what is wrong with it (empty: not complete yet).
std::string take_id(const std::string& m, NcclBootstrap& b) {
  if (std::memcmp(m.data(), kTag, std::min(m.size(), sizeof(kTag))) != 0 || m.size() > kMessage)
    return "not a Tessel NCCL id";
  if (m.size() < kMessage) return "";  // nothing yet, or cut short: ask again
  std::uint32_t w = 0;
  for (int k = 0; k < 4; ++k) w |= std::uint32_t(static_cast<unsigned char>(m[sizeof(kTag) + k])) << (8 * k);
  if (w != static_cast<std::uint32_t>(b.world))
    return "an id for " + std::to_string(w) + " ranks, not WORLD_SIZE=" + std::to_string(b.world);
  std::memcpy(b.id.internal, m.data() + sizeof(kTag) + 4, sizeof(b.id.internal));
  return "ok";
}

void file_rendezvous(NcclBootstrap& b, const std::string& path) {
  if (b.rank == 0) {
    write_file_atomic(path, id_message(b));  // readers never see a partial id
    b.id_file = path;                         // removed once every rank has joined (NcclComm)
    return;
  }
  const auto deadline = deadline_after(timeout_s());
  std::string why;
  while (Clock::now() < deadline) {
    std::ifstream in(path, std::ios::binary);
    const std::string m((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    why = take_id(m, b);
    if (why == "ok") return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw CommError("rank " + std::to_string(b.rank) + ": TESSEL_NCCL_ID_FILE=" + path + ": no id for this run within " +
                  std::to_string(timeout_s()) + " s (rank 0 writes it" +
                  (why.empty() ? ")" : "; the file holds " + why + ": a stale file of another run?)"));
}

// Rank 0 listens on `port` and hands the id to each of the world - 1 others as they connect; the others
// connect to addr:port until it answers. Every wait is bounded by TESSEL_NCCL_TIMEOUT_S.
void tcp_rendezvous(NcclBootstrap& b, const std::string& addr, int port, const char* port_var) {
  const std::string where = addr + ":" + std::to_string(port) + " (" + port_var + ")";
  const auto deadline = deadline_after(timeout_s());
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
    const std::string m = id_message(b);
    int served = 0;
    while (served < b.world - 1) {
      pollfd pf{srv, POLLIN, 0};
      const int ready = poll(&pf, 1, ms_left(deadline));
      if (ready <= 0 && (ready == 0 || errno != EINTR)) {
        close(srv);
        throw CommError("rank 0: " + std::to_string(served) + " of the " + std::to_string(b.world - 1) +
                        " other ranks fetched the NCCL id from port " + std::to_string(port) + " within " +
                        std::to_string(timeout_s()) + " s");
      }
      if (ready <= 0) continue;
      const int c = accept(srv, nullptr, nullptr);
      if (c < 0) continue;
      served += write(c, m.data(), m.size()) == static_cast<ssize_t>(m.size());
      close(c);
    }
    close(srv);
    return;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw InputError("environment MASTER_ADDR=" + addr + ": cannot resolve");
  std::string why;
  while (Clock::now() < deadline) {
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s >= 0 && connect(s, res->ai_addr, res->ai_addrlen) == 0) {
      timeval tv{};  // a peer that accepts and says nothing must not hold this rank past the deadline
      const int left = std::max(1, ms_left(deadline));
      tv.tv_sec = left / 1000;
      tv.tv_usec = (left % 1000) * 1000;
      setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      std::string m;
      char chunk[256];
      for (;;) {  // until rank 0 closes (the whole message), a timeout, or more bytes than a message
        const ssize_t n = read(s, chunk, sizeof(chunk));
        if (n <= 0 || m.size() + static_cast<std::size_t>(n) > kMessage + sizeof(chunk)) break;
        m.append(chunk, static_cast<std::size_t>(n));
      }
      close(s);
      why = take_id(m, b);
      if (why == "ok") {
        freeaddrinfo(res);
        return;
      }
      if (!why.empty()) {  // someone else answers on this port: waiting longer will not help
        freeaddrinfo(res);
        throw CommError("rank " + std::to_string(b.rank) + ": " + where + " answered with " + why +
                        " (another service on that port? under torchrun, MASTER_PORT is torchrun's own store)");
      }
      why = "connected, no id";
    } else if (s >= 0) {
      close(s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  freeaddrinfo(res);
  throw CommError("rank " + std::to_string(b.rank) + ": no NCCL id from rank 0 at " + where + " within " +
                  std::to_string(timeout_s()) + " s" + (why.empty() ? "" : " (" + why + ")"));
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
