#include "runtime/cuda/nccl_comm.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

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
  return v ? std::atof(v) : 120.0;
}

std::string id_bytes(const ncclUniqueId& id) { return std::string(id.internal, sizeof(id.internal)); }

void file_rendezvous(NcclBootstrap& b, const std::string& path) {
  if (b.rank == 0) {
    write_file_atomic(path, id_bytes(b.id));  // readers never see a partial id
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s());
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(path, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (s.size() == sizeof(b.id.internal)) {
      std::memcpy(b.id.internal, s.data(), s.size());
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw CommError("rank " + std::to_string(b.rank) + ": NCCL id file " + path + " did not appear within " +
                  std::to_string(timeout_s()) + " s (rank 0 writes it)");
}

void tcp_rendezvous(NcclBootstrap& b, const std::string& addr, int port) {
  const std::string where = addr + ":" + std::to_string(port);
  if (b.rank == 0) {
    const int srv = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons(static_cast<std::uint16_t>(port));
    if (srv < 0 || bind(srv, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(srv, b.world) != 0) {
      if (srv >= 0) close(srv);
      throw CommError("rank 0: cannot listen on port " + std::to_string(port) + " (MASTER_PORT): " + std::strerror(errno));
    }
    for (int served = 1; served < b.world; ++served) {
      const int c = accept(srv, nullptr, nullptr);
      if (c < 0) continue;
      const bool ok = write(c, b.id.internal, sizeof(b.id.internal)) == static_cast<ssize_t>(sizeof(b.id.internal));
      close(c);
      if (!ok) --served;
    }
    close(srv);
    return;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw InputError("environment MASTER_ADDR=" + addr + ": cannot resolve");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s());
  while (std::chrono::steady_clock::now() < deadline) {
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s >= 0 && connect(s, res->ai_addr, res->ai_addrlen) == 0) {
      std::size_t got = 0;
      while (got < sizeof(b.id.internal)) {
        const ssize_t n = read(s, b.id.internal + got, sizeof(b.id.internal) - got);
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
      }
      close(s);
      if (got == sizeof(b.id.internal)) {
        freeaddrinfo(res);
        return;
      }
    } else if (s >= 0) {
      close(s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  freeaddrinfo(res);
  throw CommError("rank " + std::to_string(b.rank) + ": no NCCL id from rank 0 at " + where + " within " +
                  std::to_string(timeout_s()) + " s");
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
  tcp_rendezvous(b, addr, env_int("MASTER_PORT", 1, 65535));
  return b;
}

NcclComm::NcclComm(const NcclBootstrap& b, cudaStream_t stream) : stream_(stream), rank_(b.rank), size_(b.world) {
  kernels::cuda::NvtxRange r("ncclCommInitRank");
  NCCL_CHECK(ncclCommInitRank(&comm_, b.world, b.id, b.rank));
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
