#include "runtime/comm/thread_comm.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <thread>
#include <tuple>

#include "runtime/comm/reduce.hpp"

namespace tessel::rt {
namespace {

using Clock = std::chrono::steady_clock;

// What a member called, checked across the group at the first rendezvous of every collective.
struct Call {
  const char* op = "";
  std::size_t count = 0;
  int root = -1;
  bool operator==(const Call& o) const { return std::strcmp(op, o.op) == 0 && count == o.count && root == o.root; }
};

using Inputs = std::vector<std::shared_ptr<const std::vector<float>>>;

std::vector<const float*> offset(const Inputs& ins, std::size_t at) {
  std::vector<const float*> p;
  for (auto& v : ins) p.push_back(v->data() + at);
  return p;
}

std::string describe(const Call& c) {
  std::ostringstream os;
  os << c.op << "(count=" << c.count;
  if (c.root >= 0) os << ", root=" << c.root;
  os << ")";
  return os.str();
}

// What members post for one rendezvous. Posted data is shared, not borrowed: a member that leaves early (a
// peer failed) can unwind and free its own buffers while others still read what it posted.
struct Slots {
  Inputs in;                                // input copies
  Inputs scratch;                           // partial results (all_reduce)
  std::vector<Call> calls;                  // what each member called, compared across the group
  std::vector<std::pair<int, int>> colors;  // (color, key) for split
};

// One group of ranks (the world or a split). All fields are guarded by World::mu.
struct Group {
  int id = 0;
  std::vector<int> world_ranks;     // group rank -> world rank
  std::uint64_t generation = 0;     // number of completed rendezvous
  int arrived = 0;
  std::vector<char> here;           // member arrived at the current rendezvous
  // Two slot sets, used by the parity of the generation at posting time: a fast member can be at most one
  // rendezvous ahead, so it posts into the other set while slow members still read this one.
  Slots slots[2];
  int size() const { return static_cast<int>(world_ranks.size()); }
};

struct SplitSlot {
  std::shared_ptr<Group> group;
  int taken = 0;
};

// State shared by every rank of one run_threads call. One mutex guards all of it: data moves outside the
// lock, only pointers and counters inside, so contention stays small. Each rank sleeps on its own condition
// variable and is woken only by what it waits for (its group's rendezvous completing, a message to it, a
// failure or an exit): with one variable for the world, every completion woke every sleeping rank, and with
// more ranks than cores those wake-ups took the cores from ranks that were computing.
struct World {
  std::chrono::milliseconds timeout{};
  std::mutex mu;
  std::unique_ptr<std::condition_variable[]> cv;  // one per world rank
  int world = 0;
  int failed_rank = -1;
  std::string failure;
  std::vector<char> exited;
  // (group id, src, dst, tag) -> FIFO of messages: the matching rule of MPI for one communicator.
  std::map<std::tuple<int, int, int, int>, std::deque<std::vector<float>>> mail;
  std::map<std::tuple<int, int, int>, SplitSlot> splits;  // (parent group id, split number, color)
  int next_group_id = 1;

  std::condition_variable& cv_of(int world_rank) { return cv[world_rank]; }
  void wake_all() {
    for (int r = 0; r < world; ++r) cv[r].notify_all();
  }
};

class ThreadComm final : public Comm {
 public:
  ThreadComm(std::shared_ptr<World> w, std::shared_ptr<Group> g, int rank)
      : w_(std::move(w)), g_(std::move(g)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  std::string backend() const override { return "threads"; }

  void all_reduce(float* data, std::size_t count, ReduceOp op) override {
    auto mine = std::make_shared<const std::vector<float>>(data, data + count);
    std::unique_lock lk(w_->mu);
    Slots& s1 = post({"all_reduce", count, -1}, std::move(mine), lk);
    Inputs ins = s1.in;
    lk.unlock();
    // Rank r reduces chunk r of every member's buffer (in rank order), then everybody copies all chunks.
    auto [lo, hi] = chunk_bounds(count, size(), rank_);
    auto part = std::make_shared<std::vector<float>>(hi - lo);
    if (hi > lo) reduce_rank_order(offset(ins, lo), hi - lo, op, part->data());
    lk.lock();
    Slots& s2 = g_->slots[g_->generation % 2];
    s2.scratch[rank_] = std::move(part);
    rendezvous(lk, "all_reduce");
    Inputs parts = s2.scratch;
    lk.unlock();
    for (int k = 0; k < size(); ++k) std::copy(parts[k]->begin(), parts[k]->end(), data + chunk_bounds(count, size(), k).first);
  }

  void all_gather(const float* in, float* out, std::size_t count) override {
    auto mine = std::make_shared<const std::vector<float>>(in, in + count);
    std::unique_lock lk(w_->mu);
    Inputs ins = post({"all_gather", count, -1}, std::move(mine), lk).in;
    lk.unlock();
    for (int k = 0; k < size(); ++k) std::copy(ins[k]->begin(), ins[k]->end(), out + k * count);
  }

  void reduce_scatter(const float* in, float* out, std::size_t count, ReduceOp op) override {
    auto mine = std::make_shared<const std::vector<float>>(in, in + count * size());
    std::unique_lock lk(w_->mu);
    Inputs ins = post({"reduce_scatter", count, -1}, std::move(mine), lk).in;
    lk.unlock();
    if (count > 0) reduce_rank_order(offset(ins, rank_ * count), count, op, out);
  }

  void broadcast(float* data, std::size_t count, int root) override {
    check_rank(root, "broadcast root");
    auto mine = rank_ == root ? std::make_shared<const std::vector<float>>(data, data + count) : nullptr;
    std::unique_lock lk(w_->mu);
    auto src = post({"broadcast", count, root}, std::move(mine), lk).in[root];
    lk.unlock();
    if (rank_ != root) std::copy(src->begin(), src->end(), data);
  }

  void send(const float* data, std::size_t count, int peer, int tag) override {
    check_rank(peer, "send peer");
    std::vector<float> msg(data, data + count);
    std::unique_lock lk(w_->mu);
    check_failed("send");
    w_->mail[{g_->id, rank_, peer, tag}].push_back(std::move(msg));
    w_->cv_of(g_->world_ranks[peer]).notify_all();
  }

  void recv(float* data, std::size_t count, int peer, int tag) override {
    check_rank(peer, "recv peer");
    std::unique_lock lk(w_->mu);
    auto& q = w_->mail[{g_->id, peer, rank_, tag}];
    auto deadline = Clock::now() + w_->timeout;
    while (q.empty()) {
      check_failed("recv");
      if (w_->exited[g_->world_ranks[peer]])
        fail("recv from " + who(peer) + " tag " + std::to_string(tag) + ": the peer exited without sending");
      if (my_cv().wait_until(lk, deadline) == std::cv_status::timeout && q.empty())
        fail("recv from " + who(peer) + " tag " + std::to_string(tag) + ": nothing arrived within " + timeout_text());
    }
    std::vector<float> msg = std::move(q.front());
    q.pop_front();
    lk.unlock();
    if (msg.size() != count)
      fail("recv from " + who(peer) + " tag " + std::to_string(tag) + ": expected " + std::to_string(count) +
           " floats, the message has " + std::to_string(msg.size()));
    std::copy(msg.begin(), msg.end(), data);
  }

  void barrier() override {
    std::unique_lock lk(w_->mu);
    post({"barrier", 0, -1}, nullptr, lk);
  }

  std::unique_ptr<Comm> split(int color, int key) override {
    std::unique_lock lk(w_->mu);
    Slots& s = post({"split", 0, -1}, nullptr, lk, {color, key});
    // Members of my color, ordered by (key, parent rank) as MPI_Comm_split orders them.
    std::vector<std::pair<int, int>> members;  // (key, parent rank)
    for (int k = 0; k < size(); ++k) {
      auto ck = s.colors[k];
      if (color >= 0 && ck.first == color) members.push_back({ck.second, k});
    }
    std::sort(members.begin(), members.end());
    int split_no = splits_done_++;
    std::unique_ptr<Comm> result;
    if (color >= 0) {
      auto& slot = w_->splits[{g_->id, split_no, color}];
      if (!slot.group) {
        slot.group = std::make_shared<Group>();
        slot.group->id = w_->next_group_id++;
        for (auto& m : members) slot.group->world_ranks.push_back(g_->world_ranks[m.second]);
        init_slots(*slot.group);
      }
      int new_rank = static_cast<int>(std::find_if(members.begin(), members.end(),
                                                   [&](auto& m) { return m.second == rank_; }) - members.begin());
      result = std::make_unique<ThreadComm>(w_, slot.group, new_rank);
      if (++slot.taken == static_cast<int>(members.size())) w_->splits.erase({g_->id, split_no, color});
    }
    return result;
  }

  static void init_slots(Group& g) {
    g.here.assign(g.size(), 0);
    for (Slots& s : g.slots) {
      s.in.assign(g.size(), nullptr);
      s.scratch.assign(g.size(), nullptr);
      s.calls.assign(g.size(), {});
      s.colors.assign(g.size(), {});
    }
  }

 private:
  // Posts this member's call and input, waits for all members, and checks they called the same thing.
  // Callers copy what they need from the returned slots before their next rendezvous: the slots are
  // rewritten two rendezvous later, which no member can reach before this one arrives at the next.
  Slots& post(const Call& call, std::shared_ptr<const std::vector<float>> in, std::unique_lock<std::mutex>& lk,
              std::pair<int, int> color = {}) {
    Slots& s = g_->slots[g_->generation % 2];
    s.calls[rank_] = call;
    s.in[rank_] = std::move(in);
    s.colors[rank_] = color;
    rendezvous(lk, call.op);
    for (int k = 0; k < size(); ++k)
      if (!(s.calls[k] == call))
        fail("collective mismatch in a group of " + std::to_string(size()) + ": " + who(rank_) + " called " +
             describe(call) + ", " + who(k) + " called " + describe(s.calls[k]));
    return s;
  }

  // Arrives at the group's rendezvous and waits until every member has arrived.
  void rendezvous(std::unique_lock<std::mutex>& lk, const char* what) {
    Group& g = *g_;
    std::uint64_t gen = g.generation;
    g.here[rank_] = 1;
    if (++g.arrived == g.size()) {
      g.arrived = 0;
      std::fill(g.here.begin(), g.here.end(), 0);
      ++g.generation;
      for (int k = 0; k < g.size(); ++k)
        if (k != rank_) w_->cv_of(g.world_ranks[k]).notify_all();
      return;
    }
    auto deadline = Clock::now() + w_->timeout;
    // On failure this member withdraws its arrival, so a late peer cannot complete the rendezvous with it.
    auto leave = [&](const std::string& msg) {
      --g.arrived;
      g.here[rank_] = 0;
      fail(msg);
    };
    while (g.generation == gen) {
      if (w_->failed_rank >= 0) leave(failed_text(what));
      for (int k = 0; k < g.size(); ++k)
        if (!g.here[k] && w_->exited[g.world_ranks[k]]) leave(std::string(what) + ": " + who(k) + " exited before joining it");
      if (my_cv().wait_until(lk, deadline) == std::cv_status::timeout && g.generation == gen) {
        std::string missing;
        for (int k = 0; k < g.size(); ++k)
          if (!g.here[k]) missing += (missing.empty() ? "" : ", ") + who(k);
        leave(std::string(what) + ": waited " + timeout_text() + " for " + missing);
      }
    }
  }

  std::string failed_text(const char* what) const {
    return "rank " + std::to_string(w_->failed_rank) + " failed: " + w_->failure + " (" + who(rank_) +
           " stopped in " + what + ")";
  }
  void check_failed(const char* what) const {
    if (w_->failed_rank >= 0) throw CommError(failed_text(what));
  }
  void check_rank(int r, const char* what) const {
    if (r < 0 || r >= size())
      throw CommError(std::string(what) + " " + std::to_string(r) + " is outside the group of " +
                      std::to_string(size()));
  }
  [[noreturn]] void fail(const std::string& msg) const { throw CommError(msg); }
  std::condition_variable& my_cv() const { return w_->cv_of(g_->world_ranks[rank_]); }
  std::string who(int group_rank) const {
    int wr = g_->world_ranks[group_rank];
    return "rank " + std::to_string(wr) + (g_->id == 0 ? "" : " (group rank " + std::to_string(group_rank) + ")");
  }
  std::string timeout_text() const { return std::to_string(w_->timeout.count()) + " ms"; }

  std::shared_ptr<World> w_;
  std::shared_ptr<Group> g_;
  int rank_;
  int splits_done_ = 0;
};

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

void run_threads(int world, const std::function<void(Comm&)>& fn, const ThreadCommOptions& opts) {
  if (world < 1) throw CommError("run_threads: world size must be >= 1, got " + std::to_string(world));
  auto w = std::make_shared<World>();
  w->timeout = opts.timeout;
  w->world = world;
  w->cv = std::make_unique<std::condition_variable[]>(static_cast<std::size_t>(world));
  w->exited.assign(world, 0);
  auto g = std::make_shared<Group>();
  g->world_ranks.resize(world);
  std::iota(g->world_ranks.begin(), g->world_ranks.end(), 0);
  ThreadComm::init_slots(*g);

  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::exception_ptr err;
      try {
        ThreadComm comm(w, g, r);
        fn(comm);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard lk(w->mu);
      w->exited[r] = 1;
      if (err) {
        errors[r] = err;
        if (w->failed_rank < 0) {
          w->failed_rank = r;
          w->failure = what_of(err);
        }
      }
      w->wake_all();  // its peers' waits check who exited and who failed
    });
  }
  for (auto& t : threads) t.join();
  if (w->failed_rank >= 0) std::rethrow_exception(errors[w->failed_rank]);
}

}  // namespace tessel::rt
