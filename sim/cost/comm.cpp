#include "sim/cost/comm.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tessel::cost {

const char* to_string(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::all_gather: return "all_gather";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_to_all: return "all_to_all";
    case Collective::broadcast: return "broadcast";
    case Collective::send_recv: return "send_recv";
  }
  return "?";
}

double bus_factor(Collective c, int n) {
  if (n <= 1) return 0.0;
  const double r = static_cast<double>(n - 1) / n;
  switch (c) {
    case Collective::all_reduce: return 2.0 * r;
    case Collective::all_gather:
    case Collective::reduce_scatter:
    case Collective::all_to_all: return r;
    case Collective::broadcast:
    case Collective::send_recv: return 1.0;
  }
  return 1.0;
}

namespace {

// Latency term: a ring takes n-1 steps per phase (2 phases for all-reduce); a tree log2(n). NCCL picks the
// faster; at large sizes both are bandwidth-bound and the ring's bus bandwidth wins.
double alpha_steps(Collective c, int n) {
  const double phases = c == Collective::all_reduce ? 2.0 : 1.0;
  const double ring = phases * (n - 1);
  const double tree = phases * std::ceil(std::log2(std::max(2, n)));
  return std::min(ring, tree);
}

double inter_bw(const System& sys, int span_gpus, double sharing) {
  double bw = sys.net.nic_bw_Bps * sys.net.efficiency / std::max(1.0, sharing);
  if (sys.net.pod_gpus > 0 && span_gpus > sys.net.pod_gpus) bw /= sys.net.oversubscription;
  return bw;
}

}  // namespace

NodeSplit node_split(const GroupPlacement& g, int per_node) {
  const long long n = std::max(1, g.size), s = std::max(1, g.stride), D = std::max(1, per_node);
  NodeSplit out;
  if (g.total <= 0) {
    // One group from a node boundary: members 0, s, 2s, ...
    const long long k = std::max(1LL, std::min(n, D / s));
    const bool one = s * (n - 1) < D;
    out.fewest = out.most = static_cast<int>(one ? n : k);
    out.nodes = static_cast<int>(one ? 1 : (n + k - 1) / k);
    return out;
  }
  const long long B = n * s;
  out.fewest = static_cast<int>(n);
  out.most = 0;
  out.nodes = 0;
  // A piece of L consecutive ranks inside one block holds floor(L / s) or ceil(L / s) of each group's members
  // (each group owns one residue mod s of the block); groups with none there do not touch that node.
  auto piece = [&](long long L) {
    const long long lo = L % s == 0 ? L / s : std::max(1LL, L / s), hi = (L + s - 1) / s;
    out.fewest = static_cast<int>(std::min<long long>(out.fewest, lo));
    out.most = static_cast<int>(std::max<long long>(out.most, hi));
  };
  // Block j starts at j B; its offset within a node repeats every D / gcd(B, D) blocks.
  const long long blocks = std::max(1LL, std::min(g.total / B, D / std::gcd(B, D)));
  for (long long j = 0; j < blocks; ++j) {
    const long long a = j * B, first = a / D, last = (a + B - 1) / D;
    if (first == last) {
      piece(B);
      out.nodes = std::max(out.nodes, 1);
      continue;
    }
    const long long head = (first + 1) * D - a, tail = a + B - last * D;
    piece(head);
    piece(tail);
    if (last - first > 1) piece(D);  // whole nodes between
    // Nodes one group touches: each member its own when s >= D; otherwise every piece of s ranks or more,
    // and of a short head and a short tail both only when some residue reaches into each (head + tail > s).
    long long nodes = last - first + 1;
    if (s >= D) nodes = n;
    else if (head < s && tail < s && head + tail <= s) nodes -= 1;
    out.nodes = static_cast<int>(std::max<long long>(out.nodes, nodes));
  }
  return out;
}

namespace {
// C(a, c) / C(b, c): the chance that c picks without replacement from b items all fall among a of them.
double all_among(double a, double b, double c) {
  if (a < c) return 0.0;
  double r = 1.0;
  for (int i = 0; i < static_cast<int>(c); ++i) r *= (a - i) / (b - i);
  return r;
}
}  // namespace

A2aShares deepep_shares(const DeepEpRouting& r, int per_node, int nodes) {
  const double N = nodes, E = r.experts, k = r.top_k, G = r.groups, M = r.group_top_k;
  // The nodes a token's experts are on, in expectation. Without group limits: k experts of E, E / N a node.
  // Group-limited (DeepSeek: 8 groups, 4 per token): the token's experts lie in M of the G groups; with whole
  // groups on each node (G a multiple of N) the nodes hit are those of its groups; with groups spanning
  // several nodes (N a multiple of G) its k experts fall among the M N / G nodes of its groups.
  double hit = N * (1.0 - all_among(E - E / N, E, k));
  if (G > 1 && M > 0 && k >= M) {
    if (static_cast<int>(G) % nodes == 0) {
      hit = N * (1.0 - all_among(G - G / N, G, M));
    } else if (nodes % static_cast<int>(G) == 0) {
      const double pool = M * E / G, pool_nodes = M * N / G;
      hit = pool_nodes * (1.0 - all_among(pool - E / N, pool, k));
    }
  }
  A2aShares out;
  out.network = hit * (1.0 - 1.0 / N) / k;  // the token's own node is among them with chance hit / N
  out.nvlink = static_cast<double>(per_node - 1) / per_node;  // every copy fans out inside its node
  return out;
}

double link_seconds(const LinkRate& l, double bytes) {
  if (!(l.large_bytes > 0 && l.large_bw_Bps > 0) || bytes <= l.large_bytes) return bytes / l.bw_Bps;
  return l.large_bytes / l.bw_Bps + (bytes - l.large_bytes) / l.large_bw_Bps;
}

CommTime collective_time(const System& sys, Collective c, double bytes, const GroupPlacement& g,
                         double concurrent_groups_per_nic, const DeepEpRouting& deepep) {
  CommTime out;
  const int n = g.size;
  if (n <= 1 || bytes <= 0) return out;
  const int gpn = sys.node.gpus_per_node;
  const long long span = static_cast<long long>(g.stride) * (n - 1) + 1;  // global ranks covered
  const double intra_bw_Bps = sys.node.intra_bw_Bps * sys.node.intra_efficiency;
  const NodeSplit split = node_split(g, gpn);
  if (split.inside_one_node(n)) {
    // Every group of this kind inside one NVLink domain.
    // A profile that measured this collective apart (node.collectives) prices it on that link.
    const LinkRate& own = sys.node.collective[static_cast<std::size_t>(c)];
    const double lat = own.bw_Bps > 0 ? own.latency_s : sys.node.intra_latency_s;
    const double move = own.bw_Bps > 0 ? link_seconds(own, bytes) : bytes / intra_bw_Bps;
    out.busbw = bytes / move;
    out.seconds = (alpha_steps(c, n) * lat + bus_factor(c, n) * move) * sys.gpu.time_factor[idx(CostKind::comm)];
    return out;
  }
  if (g.flat) {
    out.inter_node = true;
    const double bw = inter_bw(sys, static_cast<int>(std::min<long long>(span, 1LL << 30)), concurrent_groups_per_nic);
    out.seconds = alpha_steps(c, n) * sys.net.latency_s + bus_factor(c, n) * bytes / bw;
    out.busbw = bw;
    return out;
  }
  if (c == Collective::all_to_all) {
    // NCCL's all-to-all is a grouped send to every peer and a receive from every peer (nccl-tests'
    // alltoall.cu), with no intra-node stage: of a rank's buffer, the share for its k - 1 node peers crosses
    // NVLink while the share for the n - k members elsewhere leaves through its own NIC, at the same time.
    // (A hierarchical model, as for all-gather, would send only 1/k of the buffer over the network: an
    // expert-parallel group over two nodes sends half of it.)
    // The slowest member is the one with the fewest node peers (most over the network); NVLink carries
    // most for the one with the most (a group straddling a node boundary has both).
    const double bw_net = inter_bw(sys, static_cast<int>(std::min<long long>(span, 1LL << 30)), concurrent_groups_per_nic);
    const LinkRate& own = sys.node.collective[static_cast<std::size_t>(c)];
    // DeepEP: a token once over the network per remote node it needs, then fanned out over NVLink, the two
    // stages pipelined (DeepEP's normal kernels).
    const A2aShares shares =
        deepep.enabled() ? deepep_shares(deepep, split.most, split.nodes)
                         : A2aShares{static_cast<double>(n - split.fewest) / n, static_cast<double>(split.most - 1) / n};
    const double intra = shares.nvlink * bytes / (own.bw_Bps > 0 ? own.bw_Bps : intra_bw_Bps);
    const double inter = shares.network * bytes / bw_net;
    out.inter_node = true;
    out.seconds = sys.node.intra_latency_s + sys.net.latency_s + std::max(intra, inter);
    out.busbw = bus_factor(c, n) * bytes / out.seconds;
    return out;
  }
  // Hierarchical: k members per node, N nodes. Intra-node phase over NVLink on the full buffer, then the
  // inter-node phase over the k NICs of each node in parallel, each carrying 1/k of the buffer. A group
  // straddling node boundaries has nodes with fewer members: their NICs carry more each, and set the pace.
  const int k = split.most, nodes = split.nodes;
  out.inter_node = true;
  const double bw_net = inter_bw(sys, static_cast<int>(std::min<long long>(span, 1LL << 30)), concurrent_groups_per_nic);
  double t = 0;
  if (k > 1) t += alpha_steps(c, k) * sys.node.intra_latency_s + bus_factor(c, k) * bytes / intra_bw_Bps;
  t += alpha_steps(c, nodes) * sys.net.latency_s + bus_factor(c, nodes) * (bytes / split.fewest) / bw_net;
  out.seconds = t;
  out.busbw = bus_factor(c, n) * bytes / std::max(t, 1e-30);
  return out;
}

double ParamCollective::seconds(const System& sys, double params) const {
  if (!runs() || params <= 0) return 0.0;
  return collective_time(sys, kind, bytes(params), group).seconds;
}

bool p2p_crosses_nodes(const System& sys, int distance, long long total) {
  const int n = std::max(1, sys.node.gpus_per_node);
  return distance >= n || total > n;
}

double TransferWork::seconds(const System& sys) const {
  return p2p_crosses_nodes(sys, distance, total) ? seconds_across_nodes(sys) : seconds_within_node(sys);
}

double TransferWork::seconds_within_node(const System& sys) const { return times * p2p_time(sys, bytes, 0).seconds; }

double TransferWork::seconds_across_nodes(const System& sys) const {
  return times * p2p_time(sys, bytes, std::max(1, sys.node.gpus_per_node)).seconds;
}

CommTime p2p_time(const System& sys, double bytes, int distance) {
  CommTime out;
  if (bytes <= 0) return out;
  const bool inter = distance >= sys.node.gpus_per_node;
  out.inter_node = inter;
  if (inter) {
    out.busbw = sys.net.nic_bw_Bps * sys.net.efficiency;
    out.seconds = sys.net.latency_s + bytes / out.busbw;
  } else {
    const LinkRate& own = sys.node.collective[static_cast<std::size_t>(Collective::send_recv)];
    const double move = own.bw_Bps > 0 ? link_seconds(own, bytes) : bytes / (sys.node.intra_bw_Bps * sys.node.intra_efficiency);
    out.busbw = bytes / move;
    out.seconds = ((own.bw_Bps > 0 ? own.latency_s : sys.node.intra_latency_s) + move) * sys.gpu.time_factor[idx(CostKind::comm)];
  }
  return out;
}

}  // namespace tessel::cost
