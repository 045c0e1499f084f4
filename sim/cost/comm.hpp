// Communication cost model: collectives over a node/network topology, alpha-beta with ring and tree
// algorithms, hierarchical when a group spans nodes, bus-bandwidth factors as nccl-tests defines them
// (NVIDIA/nccl-tests doc/PERFORMANCE.md: all-reduce moves 2(n-1)/n of the buffer per rank, all-gather and
// reduce-scatter (n-1)/n, send/recv 1).
#pragma once

#include <string>

#include "sim/system.hpp"

namespace tessel::cost {

enum class Collective { all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv };
const char* to_string(Collective c);
// nccl-tests bus-bandwidth factor for n ranks.
double bus_factor(Collective c, int n);

// Seconds a measured link (node.collectives) takes to move `bytes` of a message in its bandwidth term, before
// the bus factor: bytes / bw, or in two regimes when the link has one past large_bytes (a host's buffers leave
// its caches): the bytes up to large_bytes at bw, the rest at large_bw_Bps.
double link_seconds(const LinkRate& l, double bytes);

// Where a group of ranks sits: `size` ranks, `stride` apart in the global rank order (Megatron's order
// tp-cp-dp-pp, tp fastest). From it: how many nodes it spans and how many members share a node.
struct GroupPlacement {
  int size = 1;
  int stride = 1;
  // A flat ring through every member's own NIC, without the intra-node stage (how the collectives of
  // DeepSpeed ZeRO-3 behave in Narayanan et al. Table 2; see estimate.cpp).
  bool flat = false;
  // The job's GPUs. Groups of one kind tile them in blocks of size x stride consecutive ranks (stride groups
  // interleaved in each block; Megatron's order puts every kind so), and nodes take ranks in order: where
  // neither a block nor a node divides the other, some groups straddle a node boundary (ep 64 on NVLink
  // domains of 72). 0: one group starting on a node boundary.
  long long total = 0;
};

// How a placement's groups fall on nodes of `per_node` GPUs: over every group, the fewest and the most members
// one group has on one node it touches, and the most nodes one group touches. A collective waits for its
// slowest member: the one with the fewest peers on its node sends the most over the network.
struct NodeSplit {
  int fewest = 1, most = 1, nodes = 1;
  bool inside_one_node(int size) const { return fewest >= size; }
};
NodeSplit node_split(const GroupPlacement& g, int per_node);

struct CommTime {
  double seconds = 0;
  double busbw = 0;      // achieved bus bandwidth (bytes/s) in the bandwidth term
  bool inter_node = false;
};

// DeepEP's dispatch and combine (Megatron-Core's flex token dispatcher with --moe-enable-deepep; DeepSeek-V3
// Sec. 3.2.2): a token crosses the network once per remote node holding one of its experts, to the GPU of its
// own NVLink-domain index there, which forwards it over NVLink to the experts' GPUs (the combine the reverse).
// What pricing it needs of the routing: the experts (laid out contiguously over the ep ranks), each token's
// top-k, and group-limited routing (groups of contiguous experts, the groups a token may use; 0: none).
struct DeepEpRouting {
  int experts = 0, top_k = 0, groups = 0, group_top_k = 0;
  bool enabled() const { return experts > 0; }
};
// Of the buffer of a GPU's token copies (top_k per token), the shares that cross the network and NVLink when
// the ep group spans `nodes` nodes of `per_node` members, routing balanced (every expert equally likely, and
// under group-limited routing each chosen group receiving at least one of the token's experts).
struct A2aShares {
  double network = 0, nvlink = 0;
};
A2aShares deepep_shares(const DeepEpRouting& r, int per_node, int nodes);

// `bytes` is the buffer size S as nccl-tests counts it (all-gather: the gathered output; reduce-scatter: the
// input; all-reduce: the buffer). `concurrent_groups_per_nic` > 1 when several groups' traffic leaves
// through one NIC at the same time. An all-to-all with `deepep` enabled is DeepEP's dispatch or combine.
CommTime collective_time(const System& sys, Collective c, double bytes, const GroupPlacement& g,
                         double concurrent_groups_per_nic = 1.0, const DeepEpRouting& deepep = {});
// Point-to-point between two ranks `distance` apart in global rank order.
CommTime p2p_time(const System& sys, double bytes, int distance);

// Whether some pair of a pipeline's transfers crosses a node: each of a job's `total` ranks (0: the pair
// alone) sends to the rank `distance` after it, every pair at once. Ranks r and r + distance sit on two nodes
// when a node boundary falls between them; over the job's pairs the intervals (r, r + distance] cover
// (0, total - 1], so a pair crosses when distance >= the node's GPUs or the job spans more than one node.
// The step waits for the slowest pair: the stage that receives across the boundary.
bool p2p_crosses_nodes(const System& sys, int distance, long long total);

// A collective as work: what it is, among whom, and its buffer (bytes as collective_time counts them).
struct CollectiveWork {
  Collective kind = Collective::all_reduce;
  GroupPlacement group;
  double bytes = 0;
  double seconds(const System& sys) const { return collective_time(sys, kind, bytes, group).seconds; }
};

// A collective that carries parameters or their gradients: one kind and group, bytes in proportion to the
// parameters it carries (data-parallel gradient buckets, the distributed optimizer's parameter gathers).
struct ParamCollective {
  Collective kind = Collective::all_reduce;
  GroupPlacement group;
  double bytes_per_param = 0;  // 0: the layout does not run it
  bool runs() const { return bytes_per_param > 0 && group.size > 1; }
  double bytes(double params) const { return bytes_per_param * params; }
  // 0 when it does not run or carries no parameters.
  double seconds(const System& sys, double params) const;
};

// Point-to-point work: `times` transfers of `bytes` one after the other between two ranks `distance` apart,
// as every rank of a job of `total` GPUs does at once (0: one pair). Priced as its slowest pair: over the
// network when one crosses a node (p2p_crosses_nodes).
struct TransferWork {
  double bytes = 0;
  int distance = 0;
  int times = 1;
  long long total = 0;
  double seconds(const System& sys) const;
  double seconds_within_node(const System& sys) const;  // one pair inside a node (NVLink)
  double seconds_across_nodes(const System& sys) const;  // one pair on two nodes (NICs)
};

}  // namespace tessel::cost
