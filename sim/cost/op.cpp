#include "sim/cost/op.hpp"

namespace tessel::cost {

namespace {

void price_gemm(WorkOp& op, const GpuSpec& gpu) {
  const Precision p = op.precision;
  const GemmShape& g = op.gemm;
  op.t_f = gemm_time(gpu, p, g);
  op.t_i = gemm_time(gpu, p, {g.m, g.k, g.n, g.batch});
  if (op.has_weights) {
    op.t_w = gemm_time(gpu, p, {g.k, g.n, g.m, g.batch});
  } else {
    op.t_i += gemm_time(gpu, p, {g.k, g.n, g.m, g.batch});
  }
  if (p == Precision::fp8) {
    const double mk = static_cast<double>(g.m) * g.k * g.batch, mn = static_cast<double>(g.m) * g.n * g.batch;
    op.t_f += memory_time(gpu, 3.0 * mk, 1);
    op.t_i += memory_time(gpu, 3.0 * mn, 1);
  }
}

}  // namespace

void price(WorkOp& op, const System& sys) {
  op.t_f = op.t_i = op.t_w = 0;
  switch (op.cls) {
    case OpClass::gemm:
      price_gemm(op, sys.gpu);
      return;
    case OpClass::attention:
      op.t_f = attention_time(sys.gpu, op.precision, op.exec_flops_f, op.bytes_f);
      op.t_i = attention_time(sys.gpu, op.precision, op.exec_flops_b, op.bytes_b);
      return;
    case OpClass::elementwise:
      op.t_f = memory_time(sys.gpu, op.bytes_f, op.kernels);
      op.t_i = memory_time(sys.gpu, op.bytes_b, op.kernels);
      return;
    case OpClass::collective:
      op.t_f = op.t_i = collective_time(sys, op.coll, op.comm_bytes, op.group).seconds;
      return;
  }
}

}  // namespace tessel::cost
