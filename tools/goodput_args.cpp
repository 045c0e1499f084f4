#include "tools/goodput_args.hpp"

#include <cmath>

#include "tools/format.hpp"
#include "util/error.hpp"

namespace tessel::cli {

namespace {
// 929856 -> "929,856".
std::string grouped(long long n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}
}  // namespace

std::vector<OptionSpec> goodput_options() {
  return {
      {"--tokens", true, "time to train: the job's tokens (steps = ceil(tokens / (gbs x seq)))"},
      {"--steps", true, "time to train: the job's optimizer steps (instead of --tokens)"},
      {"--gpu-mtbf-hours", true, "failure model: mean time between failures per GPU [the system's reliability object]"},
      {"--restart-s", true, "restart overhead: detection, rescheduling, warm-up; the load is computed [the system's]"},
      {"--usd-per-gpu-hour", true, "price of a GPU-hour: adds the cost"},
  };
}

std::optional<goodput::Job> read_goodput_job(const CommandLine& cl, const Model& m, int global_batch, const System& sys) {
  const bool tokens = cl.has("--tokens"), steps = cl.has("--steps");
  if (tokens && steps)
    throw InputError("--tokens " + *cl.get("--tokens") + " and --steps " + *cl.get("--steps") +
                     ": give one, the job's length in tokens or in optimizer steps");
  if (!tokens && !steps) {
    for (const char* f : {"--gpu-mtbf-hours", "--restart-s", "--usd-per-gpu-hour"})
      if (cl.has(f))
        throw InputError(std::string(f) + " " + *cl.get(f) + ": only with --tokens N or --steps N (it sets the time to "
                         "train, which needs the job's length)");
    return std::nullopt;
  }
  goodput::Job job;
  if (tokens) {
    const double n = *cl.get_double("--tokens", 1.0, 1e18);
    job.steps = std::ceil(n / (static_cast<double>(global_batch) * m.seq_len));
  } else {
    job.steps = static_cast<double>(*cl.get_int("--steps", 1, 1000000000000LL));
  }
  const auto mtbf = cl.get_double("--gpu-mtbf-hours", 1e-3, 1e9);
  const auto restart = cl.get_double("--restart-s", 0.0, 1e7);
  if (!sys.reliability && !mtbf)
    throw InputError("--" + std::string(tokens ? "tokens" : "steps") + ": the system " + sys.name + " has no \"reliability\" "
                     "object (its failure model); give --gpu-mtbf-hours H and --restart-s S, or a system file with one "
                     "(docs/goodput.md)");
  if (!sys.reliability && !restart)
    throw InputError("--gpu-mtbf-hours " + *cl.get("--gpu-mtbf-hours") + ": the system " + sys.name + " has no "
                     "\"reliability\" object to take the restart overhead from; give --restart-s S too");
  if (sys.reliability) job.reliability = *sys.reliability;
  if (mtbf) {
    // The flag replaces the system's failure model, node term included: one per-GPU rate.
    job.reliability.gpu_mtbf_s = *mtbf * 3600.0;
    job.reliability.node_mtbf_s = 0;
  }
  if (restart) job.reliability.restart_overhead_s = *restart;
  if (!sys.storage)
    throw InputError("--" + std::string(tokens ? "tokens" : "steps") + ": the system " + sys.name + " has no \"storage\" "
                     "object (the checkpoint path: node and aggregate bandwidth, device-to-host copy, async); give a "
                     "system file with one (docs/goodput.md)");
  job.storage = *sys.storage;
  job.usd_per_gpu_hour = cl.get_double("--usd-per-gpu-hour", 0.0, 1e6);
  return job;
}

std::string job_length_text(const CommandLine& cl, const goodput::Job& job) {
  const std::string steps = grouped(static_cast<long long>(job.steps)) + " steps";
  if (auto t = cl.get("--tokens")) return fmt::si(std::stod(*t), " tokens") + " = " + steps;
  return steps;
}

}  // namespace tessel::cli
