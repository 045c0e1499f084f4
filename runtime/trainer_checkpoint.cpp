#include "runtime/trainer_checkpoint.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "util/error.hpp"
#include "runtime/checkpoint/checkpoint.hpp"

namespace tessel::rt {

bool checkpoint_owns(const ParamSpec& p, const RankCoords& at, const sched::Schedule& s) {
  if (p.expert >= 0) return at.edp == 0;
  if (at.dp != 0) return false;
  if (p.shard_dim == -1 && at.tp != 0) return false;
  if (p.name == "embed.tok" && s.rank_of(0) != at.pp) return false;
  return true;
}

namespace {

namespace fs = std::filesystem;

// The runtime metadata's format. "tessel-cpu-runtime-1", the first one, stored no data position or source.
constexpr const char* kFormat = "tessel-runtime-2";
// Consumed samples are bounded so that a token index (sample x seq_len, seq_len <= 2^24 by the model spec's
// limit) stays inside int64: 2^38 x 2^24 = 2^62. 2^38 is ~1000 times the samples of a 10^12-token run at
// seq_len 4096 (2.4e8).
constexpr std::int64_t kMaxConsumedSamples = std::int64_t(1) << 38;

std::string describe_source(const Json& d, std::uint64_t seed) {
  if (d.at("source") == "synthetic") return "synthetic tokens of seed " + std::to_string(seed);
  return "the file '" + d.at("name").get<std::string>() + "' of " + std::to_string(d.at("bytes").get<std::int64_t>()) +
         " bytes";
}

// Runs `load` on this rank, then agrees over `world`: returns on every rank when all succeeded; otherwise
// every rank throws the first failed rank's message (an InputError when it was one, else an internal error),
// so that no rank goes on (and says it resumed) while another failed.
template <class F>
void on_every_rank(Comm& world, F&& load) {
  std::string error;
  float kind = 0;  // 0 loaded, 1 InputError, 2 anything else
  try {
    load();
  } catch (const InputError& e) {
    error = e.what();
    kind = 1;
  } catch (const std::exception& e) {
    error = e.what();
    kind = 2;
  }
  std::vector<float> all(static_cast<std::size_t>(world.size()));
  world.all_gather(&kind, all.data(), 1);
  int failed = -1;
  for (int r = 0; r < world.size() && failed < 0; ++r)
    if (all[static_cast<std::size_t>(r)] != 0) failed = r;
  if (failed < 0) return;
  std::string why = broadcast_text(world, error, failed);
  if (world.size() > 1) why = "rank " + std::to_string(failed) + ": " + why;
  if (all[static_cast<std::size_t>(failed)] == 1) throw InputError(why);
  throw InternalError(why);
}

}  // namespace

Json data_source_json(const std::string& data_file) {
  if (data_file.empty()) return {{"source", "synthetic"}};
  std::error_code ec;
  const auto bytes = fs::file_size(data_file, ec);
  if (ec) throw InputError("--data " + data_file + ": cannot read its size: " + ec.message());
  return {{"source", "file"}, {"name", fs::path(data_file).filename().string()}, {"bytes", bytes}};
}

DataPosition check_resume(const CheckpointReader& r, const Model& m, std::uint64_t seed, const std::string& data_file) {
  const std::string where = (fs::path(r.folder()) / "meta.json").string();
  JsonObject mo(r.metadata(), where, "meta");
  const std::string format = mo.string("format");
  if (format == "tessel-cpu-runtime-1")
    mo.fail("format", "\"tessel-cpu-runtime-1\" is an older tessel's checkpoint, which records neither how many "
                      "samples were consumed nor the data source; resume it with that version, or start afresh");
  if (format != kFormat) mo.fail("format", "value \"" + format + "\" must be \"" + kFormat + "\"");
  DataPosition at;
  at.step = static_cast<int>(mo.integer("step", 0, INT32_MAX));
  if (at.step != r.step())
    mo.fail("step", "value " + std::to_string(at.step) + " differs from the step of the folder and its manifest.json, " +
                        std::to_string(r.step()));
  const auto saved_seed = static_cast<std::uint64_t>(mo.integer("seed", 0, INT64_MAX));
  mo.choice("runtime", {"cpu", "cuda"});
  const Json& model = mo.raw("model");
  if (!model.is_object()) mo.fail("model", "value " + json_brief(model) + " must be an object");
  const Json& layout = mo.raw("layout");
  if (!layout.is_object()) mo.fail("layout", "value " + json_brief(layout) + " must be an object");
  at.consumed_samples = mo.integer("consumed_samples", 0, kMaxConsumedSamples);
  if (at.consumed_samples < at.step)
    mo.fail("consumed_samples", "value " + std::to_string(at.consumed_samples) + " is less than the step " +
                                    std::to_string(at.step) + " (every step consumes at least one sample)");
  JsonObject d = mo.object("data");
  if (d.choice("source", {"synthetic", "file"}) == "file") {
    d.string("name");
    d.integer("bytes", 2, INT64_MAX);  // TokenStream::from_file needs 2 bytes
  }
  d.finish();
  mo.finish();
  r.check_model(model_to_json(m));
  if (saved_seed != seed)
    throw InputError(r.folder() + ": the checkpoint was trained with seed " + std::to_string(saved_seed) +
                     ", this run uses " + std::to_string(seed) + " (the synthetic data stream depends on it)");
  const Json here = data_source_json(data_file), there = r.metadata().at("data");
  if (here != there)
    throw InputError(r.folder() + ": the checkpoint was trained on " + describe_source(there, saved_seed) +
                     ", this run reads " + describe_source(here, seed) +
                     "; resume with the same data source (--data), or start afresh");
  return at;
}

std::int64_t step_folder_bytes(const std::string& folder) {
  std::int64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(folder))
    if (e.is_regular_file()) n += static_cast<std::int64_t>(e.file_size());
  return n;
}

std::string write_checkpoint(const std::string& dir, const DataPosition& at, std::uint64_t seed, const std::string& data_file,
                      const Model& m, const Layout& l, const std::string& runtime, Comm& world,
                      const std::vector<CheckpointTensor>& tensors) {
  const Json data = data_source_json(data_file);  // before the collective: a failure here leaves nothing open
  CheckpointWriter w(dir, at.step, world);
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
  meta["format"] = kFormat;
  meta["step"] = at.step;
  meta["seed"] = seed;
  meta["runtime"] = runtime;
  meta["model"] = model_to_json(m);
  meta["layout"] = layout_to_json(l);
  meta["consumed_samples"] = at.consumed_samples;
  meta["data"] = data;
  w.set_metadata(meta);
  w.commit();
  return (fs::path(dir) / step_folder_name(at.step)).string();
}

LoadedCheckpoint read_checkpoint(const std::string& dir, std::uint64_t seed, const std::string& data_file, const Model& m,
                                 Comm& world, const std::vector<CheckpointTensor>& tensors) {
  LoadedCheckpoint got;
  on_every_rank(world, [&] {
    CheckpointReader r(dir);
    got.at = check_resume(r, m, seed, data_file);
    got.folder = r.folder();
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
  });
  return got;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The CPU Trainer's tensors over its ParamStore and the full moment vectors m, v (flat, ParamStore order),
// then its routed experts' over their store and em, ev.
std::vector<CheckpointTensor> trainer_tensors(Trainer& t, std::vector<float>& m, std::vector<float>& v,
                                              std::vector<float>& em, std::vector<float>& ev) {
  std::vector<CheckpointTensor> out;
  for (ParamStore* st : {&t.params(), t.expert_params()}) {
    if (!st) continue;
    const bool experts = st != &t.params();
    for (const Param& p : st->params()) {
      CheckpointTensor c;
      c.spec = p.spec;
      c.rows = p.rows;
      c.cols = p.cols;
      c.row0 = p.row0;
      c.col0 = p.col0;
      c.owned = checkpoint_owns(p.spec, t.groups().at, t.schedule());
      c.data = st->data(p);
      c.exp_avg = (experts ? em : m).data() + p.offset;
      c.exp_avg_sq = (experts ? ev : v).data() + p.offset;
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

CheckpointIo save_checkpoint(Trainer& t, const std::string& dir, std::uint64_t seed) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> m, v, em, ev;
  t.optimizer().full_moments(m, v);
  t.optimizer().expert_moments(em, ev);
  t.optimizer().materialize_params();  // ZeRO-3: every rank writes from full parameters
  CheckpointIo io;
  io.step = t.steps_done();
  io.folder = write_checkpoint(dir, {t.steps_done(), t.consumed_samples()}, seed, t.data_file(), t.model(), t.layout(),
                               "cpu", *t.groups().world, trainer_tensors(t, m, v, em, ev));
  t.optimizer().release_params();
  io.seconds = seconds_since(start);
  io.bytes = step_folder_bytes(io.folder);
  return io;
}

CheckpointIo load_checkpoint(Trainer& t, const std::string& dir, std::uint64_t seed) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> m(t.params().flat_data().size(), 0.0f), v(m.size(), 0.0f);
  const std::size_t ne = t.expert_params() ? t.expert_params()->flat_data().size() : 0;
  std::vector<float> em(ne, 0.0f), ev(ne, 0.0f);
  const LoadedCheckpoint got =
      read_checkpoint(dir, seed, t.data_file(), t.model(), *t.groups().world, trainer_tensors(t, m, v, em, ev));
  DistributedOptimizer& o = t.optimizer();
  o.load_moments(m, v);  // each rank keeps its shard of them
  o.load_expert_moments(em, ev);
  o.params_loaded();
  o.set_steps_done(got.at.step);
  t.set_consumed_samples(got.at.consumed_samples);
  CheckpointIo io{got.at.step, got.folder, 0, seconds_since(start)};
  io.bytes = step_folder_bytes(io.folder);
  return io;
}

}  // namespace tessel::rt
