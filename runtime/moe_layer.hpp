// The MLP of a mixture-of-experts layer on one rank (Shazeer et al. 2017; Fedus et al. 2021; the shared
// expert of DeepSeekMoE, arXiv:2401.06066), run as Megatron-Core's all-to-all token dispatcher does it:
//
//   router     logits = y W_r over this rank's tokens (the sequence shard under SP), scores by a softmax over
//              the E experts or each one's sigmoid (DeepSeek-V3), the top-k per token (ties: the lower expert),
//              inside its best groups under group-limited routing, their weights renormalised to sum 1 when
//              the model says so, times the router's scale;
//   dispatch   each (token, choice) slot's row goes to the ep rank owning its expert (expert_owner), sorted
//              by expert: an all-to-all of per-expert counts, then of the rows;
//   experts    each local expert runs its MLP on the rows it received, from every peer, in peer order; under
//              expert tensor parallelism (etp > 1) the etp ranks holding an expert's FFN slices gather their
//              rows first (all-gather) and reduce-scatter the outputs back (Megatron-Core's order);
//   combine    the outputs go back by the reverse all-to-all; a token's output is the weighted sum of its k;
//   shared     the shared expert runs over all tokens as the dense MLP does (column/row-parallel under tp).
//
// Load balancing: Megatron-Core's switch_load_balancing_loss_func, aux = coef E / (k T^2) sum_e c_e sum_t p_te
// over the micro-batch's T tokens, c_e the tokens routed to e (summed over the tp group), p the softmax.
// Its gradient enters the router's softmax scaled like the LM loss's (LayerShape::loss_scale); its value is
// reported beside the LM loss, not in it.
//
// Backward runs the same two all-to-alls in reverse: output gradients to the experts, input gradients back.
// Every ep rank runs the same layers of the same micro-batches in the same order (they are one pipeline
// stage), so their exchanges pair up.
#pragma once

#include <vector>

#include "runtime/gpt_layer.hpp"

namespace tessel::rt {

struct MoeActs {
  Buf yl;         // router input: this rank's tokens' norm output [Tl, h] (the layer's y2 without SP)
  Buf probs;      // [Tl, E] scores (softmax or sigmoid)
  Buf topi, topw; // [Tl * k] chosen experts (exact small integers) and their weights (scale included)
  Buf counts;     // [E] tokens of the micro-batch routed to each expert
  Buf slot_out;   // [Tl * k, h] the chosen experts' outputs, back from their owners
  // Per local expert: the rows it runs on (received from the ep peers; under etp > 1 gathered from the etp
  // ranks, each rank's block padded with zero rows to the largest: etp x rmax rows) and its MLP's intermediates
  // (this rank's 1/etp of the FFN width).
  std::vector<Buf> xin, h1, g1, act;
  std::vector<int> rows, rmax;        // per local expert: rows this rank received, the most any etp rank did
  Buf sh1, sg1, sact;                 // the shared expert's intermediates [T, shared_ffn]
  // The routing plan, kept to run the backward's exchanges: slots in dispatch order (by expert, then slot),
  // rows sent to [peer * El + local expert] and received from them.
  std::vector<int> order, sent, got;
  std::vector<const Buf*> bufs() const;
};

// The steps of moe_forward/moe_backward that run on the host whatever the backend (the CUDA runtime routes
// on the host too, as Megatron-Core's all-to-all dispatcher syncs for its token counts), so both runtimes
// route alike:
//  - moe_route: Tl tokens' router logits p [Tl, E] become their scores in place; the chosen experts topi
//    and weights topw [Tl * k] (scale included), and counts [E] of this rank's tokens per expert.
//  - moe_aux_loss: the load-balancing loss's part of these Tl tokens, given the counts over the micro-batch.
//  - moe_dispatch_plan: the slots in dispatch order (by expert, then slot) and the rows sent to each
//    [ep peer * El + local expert].
//  - moe_router_grad: the router logits' gradient dz [Tl, E] from the chosen weights' gradients dw [Tl * k]
//    (and the load-balancing loss's, scaled by s.loss_scale).
//  - moe_rows_per_peer: the rows per peer of such a [peers * El] table.
void moe_route(const LayerShape& s, const float* selection_bias, int Tl, float* p, float* topi, float* topw, float* counts);
double moe_aux_loss(const LayerShape& s, const float* p, const float* counts, int Tl);
void moe_dispatch_plan(const float* topi, int S, int experts, int ep, std::vector<int>& order, std::vector<int>& sent);
void moe_router_grad(const LayerShape& s, const float* p, const float* topi, const float* counts, const float* dw, int Tl,
                     float* dz);
std::vector<int> moe_rows_per_peer(const std::vector<int>& table, int peers, int El);

// y_local: the norm output of this rank's tokens ([Tl, h]), kept as the router's input; y_full: of all T
// tokens ([T, h]) for the shared expert (null without one; y_local itself without SP). out: [Tl, h], the MLP's
// output for this rank's tokens (the caller adds the residual). Returns this rank's part of the
// load-balancing loss.
float moe_forward(const LayerShape& s, const MoeWeights& w, const TensorParallel& tp, const ExpertParallel& ep,
                  const Buf& y_local, const Buf& y_full, float* out, MoeActs& a);

// dout: [Tl, h]. dy: [Tl, h], set to the gradient at this rank's norm output (before the SP reduction of
// the caller's other terms: it is complete for this rank's tokens).
void moe_backward(const LayerShape& s, const MoeWeights& w, const TensorParallel& tp, const ExpertParallel& ep,
                  const MoeActs& a, const Buf& y_full, const float* dout, float* dy, std::vector<WeightGradJob>& jobs);

// Auxiliary-loss-free balancing, after a step's optimizer update (Megatron-Core's get_updated_expert_bias):
// the tokens routed to each expert over the step (this rank's, summed over `dp`, the data-parallel group of
// this tp rank; null with dp 1) move the selection bias by rate * sign(mean - load_e). The load restarts
// from zero. Every rank holding the layer computes the same bias (its tp peers see the same counts).
void update_selection_bias(const MoeWeights& w, Comm* dp, float rate);
// The rule itself, for a load already summed over the step and dp: bias[e] += rate * sign(mean - load[e]).
void move_selection_bias(float* bias, const std::vector<float>& load, float rate);

}  // namespace tessel::rt
