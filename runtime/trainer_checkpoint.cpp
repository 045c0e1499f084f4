#include "runtime/trainer_checkpoint.hpp"

#include <algorithm>

#include "models/util/error.hpp"
#include "runtime/checkpoint/checkpoint.hpp"

namespace tessel::rt {

bool checkpoint_owns(const ParamSpec& p, const RankCoords& at, const sched::Schedule& s) {
  if (at.dp != 0) return false;
  if (p.shard_dim == -1 && at.tp != 0) return false;
  if (p.name == "embed.tok" && s.rank_of(0) != at.pp) return false;
  return true;
}

void write_checkpoint(const std::string& dir, int step, std::uint64_t seed, const Model& m, const Layout& l,
                      const std::string& runtime, Comm& world, const std::vector<CheckpointTensor>& tensors) {
  CheckpointWriter w(dir, step, world);
  for (const CheckpointTensor& t : tensors) {
    if (!t.owned) continue;
    const Shape full{static_cast<std::uint64_t>(t.spec.rows), static_cast<std::uint64_t>(t.spec.cols)};
    const Shape off{static_cast<std::uint64_t>(t.row0), static_cast<std::uint64_t>(t.col0)};
    const Shape ext{static_cast<std::uint64_t>(t.rows), static_cast<std::uint64_t>(t.cols)};
    w.add_tensor(t.spec.name, full, off, ext, t.data);
    w.add_tensor("optim.exp_avg." + t.spec.name, full, off, ext, t.exp_avg);
    w.add_tensor("optim.exp_avg_sq." + t.spec.name, full, off, ext, t.exp_avg_sq);
  }
  Json meta;
  meta["step"] = step;
  meta["seed"] = seed;
  meta["format"] = "tessel-cpu-runtime-1";  // the name of the format since the first runtime, kept for readers
  meta["runtime"] = runtime;
  meta["model"] = model_to_json(m);
  meta["layout"] = layout_to_json(l);
  w.set_metadata(meta);
  w.commit();
}

int read_checkpoint(const std::string& dir, std::uint64_t seed, const std::vector<CheckpointTensor>& tensors) {
  CheckpointReader r(dir);
  const Json& meta = r.metadata();
  if (!meta.contains("seed") || meta["seed"].get<std::uint64_t>() != seed)
    throw InputError("--resume " + dir + ": checkpoint was trained with seed " +
                     (meta.contains("seed") ? meta["seed"].dump() : std::string("?")) + ", this run uses " +
                     std::to_string(seed) + " (the data stream depends on it)");
  for (const CheckpointTensor& t : tensors) {
    if (!r.has_tensor(t.spec.name))
      throw InputError("--resume " + dir + ": no tensor " + t.spec.name + " (checkpoint of another model?)");
    const Shape& full = r.shape(t.spec.name);
    if (full != Shape{static_cast<std::uint64_t>(t.spec.rows), static_cast<std::uint64_t>(t.spec.cols)})
      throw InputError("--resume " + dir + ": tensor " + t.spec.name + " has another shape than this model's");
    const Shape off{static_cast<std::uint64_t>(t.row0), static_cast<std::uint64_t>(t.col0)};
    const Shape ext{static_cast<std::uint64_t>(t.rows), static_cast<std::uint64_t>(t.cols)};
    const auto d = r.read_slice(t.spec.name, off, ext);
    const auto mm = r.read_slice("optim.exp_avg." + t.spec.name, off, ext);
    const auto vv = r.read_slice("optim.exp_avg_sq." + t.spec.name, off, ext);
    std::copy(d.begin(), d.end(), t.data);
    std::copy(mm.begin(), mm.end(), t.exp_avg);
    std::copy(vv.begin(), vv.end(), t.exp_avg_sq);
  }
  return static_cast<int>(meta.at("step").get<std::int64_t>());
}

namespace {

// The CPU Trainer's tensors over its ParamStore and the full moment vectors m, v (flat, ParamStore order).
std::vector<CheckpointTensor> trainer_tensors(Trainer& t, std::vector<float>& m, std::vector<float>& v) {
  ParamStore& st = t.params();
  std::vector<CheckpointTensor> out;
  for (const Param& p : st.params()) {
    CheckpointTensor c;
    c.spec = p.spec;
    c.rows = p.rows;
    c.cols = p.cols;
    c.row0 = p.row0;
    c.col0 = p.col0;
    c.owned = checkpoint_owns(p.spec, t.groups().at, t.schedule());
    c.data = st.data(p);
    c.exp_avg = m.data() + p.offset;
    c.exp_avg_sq = v.data() + p.offset;
    out.push_back(c);
  }
  return out;
}

}  // namespace

void save_checkpoint(Trainer& t, const std::string& dir, std::uint64_t seed) {
  std::vector<float> m, v;
  t.optimizer().full_moments(m, v);
  t.optimizer().materialize_params();  // ZeRO-3: every rank writes from full parameters
  write_checkpoint(dir, t.steps_done(), seed, t.model(), t.layout(), "cpu", *t.groups().world,
                   trainer_tensors(t, m, v));
  t.optimizer().release_params();
}

void load_checkpoint(Trainer& t, const std::string& dir, std::uint64_t seed) {
  std::vector<float> m(t.params().flat_data().size(), 0.0f), v(m.size(), 0.0f);
  const int step = read_checkpoint(dir, seed, trainer_tensors(t, m, v));
  DistributedOptimizer& o = t.optimizer();
  o.load_moments(m, v);  // each rank keeps its shard of them
  o.params_loaded();
  o.set_steps_done(step);
}

}  // namespace tessel::rt
