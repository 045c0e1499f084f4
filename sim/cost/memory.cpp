#include "sim/cost/memory.hpp"

#include <algorithm>
#include <cmath>

namespace tessel::cost {

namespace {

// What an fp8 recipe changes in the kept bytes above: Transformer Engine's fp8 linear layers save for their
// backward the fp8 cast of their input (1 byte an element; _Linear, _LayerNormLinear and _LayerNormMLP keep
// `inputmat` / `ln_out` / the activation output in fp8), not the 16-bit tensor. So the QKV (MLA: the
// down-projections') input, the MLP input, the activation output (the second GEMM's input), MoE's permuted
// expert inputs and expert activation outputs, and MLA's latent norm outputs (the up-projections' inputs) keep
// one byte fewer an element. A MoE MLP's input is also the router's, a 16-bit GEMM that keeps it whole; its
// shared experts' first GEMM adds an fp8 copy. The projection's input is the attention output: flash attention
// keeps it in 16-bit for its own backward, so the projection's fp8 copy comes on top; the unfused core keeps
// its probabilities instead, and the projection's input is the fp8 copy alone. Negative: bytes saved.
double fp8_saved_input_delta(const Model& m, const Layout& l) {
  const double b = l.micro_batch, s = static_cast<double>(m.seq_len) / l.cp, h = m.hidden, t = l.tp;
  const double sp = l.sequence_parallel ? t : 1.0;
  const double sbh = s * b * h;
  double d = -sbh / sp;  // the attention's first GEMM input
  const double proj_in = m.mla.enabled() ? s * b * m.heads * m.mla.v_head_dim / t : s * b * static_cast<double>(m.heads) * m.head_dim / t;
  d += l.attention == AttentionImpl::flash ? proj_in : -proj_in;
  if (m.mla.enabled()) d -= s * b * (m.mla.q_lora_rank + m.mla.kv_lora_rank);
  if (m.moe.enabled()) {
    const double T = s * b / sp, k = m.moe.top_k * l.moe_load_factor(), etp = l.expert_tp();
    d -= etp * T * k * h + T * k * m.moe.expert_ffn;
    if (m.moe.shared_ffn > 0) d += sbh / sp - s * b * m.moe.shared_ffn / t;
  } else {
    d -= sbh / sp + s * b * static_cast<double>(m.ffn) / t;
  }
  return d;
}

// One layer's kept bytes under recompute policy `rc` (the layout's own, or another one asked about without
// copying the layout: explore calls this for every stage of every layout).
double layer_activation_bytes_as(const Model& m, const Layout& l, Recompute rc) {
  const double b = l.micro_batch, s = static_cast<double>(m.seq_len) / l.cp, h = m.hidden, t = l.tp;
  const double sbh = s * b * h;
  const double sp = l.sequence_parallel ? t : 1.0;  // divisor for tensors that SP shards along the sequence
  // 16-bit elements take 2 bytes (fp8 recipes keep 16-bit activations between layers), fp32 4.
  const double wide = l.precision == Precision::fp32 ? 2.0 : 1.0;
  if (rc == Recompute::full) return wide * 2.0 * sbh / sp;  // the layer's input only
  const double q = static_cast<double>(m.heads) * m.head_dim;
  const double kv = std::max(static_cast<double>(m.kv_heads) * m.head_dim / t, static_cast<double>(m.head_dim)) * t;
  const double f = m.ffn;
  const double gate = m.activation == Activation::swiglu ? 2.0 : 1.0;
  const double mask = m.dropout ? 1.0 : 0.0;
  // Korthikanti Sec. 4.1 term by term (2 bytes per 16-bit element, 1 per dropout mask byte):
  // attention: QKV input 2sbh, Q 2sbq/t, K and V 2sb kv/t each, projection input 2sbq/t, dropout mask sbh;
  // MLP: input 2sbh, activation input 2sbf/t (x2 for SwiGLU's gate), activation output 2sbf/t, mask sbh;
  // two norms: 2sbh each.
  double bytes = 0;
  bytes += (2.0 * sbh + mask * sbh) / sp;                     // attention: QKV input, dropout mask
  if (m.mla.enabled()) {
    // MLA (sim/workload.cpp add_mla_projections): the latents' down-projection outputs and norm outputs, whole
    // on every tp rank (the up-projections' inputs), the rotary key; Q and K of qk_head_dim, V and the
    // projection input of v_head_dim per head, split over tp.
    const double qr = m.mla.q_lora_rank, kvr = m.mla.kv_lora_rank, dr = m.mla.qk_rope_head_dim;
    const double H = m.heads, dqk = m.mla.qk_head_dim(), dv = m.mla.v_head_dim;
    bytes += s * b * (4.0 * qr + 4.0 * kvr + 2.0 * dr);
    bytes += s * b * (4.0 * H * dqk + 4.0 * H * dv) / t;
  } else {
    bytes += s * b * (2.0 * q + 4.0 * kv + 2.0 * q) / t;      // Q, K, V, projection input
  }
  bytes += (2.0 * sbh + mask * sbh) / sp;                     // MLP input, dropout mask
  if (m.moe.enabled()) {
    // A MoE MLP (sim/workload.cpp add_moe_mlp) keeps, for its backward, what each op's gradient reads: the
    // router's fp32 probabilities [T, E]; the permuted tokens, the experts' inputs [etp T k, h]; the activation's
    // input(s) and output [T k, f_e] (1/etp of the width on etp T k rows); the experts' outputs, which the
    // unpermute's weighted sum needs for its weights' gradient; the shared experts as a dense MLP. T = s b / sp.
    // On the busiest EP rank (Layout::moe_load_factor: its skew, or the padded capacity) the expert tensors grow.
    const double T = s * b / sp, k = m.moe.top_k * l.moe_load_factor(), etp = l.expert_tp(), fe = m.moe.expert_ffn;
    bytes += 4.0 * T * m.moe.experts;
    bytes += 2.0 * 2.0 * etp * T * k * h;                     // permuted inputs and expert outputs
    bytes += T * k * (2.0 * gate * fe + 2.0 * fe);            // expert activation input(s) and output
    bytes += s * b * (2.0 * gate + 2.0) * m.moe.shared_ffn / t;  // shared experts' activation input(s) and output
  } else {
    bytes += s * b * (2.0 * gate * f + 2.0 * f) / t;          // activation input(s) and output
  }
  bytes += 4.0 * sbh / sp;                                    // norms
  const bool keep_scores = rc == Recompute::none && l.attention == AttentionImpl::unfused;
  const double heads_local = static_cast<double>(m.heads) / t;
  const double sk = m.seq_len;
  if (keep_scores) {
    // softmax output (2 bytes), dropout mask (1) and dropout output (2) per score: 5 a s^2 b / t.
    bytes += (2.0 + (m.dropout ? 3.0 : 0.0)) * heads_local * s * sk * b;
  } else if (l.attention == AttentionImpl::flash) {
    bytes += 4.0 * heads_local * s * b;  // fp32 log-sum-exp per query row
  }
  if (l.precision == Precision::fp8) bytes += fp8_saved_input_delta(m, l);
  // bf16, fp16 and fp8 (whose recipes keep 16-bit activations, line above) as counted; fp32 doubles them.
  return wide * bytes;
}

}  // namespace

double layer_activation_bytes(const Model& m, const Layout& l) { return layer_activation_bytes_as(m, l, l.recompute); }

double stage_activation_bytes(const Model& m, const Layout& l, int layers, int recomputed) {
  if (l.recompute == Recompute::full) {
    // Block method: `recomputed` layers keep their input, the others everything; uniform: all keep inputs.
    return recomputed * layer_activation_bytes_as(m, l, Recompute::full) +
           (layers - recomputed) * layer_activation_bytes_as(m, l, Recompute::none);
  }
  return layers * layer_activation_bytes(m, l);
}

double stage_extra_activation_bytes(const Model& m, const Layout& l, bool first, bool last) {
  const double b = l.micro_batch, s = static_cast<double>(m.seq_len) / l.cp, h = m.hidden, t = l.tp;
  const double sbh = s * b * h;
  double bytes = 0;
  // The embedding dropout's 1-byte mask, sequence-sharded (Korthikanti Sec. 4.3: s b h p / t for p in-flight
  // micro-batches; this is one micro-batch's share, the schedule multiplies). Its output is the first
  // layer's input, counted with that layer.
  const double wide = l.precision == Precision::fp32 ? 2.0 : 1.0;  // 16-bit tensors at 4 bytes in fp32 training
  if (first) bytes += (m.dropout ? 1.0 : 0.0) * sbh / t;
  // Final norm input and output-projection input (2 s b h / t each) and fp32 logits 4 s b v / t.
  if (last) bytes += wide * 4.0 * sbh / t + 4.0 * s * b * static_cast<double>(m.vocab) / t;
  return bytes;
}

double zero3_gather_bytes(const Model& m, const Layout& l, GpuArch arch) {
  if (l.zero_stage != 3) return 0.0;
  const double h = m.hidden, f = m.ffn, q = static_cast<double>(m.heads) * m.head_dim;
  const double kv = static_cast<double>(m.kv_heads) * m.head_dim;
  const double gate = m.activation == Activation::swiglu ? 2.0 : 1.0;
  // The layers' GEMM weights as they are gathered and used (fp8 under fp8), the embedding or head 16-bit.
  const double gemm = std::max({gate * h * f, h * f, h * (q + 2 * kv)}) / l.tp * fp8_gemm_gathered_bytes(l, arch);
  const double vocab = static_cast<double>(m.vocab) * h / l.tp * weight_bytes(l.precision);
  return 2.0 * std::max(gemm, vocab);
}

double recompute_transient_bytes(const Model& m, const Layout& l) {
  if (l.recompute != Recompute::full) return 0.0;
  return layer_activation_bytes_as(m, l, Recompute::none);
}

namespace {

// Sizes of one micro-batch of one GPU for the runtime's terms.
struct Sizes {
  double T, Tl;            // tokens, and tokens of the sequence shard under SP
  double h, q, kv, f, V;   // hidden; this tp rank's share of q, kv, ffn and the vocabulary
  double elt;              // bytes per kept tensor element (the layout's activation width)
};

Sizes sizes_of(const Model& m, const Layout& l) {
  const double t = l.tp, T = static_cast<double>(l.micro_batch) * m.seq_len / l.cp;
  return {T,
          l.sequence_parallel ? T / t : T,
          static_cast<double>(m.hidden),
          static_cast<double>(m.heads) * m.head_dim / t,
          static_cast<double>(m.kv_heads) * m.head_dim / t,
          static_cast<double>(m.ffn) / t,
          static_cast<double>(m.vocab) / t,
          l.precision == Precision::fp32 ? 4.0 : 2.0};
}

constexpr double kStat = 4.0;  // fp32 statistics (norm mean and 1/std, softmax row max and sum) and logits

// Per kept layer: the two norms' statistics, and under SP their outputs kept whole (T h) beside the shard.
double runtime_layer_extra(const Sizes& z) { return kStat * 4.0 * z.Tl + z.elt * 2.0 * (z.T - z.Tl) * z.h; }

// The last stage's head: final norm input and statistics, its gathered output, fp32 logits, softmax max and sum.
double runtime_head(const Sizes& z) {
  return z.elt * (z.Tl * z.h + z.T * z.h) + kStat * (2 * z.Tl + z.T * z.V + 2 * z.T);
}

}  // namespace

RuntimeActivations runtime_stage_activations(const Model& m, const Layout& l, int stage) {
  const Sizes z = sizes_of(m, l);
  const int layers = l.layers_of_stage(stage, m.layers), last = l.num_stages() - 1;
  Layout none = l;
  none.recompute = Recompute::none;
  const double layer_extra = runtime_layer_extra(z);
  RuntimeActivations b;
  if (l.recompute != Recompute::full) {
    b.held = stage_activation_bytes(m, l, layers, 0) + layers * layer_extra;
  } else {
    // Uniform: blocks of k = recompute_layers layers (0: one, Megatron's default), one saved input per block.
    // Block: the first k layers (0: all) are checkpointed one by one, the rest keep everything.
    const bool uniform = l.recompute_method == RecomputeMethod::uniform;
    const int k = l.recompute_layers > 0 ? std::min(l.recompute_layers, layers) : (uniform ? 1 : layers);
    const int ckpt = uniform ? layers : k, block = uniform ? k : 1;
    const int inputs = uniform ? (layers + k - 1) / k : k;
    b.held = stage_activation_bytes(m, none, layers - ckpt, 0) + (layers - ckpt) * layer_extra +
             inputs * layer_activation_bytes(m, l);
    b.transient = block * (layer_activation_bytes(m, none) + layer_extra);
  }
  b.w_inputs = layers * z.elt * z.T * (2 * z.h + z.q + z.f);
  b.w_grads = layers * z.elt * z.T * (2 * z.h + z.q + 2 * z.kv + z.f);
  if (stage == 0) b.held += stage_extra_activation_bytes(m, l, true, false);  // 0 without dropout
  if (stage == last) {
    b.held += runtime_head(z);
    b.w_inputs += z.elt * z.T * z.h;
    b.w_grads += kStat * z.T * z.V;
  }
  return b;
}

double runtime_activation_peak(const Model& m, const Layout& l, const sched::Schedule& s, int rank) {
  double held = 0, peak = 0;
  auto play = [&](const sched::Action& a) {
    const RuntimeActivations b = runtime_stage_activations(m, l, a.stage);
    switch (a.type) {
      case sched::ActionType::F: held += b.held; break;
      case sched::ActionType::B: peak = std::max(peak, held + b.transient); held -= b.held; break;
      case sched::ActionType::I:
        peak = std::max(peak, held + b.transient + b.w_grads);
        held += b.w_inputs + b.w_grads - b.held;
        break;
      case sched::ActionType::W: held -= b.w_inputs + b.w_grads; break;
      default: break;
    }
    peak = std::max(peak, held);
  };
  for (const auto& a : s.ranks.at(static_cast<std::size_t>(rank))) {
    if (a.type == sched::ActionType::OVERLAP_F_B)
      for (const auto& sub : a.sub) play(sub);
    else
      play(a);
  }
  return peak;
}

double inflight_chunks(const Layout& l, int rank) {
  // Megatron-Core's combined 1F1B (the all-to-all overlap off DualPipeV) warms up with one forward more: one
  // more chunk alive (without pipelining two micro-batches, F(i+1)&B(i)).
  const double m = l.num_microbatches();
  const double extra = l.combined_1f1b() ? 1.0 : 0.0;
  if (l.pp == 1) return std::min(m, 1.0 + extra);
  return std::min(m * l.vpp, sched::inflight_chunks(l.schedule, l.microbatch_rule, l.pp, l.vpp, l.num_microbatches(), rank) + extra);
}

double last_stage_extras_alive(const Layout& l) {
  const double m = l.num_microbatches();
  if (sched::family(l.schedule).forwards_first) return m;
  return l.combined_1f1b() ? std::min(m, 2.0) : 1.0;
}

double grad_bytes(Precision p) { return p == Precision::fp16 ? 2.0 : 4.0; }

double grad_bytes(const Layout& l) {
  if (l.precision != Precision::fp32 && l.state.main_grads == StateDtype::bf16) return 2.0;
  return grad_bytes(l.precision);
}

double weight_bytes(Precision p) { return p == Precision::fp32 ? 4.0 : 2.0; }

StateBytes state_bytes_per_param(const Layout& l, GpuArch arch) {
  return state_bytes_per_param(l, static_cast<double>(l.dp) * l.cp, arch);
}

StateBytes expert_state_bytes_per_param(const Layout& l, GpuArch arch) { return state_bytes_per_param(l, l.expert_dp(), arch); }

namespace {

// One fp8 copy a layout the GEMMs read; Hopper's tensor cores read fp8 only as TN, so the backward's
// transposed operand is a second copy; MXFP8 keeps row- and column-wise copies, a 1-byte scale per 32.
double fp8_copies(const Layout& l, GpuArch arch) {
  return l.fp8_recipe == Fp8Recipe::mxfp8 ? 2.0 * (1.0 + 1.0 / 32) : arch == GpuArch::blackwell ? 1.0 : 2.0;
}

}  // namespace

double fp8_gemm_weight_bytes(const Layout& l, GpuArch arch) {
  // torchao keeps no fp8 copy between micro-batches: the 16-bit primary weight alone (with FSDP2's float8
  // all-gather too: the shard is cast before each gather).
  if (l.fp8_weight_cast == Fp8WeightCast::per_microbatch) return weight_bytes(l.precision);
  return l.fp8_params() ? fp8_copies(l, arch) : weight_bytes(l.precision) + fp8_copies(l, arch);
}

double fp8_gemm_gathered_bytes(const Layout& l, GpuArch arch) {
  if (l.precision != Precision::fp8) return weight_bytes(l.precision);
  const double gathered = fp8_gemm_gather_bytes(l);
  // fp8 data gathered (delayed or current scaling): its Hopper transpose beside it.
  if (l.fp8_params() && l.fp8_recipe != Fp8Recipe::mxfp8) return gathered + (arch == GpuArch::blackwell ? 0.0 : 1.0);
  // 16-bit values gathered (or MXFP8's, quantized after): their cast beside them, one copy under torchao.
  return gathered + (l.fp8_weight_cast == Fp8WeightCast::per_microbatch ? 1.0 : fp8_copies(l, arch));
}

double fp8_gemm_gather_bytes(const Layout& l) {
  return l.fp8_params() && l.fp8_recipe != Fp8Recipe::mxfp8 ? 1.0 : weight_bytes(l.precision);
}

StateBytes state_bytes_per_param(const Layout& l, double replicas, GpuArch arch) {
  StateBytes sb;
  const double d = replicas;
  if (l.precision == Precision::fp32) {
    sb.weights = 4;
    sb.grads = 4;
    sb.optimizer = 8;  // two fp32 moments
  } else {
    // bf16/fp16 (and fp8's 16-bit weights outside its GEMMs): 2 bytes.
    sb.weights = weight_bytes(l.precision);
    sb.grads = grad_bytes(l);  // main_grad buffer
    // Two moments (fp32 or bf16) and the master copy: fp32, a 16-bit remainder, or none.
    const double master = l.state.master_weights == MasterWeights::fp32 ? 4 : l.state.master_weights == MasterWeights::remainder ? 2 : 0;
    sb.optimizer = (l.state.moments == StateDtype::fp32 ? 8 : 4) + master;
  }
  sb.gemm_weights = l.precision == Precision::fp8 ? fp8_gemm_weight_bytes(l, arch) : sb.weights;
  if (l.zero_stage >= 1) sb.optimizer /= d;
  if (l.zero_stage >= 2) sb.grads /= d;
  if (l.zero_stage >= 3) {
    sb.weights /= d;
    // A shard holds what is gathered (fp8 primary weights' fp8 bytes, else the 16-bit weight): every cast is of
    // the gathered weight and lives in the gather's working set (zero3_gather_bytes).
    sb.gemm_weights = (l.precision == Precision::fp8 && l.fp8_weight_cast == Fp8WeightCast::cached ? fp8_gemm_gather_bytes(l)
                                                                                                  : sb.gemm_weights) / d;
  }
  return sb;
}

}  // namespace tessel::cost
