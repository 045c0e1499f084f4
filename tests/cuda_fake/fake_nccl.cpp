// The fake NCCL (include/nccl.h): communicators of threads in one process, with NCCL's blocking semantics.
//
// A communicator's ranks share a Group. A collective is a rendezvous in two phases: every rank posts its
// buffers and waits for the others (phase 1), computes its own result from every rank's input into a
// private buffer, waits again (phase 2), then writes its output: no rank writes before every rank has read,
// so in-place forms (all-gather from this rank's slot of the output, all-reduce in place) are safe. Sums run
// in rank order, so every rank gets the same bits. Point-to-point: a send waits until its receive has been
// issued and has copied the data (NCCL matches a pair's messages in issue order), a receive until a send
// from its peer is there, so two ranks that both send first wait for each other, as on GPUs. Inside
// ncclGroupStart/ncclGroupEnd (an all-to-all) sends are posted without waiting and receives deferred to
// ncclGroupEnd, which completes them and then waits for the sends to be taken, as NCCL's group semantics.
//
// The calls are deferred stream operations of the fake CUDA (fake_stream_op, fake_deferred) on the stream
// given: a result lands once something waits for it, and inputs must stay unchanged until then.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_runtime_api.h"
#include "nccl.h"

namespace {

std::chrono::duration<double> timeout() {
  const char* v = std::getenv("TESSEL_FAKE_NCCL_TIMEOUT_S");
  const double s = v ? std::atof(v) : 60.0;
  return std::chrono::duration<double>(s > 0 ? s : 60.0);
}

ncclResult_t fail(const std::string& what) {
  std::fprintf(stderr, "fake NCCL: %s\n", what.c_str());
  return ncclSystemError;
}

struct Post {  // one rank's buffers in the collective under way
  std::string call;
  const float* in = nullptr;
  float* out = nullptr;
  std::size_t count = 0;
  int op = 0, root = 0;
};

struct Message {  // a send waiting for its receive
  const float* data = nullptr;
  std::size_t count = 0;
  bool taken = false;
};

struct Group {
  explicit Group(int n) : size(n), posts(std::size_t(n)), split_posts(std::size_t(n)) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  int joined = 0;                // ncclCommInitRank
  int arrived = 0;               // of the barrier under way
  std::uint64_t generation = 0;  // barriers completed
  std::vector<Post> posts;
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Message>>> channels;  // (from, to)
  std::vector<std::pair<int, int>> split_posts;                                   // (color, key) per rank
  std::map<int, std::shared_ptr<Group>> split_groups;                             // color -> new group

  // Waits until every rank has called it; false on timeout.
  bool barrier(std::unique_lock<std::mutex>& lk) {
    const std::uint64_t g = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return true;
    }
    return cv.wait_for(lk, timeout(), [&] { return generation != g; });
  }
};

std::mutex registry_mu;
std::map<std::string, std::shared_ptr<Group>> registry;  // by id bytes

}  // namespace

struct ncclComm {
  std::shared_ptr<Group> group;
  int rank = 0;
};

namespace {

std::string who(const ncclComm* c) {
  return "rank " + std::to_string(c->rank) + " of " + std::to_string(c->group->size);
}

// NCCL defines in-place operation only in one form per call (the output's slot of this rank, or the same
// buffer); any other overlap of input and output is undefined, so the fake refuses it.
ncclResult_t check_overlap(const ncclComm* c, const Post& p, std::size_t in_count, std::size_t out_count,
                           const float* in_place) {
  const bool disjoint = p.in + in_count <= p.out || p.out + out_count <= p.in;
  if (disjoint || p.in == in_place) return ncclSuccess;
  return fail(p.call + " on " + who(c) + ": input and output overlap other than in NCCL's in-place form");
}

// The two-phase rendezvous: post, wait for all; compute(result, posts); wait for all; write.
template <class Compute>
ncclResult_t collective(ncclComm* c, const Post& mine, std::size_t out_count, cudaStream_t stream, Compute&& compute) {
  if (!c) return ncclInvalidUsage;
  const std::size_t n = std::size_t(c->group->size), r = std::size_t(c->rank);
  const bool gather = mine.call == "ncclAllGather", scatter = mine.call == "ncclReduceScatter";
  const std::size_t in_count = scatter ? mine.count * n : mine.count;
  const float* in_place = gather ? mine.out + r * mine.count : scatter ? nullptr : mine.out;
  if (scatter && mine.out == mine.in + r * mine.count) in_place = mine.in;  // recv is this rank's slot of send
  if (const ncclResult_t e = check_overlap(c, mine, in_count, out_count, in_place); e != ncclSuccess) return e;
  fake_stream_op(stream, mine.call.c_str(), {{mine.in, in_count * sizeof(float)}, {mine.out, out_count * sizeof(float)}});
  Group& g = *c->group;
  std::unique_lock<std::mutex> lk(g.mu);
  g.posts[std::size_t(c->rank)] = mine;
  if (!g.barrier(lk)) return fail(mine.call + ": " + who(c) + " waited " + std::to_string(timeout().count()) +
                                  " s for the other ranks to issue it (a rank issued something else first, or never came)");
  for (int r = 0; r < g.size; ++r) {
    const Post& p = g.posts[std::size_t(r)];
    if (p.call != mine.call || p.count != mine.count || p.op != mine.op || p.root != mine.root)
      return fail(mine.call + " (count " + std::to_string(mine.count) + ") on " + who(c) + " met " + p.call + " (count " +
                  std::to_string(p.count) + ") on rank " + std::to_string(r) + ": the ranks issued different calls");
  }
  std::vector<float> result(out_count);
  compute(result, g.posts);
  if (!g.barrier(lk)) return fail(mine.call + ": " + who(c) + " timed out in its second phase");
  lk.unlock();
  // Lands when something waits for it (fake_cudart.cpp); its input must not change until then.
  fake_deferred(stream, mine.call.c_str(), mine.out, result.data(), out_count * sizeof(float),
                {{mine.in, in_count * sizeof(float)}});
  return ncclSuccess;
}

void reduce_into(std::vector<float>& acc, const std::vector<Post>& posts, std::size_t offset, int op) {
  for (std::size_t i = 0; i < acc.size(); ++i) {
    float v = posts[0].in[offset + i];
    for (std::size_t r = 1; r < posts.size(); ++r) {
      const float x = posts[r].in[offset + i];
      v = op == ncclMax ? std::max(v, x) : v + x;
    }
    acc[i] = v;
  }
}

}  // namespace

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidUsage;
  std::shared_ptr<Group> g;
  {
    std::lock_guard<std::mutex> l(registry_mu);
    auto& slot = registry[std::string(id.internal, sizeof(id.internal))];
    if (!slot) slot = std::make_shared<Group>(nranks);
    g = slot;
  }
  if (g->size != nranks) return fail("ncclCommInitRank: rank " + std::to_string(rank) + " says " + std::to_string(nranks) +
                                     " ranks, an earlier one " + std::to_string(g->size));
  std::unique_lock<std::mutex> lk(g->mu);
  ++g->joined;
  g->cv.notify_all();
  if (!g->cv.wait_for(lk, timeout(), [&] { return g->joined == g->size; }))
    return fail("ncclCommInitRank: rank " + std::to_string(rank) + " waited for " + std::to_string(nranks) + " ranks, " +
                std::to_string(g->joined) + " came (ranks in other processes never join the fake)");
  *comm = new ncclComm{g, rank};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  if (!comm || !rank) return ncclInvalidUsage;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  if (!comm || !count) return ncclInvalidUsage;
  *count = comm->group->size;
  return ncclSuccess;
}

// Collective over the parent: ranks of one color form a communicator ordered by (key, parent rank).
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, void*) {
  if (!comm || !newcomm) return ncclInvalidUsage;
  Group& g = *comm->group;
  std::unique_lock<std::mutex> lk(g.mu);
  g.split_posts[std::size_t(comm->rank)] = {color, key};
  if (!g.barrier(lk)) return fail("ncclCommSplit: " + who(comm) + " waited for the other ranks to split");
  std::vector<std::pair<int, int>> members;  // (key, parent rank) of this color
  for (int r = 0; r < g.size; ++r)
    if (g.split_posts[std::size_t(r)].first == color) members.emplace_back(g.split_posts[std::size_t(r)].second, r);
  std::sort(members.begin(), members.end());
  if (color != NCCL_SPLIT_NOCOLOR && members.front().second == comm->rank)  // the color's first rank makes its group
    g.split_groups[color] = std::make_shared<Group>(int(members.size()));
  if (!g.barrier(lk)) return fail("ncclCommSplit: " + who(comm) + " timed out making the groups");
  *newcomm = nullptr;
  if (color != NCCL_SPLIT_NOCOLOR) {
    const auto at = std::find_if(members.begin(), members.end(), [&](const auto& m) { return m.second == comm->rank; });
    *newcomm = new ncclComm{g.split_groups.at(color), int(at - members.begin())};
  }
  if (!g.barrier(lk)) return fail("ncclCommSplit: " + who(comm) + " timed out taking its group");
  if (members.front().second == comm->rank) g.split_groups.erase(color);
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, ncclDataType_t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  const Post mine{"ncclAllReduce", static_cast<const float*>(send), static_cast<float*>(recv), count, int(op), 0};
  return collective(comm, mine, count, stream,
                    [&](std::vector<float>& out, const std::vector<Post>& posts) { reduce_into(out, posts, 0, int(op)); });
}

ncclResult_t ncclAllGather(const void* send, void* recv, std::size_t sendcount, ncclDataType_t, ncclComm_t comm,
                           cudaStream_t stream) {
  const Post mine{"ncclAllGather", static_cast<const float*>(send), static_cast<float*>(recv), sendcount, 0, 0};
  const std::size_t n = comm ? std::size_t(comm->group->size) : 0;
  return collective(comm, mine, sendcount * n, stream, [&](std::vector<float>& out, const std::vector<Post>& posts) {
    for (std::size_t r = 0; r < posts.size(); ++r) std::copy(posts[r].in, posts[r].in + sendcount, out.begin() + long(r * sendcount));
  });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, std::size_t recvcount, ncclDataType_t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  const Post mine{"ncclReduceScatter", static_cast<const float*>(send), static_cast<float*>(recv), recvcount, int(op), 0};
  const std::size_t me = comm ? std::size_t(comm->rank) : 0;
  return collective(comm, mine, recvcount, stream, [&](std::vector<float>& out, const std::vector<Post>& posts) {
    reduce_into(out, posts, me * recvcount, int(op));
  });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, ncclDataType_t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  const Post mine{"ncclBroadcast", static_cast<const float*>(send), static_cast<float*>(recv), count, 0, root};
  return collective(comm, mine, count, stream, [&](std::vector<float>& out, const std::vector<Post>& posts) {
    std::copy(posts[std::size_t(root)].in, posts[std::size_t(root)].in + count, out.begin());
  });
}

namespace {

struct PendingSend {
  ncclComm* comm = nullptr;
  std::shared_ptr<Message> m;
  int peer = 0;
  cudaStream_t stream = nullptr;
};
struct PendingRecv {
  void* recv = nullptr;
  std::size_t count = 0;
  int peer = 0;
  ncclComm* comm = nullptr;
  cudaStream_t stream = nullptr;
};
// This thread's open group (ncclGroupStart .. ncclGroupEnd): depth, and the calls it holds.
thread_local int group_depth = 0;
thread_local std::vector<PendingSend> group_sends;
thread_local std::vector<PendingRecv> group_recvs;

// A posted send waits until its receive took the data.
ncclResult_t finish_send(const PendingSend& p) {
  Group& g = *p.comm->group;
  std::unique_lock<std::mutex> lk(g.mu);
  if (!g.cv.wait_for(lk, timeout(), [&] { return p.m->taken; }))
    return fail("ncclSend: " + who(p.comm) + " sent " + std::to_string(p.m->count) + " floats to rank " +
                std::to_string(p.peer) + ", which issued no matching receive for " + std::to_string(timeout().count()) +
                " s (on GPUs the stream blocks: a deadlock)");
  lk.unlock();
  fake_deferred(p.stream, "ncclSend", nullptr, nullptr, 0, {{p.m->data, p.m->count * sizeof(float)}});  // its buffer stays put
  return ncclSuccess;
}

ncclResult_t run_recv(const PendingRecv& p) {
  Group& g = *p.comm->group;
  std::unique_lock<std::mutex> lk(g.mu);
  auto& q = g.channels[{p.peer, p.comm->rank}];
  if (!g.cv.wait_for(lk, timeout(), [&] { return !q.empty(); }))
    return fail("ncclRecv: " + who(p.comm) + " waited " + std::to_string(timeout().count()) + " s for a send from rank " +
                std::to_string(p.peer) + " (on GPUs the stream blocks: a deadlock)");
  std::shared_ptr<Message> m = q.front();
  q.pop_front();
  if (m->count != p.count) {
    m->taken = true;  // let the sender go; the run fails here
    g.cv.notify_all();
    return fail("ncclRecv: " + who(p.comm) + " expected " + std::to_string(p.count) + " floats from rank " +
                std::to_string(p.peer) + ", which sent " + std::to_string(m->count));
  }
  std::vector<float> got(m->data, m->data + p.count);
  m->taken = true;
  g.cv.notify_all();
  lk.unlock();
  fake_deferred(p.stream, "ncclRecv", p.recv, got.data(), p.count * sizeof(float), {});
  return ncclSuccess;
}

}  // namespace

ncclResult_t ncclSend(const void* send, std::size_t count, ncclDataType_t, int peer, ncclComm_t comm, cudaStream_t stream) {
  if (!comm || peer < 0 || peer >= comm->group->size || peer == comm->rank) return ncclInvalidUsage;
  fake_stream_op(stream, "ncclSend", {{send, count * sizeof(float)}});
  Group& g = *comm->group;
  auto m = std::make_shared<Message>();
  m->data = static_cast<const float*>(send);
  m->count = count;
  {
    std::lock_guard<std::mutex> lk(g.mu);
    g.channels[{comm->rank, peer}].push_back(m);
    g.cv.notify_all();
  }
  const PendingSend p{comm, m, peer, stream};
  if (group_depth > 0) {
    group_sends.push_back(p);
    return ncclSuccess;
  }
  return finish_send(p);
}

ncclResult_t ncclRecv(void* recv, std::size_t count, ncclDataType_t, int peer, ncclComm_t comm, cudaStream_t stream) {
  if (!comm || peer < 0 || peer >= comm->group->size || peer == comm->rank) return ncclInvalidUsage;
  fake_stream_op(stream, "ncclRecv", {{recv, count * sizeof(float)}});
  const PendingRecv p{recv, count, peer, comm, stream};
  if (group_depth > 0) {
    group_recvs.push_back(p);
    return ncclSuccess;
  }
  return run_recv(p);
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return fail("ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  std::vector<PendingRecv> recvs;
  std::vector<PendingSend> sends;
  recvs.swap(group_recvs);
  sends.swap(group_sends);
  ncclResult_t r = ncclSuccess;
  for (const PendingRecv& p : recvs)
    if (const ncclResult_t e = run_recv(p); e != ncclSuccess && r == ncclSuccess) r = e;
  for (const PendingSend& p : sends)
    if (const ncclResult_t e = finish_send(p); e != ncclSuccess && r == ncclSuccess) r = e;
  return r;
}
