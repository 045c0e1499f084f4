// Happens-before graph of a schedule. Every action k has a "post" node 2k (the rank reached it) and a
// "done" node 2k+1 (it finished). Edge weights are durations, so the longest path gives each op's
// earliest time and a cycle is a deadlock. The comm models differ only in their edges:
//   eager     send: post->done (never waits); recv done >= send post + comm
//   blocking  send and recv both finish at max(post_send, post_recv) + comm (rendezvous), and a rank
//             posts its next op only after the previous one is done
//   batched   like blocking, but a run of consecutive comm ops posts together after the op before the run,
//             and the op after the run waits for all of them (batch_isend_irecv)
#include "sim/schedule/hb_graph.hpp"

#include <algorithm>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/depth_first_search.hpp>
#include <boost/graph/topological_sort.hpp>

#include "util/error.hpp"

namespace tessel::sched::detail {

namespace {

using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;

void index_action(std::map<std::tuple<int, int, int>, std::vector<OpRef>>& ops, const Action& a, OpRef ref) {
  if (a.type == ActionType::OVERLAP_F_B) {
    for (const auto& sub : a.sub) index_action(ops, sub, ref);
    return;
  }
  ops[{static_cast<int>(a.type), a.stage, a.mb}].push_back(ref);
}

}  // namespace

OpIndex::OpIndex(const Schedule& s) {
  for (int r = 0; r < static_cast<int>(s.ranks.size()); ++r)
    for (int i = 0; i < static_cast<int>(s.ranks[static_cast<std::size_t>(r)].size()); ++i)
      index_action(ops_, s.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)], {r, i});
}

const std::vector<OpRef>& OpIndex::find(ActionType t, int stage, int mb) const {
  auto it = ops_.find({static_cast<int>(t), stage, mb});
  return it == ops_.end() ? none_ : it->second;
}

std::vector<Dep> deps_of(const Schedule& s, const OpIndex& idx, const Action& a) {
  std::vector<Dep> out;
  const int st = a.stage, i = a.mb, last = s.num_stages - 1;
  auto local = [&](ActionType t) { out.push_back({t, st, i, false, t, t, st, st}); };
  switch (a.type) {
    case ActionType::F:
      if (st > 0)
        out.push_back({ActionType::F, st - 1, i, s.rank_of(st - 1) != s.rank_of(st), ActionType::SEND_F,
                       ActionType::RECV_F, st - 1, st});
      break;
    case ActionType::B:
    case ActionType::I:
      local(ActionType::F);
      if (st < last) {
        const ActionType prod = idx.find(ActionType::B, st + 1, i).empty() ? ActionType::I : ActionType::B;
        out.push_back({prod, st + 1, i, s.rank_of(st + 1) != s.rank_of(st), ActionType::SEND_B, ActionType::RECV_B,
                       st + 1, st});
      }
      break;
    case ActionType::W: local(ActionType::I); break;
    case ActionType::RECOMPUTE: local(ActionType::F); break;
    default: break;
  }
  return out;
}

std::string file_position(const Schedule& s, OpRef ref) {
  const auto r = static_cast<std::size_t>(ref.rank), p = static_cast<std::size_t>(ref.pos);
  if (r >= s.cells.size() || s.cells[r].size() != s.ranks[r].size()) return "";
  return " (line " + std::to_string(ref.rank + 1) + " cell " + std::to_string(s.cells[r][p]) + ")";
}

std::string where(const Schedule& s, OpRef ref) {
  return "rank " + std::to_string(ref.rank) + " #" + std::to_string(ref.pos) + " '" +
         s.ranks[static_cast<std::size_t>(ref.rank)][static_cast<std::size_t>(ref.pos)].token() + "'" + file_position(s, ref);
}

namespace {

void add_program_order(HbGraph& g, const Schedule& s, CommModel comm) {
  for (int r = 0; r < s.num_ranks; ++r) {
    const auto& acts = s.ranks[static_cast<std::size_t>(r)];
    std::vector<int> base, acc;  // batched: what a comm run posts after; the run's done nodes
    for (int p = 0; p < static_cast<int>(acts.size()); ++p) {
      const bool c = is_comm(acts[static_cast<std::size_t>(p)].type);
      if (comm == CommModel::Batched && c) {
        for (int b : base) g.edges.push_back({b, g.post(r, p), 0});
        acc.push_back(g.done(r, p));
        continue;
      }
      if (comm == CommModel::Batched) {
        for (int b : (acc.empty() ? base : acc)) g.edges.push_back({b, g.post(r, p), 0});
        base = {g.done(r, p)};
        acc.clear();
      } else if (p > 0) {
        g.edges.push_back({g.done(r, p - 1), g.post(r, p), 0});
      }
    }
  }
}

void add_comm_edges(HbGraph& g, const Schedule& s, const OpIndex& idx, CommModel comm, double c) {
  for (int r = 0; r < s.num_ranks; ++r) {
    const auto& acts = s.ranks[static_cast<std::size_t>(r)];
    for (int p = 0; p < static_cast<int>(acts.size()); ++p) {
      const Action& a = acts[static_cast<std::size_t>(p)];
      if (is_wait_send(a.type)) {
        // A wait retires its send, which completes once the receiver has posted the receive and the data
        // has moved: the wait ends after the receive's post, one transfer later.
        const bool fwd = a.type == ActionType::WAIT_SEND_F;
        const auto& rv = idx.find(fwd ? ActionType::RECV_F : ActionType::RECV_B, fwd ? a.stage + 1 : a.stage - 1, a.mb);
        if (rv.size() == 1) g.edges.push_back({g.post(rv[0].rank, rv[0].pos), g.done(r, p), c});
        continue;
      }
      if (!is_send(a.type)) continue;
      const bool fwd = a.type == ActionType::SEND_F;
      const auto& rv = idx.find(fwd ? ActionType::RECV_F : ActionType::RECV_B, fwd ? a.stage + 1 : a.stage - 1, a.mb);
      TESSEL_CHECK(rv.size() == 1, "unmatched " << a.token() << " reached the graph builder");
      const int sp = g.post(r, p), sd = g.done(r, p), rp = g.post(rv[0].rank, rv[0].pos),
                rd = g.done(rv[0].rank, rv[0].pos);
      if (comm == CommModel::Eager) {
        g.edges.push_back({sp, sd, 0});
        g.edges.push_back({sp, rd, c});
        g.edges.push_back({rp, rd, 0});
      } else {
        for (int from : {sp, rp})
          for (int to : {sd, rd}) g.edges.push_back({from, to, c});
      }
    }
  }
}

void add_data_edges(HbGraph& g, const Schedule& s, const OpIndex& idx, const Costs& costs, bool lowered) {
  auto one = [&](ActionType t, int st, int mb) { return idx.find(t, st, mb).at(0); };
  for (int r = 0; r < s.num_ranks; ++r) {
    const auto& acts = s.ranks[static_cast<std::size_t>(r)];
    for (int p = 0; p < static_cast<int>(acts.size()); ++p) {
      const Action& a = acts[static_cast<std::size_t>(p)];
      if (!is_comm(a.type)) g.edges.push_back({g.post(r, p), g.done(r, p), costs.of(a)});
      std::vector<Action> parts = a.type == ActionType::OVERLAP_F_B ? a.sub : std::vector<Action>{a};
      for (const auto& part : parts) {
        if (!is_compute(part.type)) continue;
        for (const Dep& d : deps_of(s, idx, part)) {
          const OpRef prod = one(d.producer_type, d.producer_stage, d.mb);
          if (!d.cross_rank) {
            if (prod.rank == r && prod.pos == p) continue;  // both halves of one OVERLAP_F_B
            g.edges.push_back({g.done(prod.rank, prod.pos), g.post(r, p), 0});
          } else if (!lowered) {
            g.edges.push_back({g.done(prod.rank, prod.pos), g.post(r, p), costs.comm});
          } else {
            const OpRef snd = one(d.send_type, d.send_stage, d.mb), rcv = one(d.recv_type, d.recv_stage, d.mb);
            g.edges.push_back({g.done(prod.rank, prod.pos), g.post(snd.rank, snd.pos), 0});
            g.edges.push_back({g.done(rcv.rank, rcv.pos), g.post(r, p), 0});
          }
        }
      }
    }
  }
}

Graph to_boost(const HbGraph& g) {
  Graph bg(static_cast<std::size_t>(g.num_nodes));
  for (const auto& e : g.edges) boost::add_edge(static_cast<std::size_t>(e.from), static_cast<std::size_t>(e.to), bg);
  return bg;
}

// Records DFS tree parents and the first back edge, which closes a cycle.
struct CycleVisitor : boost::default_dfs_visitor {
  std::vector<std::size_t>* parent;
  std::optional<std::pair<std::size_t, std::size_t>>* back;
  void tree_edge(Graph::edge_descriptor e, const Graph& g) const { (*parent)[boost::target(e, g)] = boost::source(e, g); }
  void back_edge(Graph::edge_descriptor e, const Graph& g) const {
    if (!*back) *back = std::make_pair(boost::source(e, g), boost::target(e, g));
  }
};

}  // namespace

HbGraph build_hb_graph(const Schedule& s, const OpIndex& idx, CommModel comm, const Costs& costs) {
  HbGraph g;
  bool lowered = false;
  g.action_id.resize(static_cast<std::size_t>(s.num_ranks));
  for (int r = 0; r < s.num_ranks; ++r)
    for (int p = 0; p < static_cast<int>(s.ranks[static_cast<std::size_t>(r)].size()); ++p) {
      g.action_id[static_cast<std::size_t>(r)].push_back(static_cast<int>(g.node_op.size() / 2));
      g.node_op.push_back({r, p});
      g.node_op.push_back({r, p});
      lowered = lowered || is_comm(s.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(p)].type);
    }
  g.num_nodes = static_cast<int>(g.node_op.size());
  add_program_order(g, s, comm);
  add_comm_edges(g, s, idx, comm, costs.comm);
  add_data_edges(g, s, idx, costs, lowered);
  return g;
}

std::optional<std::vector<OpRef>> find_cycle(const HbGraph& g) {
  Graph bg = to_boost(g);
  const std::size_t n = boost::num_vertices(bg), none = n;
  std::vector<std::size_t> parent(n, none);
  std::optional<std::pair<std::size_t, std::size_t>> back;
  CycleVisitor vis;
  vis.parent = &parent;
  vis.back = &back;
  std::vector<boost::default_color_type> color(n);
  boost::depth_first_search(bg, vis, boost::make_iterator_property_map(color.begin(), boost::get(boost::vertex_index, bg)));
  if (!back) return std::nullopt;
  // back edge u -> v with v an ancestor of u: the cycle is v -> ... -> u -> v.
  std::vector<std::size_t> path;
  for (std::size_t x = back->first; x != back->second && x != none; x = parent[x]) path.push_back(x);
  path.push_back(back->second);
  std::reverse(path.begin(), path.end());
  std::vector<OpRef> ops;
  for (std::size_t x : path) {
    const OpRef ref = g.node_op[x];
    if (ops.empty() || ops.back().rank != ref.rank || ops.back().pos != ref.pos) ops.push_back(ref);
  }
  return ops;
}

std::vector<double> longest_path(const HbGraph& g) {
  Graph bg = to_boost(g);
  std::vector<std::size_t> order;
  bool dag = true;
  try {
    boost::topological_sort(bg, std::back_inserter(order));
  } catch (const boost::not_a_dag&) {
    dag = false;  // a caller skipped validate() on a schedule that deadlocks
  }
  TESSEL_CHECK(dag, "longest_path on a happens-before graph with a cycle (the schedule deadlocks; validate() names it)");
  std::reverse(order.begin(), order.end());
  std::vector<std::vector<std::pair<int, double>>> out(static_cast<std::size_t>(g.num_nodes));
  for (const auto& e : g.edges) out[static_cast<std::size_t>(e.from)].push_back({e.to, e.w});
  std::vector<double> t(static_cast<std::size_t>(g.num_nodes), 0.0);
  for (std::size_t u : order)
    for (const auto& [v, w] : out[u]) t[static_cast<std::size_t>(v)] = std::max(t[static_cast<std::size_t>(v)], t[u] + w);
  return t;
}

}  // namespace tessel::sched::detail
