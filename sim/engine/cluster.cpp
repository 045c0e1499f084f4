#include "sim/engine/cluster.hpp"

#include <algorithm>

#include "util/error.hpp"

namespace tessel::engine {

const char* to_string(Fidelity f) { return f == Fidelity::cluster ? "cluster" : "replica"; }

Cluster::Cluster(const Layout& l, const System& sys, Fidelity f) : l_(l), flat_sys_(sys), fidelity_(f) {
  replicas_ = f == Fidelity::cluster ? l.dp : 1;
  gpn_ = std::max(1, sys.node.gpus_per_node);
  pod_gpus_ = sys.net.pod_gpus > 0 && sys.net.oversubscription > 1.0 ? sys.net.pod_gpus : 0;
  flat_sys_.net.pod_gpus = 0;
  flat_sys_.net.oversubscription = 1.0;
  for (int r = 0; r < l.pp; ++r)
    for (int d = 0; d < replicas_; ++d)
      for (int c = 0; c < l.cp; ++c) {
        pp_.push_back(r);
        dp_.push_back(d);
        cp_.push_back(c);
      }
  const int n = num_positions();
  capacity_.assign(2 * static_cast<std::size_t>(n), 1.0);
  if (pod_gpus_ > 0) {
    // Core above each pod: its uplinks carry 1/oversubscription of the pod's NIC bandwidth. In units of one
    // position's NIC: (positions in the pod) / o. With one replica simulated, only this replica's positions
    // in the pod are counted: the others send the same flows at the same time and take their share.
    num_pods_ = (l.gpus() + pod_gpus_ - 1) / pod_gpus_;
    std::vector<double> in_pod(static_cast<std::size_t>(num_pods_), 0.0);
    for (int p = 0; p < n; ++p) in_pod[static_cast<std::size_t>(global_rank(p) / pod_gpus_)] += 1.0;
    for (double k : in_pod) capacity_.push_back(std::max(1.0, k) / sys.net.oversubscription);
  }
}

int Cluster::position(int pp, int dp, int cp) const {
  TESSEL_CHECK(dp < replicas_, "dp " << dp << " in " << to_string(fidelity_) << " fidelity");
  return cp + l_.cp * (dp + replicas_ * pp);
}

int Cluster::global_rank(int pos) const { return l_.tp * (cp_of(pos) + l_.cp * (dp_of(pos) + l_.dp * pp_of(pos))); }

int Cluster::node_of(int pos) const { return global_rank(pos) / gpn_; }

void Cluster::add_core(int first_rank, int last_rank, std::vector<std::uint32_t>& out) const {
  if (pod_gpus_ == 0 || first_rank / pod_gpus_ == last_rank / pod_gpus_) return;
  const auto base = static_cast<std::uint32_t>(2 * num_positions());
  for (int pod = first_rank / pod_gpus_; pod <= last_rank / pod_gpus_ && pod < num_pods_; ++pod)
    out.push_back(base + static_cast<std::uint32_t>(pod));
}

bool Cluster::same_node(int a, int b) const { return node_of(a) == node_of(b) && l_.tp <= gpn_; }

void Cluster::p2p_links(int a, int b, std::vector<std::uint32_t>& out) const {
  const auto n = static_cast<std::uint32_t>(num_positions());
  const bool intra = same_node(a, b);
  const std::uint32_t off = intra ? 0 : n;
  out.push_back(off + static_cast<std::uint32_t>(a));
  out.push_back(off + static_cast<std::uint32_t>(b));
  if (!intra) add_core(std::min(global_rank(a), global_rank(b)), std::max(global_rank(a), global_rank(b)), out);
}

void Cluster::group_links(const std::vector<int>& members, int first_rank, int last_rank,
                          std::vector<std::uint32_t>& out) const {
  const auto n = static_cast<std::uint32_t>(num_positions());
  const bool intra = first_rank / gpn_ == last_rank / gpn_;
  for (int m : members) out.push_back((intra ? 0 : n) + static_cast<std::uint32_t>(m));
  if (!intra) add_core(first_rank, last_rank, out);
}

}  // namespace tessel::engine
