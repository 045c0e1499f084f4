// Training on the CPU runtime: one Trainer per rank (a thread with ThreadComm, or an MPI process), each
// running the same Layout and the same schedule the simulator uses.
//
// A step: build this data-parallel rank's micro-batches, walk the pipeline schedule (executor.hpp), then
// the optimizer step (optimizer_step.hpp). The loss is the mean token cross-entropy over the global batch:
// micro-batch means scaled by 1 / (microbatches * dp), summed over the world.
// Sample j of a step is TokenStream::sample(c + j), c the samples consumed by the steps before it (k *
// global_batch at step k of a run that kept its global batch; a resumed run continues from its checkpoint's
// count, as Megatron's consumed_train_samples); data-parallel rank d takes samples [d * m * b, (d + 1) * m * b)
// of its step, micro-batch i the next b of those.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/executor.hpp"
#include "runtime/init.hpp"
#include "runtime/optimizer_step.hpp"
#include "runtime/rank_groups.hpp"
#include "sim/layout.hpp"
#include "sim/schedule/schedule.hpp"

namespace tessel::rt {

struct TrainOptions {
  std::uint64_t seed = 1234;
  std::string data_file;           // empty: synthetic tokens
  OptimizerConfig optimizer;
  bool record_trace = false;
};

struct StepStats {
  int step = 0;                    // 0-based index of the step just done
  double loss = 0;
  double aux_loss = 0;             // MoE: the load-balancing loss (weighted by its coefficient), not in `loss`
  double grad_norm = 0;
  std::vector<double> param_grad_norms;  // gpt_param_specs() order
  double seconds = 0;
  // Summed over the ranks, this step (runtime/host_sched.hpp): CPU time, and time runnable but waiting for a
  // core; absent where a rank's kernel does not count them.
  std::optional<double> cpu_s, run_delay_s;
};

// Rejects what this runtime cannot run (cp > 1, SP with tokens not divisible by tp, position embeddings the
// layer cannot compute, the parts of a mixture of experts it does not build) and
// every layout rule of check_layout, with InputError/InfeasibleLayout naming the rule.
void check_runnable(const Model& m, const Layout& l);

// The pipeline schedule of the layout, lowered with sends/recvs. pp 1 runs F then B per micro-batch.
// Where the recvs go depends on whether a send can wait for its receiver, because a rank blocks at each
// recv where its list has it:
//   Eager (the CPU runtime: its thread and MPI communicators buffer every send): each recv right before the
//     op that consumes it (GapOrder::SendsFirst), which is the list the simulator plays and where PyTorch's
//     pipelining runtime waits on an irecv. A valid compute order cannot deadlock under eager sends.
//   Rendezvous (the CUDA runtime: an NCCL send completes only with its recv): ZB's deadlock-free order
//     (GapOrder::Auto), whose recvs may sit a gap earlier and hold the rank there.
enum class SendMode { eager, rendezvous };
sched::Schedule runtime_schedule(const Layout& l, SendMode sends);

// What the CPU and CUDA trainers build a rank from: the parameters its stages need (gpt_param_specs order,
// each once: a tied embedding shared by two stages of the rank is one tensor), and one stage's config.
std::vector<std::string> rank_param_names(const Model& m, const Layout& l, const sched::Schedule& s, int pp_rank);
StageConfig stage_config(const Model& m, const Layout& l, const sched::Schedule& s, int stage);

class Trainer {
 public:
  Trainer(const Model& m, const Layout& l, const TrainOptions& opt, Comm& world, Recorder::Clock::time_point t0);
  StepStats step();

  int steps_done() const { return optimizer_->steps_done(); }
  std::int64_t consumed_samples() const { return consumed_samples_; }
  void set_consumed_samples(std::int64_t n) { consumed_samples_ = n; }  // resuming: the checkpoint's count
  const std::string& data_file() const { return opt_.data_file; }
  const Model& model() const { return model_; }
  const Layout& layout() const { return layout_; }
  Recorder& recorder() { return rec_; }
  ParamStore& params() { return store_; }
  ParamStore* expert_params() { return model_.moe.enabled() ? &experts_ : nullptr; }
  DistributedOptimizer& optimizer() { return *optimizer_; }
  const RankGroups& groups() const { return groups_; }
  const sched::Schedule& schedule() const { return schedule_; }
  std::string process_name() const;  // "rank R (stage S)" for the trace

 private:
  void load_batch(std::int64_t first_sample);

  Model model_;
  Layout layout_;
  TrainOptions opt_;
  RankGroups groups_;
  Recorder rec_;
  sched::Schedule schedule_;
  TokenStream data_;
  ParamStore store_;
  ParamStore experts_;             // this rank's routed experts (MoE models; empty otherwise)
  TensorParallel tp_;
  ExpertParallel ep_;
  std::map<int, std::unique_ptr<Stage>> stages_;
  std::unique_ptr<DistributedOptimizer> optimizer_;
  std::vector<MicroBatch> batch_;
  std::int64_t consumed_samples_ = 0;
};

// Everything ranks-as-threads produce.
struct ThreadRunResult {
  std::vector<StepStats> steps;                  // identical on every rank; rank 0's copy
  std::vector<std::int64_t> peak_activation_bytes;  // per world rank
  std::vector<StateMemory> state_memory;             // per world rank: parameters, gradients, Adam moments
  trace::Trace trace;                            // all ranks' events when opt.record_trace
};

ThreadRunResult train_threads(const Model& m, const Layout& l, const TrainOptions& opt, int steps);

}  // namespace tessel::rt
