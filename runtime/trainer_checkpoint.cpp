#include "runtime/trainer_checkpoint.hpp"

#include <algorithm>

#include "models/util/error.hpp"
#include "runtime/checkpoint/checkpoint.hpp"

namespace tessel::rt {

namespace {

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
  t.optimizer().full_moments(m, v);
  t.optimizer().materialize_params();  // ZeRO-3: every rank writes from full parameters
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
  t.optimizer().release_params();
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
  std::vector<float> m(st.flat_data().size(), 0.0f), v(m.size(), 0.0f);
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
    std::copy(mm.begin(), mm.end(), m.begin() + static_cast<long>(p.offset));
    std::copy(vv.begin(), vv.end(), v.begin() + static_cast<long>(p.offset));
  }
  o.load_moments(m, v);  // each rank keeps its shard of them
  o.params_loaded();
  o.set_steps_done(static_cast<int>(meta.at("step").get<std::int64_t>()));
}

}  // namespace tessel::rt
