// One pipeline stage of the GPT on one rank: optionally the embedding (first stage), layers [l0, l1), and
// optionally the final norm, LM head and cross-entropy (last stage). Keeps per-micro-batch activations
// between F and B/I, and queued weight-gradient jobs between I and W, counting their bytes in the rank's
// Recorder. Activation checkpointing follows the Layout:
//   none       every layer keeps what its backward reads;
//   selective  the attention probabilities (s*s per head) are dropped and recomputed in the backward
//              (Korthikanti et al. 2022, section 5);
//   full       a block keeps only its input and is re-run forward inside the backward; blocks per Megatron
//              --recompute-method: uniform = consecutive blocks of recompute_layers layers (0: one layer
//              each, Megatron's default --recompute-num-layers 1, as the cost model and the GPU runtime
//              price it), block = the first recompute_layers layers (0: all) each checkpointed alone.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "runtime/gpt_layer.hpp"
#include "sim/layout.hpp"

namespace tessel::rt {

struct StageConfig {
  int stage = 0, chunk = 0;
  int l0 = 0, l1 = 0;              // layers [l0, l1)
  bool first = false, last = false;
  int micro_batch = 1;
  float loss_scale = 1.0f;         // d(global loss)/d(this micro-batch's mean loss) = 1 / (microbatches * dp)
  Recompute recompute = Recompute::none;
  RecomputeMethod method = RecomputeMethod::uniform;
  int recompute_layers = 0;
};

class Stage {
 public:
  // experts: this rank's routed experts (a MoE model; nullptr otherwise), exchanged over ep.
  Stage(const Model& m, const StageConfig& cfg, ParamStore& store, const TensorParallel& tp, Recorder& rec,
        ParamStore* experts = nullptr, const ExpertParallel& ep = {});

  // First stage: tokens/targets of the micro-batch (T each); others: input [local_tokens, hidden].
  // Returns the output activation; the last stage returns nothing and keeps the micro-batch's mean loss.
  std::vector<float> forward(int mb, std::vector<float> input, const std::int32_t* tokens, const std::int32_t* targets);
  float loss(int mb) const;
  // This rank's part of the micro-batch's load-balancing loss, summed over the stage's MoE layers (0 for a
  // dense model); the tp ranks' parts sum to the micro-batch's.
  float aux_loss(int mb) const;
  // Input-gradient pass (I, or the first half of B). dout is empty on the last stage. Returns dx (empty on
  // the first stage). Weight GEMMs are queued for backward_weight. defer_weight (a split I, zero bubble):
  // what the queued GEMMs read stays counted until W; otherwise (B: backward_weight follows at once) the
  // queue is transient, as in Megatron, where each layer's weight gradient is computed right after its
  // input gradient and its output gradient freed.
  std::vector<float> backward_input(int mb, std::vector<float> dout, bool defer_weight = true);
  void backward_weight(int mb);

  // After the optimizer's update: each MoE layer's selection bias moved by the step's load (summed over dp).
  void update_selection_bias(Comm* dp, float rate);

  const StageConfig& config() const { return cfg_; }
  std::size_t activation_elems() const { return static_cast<std::size_t>(shape_.local_tokens) * shape_.hidden; }
  // Forward FLOPs of one micro-batch on this rank (GEMMs and attention core; trace metadata).
  double forward_flops() const;

 private:
  struct Block {
    int begin, end;        // indices into layers_ (0-based within the stage)
    bool checkpointed;
  };
  struct MbState {
    std::vector<LayerActs> acts;          // per layer (empty inside checkpointed blocks)
    std::vector<Buf> block_inputs;        // per block (only checkpointed ones)
    std::vector<std::int32_t> tokens, targets;
    Buf head_x, head_mu, head_rs, head_y, logits, row_max, row_sum;
    float loss = 0, aux_loss = 0;
    // Buffers counted in the recorder for this micro-batch, each once however many jobs share it
    // (the wq/wk/wv jobs all read the norm output, which is also a saved activation).
    std::map<const void*, std::int64_t> counted;
    bool defer_weight = true;             // during the backward: count the queued jobs' buffers
    std::vector<WeightGradJob> jobs;
  };

  void embed_forward(MbState& st, float* x);
  void embed_backward(MbState& st, const float* dx);
  void head_forward(MbState& st, const float* x);
  std::vector<float> head_backward(MbState& st);
  void run_blocks_forward(MbState& st, std::vector<float>& x);
  void block_backward(MbState& st, const Block& b, std::vector<float>& grad);
  void hold(MbState& st, const Buf& b);    // counts b once per micro-batch
  void hold_acts(MbState& st, const LayerActs& a);
  void release_all(MbState& st);

  Model model_;
  StageConfig cfg_;
  ParamStore& store_;
  TensorParallel tp_;
  ExpertParallel ep_;
  Recorder& rec_;
  LayerShape shape_;
  std::vector<LayerWeights> layers_;
  std::vector<Block> blocks_;
  std::map<int, MbState> mbs_;
};

}  // namespace tessel::rt
