// One pipeline stage of the GPT on one GPU rank: runtime/gpt_layer.hpp's block (Megatron TP partitioning,
// optional sequence parallelism) and runtime/gpt_stage.hpp's embedding and head, on device buffers with
// the kernels of kernels/cuda. The split backward is the CPU stage's: an I action queues the weight GEMMs
// (with the bias gradients they carry; the head's included) and a W action runs them, so zero-bubble
// schedules defer the same work; the residual biases, norm parameters and embeddings get their gradients
// in I. Differences from the CPU stage, all deliberate:
//   - attention is a flash kernel (the variant the run names): no probabilities are kept, so `selective` recomputation is free and
//     the same as `none`; `full` re-runs each layer's forward inside its backward (per layer);
//   - GEMMs run in the chosen type (bf16 operands with fp32 accumulation by default, tf32 or fp32).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/comm.hpp"
#include "runtime/cuda/gpu_params.hpp"
#include "runtime/gpt_stage.hpp"
#include "sim/layout.hpp"

namespace tessel::rt::cuda {

// The tensor-parallel group on the GPU. record_only: collectives are recorded on the trace's tp lane
// (bytes, issue time) but neither run nor waited for (--only-rank).
struct GpuTp {
  Comm* comm = nullptr;
  int size = 1, rank = 0;
  bool sp = false, record_only = false;
};

// Expert parallelism on the GPU (a mixture-of-experts model): the ep and etp groups, this rank's place in
// them, and the store of the routed experts it holds, apart from the dense parameters as the CPU trainer
// keeps them (runtime/trainer.cpp).
struct GpuEp {
  Comm* comm = nullptr;  // null with ep 1
  int size = 1, rank = 0;
  GpuParams* experts = nullptr;  // this rank's slices (1/etp of each FFN) of its ep rank's experts
  Comm* etp_comm = nullptr;      // expert tensor parallelism: the etp group (null with etp 1)
  int etp_size = 1, etp_rank = 0;
};

// The CPU stage's StageConfig (runtime/gpt_stage.hpp); full recomputation is per layer here, whatever its
// method and recompute_layers say (docs/cuda.md).
using GpuStageConfig = StageConfig;

class GpuStage {
 public:
  // attention_kernel: --attention-kernel's name ("" = the default for the GEMM type; the names and their
  // rules: kernels/cuda/attention_variant.hpp). InputError when this stage's shard cannot run it.
  // ep: a MoE model's expert parallelism (its `experts` store is required when the stage has MoE layers).
  GpuStage(CudaDevice& dev, const Model& m, const GpuStageConfig& cfg, GpuParams& params, const GpuTp& tp,
           kernels::cuda::GemmType gemm, const std::string& attention_kernel, const GpuEp& ep = {});
  ~GpuStage();
  GpuStage(const GpuStage&) = delete;
  GpuStage& operator=(const GpuStage&) = delete;

  // tokens/targets: device arrays of T on the first/last stage. in: [local_tokens, hidden] elsewhere.
  DBuf forward(int mb, DBuf in, const std::int32_t* tokens, const std::int32_t* targets);
  // Adds this micro-batch's summed token losses into `loss_sum` (device float) on the last stage.
  // defer_weight (a split I): the weight GEMMs are queued, with the buffers they read, for backward_weight.
  DBuf backward(int mb, DBuf dout, bool defer_weight = false);
  void backward_weight(int mb);  // W: the queued weight GEMMs of micro-batch mb
  void set_loss_sink(float* loss_sum);
  // The load-balancing losses of the forwards run since the last call (recomputed ones not counted), this
  // rank's part: its tokens, its MoE layers (runtime/moe_layer.hpp). Host-side: routing runs on the host.
  double take_aux_loss();
  // Auxiliary-loss-free balancing (a router with a selection bias), after the step's optimizer update: each
  // MoE layer's tokens per expert over the step (counted in each micro-batch's backward, summed over the
  // data-parallel group by dp_sum) move its bias by rate * sign(mean - load), as runtime/moe_layer.hpp's
  // update_selection_bias; the load restarts from zero.
  void update_selection_bias(const std::function<void(std::vector<float>&)>& dp_sum, float rate);
  // ZeRO (gpu_trainer.cpp), with a parameter group's name (runtime/zero_partition.hpp's: "embed.tok",
  // "embed.pos", "layers.<i>", "final"):
  //  - values (ZeRO-3, and ZeRO-1/2's exchange after the step): called before the kernels reading the
  //    group's values are queued (enter true) and after them (false): the embeddings, each layer (its
  //    recomputation and backward included) and the head. The weight-gradient GEMMs read no weights and
  //    are outside every window.
  //  - grads (ZeRO-2/3): called before kernels write the group's gradient (enter true), and after the
  //    micro-batch's part of it is complete (enter false, done true): at once in a full backward, for the
  //    embeddings at once in any backward, and for a split I after the weight GEMMs W runs (the calls are
  //    queued with them); after a split I itself it is called with done false. So a group's full gradient
  //    lives for about one layer's backward, as DeepSpeed's reduction buckets.
  //  - prefetch (ZeRO-3, ZeRO-1/2): the group whose values window comes next (the next layer, forward or
  //    backward; after the last layer's forward, the head's groups), called once the current window is
  //    entered and before its kernels are queued, so its gather can run beside them.
  struct ParamHooks {
    std::function<void(const std::string& group, bool enter)> values;
    std::function<void(const std::string& group)> prefetch;
    std::function<void(const std::string& group, bool enter, bool done)> grads;
  };
  void set_param_hooks(ParamHooks h);

  const GpuStageConfig& config() const;
  std::size_t activation_elems() const;  // [local_tokens, hidden]
  double forward_flops() const;           // per micro-batch (GEMMs, attention core, head)
  int tokens() const;                      // T = micro_batch * seq

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel::rt::cuda
