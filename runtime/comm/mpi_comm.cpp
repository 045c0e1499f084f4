#include "runtime/comm/mpi_comm.hpp"

// Only the C API is used; the deprecated C++ bindings would only add warnings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <thread>

#include "util/error.hpp"
#include "runtime/comm/reduce.hpp"

namespace tessel::rt {
namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, static_cast<std::size_t>(len));
}

constexpr int kLeftTag = 7;  // on the notices communicator: "this rank's work returned"

class MpiComm final : public Comm {
 public:
  // `notices`: where ranks that finished their work announce it (run_mpi), so a peer that times out waiting
  // can name who left; MPI_COMM_NULL for none.
  MpiComm(MPI_Comm c, MpiCommOptions opts, bool owned, MPI_Comm notices = MPI_COMM_NULL)
      : c_(c), opts_(opts), owned_(owned), notices_(notices) {
    // Errors come back as codes that we turn into CommError, instead of MPI's default abort.
    MPI_Comm_set_errhandler(c_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c_, &rank_);
    MPI_Comm_size(c_, &size_);
    int wr = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    world_rank_ = wr;
  }
  ~MpiComm() override {
    if (std::uncaught_exceptions() > 0) {
      // Unwinding towards run_mpi's MPI_Abort: a peer may never take our sends, so waiting could hang.
      // The buffers stay allocated (MPI may still read them) until the abort ends the process.
      new std::deque<Pending>(std::move(pending_));
      return;
    }
    // Buffered sends must complete before their buffers go.
    for (auto& p : pending_) MPI_Wait(&p.req, MPI_STATUS_IGNORE);
    if (owned_) MPI_Comm_free(&c_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce(float* data, std::size_t count, ReduceOp op) override {
    // Reduce-scatter by chunks then all-gather (the bandwidth of a ring all-reduce), summing every chunk in
    // rank order so the bits equal the thread backend's. MPI_Allreduce does not fix its order.
    std::vector<int> counts(size_), displs(size_);
    for (int k = 0; k < size_; ++k) {
      auto [lo, hi] = chunk_bounds(count, size_, k);
      counts[k] = to_int(hi - lo, "all_reduce");
      displs[k] = to_int(lo, "all_reduce");
    }
    int mine = counts[rank_];
    std::vector<float> blocks(static_cast<std::size_t>(mine) * size_);
    std::vector<int> rcounts(size_, mine), rdispls(size_);
    for (int k = 0; k < size_; ++k) rdispls[k] = k * mine;
    MPI_Request req;
    check(MPI_Ialltoallv(data, counts.data(), displs.data(), MPI_FLOAT, blocks.data(), rcounts.data(),
                         rdispls.data(), MPI_FLOAT, c_, &req), "all_reduce");
    wait(req, "all_reduce");
    std::vector<float> part(mine);
    if (mine > 0) reduce_rank_order(block_ptrs(blocks.data(), mine), mine, op, part.data());
    check(MPI_Iallgatherv(part.data(), mine, MPI_FLOAT, data, counts.data(), displs.data(), MPI_FLOAT, c_, &req),
          "all_reduce");
    wait(req, "all_reduce");
  }

  void all_gather(const float* in, float* out, std::size_t count) override {
    MPI_Request req;
    int n = to_int(count, "all_gather");
    to_int(count * size_, "all_gather");
    const void* src = in == out + rank_ * count ? MPI_IN_PLACE : in;
    check(MPI_Iallgather(src, n, MPI_FLOAT, out, n, MPI_FLOAT, c_, &req), "all_gather");
    wait(req, "all_gather");
  }

  void reduce_scatter(const float* in, float* out, std::size_t count, ReduceOp op) override {
    int n = to_int(count, "reduce_scatter");
    to_int(count * size_, "reduce_scatter");
    std::vector<float> blocks(count * size_);
    MPI_Request req;
    check(MPI_Ialltoall(in, n, MPI_FLOAT, blocks.data(), n, MPI_FLOAT, c_, &req), "reduce_scatter");
    wait(req, "reduce_scatter");
    if (count > 0) reduce_rank_order(block_ptrs(blocks.data(), count), count, op, out);
  }

  void broadcast(float* data, std::size_t count, int root) override {
    check_peer(root, "broadcast root");
    MPI_Request req;
    check(MPI_Ibcast(data, to_int(count, "broadcast"), MPI_FLOAT, root, c_, &req), "broadcast");
    wait(req, "broadcast");
  }

  void send(const float* data, std::size_t count, int peer, int tag) override {
    check_peer(peer, "send peer");
    reap();
    // Buffered like the thread backend: the copy lives until MPI is done with it, the caller goes on.
    pending_.push_back({std::vector<float>(data, data + count), MPI_REQUEST_NULL});
    auto& p = pending_.back();
    check(MPI_Isend(p.buf.data(), to_int(count, "send"), MPI_FLOAT, peer, tag, c_, &p.req), "send");
  }

  void recv(float* data, std::size_t count, int peer, int tag) override {
    check_peer(peer, "recv peer");
    MPI_Request req;
    std::string what = "recv from rank " + std::to_string(peer) + " tag " + std::to_string(tag);
    check(MPI_Irecv(data, to_int(count, "recv"), MPI_FLOAT, peer, tag, c_, &req), what.c_str());
    MPI_Status st = wait(req, what.c_str());
    int got = 0;
    MPI_Get_count(&st, MPI_FLOAT, &got);
    if (static_cast<std::size_t>(got) != count)
      throw CommError(what + ": expected " + std::to_string(count) + " floats, the message has " + std::to_string(got));
    reap();
  }

  void barrier() override {
    MPI_Request req;
    check(MPI_Ibarrier(c_, &req), "barrier");
    wait(req, "barrier");
    reap();
  }

  std::unique_ptr<Comm> split(int color, int key) override {
    MPI_Comm sub;
    check(MPI_Comm_split(c_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "split");
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiComm>(sub, opts_, true, notices_);
  }

 private:
  struct Pending {
    std::vector<float> buf;
    MPI_Request req;
  };

  // Polls until the request completes; CommError on an MPI error or after the timeout.
  MPI_Status wait(MPI_Request& req, const char* what) {
    auto deadline = Clock::now() + opts_.timeout;
    MPI_Status st{};
    for (long spins = 0;; ++spins) {
      int done = 0;
      check(MPI_Test(&req, &done, &st), what);
      if (done) return st;
      if (Clock::now() > deadline)
        throw CommError(std::string(what) + ": rank " + std::to_string(world_rank_) + " waited " +
                        std::to_string(opts_.timeout.count()) + " ms for its peers" + departed());
      // Spin briefly for latency, then sleep so waiting ranks leave the cores to the working ones.
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // "; rank 1 had already finished its work and left" from the notices received so far (see run_mpi).
  std::string departed() {
    if (notices_ == MPI_COMM_NULL) return "";
    std::string who;
    for (;;) {
      int flag = 0;
      MPI_Status st{};
      if (MPI_Iprobe(MPI_ANY_SOURCE, kLeftTag, notices_, &flag, &st) != MPI_SUCCESS || !flag) break;
      int r = -1;
      MPI_Recv(&r, 1, MPI_INT, st.MPI_SOURCE, kLeftTag, notices_, MPI_STATUS_IGNORE);
      who += (who.empty() ? "" : ", ") + std::to_string(r);
    }
    if (who.empty()) return "";
    return "; rank(s) " + who + " had already finished their work and left";
  }
  void reap() {
    while (!pending_.empty()) {
      int done = 0;
      check(MPI_Test(&pending_.front().req, &done, MPI_STATUS_IGNORE), "send");
      if (!done) break;
      pending_.pop_front();
    }
  }
  void check(int code, const char* what) const {
    if (code != MPI_SUCCESS)
      throw CommError(std::string(what) + " on rank " + std::to_string(world_rank_) + ": " + mpi_error_text(code));
  }
  void check_peer(int r, const char* what) const {
    if (r < 0 || r >= size_)
      throw CommError(std::string(what) + " " + std::to_string(r) + " is outside the group of " + std::to_string(size_));
  }
  static int to_int(std::size_t n, const char* what) {
    if (n > static_cast<std::size_t>(INT_MAX))
      throw CommError(std::string(what) + ": " + std::to_string(n) + " elements exceed MPI's int count limit");
    return static_cast<int>(n);
  }
  std::vector<const float*> block_ptrs(const float* base, std::size_t block) const {
    std::vector<const float*> p(size_);
    for (int k = 0; k < size_; ++k) p[k] = base + k * block;
    return p;
  }

  MPI_Comm c_;
  MpiCommOptions opts_;
  bool owned_;
  MPI_Comm notices_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, world_rank_ = 0;
  std::deque<Pending> pending_;
};

}  // namespace

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

void run_mpi(const std::function<void(Comm&)>& fn, const MpiCommOptions& opts) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::exception_ptr err;
  {
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);  // our own context: no tag clashes with other MPI users
    MPI_Comm notices;
    MPI_Comm_dup(MPI_COMM_WORLD, &notices);
    try {
      MpiComm comm(dup, opts, true, notices);
      fn(comm);
    } catch (...) {
      err = std::current_exception();
    }
    if (!err && size > 1) {
      // Announce that this rank's work returned, so a peer still waiting for it can name it when it times
      // out, then meet everyone here and consume the notices before MPI_Finalize. A peer that fails instead
      // aborts the job (below), which also ends this barrier.
      static const int me_buffer[1] = {rank};
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        MPI_Request req;
        MPI_Isend(me_buffer, 1, MPI_INT, r, kLeftTag, notices, &req);
        MPI_Request_free(&req);
      }
      MPI_Barrier(notices);
      for (int k = 0; k < size - 1; ++k) {
        int r = -1;
        MPI_Recv(&r, 1, MPI_INT, MPI_ANY_SOURCE, kLeftTag, notices, MPI_STATUS_IGNORE);
      }
    }
    if (!err) MPI_Comm_free(&notices);
  }
  if (err && size > 1) {
    int code = 1;
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(err);
    } catch (const InputError& e) {
      code = 2;
      what = e.what();
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::fprintf(stderr, "tessel: rank %d of %d failed: %s\n", rank, size, what.c_str());
    std::fflush(stderr);
    // The last resort the MPI standard offers: peers blocked in MPI cannot be reached otherwise.
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  if (!inited) MPI_Finalize();
  if (err) std::rethrow_exception(err);
}

}  // namespace tessel::rt
