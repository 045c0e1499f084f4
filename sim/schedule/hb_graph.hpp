// Internal: where every op of a schedule sits, its data dependencies, and the happens-before graph that
// both the deadlock check (a cycle) and the unit-cost simulation (longest path) are read from.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "sim/schedule/schedule.hpp"

namespace tessel::sched::detail {

struct OpRef {
  int rank = -1;
  int pos = -1;  // index in the rank's list (OVERLAP sub-actions share their parent's position)
};

// Multiset of ops by (type, stage, mb); comm ops are keyed by their own token stage.
class OpIndex {
 public:
  explicit OpIndex(const Schedule& s);
  const std::vector<OpRef>& find(ActionType t, int stage, int mb) const;
  const std::map<std::tuple<int, int, int>, std::vector<OpRef>>& all() const { return ops_; }

 private:
  std::map<std::tuple<int, int, int>, std::vector<OpRef>> ops_;
  std::vector<OpRef> none_;
};

// One data dependency of a compute op: the producer op and, for cross-rank edges, the comm tokens that
// carry it (SEND on the producer's rank, RECV on the consumer's).
struct Dep {
  ActionType producer_type;
  int producer_stage;
  int mb;
  bool cross_rank;
  ActionType send_type, recv_type;
  int send_stage, recv_stage;
};
// Dependencies of one (non-overlap) compute action; requires a complete index for the B-or-I choice.
std::vector<Dep> deps_of(const Schedule& s, const OpIndex& idx, const Action& a);

// "rank 1 #4 '1F3'": #4 is the action's index in its rank's list, from 0, idle cells not counted; a schedule
// read from a file adds where it is there: "rank 1 #4 '1F3' (line 2 cell 6)".
std::string where(const Schedule& s, OpRef ref);
std::string file_position(const Schedule& s, OpRef ref);  // " (line 2 cell 6)", or "" when not from a file

struct HbGraph {
  int num_nodes = 0;
  struct Edge { int from, to; double w; };
  std::vector<Edge> edges;
  std::vector<OpRef> node_op;                // node -> op (post node 2k, done node 2k+1)
  std::vector<std::vector<int>> action_id;   // [rank][pos] -> k
  int post(int rank, int pos) const { return 2 * action_id[rank][pos]; }
  int done(int rank, int pos) const { return 2 * action_id[rank][pos] + 1; }
};

// Requires a structurally valid, complete schedule with matched send/recv (validate's earlier checks).
HbGraph build_hb_graph(const Schedule& s, const OpIndex& idx, CommModel comm, const Costs& costs);

// A cycle as the list of distinct ops on it, in wait-for order; nullopt when the graph is acyclic.
std::optional<std::vector<OpRef>> find_cycle(const HbGraph& g);

// Earliest time of every node (longest path from the sources); TESSEL_CHECK on a cycle.
std::vector<double> longest_path(const HbGraph& g);

// unit_cost_simulate without the validate() pass: the schedule must be valid under `comm`.
SimResult simulate_valid(const Schedule& s, const Costs& costs, CommModel comm);

}  // namespace tessel::sched::detail
