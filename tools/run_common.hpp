// What `tessel run` prints, on either backend (tools/cmd_run.cpp: CPU; tools/cmd_run_cuda.cpp: CUDA): the
// human lines, and under --json one document on stdout (docs/runtime.md lists its fields). Under --json the
// human lines go to stderr, so stdout carries the document alone and a run killed part-way still leaves
// its log. Every line is flushed as it is printed: with the stream in a file or a pipe it is
// block-buffered, and a run killed (SIGTERM, SIGKILL, a job's time limit) would lose what it held.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "models/model.hpp"
#include "runtime/run_report.hpp"
#include "runtime/run_spec.hpp"
#include "runtime/trainer_checkpoint.hpp"
#include "sim/layout.hpp"
#include "util/json_reader.hpp"

namespace tessel::cli {
class CommandLine;
}

namespace tessel::cmd {

// The flags both backends read, parsed and checked before any rank starts.
struct RunFlags : rt::RunSpec {
  // --save-every auto: save after the first step, then every Daly interval for the measured save time and
  // --mtbf-hours, the job's mean time between failures (docs/goodput.md).
  bool save_auto = false;
  double mtbf_s = 0;
  bool json = false;
};

// The recovery-checkpoint flags of either backend, checked before any rank starts: --save-every and
// --checkpoint-dir go together; a checkpoint to resume is verified (checksums, metadata), of this model,
// seed and data source, and short of --steps (which counts from step 0, as Megatron's --train-iters); the
// run must reach a step that --save-every saves; and the checkpoint folder must be able to take the saves.
// Returns the step the run starts from: the checkpoint's, 0 for a fresh run.
int check_checkpoint_flags(int save_every, const std::string& dir, const std::string& resume, const Model& m,
                           int steps, std::uint64_t seed, const std::string& data_file);

// Where the human lines go: stdout, or stderr under --json.
class RunLog {
 public:
  explicit RunLog(bool json) : f_(json ? stderr : stdout) {}
  // printf-style; the line is flushed at once.
  [[gnu::format(printf, 2, 3)]] void line(const char* fmt, ...) const;
  std::FILE* file() const { return f_; }

 private:
  std::FILE* f_;
};

// "checkpoint: step 4 saved, 4.825 MiB in 0.052 s (97.3 MB/s): D/step-00000004", or "loaded".
void print_checkpoint(const RunLog& log, const rt::CheckpointIo& c, const char* verb);

// "step    3  loss 5.303900  grad_norm 2.0915  time    12.34 ms       1234 tokens/s" (and the rank's model
// TFLOP/s where given).
void print_step(const RunLog& log, const rt::StepRecord& s, std::optional<double> tflops = std::nullopt);

// The document's parts.
Json run_config_json(const RunFlags& f, const std::string& backend, const std::string& comm, const std::string& schedule,
                     int first_step);
Json steps_json(const std::vector<rt::StepRecord>& steps);
Json memory_json(const std::vector<rt::RankMemory>& ranks);
Json checkpoints_json(const std::vector<rt::CheckpointIo>& saved, const std::optional<rt::CheckpointIo>& resumed);
Json trace_json(const std::string& file, std::size_t events);  // null without a trace
// Prints the document on stdout: {config, steps, memory, checkpoints, trace, tool} and `extra`'s keys.
void print_run_document(Json config, const std::vector<rt::StepRecord>& steps, const std::vector<rt::RankMemory>& ranks,
                        const std::vector<rt::CheckpointIo>& saved, const std::optional<rt::CheckpointIo>& resumed,
                        Json trace, const Json& extra = Json::object());

// `tessel run --backend cuda` with the flags read (tools/cmd_run_cuda.cpp; CUDA builds only).
int run_cuda_backend(const cli::CommandLine& cl, const RunFlags& f);

}  // namespace tessel::cmd
