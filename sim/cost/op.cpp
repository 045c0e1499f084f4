#include "sim/cost/op.hpp"

#include <string_view>

namespace tessel::cost {

namespace {

// The element-wise kind of a lowered op, by its name (sim/workload.cpp's static names): what a measured
// profile rates it as. Unnamed element-wise work is `memory`.
CostKind elementwise_kind(const char* name) {
  const std::string_view n(name);
  if (n == "norm1" || n == "norm2") return CostKind::norm;
  if (n == "act" || n == "expert_act" || n == "shared_act") return CostKind::activation;
  if (n == "softmax_dropout") return CostKind::softmax;
  if (n == "residual1" || n == "residual2") return CostKind::glue;  // bias + dropout + residual add
  return CostKind::memory;
}

// The attention core when the profile measured it as one kernel: the flash path's executed count at the
// measured rates; the unfused path's softmax runs inside that kernel. The flash op carries its executed FLOPs
// (exec_flops_*: F/2 forward and 2.5 F/2 backward for full causal attention, F = 4 b h s_q s_k d; a window's
// tiles); so do a windowed layer's unfused GEMMs (their shares of what the flash kernel would run); a full
// layer's unfused GEMMs are F/2 and 2.5 F/2 of their flops_f.
void price_measured_core(WorkOp& op, const GpuSpec& gpu) {
  const double f = op.cls == OpClass::attention || op.cls == OpClass::gemm ? op.flops_f : 0.0;
  const bool executed = op.exec_flops_f > 0;
  const int launches = std::string_view(op.name) == "attn_v" ? 0 : 1;  // one kernel for both unfused GEMMs
  op.t_f = attention_core_time(gpu, executed ? op.exec_flops_f : f / 2, false, launches);
  op.t_i = attention_core_time(gpu, executed ? op.exec_flops_b : 2.5 * f / 2, true, launches);
  op.t_w = 0;
}

void price_gemm(WorkOp& op, const GpuSpec& gpu, const Layout& l) {
  const Precision p = op.precision;
  const GemmShape& g = op.gemm;
  op.t_f = gemm_time(gpu, p, g);
  // The gradient classes' factors are 1 unless a profile measured them (multiplying by 1 changes nothing).
  op.t_i = gemm_time(gpu, p, {g.m, g.k, g.n, g.batch}) * gpu.gemm_dgrad_factor;
  if (op.has_weights) {
    op.t_w = gemm_time(gpu, p, {g.k, g.n, g.m, g.batch}) * gpu.gemm_wgrad_factor;
    // The weight gradient lands in the fp32 gradient buffer: an fp32 output, where the other GEMMs write
    // 16-bit (an fp32 GEMM writes fp32 anyway).
    if (l.state.main_grads == StateDtype::fp32 && p != Precision::fp32) op.t_w *= gpu.gemm_fp32_out;
  } else {
    op.t_i += gemm_time(gpu, p, {g.k, g.n, g.m, g.batch}) * gpu.gemm_dgrad_factor;
  }
  if (p == Precision::fp8) {
    const double mk = static_cast<double>(g.m) * g.k * g.batch, mn = static_cast<double>(g.m) * g.n * g.batch;
    const Fp8Cast c = fp8_cast(l.fp8_recipe, gpu);
    op.t_f += memory_time(gpu, c.bytes * mk, c.kernels);
    op.t_i += memory_time(gpu, c.bytes * mn, c.kernels);
    // torchao's Float8Linear casts the weight in the forward and again for the backward's input gradient, in
    // every micro-batch, each a cast to one copy (Transformer Engine casts a step's weights once: the step's
    // optimizer time). With FSDP2's float8 all-gather the weight arrives in fp8 and, where the tensor cores
    // take fp8 only as TN, the backward makes its transposed copy (read and written once).
    if (op.has_weights && l.fp8_weight_cast == Fp8WeightCast::per_microbatch) {
      const double kn = static_cast<double>(g.k) * g.n * g.batch;
      if (!l.fp8_params()) {
        const Fp8Cast one = fp8_cast_one_copy(l.fp8_recipe);
        op.t_f += memory_time(gpu, one.bytes * kn, one.kernels);
        op.t_i += memory_time(gpu, one.bytes * kn, one.kernels);
      } else if (gpu.fp8_transposed_copy()) {
        op.t_i += memory_time(gpu, 2.0 * kn, 1);
      }
    }
  }
}

}  // namespace

Fp8Cast fp8_cast(Fp8Recipe r, const GpuSpec& gpu) {
  const double copies = gpu.fp8_transposed_copy() ? 2.0 : 1.0;
  switch (r) {
    case Fp8Recipe::delayed: return {2.0 + copies, 1};
    case Fp8Recipe::current: return {2.0 + 2.0 + copies, 2};
    case Fp8Recipe::mxfp8: return {2.0 + 2.0 * (1.0 + 1.0 / 32), 1};
  }
  return {2.0 + copies, 1};
}

Fp8Cast fp8_cast_one_copy(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::delayed: return {2.0 + 1.0, 1};
    case Fp8Recipe::current: return {2.0 + 2.0 + 1.0, 2};
    case Fp8Recipe::mxfp8: return {2.0 + 1.0 + 1.0 / 32, 1};
  }
  return {2.0 + 1.0, 1};
}

AttentionKernel attention_kernel(const WorkOp& op, bool fa2, bool backward) {
  return {fa2, backward, op.attn_seq, op.attn_head_dim, op.attn_batch_heads, op.attn_queries, op.attn_causal};
}

void price(WorkOp& op, const System& sys, const Layout& l) {
  op.t_f = op.t_i = op.t_w = 0;
  op.runtime_priced = false;
  if (op.attention_core && measured_attention_core(sys.gpu)) {
    price_measured_core(op, sys.gpu);
    return;
  }
  switch (op.cls) {
    case OpClass::gemm:
      price_gemm(op, sys.gpu, l);
      return;
    case OpClass::attention: {
      const bool fa2 = l.runs_fa2();
      op.t_f = attention_time(sys.gpu, op.precision, op.exec_flops_f, op.bytes_f, attention_kernel(op, fa2, false));
      op.t_i = attention_time(sys.gpu, op.precision, op.exec_flops_b, op.bytes_b, attention_kernel(op, fa2, true));
      return;
    }
    case OpClass::elementwise: {
      const CostKind k = elementwise_kind(op.name);
      // A profile calibrated on Tessel's runtime (measured kind rates) prices that runtime's glue passes.
      const bool runtime = k == CostKind::glue && sys.gpu.kind_rates() && op.runtime_bytes_f + op.runtime_bytes_b > 0;
      op.runtime_priced = runtime;
      op.t_f = memory_time(sys.gpu, runtime ? op.runtime_bytes_f : op.bytes_f, op.kernels, k, false);
      op.t_i = memory_time(sys.gpu, runtime ? op.runtime_bytes_b : op.bytes_b, op.kernels_b > 0 ? op.kernels_b : op.kernels,
                           k, true);
      return;
    }
    case OpClass::collective:
      op.t_f = op.t_i = collective_time(sys, op.coll, op.comm_bytes, op.group, 1.0, op.deepep).seconds;
      return;
  }
}

}  // namespace tessel::cost
