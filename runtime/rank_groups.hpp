// Where a world rank sits in the layout and its communicators per parallel dimension.
// Rank order (Megatron-LM's default "tp-dp-pp": tensor ranks adjacent, so a node holds whole TP groups):
//   world = tp_rank + tp * (dp_rank + dp * pp_rank).
#pragma once

#include <memory>

#include "runtime/comm/comm.hpp"
#include "sim/layout.hpp"

namespace tessel::rt {

struct RankCoords {
  int tp = 0, pp = 0, dp = 0;
  int etp = 0, ep = 0, edp = 0;  // expert tensor-parallel rank, expert-parallel rank, expert data-parallel replica
};

// Megatron-Core's parallel folding: a stage's tp x dp GPUs, numbered i = tp_rank + tp * dp_rank, are also
// etp x ep x edp for the experts, etp fastest: etp rank i % etp, ep rank (i / etp) % ep, edp rank
// i / (etp ep). With etp 1 (Layout::expert_tp) the experts are whole on their ep rank.
void expert_coords(RankCoords& c, const Layout& l);

RankCoords coords_of(int world_rank, const Layout& l);
int world_rank_of(const RankCoords& c, const Layout& l);

struct RankGroups {
  Comm* world = nullptr;
  std::unique_ptr<Comm> tp, pp, dp;  // every member of the world calls split in the same order
  // Mixture of experts only (null otherwise): the ep ranks that exchange tokens, the etp ranks that split
  // each of their experts' FFN (gathering their tokens before it and reduce-scattering after), and the edp
  // replicas of this rank's expert shards, which reduce their gradients (tp x dp / (etp ep) GPUs: they saw
  // different tokens).
  std::unique_ptr<Comm> ep, etp, edp;
  RankCoords at;
};

// Collective over the world: every rank must call it. Throws InputError when the world size differs from
// the layout's GPU count (tp * pp * dp; cp must be 1 on this runtime).
// experts: also split the ep and edp groups (a mixture-of-experts model).
RankGroups make_groups(Comm& world, const Layout& l, bool experts = false);

}  // namespace tessel::rt
