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
};

RankCoords coords_of(int world_rank, const Layout& l);
int world_rank_of(const RankCoords& c, const Layout& l);

struct RankGroups {
  Comm* world = nullptr;
  std::unique_ptr<Comm> tp, pp, dp;  // every member of the world calls split in the same order
  RankCoords at;
};

// Collective over the world: every rank must call it. Throws InputError when the world size differs from
// the layout's GPU count (tp * pp * dp; cp must be 1 on this runtime).
RankGroups make_groups(Comm& world, const Layout& l);

}  // namespace tessel::rt
