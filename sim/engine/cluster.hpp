// Where the simulated ranks sit and which links they share. A "position" is one (pp, dp, cp) coordinate:
// the tp ranks of one stage do identical work at the same time, so one position stands for its tp GPUs,
// with its TP collectives inside its compute ops (blocking, as Megatron-LM runs them) and its links the
// aggregate of its tp GPUs' links (each GPU has its own NVLink ports and NIC, so a folded transfer is tp
// identical transfers in parallel, one per GPU; capacity 1 = one flow at full rate).
// Positions are numbered in Megatron's order with tp folded: cp fastest, then dp, then pp.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/layout.hpp"
#include "sim/system.hpp"

namespace tessel::engine {

enum class Fidelity {
  cluster,  // every (pp, dp, cp) position of the job
  replica,  // one data-parallel replica; the other replicas' identical traffic is counted on shared links
};
const char* to_string(Fidelity f);

class Cluster {
 public:
  Cluster(const Layout& l, const System& sys, Fidelity f);

  int num_positions() const { return static_cast<int>(pp_.size()); }
  int pp_of(int pos) const { return pp_[static_cast<std::size_t>(pos)]; }
  int dp_of(int pos) const { return dp_[static_cast<std::size_t>(pos)]; }
  int cp_of(int pos) const { return cp_[static_cast<std::size_t>(pos)]; }
  int position(int pp, int dp, int cp) const;  // dp must be 0 in replica fidelity
  int global_rank(int pos) const;              // Megatron rank of the position's tp rank 0
  int node_of(int pos) const;
  bool same_node(int a, int b) const;          // a transfer between them stays on NVLink
  int replicas() const { return replicas_; }   // dp replicas simulated
  Fidelity fidelity() const { return fidelity_; }

  // Links of a transfer between two positions, and of a collective among `members` whose full group (all
  // replicas) spans global ranks [first_rank, last_rank]. Appended to `out`.
  void p2p_links(int a, int b, std::vector<std::uint32_t>& out) const;
  void group_links(const std::vector<int>& members, int first_rank, int last_rank, std::vector<std::uint32_t>& out) const;
  const std::vector<double>& link_capacity() const { return capacity_; }
  // The system without the static oversubscription factor: the core link models it explicitly.
  const System& flat_system() const { return flat_sys_; }

 private:
  void add_core(int first_rank, int last_rank, std::vector<std::uint32_t>& out) const;
  Layout l_;
  System flat_sys_;
  Fidelity fidelity_;
  int replicas_ = 1;
  int gpn_ = 8, pod_gpus_ = 0;
  std::vector<int> pp_, dp_, cp_;
  std::vector<double> capacity_;  // [nvlink per position][nic per position][core per pod]
  int num_pods_ = 0;
};

}  // namespace tessel::engine
