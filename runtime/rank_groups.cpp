#include "runtime/rank_groups.hpp"

#include <string>

#include "util/error.hpp"

namespace tessel::rt {

RankCoords coords_of(int r, const Layout& l) {
  RankCoords c;
  c.tp = r % l.tp;
  c.dp = (r / l.tp) % l.dp;
  c.pp = r / (l.tp * l.dp);
  return c;
}

void expert_coords(RankCoords& c, const Layout& l) {
  const int i = c.tp + l.tp * c.dp, etp = l.expert_tp();
  c.etp = i % etp;
  c.ep = (i / etp) % l.ep;
  c.edp = i / (etp * l.ep);
}

int world_rank_of(const RankCoords& c, const Layout& l) { return c.tp + l.tp * (c.dp + l.dp * c.pp); }

RankGroups make_groups(Comm& world, const Layout& l, bool experts) {
  if (l.cp != 1) throw InputError("--cp " + std::to_string(l.cp) + ": context parallelism is not implemented by the CPU runtime (use cp 1)");
  if (world.size() != l.gpus())
    throw InputError("world size " + std::to_string(world.size()) + " differs from the layout's GPU count tp*pp*dp = " +
                     std::to_string(l.gpus()) + " (" + l.describe() + ")");
  RankGroups g;
  g.world = &world;
  g.at = coords_of(world.rank(), l);
  const RankCoords& c = g.at;
  g.tp = world.split(c.dp + l.dp * c.pp, c.tp);
  g.dp = world.split(c.tp + l.tp * c.pp, c.dp);
  g.pp = world.split(c.tp + l.tp * c.dp, c.pp);
  TESSEL_CHECK(g.tp->rank() == c.tp && g.dp->rank() == c.dp && g.pp->rank() == c.pp, "split gave unexpected ranks");
  if (experts) {
    expert_coords(g.at, l);
    const int etp = l.expert_tp(), edp = l.tp * l.dp / (etp * l.ep);
    TESSEL_CHECK(edp * etp * l.ep == l.tp * l.dp, "etp " << etp << " x ep " << l.ep << " does not divide tp x dp");
    // Each split's colour: the rank's other two expert coordinates and its pipeline rank.
    g.ep = world.split(c.etp + etp * (c.edp + edp * c.pp), c.ep);
    g.etp = world.split(c.ep + l.ep * (c.edp + edp * c.pp), c.etp);
    g.edp = world.split(c.etp + etp * (c.ep + l.ep * c.pp), c.edp);
    TESSEL_CHECK(g.ep->rank() == c.ep && g.etp->rank() == c.etp && g.edp->rank() == c.edp,
                 "expert split gave unexpected ranks");
  }
  return g;
}

}  // namespace tessel::rt
