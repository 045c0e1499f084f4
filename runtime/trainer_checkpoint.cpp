#include "runtime/trainer_checkpoint.hpp"

#include <algorithm>

#include "models/util/error.hpp"
#include "runtime/checkpoint/checkpoint.hpp"

namespace tessel::rt {

namespace {

// Full-flat Adam moments on every dp rank (ZeRO keeps a 1/dp slice of the flat buffer per rank).
void full_moments(Trainer& t, std::vector<float>& m, std::vector<float>& v) {
  DistributedOptimizer& o = t.optimizer();
  const std::size_t n = t.params().flat_data().size();
  if (o.shard_begin() == 0 && o.shard_end() == n) {
    m = o.exp_avg();
    v = o.exp_avg_sq();
    return;
  }
  const std::size_t shard = o.shard_end() - o.shard_begin();
  const int dp = t.groups().dp->size();
  for (auto* pair : {&m, &v}) {
    std::vector<float> all(shard * static_cast<std::size_t>(dp));
    t.groups().dp->all_gather((pair == &m ? o.exp_avg() : o.exp_avg_sq()).data(), all.data(), shard);
    all.resize(n);
    *pair = std::move(all);
  }
}

bool owns_copy(Trainer& t, const Param& p) {
  const RankCoords& c = t.groups().at;
  if (c.dp != 0) return false;
  if (p.spec.shard_dim == -1 && c.tp != 0) return false;
  // The tied embedding also lives on the last stage's rank: the first stage's copy is the one saved.
  if (p.spec.name == "embed.tok" && t.schedule().rank_of(0) != c.pp) return false;
  return true;
}

}  // namespace

void save_checkpoint(Trainer& t, const std::string& dir, std::uint64_t seed) {
  std::vector<float> m, v;
  full_moments(t, m, v);
  CheckpointWriter w(dir, t.steps_done(), *t.groups().world);
  ParamStore& st = t.params();
  for (const Param& p : st.params()) {
    if (!owns_copy(t, p)) continue;
    const Shape full{static_cast<std::uint64_t>(p.spec.rows), static_cast<std::uint64_t>(p.spec.cols)};
    const Shape off{static_cast<std::uint64_t>(p.row0), static_cast<std::uint64_t>(p.col0)};
    const Shape ext{static_cast<std::uint64_t>(p.rows), static_cast<std::uint64_t>(p.cols)};
    w.add_tensor(p.spec.name, full, off, ext, st.data(p));
    w.add_tensor("optim.exp_avg." + p.spec.name, full, off, ext, m.data() + p.offset);
    w.add_tensor("optim.exp_avg_sq." + p.spec.name, full, off, ext, v.data() + p.offset);
  }
  Json meta;
  meta["step"] = t.steps_done();
  meta["seed"] = seed;
  meta["format"] = "tessel-cpu-runtime-1";
  meta["model"] = model_to_json(t.model());
  meta["layout"] = layout_to_json(t.layout());
  w.set_metadata(meta);
  w.commit();
}

void load_checkpoint(Trainer& t, const std::string& dir, std::uint64_t seed) {
  CheckpointReader r(dir);
  const Json& meta = r.metadata();
  if (!meta.contains("seed") || meta["seed"].get<std::uint64_t>() != seed)
    throw InputError("--resume " + dir + ": checkpoint was trained with seed " +
                     (meta.contains("seed") ? meta["seed"].dump() : std::string("?")) + ", this run uses " +
                     std::to_string(seed) + " (the data stream depends on it)");
  ParamStore& st = t.params();
  DistributedOptimizer& o = t.optimizer();
  for (const Param& p : st.params()) {
    if (!r.has_tensor(p.spec.name))
      throw InputError("--resume " + dir + ": no tensor " + p.spec.name + " (checkpoint of another model?)");
    const Shape& full = r.shape(p.spec.name);
    if (full != Shape{static_cast<std::uint64_t>(p.spec.rows), static_cast<std::uint64_t>(p.spec.cols)})
      throw InputError("--resume " + dir + ": tensor " + p.spec.name + " has another shape than this model's");
    const Shape off{static_cast<std::uint64_t>(p.row0), static_cast<std::uint64_t>(p.col0)};
    const Shape ext{static_cast<std::uint64_t>(p.rows), static_cast<std::uint64_t>(p.cols)};
    const auto d = r.read_slice(p.spec.name, off, ext);
    std::copy(d.begin(), d.end(), st.data(p));
    const auto mm = r.read_slice("optim.exp_avg." + p.spec.name, off, ext);
    const auto vv = r.read_slice("optim.exp_avg_sq." + p.spec.name, off, ext);
    // Keep the part of this parameter inside the rank's optimizer shard.
    for (std::size_t i = 0; i < p.size(); ++i) {
      const std::size_t flat = p.offset + i;
      if (flat < o.shard_begin() || flat >= o.shard_end()) continue;
      o.exp_avg()[flat - o.shard_begin()] = mm[i];
      o.exp_avg_sq()[flat - o.shard_begin()] = vv[i];
    }
  }
  o.set_steps_done(static_cast<int>(meta.at("step").get<std::int64_t>()));
}

}  // namespace tessel::rt
