#include "sim/calibrate/checkpoint_fit.hpp"

#include <sstream>

#include "util/error.hpp"
#include "util/json_reader.hpp"

namespace tessel::calib {

namespace {

// One save or load: its bytes and seconds, both positive (a run writes at least its metadata).
void add(const Json& c, const std::string& where, double& bytes, double& seconds, int& count) {
  if (!c.is_object() || !c.contains("bytes") || !c.contains("seconds") || !c["bytes"].is_number() ||
      !c["seconds"].is_number())
    throw InputError(where + ": must be an object with numbers bytes and seconds, as `tessel run --json` writes it");
  const double b = c["bytes"].get<double>(), s = c["seconds"].get<double>();
  if (!(b > 0) || !(s > 0))
    throw InputError(where + ": bytes " + std::to_string(b) + " and seconds " + std::to_string(s) + " must be positive");
  bytes += b;
  seconds += s;
  ++count;
}

}  // namespace

CheckpointFit fit_checkpoints(const std::vector<std::string>& run_documents) {
  CheckpointFit f;
  for (const std::string& path : run_documents) {
    const Json doc = parse_json_file(path, "--checkpoints ");
    if (!doc.is_object() || !doc.contains("checkpoints") || !doc["checkpoints"].is_object())
      throw InputError(path + ": checkpoints: missing; give documents of `tessel run --json` (with --save-every or --resume)");
    const Json& c = doc["checkpoints"];
    const Json saved = c.value("saved", Json::array());
    if (!saved.is_array()) throw InputError(path + ": checkpoints.saved: must be an array");
    for (std::size_t i = 0; i < saved.size(); ++i)
      add(saved[i], path + ": checkpoints.saved[" + std::to_string(i) + "]", f.save_bytes, f.save_s, f.saves);
    if (c.contains("resumed") && !c["resumed"].is_null())
      add(c["resumed"], path + ": checkpoints.resumed", f.load_bytes, f.load_s, f.loads);
  }
  if (f.saves == 0 && f.loads == 0)
    throw InputError("--checkpoints: no save or load in " + std::to_string(run_documents.size()) +
                     " document(s); run with --save-every N --checkpoint-dir D (and --resume D for loads)");
  // The ratio of the sums is the throughput of all the measured bytes: a large save weighs by its size, and the
  // fixed costs of a save (fsyncs, renames, the manifest) stay in, as they do in a real save.
  if (f.saves > 0) f.write_bw = f.save_bytes / f.save_s;
  if (f.loads > 0) f.read_bw = f.load_bytes / f.load_s;
  return f;
}

void apply_checkpoint_fit(System& profile, const CheckpointFit& fit, const std::string& origin) {
  if (!profile.storage)
    throw InputError(origin + ": the base system " + profile.name + " has no \"storage\" object to refine; give "
                     "--base-system with one (every preset has one)");
  if (fit.write_bw > 0) profile.storage->node_write_bw = fit.write_bw;
  if (fit.read_bw > 0) profile.storage->node_read_bw = fit.read_bw;
}

std::string describe_checkpoint_fit(const CheckpointFit& fit, const std::string& origin) {
  std::ostringstream os;
  os.precision(4);
  os << " Storage from the recovery checkpoints of " << origin << " (bytes over seconds, all of one node):";
  if (fit.saves > 0)
    os << " node_write_GBps " << fit.write_bw / 1e9 << " from " << fit.saves << " saves (" << fit.save_bytes << " bytes in "
       << fit.save_s << " s);";
  else
    os << " node_write_GBps kept (no save measured);";
  if (fit.loads > 0)
    os << " node_read_GBps " << fit.read_bw / 1e9 << " from " << fit.loads << " loads (" << fit.load_bytes
       << " bytes in " << fit.load_s << " s).";
  else
    os << " node_read_GBps kept (no load measured).";
  return os.str();
}

}  // namespace tessel::calib
