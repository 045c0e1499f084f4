#include "tools/run_common.hpp"

#include <unistd.h>

#include <cstdarg>
#include <filesystem>
#include <iostream>

#include "runtime/checkpoint/checkpoint.hpp"
#include "util/error.hpp"

namespace tessel::cmd {

namespace {

// --checkpoint-dir D before any rank starts: D, or the nearest folder above it that exists (the saver
// creates the rest), must be a writable folder, a `latest` in it the saver's file, and D must hold no
// checkpoints but those this run continues: a fresh run would stop at its first save over them, losing what
// it trained, and continuing an older step than D's published one would save over its successors.
void check_checkpoint_dir(const std::string& dir, const std::string& resume, int resume_step) {
  namespace fs = std::filesystem;
  const std::string flag = "--checkpoint-dir " + dir;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) throw InputError(flag + ": is a file, not a folder");
  fs::path have = fs::path(dir).lexically_normal();
  while (!have.empty() && !fs::exists(have, ec)) have = have.parent_path();
  if (have.empty()) have = ".";
  if (!fs::is_directory(have, ec)) throw InputError(flag + ": " + have.string() + " is a file, not a folder");
  if (::access(have.c_str(), W_OK | X_OK) != 0)
    throw InputError(flag + ": folder " + have.string() + " is not writable");
  if (fs::exists(fs::path(dir) / "manifest.json", ec))
    throw InputError(flag + ": is one step folder of a checkpoint; give the folder that holds the step folders");
  const std::vector<std::string> entries = rt::CheckpointReader::checkpoint_entries(dir);
  if (entries.empty()) return;
  std::optional<std::int64_t> published;
  try {
    published = rt::CheckpointReader::latest_step(dir);
  } catch (const InputError& e) {
    throw InputError(flag + ": " + e.what());
  }
  // What is there, briefly: the published step and up to 3 step-* names.
  std::string held = published ? "latest publishes " + rt::step_folder_name(*published) : "no latest";
  std::vector<std::string> steps_there;
  for (const std::string& e : entries)
    if (e != "latest") steps_there.push_back(e);
  for (std::size_t i = 0; i < steps_there.size() && i < 3; ++i) held += (i == 0 ? "; " : ", ") + steps_there[i];
  if (steps_there.size() > 3) held += " and " + std::to_string(steps_there.size() - 3) + " more";
  if (resume.empty())
    throw InputError(flag + ": holds checkpoints already (" + held + "); this run would stop at its first save over "
                     "them: resume them (--resume " + dir + ") or choose an empty folder");
  fs::path root = fs::path(resume).lexically_normal();
  if (root.filename().empty()) root = root.parent_path();
  if (fs::is_regular_file(root / "manifest.json", ec)) root = root.has_parent_path() ? root.parent_path() : ".";
  if (!fs::equivalent(root, dir, ec))
    throw InputError(flag + ": holds other checkpoints (" + held + ") than --resume " + resume + "'s; save into " +
                     root.string() + " to continue them, or into an empty folder");
  if (published && *published > resume_step)
    throw InputError("--resume " + resume + ": step " + std::to_string(resume_step) + " is older than the one " + dir +
                     "/latest publishes (" + std::to_string(*published) + "); continuing it there would save over "
                     "its later steps: save into an empty folder (--checkpoint-dir)");
}

}  // namespace

// --steps counts from step 0, as Megatron's --train-iters: a run resumed at or past it would train nothing.
int check_checkpoint_flags(int save_every, const std::string& dir, const std::string& resume, const Model& m,
                            int steps, std::uint64_t seed, const std::string& data_file) {
  if (save_every > 0 && dir.empty()) throw InputError("--save-every: needs --checkpoint-dir");
  if (!dir.empty() && save_every == 0) throw InputError("--checkpoint-dir: needs --save-every N");
  int start = 0;
  if (!resume.empty()) {
    rt::CheckpointReader r(resume);
    start = rt::check_resume(r, m, seed, data_file).step;
    if (start >= steps)
      throw InputError("--steps " + std::to_string(steps) + ": the checkpoint " + resume + " is at step " +
                       std::to_string(start) + " already, so there is nothing to train (--steps counts from step 0; "
                       "give more than " + std::to_string(start) + ")");
  }
  if (save_every == 0) return start;
  if ((static_cast<std::int64_t>(start) / save_every + 1) * save_every > steps) {
    if (resume.empty())
      throw InputError("--save-every " + std::to_string(save_every) + ": must be <= --steps " + std::to_string(steps) +
                       ", or nothing would be saved");
    throw InputError("--save-every " + std::to_string(save_every) + ": this run trains steps " +
                     std::to_string(start + 1) + " to " + std::to_string(steps) + " (resumed at step " +
                     std::to_string(start) + ", --steps " + std::to_string(steps) + ") and none is a multiple of " +
                     std::to_string(save_every) + ", so nothing would be saved");
  }
  check_checkpoint_dir(dir, resume, start);
  return start;
}

void RunLog::line(const char* fmt, ...) const {
  va_list args;
  va_start(args, fmt);
  std::vfprintf(f_, fmt, args);
  va_end(args);
  std::fputc('\n', f_);
  std::fflush(f_);
}

void print_checkpoint(const RunLog& log, const rt::CheckpointIo& c, const char* verb) {
  log.line("checkpoint: step %d %s, %.3f MiB in %.3f s (%.1f MB/s): %s", c.step, verb, c.bytes / 1048576.0, c.seconds,
           c.seconds > 0 ? c.bytes / c.seconds / 1e6 : 0.0, c.folder.c_str());
}

void print_step(const RunLog& log, const rt::StepRecord& s, std::optional<double> tflops) {
  char tail[64] = "", aux[32] = "";
  if (tflops) std::snprintf(tail, sizeof tail, "  %7.1f TFLOP/s", *tflops);
  if (s.aux_loss) std::snprintf(aux, sizeof aux, "  aux %.6f", *s.aux_loss);
  log.line("step %4d  loss %.6f%s  grad_norm %.4f  time %8.2f ms  %10.0f tokens/s%s", s.step, s.loss, aux, s.grad_norm,
           s.seconds * 1e3, s.tokens_per_s, tail);
}

Json run_config_json(const RunFlags& f, const std::string& backend, const std::string& comm, const std::string& schedule,
                     int first_step) {
  Json c;
  c["backend"] = backend;
  c["comm"] = comm;
  c["ranks"] = f.layout.gpus();
  c["model"] = model_to_json(f.model);
  c["layout"] = layout_to_json(f.layout);
  c["schedule"] = schedule;
  c["seed"] = f.seed;
  c["lr"] = f.lr;
  c["steps"] = f.steps;
  c["first_step"] = first_step;
  c["data"] = rt::data_source_json(f.data_file);
  return c;
}

Json steps_json(const std::vector<rt::StepRecord>& steps) {
  Json a = Json::array();
  for (const rt::StepRecord& s : steps) {
    a.push_back({{"step", s.step}, {"loss", s.loss}, {"grad_norm", s.grad_norm}, {"seconds", s.seconds},
                 {"tokens_per_s", s.tokens_per_s}});
    if (s.aux_loss) a.back()["aux_loss"] = *s.aux_loss;
    if (s.cpu_s) a.back()["cpu_s"] = *s.cpu_s;
    if (s.run_delay_s) a.back()["run_delay_s"] = *s.run_delay_s;
  }
  return a;
}

Json memory_json(const std::vector<rt::RankMemory>& ranks) {
  Json a = Json::array();
  for (const rt::RankMemory& m : ranks) {
    Json r = {{"rank", m.rank}, {"parameter_bytes", m.parameter_bytes}, {"gradient_bytes", m.gradient_bytes},
              {"optimizer_bytes", m.optimizer_bytes}};
    const auto put = [&r](const char* key, const std::optional<std::int64_t>& v) {
      if (v) r[key] = *v;
    };
    put("peak_activation_bytes", m.peak_activation_bytes);
    put("peak_state_bytes", m.peak_state_bytes);
    put("device_peak_bytes", m.device_peak_bytes);
    put("device_reserved_bytes", m.device_reserved_bytes);
    a.push_back(std::move(r));
  }
  return a;
}

namespace {

Json checkpoint_json(const rt::CheckpointIo& c) {
  return {{"step", c.step}, {"folder", c.folder}, {"bytes", c.bytes}, {"seconds", c.seconds}};
}

}  // namespace

Json checkpoints_json(const std::vector<rt::CheckpointIo>& saved, const std::optional<rt::CheckpointIo>& resumed) {
  Json s = Json::array();
  for (const rt::CheckpointIo& c : saved) s.push_back(checkpoint_json(c));
  return {{"saved", s}, {"resumed", resumed ? checkpoint_json(*resumed) : Json()}};
}

Json trace_json(const std::string& file, std::size_t events) {
  if (file.empty()) return Json();
  return {{"file", file}, {"events", events}};
}

void print_run_document(Json config, const std::vector<rt::StepRecord>& steps, const std::vector<rt::RankMemory>& ranks,
                        const std::vector<rt::CheckpointIo>& saved, const std::optional<rt::CheckpointIo>& resumed,
                        Json trace, const Json& extra) {
  Json doc;
  doc["config"] = std::move(config);
  doc["steps"] = steps_json(steps);
  doc["memory"] = memory_json(ranks);
  doc["checkpoints"] = checkpoints_json(saved, resumed);
  doc["trace"] = std::move(trace);
  for (const auto& [k, v] : extra.items()) doc[k] = v;
  doc["tool"] = std::string("tessel ") + TESSEL_VERSION;
  std::cout << doc.dump(2) << "\n" << std::flush;
}

}  // namespace tessel::cmd
