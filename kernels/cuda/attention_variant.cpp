#include "kernels/cuda/attention_variant.hpp"

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "util/error.hpp"

namespace tessel::kernels::cuda {

namespace {

struct Named {
  const char* name;
  AttentionConfig config;
};

// The accepted names, the measured ones first (attention_variant.hpp's list).
const std::vector<Named>& table() {
  static const std::vector<Named> t = {
      {"fp32", {AttentionVariant::fp32}},
      {"tc", {AttentionVariant::tc}},
      {"cudnn", {AttentionVariant::cudnn}},
      {"experimental-tc2", {AttentionVariant::tc2}},
      {"experimental-tc3", {AttentionVariant::tc3, 8, 128, false}},
      {"experimental-tc3-noswizzle", {AttentionVariant::tc3, 8, 0, false}},
      {"experimental-tc3-overlap", {AttentionVariant::tc3, 8, 128, true}},
  };
  return t;
}

std::string shape_text(const AttentionShape& a) {
  return "batch " + std::to_string(a.batch) + " seq " + std::to_string(a.seq) + " hq " + std::to_string(a.hq) +
         " hkv " + std::to_string(a.hkv) + " d " + std::to_string(a.d);
}

bool aligned(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

std::string name_list() {
  std::string s;
  for (const Named& n : table()) s += (s.empty() ? "" : ", ") + std::string(n.name);
  return s;
}

// The tensors a direction reads and writes, with the leading dimension the layout needs at least.
struct Mat {
  const char* name;
  const void* p;
  int ld, min_ld;
};

std::string operand_rule(const AttentionConfig& c, const AttentionArgs& a, bool backward) {
  const AttentionShape& s = a.shape;
  const int qd = s.hq * s.d, kd = s.hkv * s.d;
  std::vector<Mat> in = {{"q", a.q, a.ldq, qd}, {"k", a.k, a.ldk, kd}, {"v", a.v, a.ldv, kd}};
  std::vector<Mat> out = {{"out", a.out, a.ldo, qd}};
  if (backward) {
    in.push_back({"dout", a.dout, a.lddo, qd});
    out = {{"out", a.out, a.ldo, qd}, {"dq", a.dq, a.lddq, qd}, {"dk", a.dk, a.lddk, kd}, {"dv", a.dv, a.lddv, kd}};
  }
  for (const std::vector<Mat>* group : {&in, &out})
    for (const Mat& m : *group) {
      if (!m.p) return std::string(m.name) + " is null";
      if (m.ld < m.min_ld)
        return std::string(m.name) + " row stride " + std::to_string(m.ld) + " is below its width " + std::to_string(m.min_ld);
    }
  if (!a.lse) return "lse is null";
  if (backward && !a.delta) return "delta (scratch) is null";
  const bool bf16 = a.dtype == AttnDtype::bf16;
  if (bf16 && !attention_takes_bf16(c.variant))
    return "the " + attention_kernel_name(c) + " kernel reads fp32 operands, not bf16 ones";
  if (bf16)
    for (const Mat& m : in) {
      if (m.ld != m.min_ld)
        return std::string("bf16 operand ") + m.name + " needs compact rows (row stride " + std::to_string(m.min_ld) +
               ", got " + std::to_string(m.ld) + ")";
      if (!aligned(m.p, 16))
        return std::string("bf16 operand ") + m.name + " needs a 16-byte aligned pointer";
    }
  if (c.variant == AttentionVariant::fp32) return "";
  // The hand-written tensor-core kernels load fp32 rows as float4s and store outputs as float2s; cuDNN
  // reads the same copies (kernels/cuda/attention_cudnn.cpp), so the rules are one set.
  if (!bf16)
    for (const Mat& m : in)
      if (!aligned(m.p, 16) || m.ld % 4 != 0)
        return std::string("fp32 operand ") + m.name + " needs a 16-byte aligned pointer and a row stride divisible by 4 (ld " +
               std::to_string(m.ld) + ")";
  for (const Mat& m : out)
    if (!aligned(m.p, 8) || m.ld % 2 != 0)
      return std::string("output ") + m.name + " needs 8-byte alignment and an even row stride (ld " + std::to_string(m.ld) + ")";
  return "";
}

}  // namespace

std::string attention_kernel_name(const AttentionConfig& c) {
  for (const Named& n : table())
    if (n.config.variant == c.variant &&
        (c.variant != AttentionVariant::tc3 ||
         (n.config.tc3_swizzle == c.tc3_swizzle && n.config.tc3_overlap == c.tc3_overlap)))
      return n.name;
  return "experimental-tc3";  // a tc3 tuning no name spells (tests only)
}

const std::vector<std::string>& attention_kernel_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Named& n : table()) v.push_back(n.name);
    return v;
  }();
  return names;
}

bool attention_takes_bf16(AttentionVariant v) {
  return v == AttentionVariant::cudnn || v == AttentionVariant::tc2 || v == AttentionVariant::tc3;
}

std::string attention_shape_rule(AttentionVariant v, const AttentionShape& a) {
  if (a.batch < 1 || a.seq < 1 || a.hq < 1 || a.hkv < 1 || a.d < 1 || a.hq % a.hkv != 0)
    return shape_text(a) + ": needs positive sizes and hq % hkv == 0";
  switch (v) {
    case AttentionVariant::fp32:
      return a.d <= 128 ? "" : shape_text(a) + ": the fp32 kernel needs d <= 128";
    case AttentionVariant::cudnn:
      return a.d % 8 == 0 && a.d <= 128 ? "" : shape_text(a) + ": cuDNN's attention here needs d a multiple of 8, at most 128";
    default:
      return a.d == 64 || a.d == 128 ? "" : shape_text(a) + ": the tensor-core kernels need d 64 or 128";
  }
}

std::string attention_args_rule(const AttentionConfig& c, const AttentionArgs& a, bool backward) {
  std::string rule = attention_shape_rule(c.variant, a.shape);
  if (rule.empty()) rule = operand_rule(c, a, backward);
  if (rule.empty() && c.variant == AttentionVariant::tc && c.tc_block_warps != 4 && c.tc_block_warps != 8)
    rule = "tc block warps " + std::to_string(c.tc_block_warps) + " (needs 4 or 8)";
  if (rule.empty() && c.variant == AttentionVariant::tc3 && c.tc3_swizzle != 0 && c.tc3_swizzle != 128)
    rule = "tc3 swizzle " + std::to_string(c.tc3_swizzle) + " (needs 0 or 128)";
  return rule.empty() ? "" : "attention (" + attention_kernel_name(c) + "): " + rule;
}

AttentionConfig resolve_attention_kernel(const std::string& name, bool bf16_gemms, const AttentionShape& shape) {
  if (name.empty()) {
    const bool tc = bf16_gemms && attention_shape_rule(AttentionVariant::tc, shape).empty();
    return AttentionConfig{tc ? AttentionVariant::tc : AttentionVariant::fp32};
  }
  const Named* hit = nullptr;
  for (const Named& n : table())
    if (name == n.name) hit = &n;
  if (!hit) throw InputError("--attention-kernel " + name + ": not an attention kernel (one of " + name_list() + ")");
  const AttentionConfig c = hit->config;
  if (c.variant != AttentionVariant::fp32 && !bf16_gemms)
    throw InputError("--attention-kernel " + name + ": computes on bf16 operands, so it needs --precision bf16 "
                     "(fp32 is the kernel of fp32 and tf32 runs)");
  if (const std::string rule = attention_shape_rule(c.variant, shape); !rule.empty())
    throw InputError("--attention-kernel " + name + ": no kernel for this layer's shard (" + rule + ")");
  if (c.variant == AttentionVariant::cudnn && !attention_cudnn_built())
    throw InputError("--attention-kernel cudnn: this build has no cuDNN (libcudnn or the cudnn-frontend headers were "
                     "not found when it was configured: tools/setup.sh installs them)");
  return c;
}

}  // namespace tessel::kernels::cuda
