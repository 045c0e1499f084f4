// Training on the CUDA runtime: one GpuTrainer per GPU process, walking the same lowered schedule as the
// CPU runtime (runtime_schedule) over GpuStages, then the data-parallel gradient reduction, global-norm
// clipping and AdamW on the device. Every op is timed with CUDA events into the rank's Recorder.
//
// --only-rank R: this single process plays world rank R of a larger layout. Its stages get their real
// shard shapes; parameters, tokens and received activations are synthesised on the device; every
// communication (tp collectives, pp send/recv, dp reduction) is recorded on its trace lane with its bytes
// but neither run nor waited for. What it measures is rank R's compute, which is what the cost model's
// per-rank compute must predict for layouts far larger than one GPU.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/cuda/gpu_stage.hpp"
#include "runtime/init.hpp"
#include "runtime/optimizer_step.hpp"
#include "runtime/rank_groups.hpp"
#include "runtime/trainer.hpp"
#include "runtime/trainer_checkpoint.hpp"

namespace tessel::rt::cuda {

struct GpuTrainOptions {
  std::uint64_t seed = 1234;
  OptimizerConfig optimizer;
  bool record_trace = false;
  kernels::cuda::GemmType gemm = kernels::cuda::GemmType::bf16_fp32;
  std::string attention_kernel;  // the attention kernel's variant by name (`tessel run --attention-kernel`); empty: the default
  int only_rank = -1;          // >= 0: play this world rank alone (see above)
  std::string data_file;       // token file (runtime/init.hpp's TokenStream); empty: the synthetic stream
};

class GpuTrainer {
 public:
  // world: the communicator of all ranks (nullptr with only_rank >= 0 or a one-GPU layout).
  GpuTrainer(CudaDevice& dev, const Model& m, const Layout& l, const GpuTrainOptions& opt, Comm* world,
             Recorder::Clock::time_point t0);
  ~GpuTrainer();
  StepStats step();

  Recorder& recorder() { return rec_; }
  GpuParams& params() { return *params_; }
  GpuParams* experts() { return experts_.get(); }  // a MoE model's routed experts on this rank; else null
  std::string process_name() const;
  int world_rank() const { return world_rank_; }
  const sched::Schedule& schedule() const { return schedule_; }  // lowered, as walked
  // The world with host buffers (staged through the device; a one-rank world without one): checkpoints,
  // scalars, run reports.
  Comm& host_world();
  int steps_done() const { return steps_; }
  std::int64_t consumed_samples() const { return consumed_samples_; }  // as the CPU Trainer's
  double step_flops() const;  // forward + backward (3x forward) of this rank's stages, one step

  // Recovery checkpoints in the CPU runtime's format (runtime/trainer_checkpoint.hpp), so a run saved on
  // either runtime resumes on the other, under any layout. Collective over the world.
  CheckpointIo save_checkpoint(const std::string& dir, std::uint64_t seed);
  CheckpointIo load_checkpoint(const std::string& dir, std::uint64_t seed);
  // Every parameter's whole values and moments on the host (params() order), once any values exchange
  // still waiting for the next forward has run. Collective over the dp group.
  std::vector<GpuParams::HostParamState> host_states();
  // ZeRO-1/2 under overlap_param_gather: values exchanges issued only when their own window opened (no
  // prefetch before them), so far: each stage's first window, where the simulator exposes one bucket.
  std::size_t values_exchanges_exposed() const { return values_exposed_; }

 private:
  class Pipeline;  // this trainer's PipelineBackend (runtime/executor.hpp)
  void load_batch(std::int64_t first_sample);
  void reduce_gradients();
  void sync_tied();
  void sync_sequence_parallel();
  void gather_params();
  // ZeRO-1/2's values exchange after the step, group by group (gather_params): issued, completed on
  // compute; the values window and prefetch hooks of the next forward.
  void issue_values(std::size_t g);
  void finish_values(std::size_t g);
  void values_window(const std::string& group);
  void values_prefetch(const std::string& group);
  // ZeRO-2/3 (see Walker::compute): the parameter groups of a stage; any still live after a B/W reduced;
  // the stage's per-group windows (gradients; ZeRO-3's values); one group's gather and one group's
  // gradient reduction.
  const std::vector<std::size_t>& stage_groups(int stage);
  void flush_grads(const std::vector<std::size_t>& groups);
  void grads_window(const std::string& group, bool enter, bool done);
  void param_window(const std::string& group, bool enter);
  void prefetch_group(const std::string& group);
  void gather_group(std::size_t g);
  void start_gather(std::size_t g);
  void finish_group_gather(std::size_t g);
  void flush_group(std::size_t g);
  void reduce_bucket(std::size_t b);
  bool shard_sums() const;  // the tied and sequence-parallel sums run on the reduced shards
  double global_grad_norm();
  bool counts_in_norm(const GpuParam& p) const;
  float world_sum(float v);  // over every rank (host scalar)
  std::vector<CheckpointTensor> checkpoint_views(std::vector<GpuParams::HostParamState>& host, bool for_writing) const;

  CudaDevice& dev_;
  Model model_;
  Layout layout_;
  GpuTrainOptions opt_;
  Comm* world_ = nullptr;
  RankGroups groups_;
  // The first and last stages' pipeline ranks; with tied embeddings on two of them, both hold embed.tok
  // and sum its gradient over `embed_` (the pair, per tp and dp position), Megatron's embedding group.
  int first_pp_ = 0, last_pp_ = 0;
  std::unique_ptr<Comm> embed_;
  std::unique_ptr<Comm> host_world_;  // host-pointer view of world_ (checkpoints, scalars)
  RankCoords at_;
  int world_rank_ = 0;
  bool record_only_ = false;
  Recorder rec_;
  sched::Schedule schedule_;
  TokenStream data_;
  std::unique_ptr<GpuParams> params_;
  // A mixture of experts: this rank's routed experts (whole, their ep rank's), apart from the dense
  // parameters as the CPU trainer keeps them: reduced over the expert data-parallel group (edp), stepped
  // by the same AdamW with the same clip.
  std::unique_ptr<GpuParams> experts_;
  void reduce_expert_gradients();
  void gather_expert_values();
  std::map<int, std::unique_ptr<GpuStage>> stages_;
  std::map<int, std::vector<std::size_t>> stage_groups_;
  // Communication in flight (CudaDevice::comm_in_flight): the latest ZeRO-2/3 gradient reduce-scatter,
  // and ZeRO-3 gathers issued ahead of their window, by group.
  std::optional<CudaDevice::Ticket> grad_ticket_;
  std::map<std::size_t, CudaDevice::Ticket> prefetched_;
  // ZeRO-1/2: groups whose values exchange has not completed on compute since the last optimizer step;
  // issued: queued on the dp stream (ticket), with the gathered fp32 buffer where one is used.
  struct StaleValues {
    bool issued = false;
    CudaDevice::Ticket ticket = 0;
    DBuf whole;
  };
  std::map<std::size_t, StaleValues> stale_values_;
  std::size_t values_exposed_ = 0;
  // ZeRO-0/1 over dp: each bucket's reduction is issued when the step's last micro-batch has completed its
  // part of it (every window of this rank's stages that closes it: `expected` per step), beside the rest
  // of that backward, as Megatron's overlap_grad_reduce; `closed` counts this step's.
  bool dp_overlap_ = false;
  std::vector<int> bucket_expected_, bucket_closed_;
  std::vector<DBuf> tokens_, targets_;  // per micro-batch, device
  DBuf loss_sum_;
  int steps_ = 0;
  std::int64_t consumed_samples_ = 0;  // training samples of the steps done (a checkpoint's data position)
};

}  // namespace tessel::rt::cuda
