#include "tools/layer_ops.hpp"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "tools/format.hpp"

namespace tessel::cmd {

namespace {

const char* class_name(OpClass c) {
  switch (c) {
    case OpClass::gemm: return "gemm";
    case OpClass::attention: return "attention";
    case OpClass::elementwise: return "element-wise";
    case OpClass::collective: return "collective";
  }
  return "?";
}

// The op's work in words: a GEMM's forward shape (m x n x k, batched), bytes of memory traffic, a collective's buffer.
std::string op_work(const WorkOp& op) {
  if (op.cls == OpClass::gemm)
    return std::to_string(op.gemm.m) + "x" + std::to_string(op.gemm.n) + "x" + std::to_string(op.gemm.k) +
           (op.gemm.batch > 1 ? " x" + std::to_string(op.gemm.batch) : std::string());
  if (op.cls == OpClass::collective) return fmt::bytes(op.comm_bytes);
  if (op.cls == OpClass::attention) return fmt::fixed(op.exec_flops_f / 1e9, 1) + " GFLOP executed";
  if (op.runtime_priced) return fmt::bytes(op.runtime_bytes_f) + " / " + fmt::bytes(op.runtime_bytes_b) + " (runtime)";
  return fmt::bytes(op.bytes_f) + " / " + fmt::bytes(op.bytes_b);
}

// One transformer layer's ops per micro-batch on one GPU, in execution order, with their price: where a
// layer's time goes (--ops). Shares are of the layer's forward + backward, collectives included.
std::vector<const WorkOp*> layer_ops(const LayerWork& lw) {
  std::vector<const WorkOp*> v;
  for (const auto& op : lw.ops) v.push_back(&op);
  return v;
}

double op_total(const WorkOp& op) { return op.t_f + op.t_i + op.t_w; }

// The dtype an op runs in: a GEMM's or attention's own; element-wise ops and collectives move the layer's
// activations, 16-bit under bf16, fp16 and fp8 recipes alike, fp32 under fp32.
std::string op_dtype(const WorkOp& op, Precision p) {
  if (op.cls == OpClass::gemm || op.cls == OpClass::attention) return to_string(op.precision);
  return p == Precision::fp32 ? "fp32" : p == Precision::fp16 ? "fp16" : "bf16";
}

void print_ops_table(const LayerWork& lw, Precision p, const std::string& title) {
  double total = 0;
  for (const auto& op : lw.ops) total += op_total(op);
  std::vector<std::vector<std::string>> rows = {
      {"op", "kind", "dtype", "work (fwd shape or bytes fwd / bwd)", "forward", "input grad", "weight grad", "share"}};
  for (const WorkOp* op : layer_ops(lw))
    rows.push_back({op->name, class_name(op->cls), op_dtype(*op, p), op_work(*op), fmt::seconds(op->t_f),
                    fmt::seconds(op->t_i), fmt::seconds(op->t_w), fmt::pct(total > 0 ? op_total(*op) / total : 0)});
  std::cout << "\n" << title << ", one micro-batch, one GPU (--ops):\n" << fmt::table(rows)
            << "layer total " << fmt::seconds(total) << " (recompute, if any, adds " << fmt::seconds(lw.t_recompute)
            << " to the backward)\n";
}

Json layer_ops_json(const LayerWork& lw, Precision p) {
  Json a = Json::array();
  for (const WorkOp* op : layer_ops(lw)) {
    Json o = {{"name", op->name}, {"kind", class_name(op->cls)}, {"dtype", op_dtype(*op, p)},
              {"forward_s", op->t_f}, {"input_grad_s", op->t_i}, {"weight_grad_s", op->t_w},
              {"flops_forward", op->flops_f}, {"flops_backward", op->flops_b}};
    if (op->cls == OpClass::gemm) o["gemm_mnk_batch"] = {op->gemm.m, op->gemm.n, op->gemm.k, op->gemm.batch};
    if (op->cls == OpClass::elementwise || op->cls == OpClass::attention) {
      o["bytes_forward"] = op->runtime_priced ? op->runtime_bytes_f : op->bytes_f;
      o["bytes_backward"] = op->runtime_priced ? op->runtime_bytes_b : op->bytes_b;
    }
    if (op->cls == OpClass::collective) o["comm_bytes"] = op->comm_bytes;
    a.push_back(std::move(o));
  }
  return a;
}

}  // namespace

namespace {
// The kinds of layer the model has (sim/workload.hpp layer_kind), each with its title and JSON key.
struct KindTitle {
  int kind;
  std::string title, key;
};

std::vector<KindTitle> kind_titles(const Model& m) {
  const auto n = layer_kinds_in(m, 0, m.layers);
  const bool several = std::count_if(n.begin(), n.end(), [](int x) { return x > 0; }) > 1;
  const std::string window = "attention through a " + std::to_string(m.sliding_window) + "-token window";
  std::vector<KindTitle> out;
  for (int k = 0; k < kLayerKinds; ++k) {
    const int count = n[static_cast<std::size_t>(k)];
    if (count == 0) continue;
    std::string t = (k & 1) || !m.moe.enabled() ? (k & 1 ? "one dense layer" : "one transformer layer") : "one MoE layer";
    if (k & 2) t += " with " + window;
    else if (n[2] + n[3] > 0) t += " with full attention";
    if (several) t += " (" + std::to_string(count) + " of them)";
    out.push_back({k, t, std::string(k & 1 ? "dense_" : "") + (k & 2 ? "window_" : "") + "layer_ops"});
  }
  return out;
}
}  // namespace

void print_layer_ops(const Model& m, const Layout& l, const System& sys) {
  for (const auto& k : kind_titles(m)) print_ops_table(lower_layer(kind_model(m, k.kind), l, sys), l.precision, k.title);
}

void add_layer_ops_json(const Model& m, const Layout& l, const System& sys, Json& j) {
  for (const auto& k : kind_titles(m)) j[k.key] = layer_ops_json(lower_layer(kind_model(m, k.kind), l, sys), l.precision);
}

}  // namespace tessel::cmd
