// kernels/cuda's API (kernels.hpp, gemm.hpp, device_info.hpp) implemented by the CPU reference kernels
// (kernels/cpu) on the fake runtime's host memory: the GPU runtime's code (runtime/cuda) then runs on the
// CPU with the CPU runtime's own arithmetic, so what tests/cuda_fake compares is the orchestration (the
// schedule walk, tp collectives and the vocab-parallel cross-entropy, sequence-parallel and tied-embedding
// sums, the dp reduction and ZeRO-1, checkpoints, staged communication), not the kernels, which
// tests/cuda and tests/cuda_emu cover.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/norm.hpp"
#include "kernels/cpu/optimizer.hpp"
#include "kernels/cpu/permute.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/kernels.hpp"

namespace tessel::kernels::cuda {

namespace kc = tessel::kernels::cpu;

namespace {

Status bad(const std::string& what) { return {1, "fake kernels: " + what}; }

// A result wanted in fp32 (f32), bf16 (f16) or both: the CPU kernel writes fp32 (into f32, or scratch),
// the bf16 form is rounded from it when the scope ends, as the fused CUDA kernels write it.
struct Out {
  Out(float* f32, __nv_bfloat16* f16, std::size_t n) : f16_(f16), n_(n) {
    if (!f32) scratch_.resize(n), f32 = scratch_.data();
    f = f32;
  }
  ~Out() {
    if (f16_)
      for (std::size_t i = 0; i < n_; ++i) f16_[i] = __float2bfloat16(f[i]);
  }
  Out(const Out&) = delete;
  Out& operator=(const Out&) = delete;
  float* f = nullptr;

 private:
  std::vector<float> scratch_;
  __nv_bfloat16* f16_;
  std::size_t n_;
};

std::vector<float> widen(const __nv_bfloat16* x, std::size_t n) {
  std::vector<float> f(n);
  for (std::size_t i = 0; i < n; ++i) f[i] = __bfloat162float(x[i]);
  return f;
}

void add_residual(float* dx, const float* dres, std::size_t n) {
  if (dres)
    for (std::size_t i = 0; i < n; ++i) dx[i] = dx[i] + dres[i];
}

kc::RopeTable table_of(const RopeTableView& t) {
  kc::RopeTable r;
  r.seq = t.seq;
  r.d = t.d;
  const std::size_t n = std::size_t(t.seq) * (t.d / 2);
  r.cos.assign(t.cos, t.cos + n);
  r.sin.assign(t.sin, t.sin + n);
  return r;
}

std::uint64_t mix64(std::uint64_t z) {  // runtime/init.hpp's SplitMix64 finaliser, as elementwise.cu
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

// ---- device_info.hpp ----
int device_count() { return 1; }
Status device_info(DeviceInfo& out) {
  out = DeviceInfo{};
  out.name = "fake device (tests/cuda_fake: host memory, CPU kernels)";
  out.sm_count = 132;
  out.max_threads_per_sm = 2048;
  out.major = 9;
  out.max_smem_per_block_optin = 232448;
  out.l2_bytes = 50 << 20;
  out.mem_bytes = 64e9;
  return {};
}

// ---- gemm.hpp: the row-major contract on kc::gemm; bf16 operands widened exactly first ----
struct Gemm::Plan {};
Gemm::Gemm() = default;
Gemm::~Gemm() = default;
Status Gemm::init(std::size_t workspace_bytes) {  // nothing to create; the fields say what a real handle would hold
  handle_ = this;
  workspace_ = nullptr;
  workspace_bytes_ = workspace_bytes;
  return {};
}
Status Gemm::plan(const GemmArgs&, Plan*& out) {
  out = nullptr;
  return {};
}
Status Gemm::run(cudaStream_t stream_, const GemmArgs& a) {
  fake_stream_op(stream_, "gemm");
  if (!handle_) return bad("Gemm::run before init");
  if (a.epilogue == Epilogue::bias_gelu) return bad("the GELU epilogue is not faked");
  const float* A = static_cast<const float*>(a.A);
  const float* B = static_cast<const float*>(a.B);
  std::vector<float> wa, wb, wc;
  const bool out16 = a.type == GemmType::bf16;  // C and the bias in bf16 too: computed in fp32, rounded once
  if (a.type == GemmType::bf16_fp32 || out16) {
    const std::size_t na = std::size_t(a.trans_a ? a.K : a.M) * a.lda, nb = std::size_t(a.trans_b ? a.N : a.K) * a.ldb;
    wa = widen(static_cast<const __nv_bfloat16*>(a.A), na);
    wb = widen(static_cast<const __nv_bfloat16*>(a.B), nb);
    A = wa.data();
    B = wb.data();
  }
  float* C = static_cast<float*>(a.C);
  auto* C16 = static_cast<__nv_bfloat16*>(a.C);
  const auto at = [&](int r, int c) { return std::size_t(r) * a.ldc + c; };
  if (out16) {
    wc.assign(std::size_t(a.M) * a.ldc, 0.0f);
    if (a.beta != 0.0f)
      for (int r = 0; r < a.M; ++r)
        for (int c = 0; c < a.N; ++c) wc[at(r, c)] = __bfloat162float(C16[at(r, c)]);
    C = wc.data();
  }
  kc::gemm(a.trans_a, a.trans_b, a.M, a.N, a.K, a.alpha, A, a.lda, B, a.ldb, a.beta, C, a.ldc);
  if (a.epilogue == Epilogue::bias) {
    for (int c = 0; c < a.N; ++c) {
      const float b = out16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(a.bias)[c]) : static_cast<const float*>(a.bias)[c];
      for (int r = 0; r < a.M; ++r) C[at(r, c)] += b;
    }
  }
  if (out16)
    for (int r = 0; r < a.M; ++r)
      for (int c = 0; c < a.N; ++c) C16[at(r, c)] = __float2bfloat16(C[at(r, c)]);
  return {};
}

// ---- kernels.hpp ----
Status layernorm_fwd(cudaStream_t stream_, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                     float* rstd, int rows, int cols, float eps, __nv_bfloat16* y16) {
  fake_stream_op(stream_, "layernorm_fwd");
  if (!y && !y16) return bad("layernorm_fwd without an output");
  Out o(y, y16, std::size_t(rows) * cols);
  kc::layernorm_fwd(x, gamma, beta, o.f, mean, rstd, rows, cols, eps);
  return {};
}
Status layernorm_bwd(cudaStream_t stream_, const float* dy, const float* x, const float* gamma, const float* mean,
                     const float* rstd, float* dx, float* dgamma, float* dbeta, int rows, int cols, const float* dres) {
  fake_stream_op(stream_, "layernorm_bwd");
  std::vector<float> scratch;
  if (!dx) scratch.resize(std::size_t(rows) * cols), dx = scratch.data();
  kc::layernorm_bwd(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols);
  add_residual(dx, dres, std::size_t(rows) * cols);
  return {};
}
Status rmsnorm_fwd(cudaStream_t stream_, const float* x, const float* gamma, float* y, float* rstd, int rows, int cols,
                   float eps, __nv_bfloat16* y16) {
  fake_stream_op(stream_, "rmsnorm_fwd");
  if (!y && !y16) return bad("rmsnorm_fwd without an output");
  Out o(y, y16, std::size_t(rows) * cols);
  kc::rmsnorm_fwd(x, gamma, o.f, rstd, rows, cols, eps);
  return {};
}
Status rmsnorm_bwd(cudaStream_t stream_, const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                   float* dgamma, int rows, int cols, const float* dres) {
  fake_stream_op(stream_, "rmsnorm_bwd");
  std::vector<float> scratch;
  if (!dx) scratch.resize(std::size_t(rows) * cols), dx = scratch.data();
  kc::rmsnorm_bwd(dy, x, gamma, rstd, dx, dgamma, rows, cols);
  add_residual(dx, dres, std::size_t(rows) * cols);
  return {};
}
Status gelu_fwd(cudaStream_t stream_, const float* x, float* y, std::size_t n, __nv_bfloat16* y16) {
  fake_stream_op(stream_, "gelu_fwd");
  if (!y && !y16) return bad("gelu_fwd without an output");
  Out o(y, y16, n);
  kc::gelu_fwd(x, o.f, n);
  return {};
}
Status gelu_bwd(cudaStream_t stream_, const float* dy, const float* x, float* dx, std::size_t n, __nv_bfloat16* dx16) {
  fake_stream_op(stream_, "gelu_bwd");
  if (!dx && !dx16) return bad("gelu_bwd without an output");
  Out o(dx, dx16, n);
  kc::gelu_bwd(dy, x, o.f, n);
  return {};
}
Status swiglu_fwd(cudaStream_t stream_, const float* gate, const float* up, float* y, std::size_t n, __nv_bfloat16* y16) {
  fake_stream_op(stream_, "swiglu_fwd");
  if (!y && !y16) return bad("swiglu_fwd without an output");
  Out o(y, y16, n);
  kc::swiglu_fwd(gate, up, o.f, n);
  return {};
}
Status swiglu_bwd(cudaStream_t stream_, const float* dy, const float* gate, const float* up, float* dgate, float* dup,
                  std::size_t n, __nv_bfloat16* dgate16, __nv_bfloat16* dup16) {
  fake_stream_op(stream_, "swiglu_bwd");
  if ((!dgate && !dgate16) || (!dup && !dup16)) return bad("swiglu_bwd without an output");
  Out og(dgate, dgate16, n), ou(dup, dup16, n);
  kc::swiglu_bwd(dy, gate, up, og.f, ou.f, n);
  return {};
}
Status gelu_fwd_bf16(cudaStream_t stream_, const __nv_bfloat16* x, __nv_bfloat16* y, std::size_t n) {
  fake_stream_op(stream_, "gelu_fwd_bf16");
  if (!y) return bad("gelu_fwd_bf16 without an output");
  const std::vector<float> xf = widen(x, n);
  Out o(nullptr, y, n);
  kc::gelu_fwd(xf.data(), o.f, n);
  return {};
}
Status gelu_bwd_bf16(cudaStream_t stream_, const __nv_bfloat16* dy, const __nv_bfloat16* x, __nv_bfloat16* dx,
                     std::size_t n) {
  fake_stream_op(stream_, "gelu_bwd_bf16");
  if (!dx) return bad("gelu_bwd_bf16 without an output");
  const std::vector<float> df = widen(dy, n), xf = widen(x, n);
  Out o(nullptr, dx, n);
  kc::gelu_bwd(df.data(), xf.data(), o.f, n);
  return {};
}
Status swiglu_fwd_bf16(cudaStream_t stream_, const __nv_bfloat16* gate, const __nv_bfloat16* up, __nv_bfloat16* y,
                       std::size_t n) {
  fake_stream_op(stream_, "swiglu_fwd_bf16");
  if (!y) return bad("swiglu_fwd_bf16 without an output");
  const std::vector<float> gf = widen(gate, n), uf = widen(up, n);
  Out o(nullptr, y, n);
  kc::swiglu_fwd(gf.data(), uf.data(), o.f, n);
  return {};
}
Status swiglu_bwd_bf16(cudaStream_t stream_, const __nv_bfloat16* dy, const __nv_bfloat16* gate, const __nv_bfloat16* up,
                       __nv_bfloat16* dgate, __nv_bfloat16* dup, std::size_t n) {
  fake_stream_op(stream_, "swiglu_bwd_bf16");
  if (!dgate || !dup) return bad("swiglu_bwd_bf16 without an output");
  const std::vector<float> df = widen(dy, n), gf = widen(gate, n), uf = widen(up, n);
  Out og(nullptr, dgate, n), ou(nullptr, dup, n);
  kc::swiglu_bwd(df.data(), gf.data(), uf.data(), og.f, ou.f, n);
  return {};
}
// ---- attention (kernels/cuda/attention.hpp): every variant is the CPU reference here; the variant only
// decides, through the runtime, which operand type it is handed (attention_takes_bf16). The calls are
// checked against the variant's rules as the device's entry point checks them (attention_args_rule).
struct CudnnAttention {};
void CudnnAttentionDeleter::operator()(CudnnAttention* p) const { delete p; }
bool attention_cudnn_built() { return true; }  // the fake stands in for a full build

namespace {

// q, k, v or dout as fp32 rows: the caller's, or bf16 compact rows widened exactly.
const float* rows_f32(const AttentionArgs& g, const void* p, int heads, std::vector<float>& keep) {
  if (g.dtype == AttnDtype::fp32) return static_cast<const float*>(p);
  keep = widen(static_cast<const __nv_bfloat16*>(p), std::size_t(g.shape.batch) * g.shape.seq * heads * g.shape.d);
  return keep.data();
}

void reference_fwd(const AttentionArgs& g, const float* q, const float* k, const float* v) {
  const AttentionShape& a = g.shape;
  std::vector<float> probs(std::size_t(a.batch) * a.hq * a.seq * a.seq);
  kc::attention_fwd(a, q, g.ldq, k, g.ldk, v, g.ldv, g.out, g.ldo, probs.data());
  kc::attention_lse(a, q, g.ldq, k, g.ldk, g.lse);
}

// As strict as the flash backward about what it is handed: the probabilities are rebuilt from the lse
// passed in (p_ij = exp(s_ij - lse_i)), not recomputed, and the out passed in must be probs V, else
// delta = rowsum(dO * out) would be wrong on the device: a stale or reused lse/out fails here too.
Status reference_bwd(const AttentionArgs& g, const float* q, const float* k, const float* v, const float* dout) {
  const AttentionShape& a = g.shape;
  std::vector<float> probs(std::size_t(a.batch) * a.hq * a.seq * a.seq, 0.0f);
  const double scale = 1.0 / std::sqrt(double(a.d));
  for (int b = 0; b < a.batch; ++b)
    for (int h = 0; h < a.hq; ++h)
      for (int i = 0; i < a.seq; ++i) {
        const std::size_t row = (std::size_t(b) * a.hq + h) * a.seq + i;
        const float* qi = q + std::size_t(b * a.seq + i) * g.ldq + h * a.d;
        for (int j = 0; j <= i; ++j) {
          const float* kj = k + std::size_t(b * a.seq + j) * g.ldk + (h / (a.hq / a.hkv)) * a.d;
          double dot = 0;
          for (int c = 0; c < a.d; ++c) dot += double(qi[c]) * kj[c];
          probs[row * a.seq + j] = static_cast<float>(std::exp(dot * scale - g.lse[row]));
        }
      }
  std::vector<float> expect(std::size_t(a.batch) * a.seq * g.ldo, 0.0f), probs2(probs.size());
  kc::attention_fwd(a, q, g.ldq, k, g.ldk, v, g.ldv, expect.data(), g.ldo, probs2.data());
  double num = 0, den = 0;
  for (int t = 0; t < a.batch * a.seq; ++t)
    for (int c = 0; c < a.hq * a.d; ++c) {
      const double e = expect[std::size_t(t) * g.ldo + c], o = g.out[std::size_t(t) * g.ldo + c];
      num += (o - e) * (o - e);
      den += e * e;
    }
  if (!(num <= 1e-8 * den))
    return bad("attention backward handed an out that is not softmax(q k^T) v (relative error " +
               std::to_string(std::sqrt(num / std::max(den, 1e-30))) + ")");
  kc::attention_bwd(a, q, g.ldq, k, g.ldk, v, g.ldv, probs.data(), dout, g.lddo, g.dq, g.lddq, g.dk, g.lddk, g.dv, g.lddv);
  return {};
}

}  // namespace

Attention::Attention(AttentionConfig config) : config_(config) {}

Status Attention::forward(cudaStream_t stream_, const AttentionArgs& g) {
  fake_stream_op(stream_, "attention_fwd");
  if (const std::string rule = attention_args_rule(config_, g, false); !rule.empty()) return bad(rule);
  std::vector<float> qf, kf, vf;
  reference_fwd(g, rows_f32(g, g.q, g.shape.hq, qf), rows_f32(g, g.k, g.shape.hkv, kf), rows_f32(g, g.v, g.shape.hkv, vf));
  return {};
}

Status Attention::backward(cudaStream_t stream_, const AttentionArgs& g) {
  fake_stream_op(stream_, "attention_bwd");
  if (const std::string rule = attention_args_rule(config_, g, true); !rule.empty()) return bad(rule);
  std::vector<float> qf, kf, vf, df;
  return reference_bwd(g, rows_f32(g, g.q, g.shape.hq, qf), rows_f32(g, g.k, g.shape.hkv, kf),
                       rows_f32(g, g.v, g.shape.hkv, vf), rows_f32(g, g.dout, g.shape.hq, df));
}
Status rope_fwd(cudaStream_t stream_, const RopeTableView& t, float* x, int rows, int heads, int ld) {
  fake_stream_op(stream_, "rope_fwd");
  kc::rope_fwd(table_of(t), x, rows, heads, ld);
  return {};
}
Status rope_bwd(cudaStream_t stream_, const RopeTableView& t, float* dx, int rows, int heads, int ld) {
  fake_stream_op(stream_, "rope_bwd");
  kc::rope_bwd(table_of(t), dx, rows, heads, ld);
  return {};
}
Status cross_entropy_fwd(cudaStream_t stream_, const float* logits, int rows, int vocab_local, int vocab_start,
                         const std::int32_t* targets, float* loss, float* row_max, float* row_sum) {
  fake_stream_op(stream_, "cross_entropy_fwd");
  kc::cross_entropy_fwd(logits, rows, vocab_local, vocab_start, targets, loss, row_max, row_sum, nullptr);
  return {};
}
Status cross_entropy_bwd(cudaStream_t stream_, const float* logits, int rows, int vocab_local, int vocab_start,
                         const std::int32_t* targets, const float* row_max, const float* row_sum, const float* dloss,
                         float* dlogits, __nv_bfloat16* dlogits16) {
  fake_stream_op(stream_, "cross_entropy_bwd");
  if (!dlogits == !dlogits16) return bad("cross_entropy_bwd: exactly one of dlogits and dlogits16");
  Out o(dlogits, dlogits16, std::size_t(rows) * vocab_local);
  kc::cross_entropy_bwd(logits, rows, vocab_local, vocab_start, targets, row_max, row_sum, dloss, o.f);
  return {};
}
Status cross_entropy_max(cudaStream_t stream_, const float* logits, int rows, int vocab_local, float* row_max) {
  fake_stream_op(stream_, "cross_entropy_max");
  for (int r = 0; r < rows; ++r) {
    const float* z = logits + std::size_t(r) * vocab_local;
    row_max[r] = *std::max_element(z, z + vocab_local);
  }
  return {};
}
Status cross_entropy_partial(cudaStream_t stream_, const float* logits, int rows, int vocab_local, int vocab_start,
                             const std::int32_t* targets, const float* row_max, float* sums) {
  fake_stream_op(stream_, "cross_entropy_partial");
  for (int r = 0; r < rows; ++r) {  // the CPU reference's second pass (kernels/cpu/cross_entropy.cpp)
    const float* z = logits + std::size_t(r) * vocab_local;
    double s = 0;
    for (int j = 0; j < vocab_local; ++j) s += std::exp(z[j] - row_max[r]);
    sums[r] = static_cast<float>(s);
    const int t = targets[r] - vocab_start;
    sums[rows + r] = t >= 0 && t < vocab_local ? z[t] : 0.0f;
  }
  return {};
}
Status cross_entropy_loss(cudaStream_t stream_, int rows, const float* row_max, const float* sums, float* loss) {
  fake_stream_op(stream_, "cross_entropy_loss");
  for (int r = 0; r < rows; ++r) loss[r] = row_max[r] + std::log(sums[r]) - sums[rows + r];
  return {};
}
Status gather_rows(cudaStream_t stream_, const float* src, const std::int32_t* index, const float* scale, int n, int width,
                   float* dst) {
  fake_stream_op(stream_, "gather_rows");
  kc::gather_rows(src, index, scale, n, width, dst);
  return {};
}
Status combine_rows(cudaStream_t stream_, const float* src, const float* w, int tokens, int k, int width, float* dst,
                    bool accumulate) {
  fake_stream_op(stream_, "combine_rows");
  kc::combine_rows(src, w, tokens, k, width, dst, accumulate);
  return {};
}
Status row_dots(cudaStream_t stream_, const float* a, const float* b, int n, int k, int width, float* out) {
  fake_stream_op(stream_, "row_dots");
  kc::row_dots(a, b, n, k, width, out);
  return {};
}
Status embedding_fwd(cudaStream_t stream_, const float* table, int vocab_local, int vocab_start, int dim,
                     const std::int32_t* tokens, int n, float* out) {
  fake_stream_op(stream_, "embedding_fwd");
  kc::embedding_fwd(table, vocab_local, vocab_start, dim, tokens, n, out);
  return {};
}
Status embedding_fwd_bf16(cudaStream_t stream_, const __nv_bfloat16* table, int vocab_local, int vocab_start, int dim,
                          const std::int32_t* tokens, int n, float* out) {
  fake_stream_op(stream_, "embedding_fwd_bf16");
  for (int i = 0; i < n; ++i) {  // kernels/cpu/embedding.hpp's lookup on the widened rows
    const int t = tokens[i] - vocab_start;
    float* o = out + std::size_t(i) * dim;
    for (int c = 0; c < dim; ++c) o[c] = t >= 0 && t < vocab_local ? __bfloat162float(table[std::size_t(t) * dim + c]) : 0.0f;
  }
  return {};
}
Status embedding_bwd(cudaStream_t stream_, const float* dout, int vocab_local, int vocab_start, int dim,
                     const std::int32_t* tokens, int n, float* dtable) {
  fake_stream_op(stream_, "embedding_bwd");
  kc::embedding_bwd(dout, vocab_local, vocab_start, dim, tokens, n, dtable);
  return {};
}
Status add_positions(cudaStream_t stream_, float* x, const float* pos, int rows, int row0, int seq, int dim) {
  fake_stream_op(stream_, "add_positions");
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < dim; ++c) x[std::size_t(r) * dim + c] += pos[std::size_t((row0 + r) % seq) * dim + c];
  return {};
}
Status add_positions_bwd(cudaStream_t stream_, const float* dx, float* dpos, int rows, int row0, int seq, int dim) {
  fake_stream_op(stream_, "add_positions_bwd");
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < dim; ++c) dpos[std::size_t((row0 + r) % seq) * dim + c] += dx[std::size_t(r) * dim + c];
  return {};
}
Status adamw_step(cudaStream_t stream_, float* param, const float* grad, float* m, float* v, std::size_t n, const AdamW& hp,
                  int step, float grad_scale, __nv_bfloat16* param16) {
  fake_stream_op(stream_, "adamw_step");
  if (step < 1) return bad("AdamW step " + std::to_string(step) + " (steps count from 1)");
  std::vector<float> g(grad, grad + n);
  kc::scale(g.data(), n, grad_scale);
  kc::adamw_step(param, g.data(), m, v, n, hp, step);
  if (param16)
    for (std::size_t i = 0; i < n; ++i) param16[i] = __float2bfloat16(param[i]);
  return {};
}
Status sum_squares(cudaStream_t stream_, const float* x, std::size_t n, double* out) {
  fake_stream_op(stream_, "sum_squares");
  *out += kc::sum_squares(x, n);
  return {};
}
Status scale(cudaStream_t stream_, float* x, std::size_t n, float factor) {
  fake_stream_op(stream_, "scale");
  kc::scale(x, n, factor);
  return {};
}
Status add(cudaStream_t stream_, const float* a, const float* b, float* out, std::size_t n) {
  fake_stream_op(stream_, "add");
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  return {};
}
Status residual_add(cudaStream_t stream_, const float* a, const float* b, const float* bias, float* out, int rows, int cols) {
  fake_stream_op(stream_, "residual_add");
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const std::size_t i = std::size_t(r) * cols + c;
      out[i] = a[i] + b[i] + (bias ? bias[c] : 0.0f);
    }
  return {};
}
Status col_sum(cudaStream_t stream_, const float* dy, int rows, int cols, float* db) {
  fake_stream_op(stream_, "col_sum");
  for (int c = 0; c < cols; ++c) {
    double s = 0;
    for (int r = 0; r < rows; ++r) s += dy[std::size_t(r) * cols + c];
    db[c] += static_cast<float>(s);
  }
  return {};
}
Status col_sum_bf16(cudaStream_t stream_, const __nv_bfloat16* dy, int rows, int cols, float* db) {
  fake_stream_op(stream_, "col_sum_bf16");
  for (int c = 0; c < cols; ++c) {
    double s = 0;
    for (int r = 0; r < rows; ++r) s += __bfloat162float(dy[std::size_t(r) * cols + c]);
    db[c] += static_cast<float>(s);
  }
  return {};
}
Status reduce_blocks(cudaStream_t stream_, const float* in, int parts, std::size_t count, float* out, bool max) {
  fake_stream_op(stream_, "reduce_blocks");
  for (std::size_t i = 0; i < count; ++i) {
    float a = in[i];
    for (int p = 1; p < parts; ++p) a = max ? std::max(a, in[std::size_t(p) * count + i]) : a + in[std::size_t(p) * count + i];
    out[i] = a;
  }
  return {};
}
Status to_bf16(cudaStream_t stream_, const float* in, __nv_bfloat16* out, std::size_t n) {
  fake_stream_op(stream_, "to_bf16");
  for (std::size_t i = 0; i < n; ++i) out[i] = __float2bfloat16(in[i]);
  return {};
}
Status from_bf16(cudaStream_t stream_, const __nv_bfloat16* in, float* out, std::size_t n) {
  fake_stream_op(stream_, "from_bf16");
  for (std::size_t i = 0; i < n; ++i) out[i] = __bfloat162float(in[i]);
  return {};
}
Status fill(cudaStream_t stream_, float* x, std::size_t n, float value) {
  fake_stream_op(stream_, "fill");
  std::fill(x, x + n, value);
  return {};
}
Status fill_uniform(cudaStream_t stream_, float* x, std::size_t n, std::uint64_t seed, float bound) {
  fake_stream_op(stream_, "fill_uniform");
  for (std::size_t i = 0; i < n; ++i)
    x[i] = bound * (float(mix64(seed + i * 0x9e3779b97f4a7c15ull) >> 40) * (2.0f / 16777216.0f) - 1.0f);
  return {};
}
Status fill_tokens(cudaStream_t stream_, std::int32_t* tokens, std::size_t n, std::uint64_t seed, int vocab) {
  fake_stream_op(stream_, "fill_tokens");
  for (std::size_t i = 0; i < n; ++i)
    tokens[i] = static_cast<std::int32_t>(mix64(seed + i * 0x9e3779b97f4a7c15ull) % std::uint64_t(vocab));
  return {};
}

}  // namespace tessel::kernels::cuda
