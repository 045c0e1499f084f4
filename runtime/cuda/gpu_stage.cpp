#include "runtime/cuda/gpu_stage.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <utility>

#include "kernels/cpu/rope.hpp"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/nvtx.hpp"
#include "runtime/cuda/nccl_comm.hpp"
#include "runtime/gpt_layer.hpp"
#include "runtime/moe_layer.hpp"
#include "util/error.hpp"

namespace tessel::rt::cuda {

namespace kg = kernels::cuda;
using kg::GemmType;

// A launch (returning Status) inside a named kernel scope of the device's profile (--profile-kernels).
// A kernel launch in a named profile scope (CudaDevice::set_kernel_profile) with the work it does: its
// FLOPs and the bytes it must move to and from device memory at least (each tensor read or written once;
// the profile sets the measured time against the roofline of the two).
#define TIMED_W(name, flops, bytes, expr)          \
  do {                                              \
    KernelScope ks_(dev, name, (flops), (bytes));   \
    throw_if_failed(expr);                          \
  } while (0)

namespace {

// What a layer's backward reads. The GEMM operands (g1, g2, ga, gact) are bf16 when GEMMs take bf16, else
// the fp32 activations themselves; norm and activation outputs that only feed GEMMs are kept in that form
// alone. Under bf16 GEMMs the MLP's inner activations (h1, gate) are bf16 too: their GEMMs write them so.
// A MoE layer's MLP (Impl::moe_forward): the routing on the host (runtime/moe_layer.hpp's moe_route, as the
// CPU runtime), the dispatch plan, and on the device the router input, the slots' outputs, and the local
// experts' rows (expert-major: expert j's rows at off[j]) with their MLP intermediates; the shared
// expert's in the dense MLP's form.
struct MoeActs {
  std::vector<float> probs, topi, topw, counts;  // [Tl, E] scores; [Tl k] choices and weights; [E] counts
  std::vector<int> order, sent, got;             // slots in dispatch order; rows per [peer * El + local expert]
  std::vector<int> rows, off;                    // per local expert: rows received, first row (expert-major)
  std::vector<int> rmax;                         // per local expert: the most rows any etp rank received
  int received = 0;                              // rows of all local experts
  DBuf yl;                                       // [Tl, h] fp32 norm output of this rank's tokens
  DBuf disp_index, disp_scale, inv;              // int32 [S] token of each dispatched slot; fp32 [S] its weight; slot -> position
  DBuf to_experts, from_experts;                 // int32 permutations between peer-major and expert-major rows
  DBuf topw_d, slot_out;                         // [S] weights; [S, h] outputs in slot order
  // Per local expert: the rows its MLP runs on (this rank's; under etp > 1 every etp rank's block padded to
  // rmax, gathered: etp x rmax rows) as the GEMMs read them, and its intermediates over this rank's 1/etp
  // of the expert's FFN width, in the GEMMs' operand type.
  std::vector<DBuf> xe, h1e, gatee, acte;
  DBuf sg, sh1, sgate, sact;                     // shared expert: its input (all tokens, operand) and intermediates
};

struct Acts {
  DBuf x, mu1, rs1, g1, q, k, v, attn, ga, lse, x2, mu2, rs2, g2, h1, gate, gact;
  std::shared_ptr<MoeActs> moe;
};

// Every ep peer's rows (send: peer order, send_counts[p] floats each; recv likewise) on the communicator's
// stream: NCCL's grouped sends and receives, or over a host-staged communicator its buffered sends, then
// the receives in peer order; this rank's own part is a copy on `stream`.
void all_to_all(Comm& c, const float* send, const std::vector<std::size_t>& sc, float* recv,
                const std::vector<std::size_t>& rc, cudaStream_t stream) {
  if (auto* n = dynamic_cast<NcclComm*>(&c)) return n->all_to_all_v(send, sc, recv, rc);
  const int P = c.size(), me = c.rank();
  std::vector<std::size_t> so(std::size_t(P) + 1, 0), ro(std::size_t(P) + 1, 0);
  for (int p = 0; p < P; ++p) so[p + 1] = so[p] + sc[p], ro[p + 1] = ro[p] + rc[p];
  for (int p = 0; p < P; ++p)
    if (p != me && sc[p] > 0) c.send(send + so[p], sc[p], p, 17);
  if (sc[me] > 0)
    cuda_ok(cudaMemcpyAsync(recv + ro[me], send + so[me], sc[me] * sizeof(float), cudaMemcpyDeviceToDevice, stream),
            "all-to-all self copy");
  for (int p = 0; p < P; ++p)
    if (p != me && rc[p] > 0) c.recv(recv + ro[p], rc[p], p, 17);
}

}  // namespace

struct GpuStage::Impl {
  CudaDevice& dev;
  Model model;
  GpuStageConfig cfg;
  GpuParams& P;
  GpuTp tp;
  GpuEp ep;
  GemmType type;
  LayerShape sh;  // the CPU layer's shape of this tp shard (runtime/gpt_layer.hpp), rotary table included
  double aux_loss = 0;                     // this rank's load-balancing losses since take_aux_loss
  std::map<int, std::vector<float>> load;  // selection bias: per MoE layer, tokens per expert this step
  bool recomputing = false;                // a full recomputation's forward: its load-balancing loss is not counted again
  float* loss_sum = nullptr;
  kg::Attention attention;  // the variant --attention-kernel names (kernels/cuda/attention_variant.hpp)
  // Rotary models: the stage's cos/sin table on the device (null buffers for learned positions).
  DBuf rope_cos, rope_sin;
  kg::RopeTableView rope;
  struct Mb {
    std::vector<Acts> acts;            // per layer (only x under full recomputation)
    DBuf head_x, head_mu, head_rs, head_g, logits, row_max, row_sum;
    const std::int32_t* tokens = nullptr;
    const std::int32_t* targets = nullptr;
    std::vector<std::function<void()>> jobs;  // a split I's weight GEMMs, each holding the buffers it reads
  };
  std::map<int, Mb> mbs;
  Mb* current_mb = nullptr;  // the micro-batch whose backward is running
  bool defer = false;        // its weight GEMMs are queued (split I) rather than run
  // A weight-gradient GEMM (and the bias it carries): now, or queued for W. The closure holds the
  // DBufs it reads, so they outlive the I.
  GpuStage::ParamHooks hooks;  // ZeRO's gathers and gradient windows, or empty
  void enter(const std::vector<std::string>& groups) {
    if (hooks.values)
      for (const std::string& g : groups) hooks.values(g, true);
  }
  // The layer whose values window comes after the current one (ZeRO's prefetch), if it is on this stage;
  // in the forward, past the last layer, the head's groups on the last stage.
  void prefetch_layer(int l, bool then_head = false) {
    if (!hooks.prefetch) return;
    if (l >= cfg.l0 && l < cfg.l1) hooks.prefetch("layers." + std::to_string(l));
    else if (then_head && l == cfg.l1 && cfg.last)
      for (const std::string& g : head_groups()) hooks.prefetch(g);
  }
  void leave(const std::vector<std::string>& groups) {
    if (hooks.values)
      for (const std::string& g : groups) hooks.values(g, false);
  }
  // Gradient windows (GpuStage::ParamHooks::grads). With a split I (defer), the same calls are queued
  // around the weight GEMMs it queues, so W makes the groups live again and completes them.
  // weight_jobs: the code between begin and end may queue weight GEMMs (a split I queues them).
  void grads_begin(const std::vector<std::string>& groups, bool weight_jobs) {
    if (!hooks.grads) return;
    for (const std::string& g : groups) hooks.grads(g, true, false);
    if (defer && weight_jobs)
      current_mb->jobs.push_back([this, groups] {
        for (const std::string& g : groups) hooks.grads(g, true, false);
      });
  }
  void grads_end(const std::vector<std::string>& groups, bool weight_jobs) {
    if (!hooks.grads) return;
    const bool later = defer && weight_jobs;
    for (const std::string& g : groups) hooks.grads(g, false, !later);
    if (later)
      current_mb->jobs.push_back([this, groups] {
        for (const std::string& g : groups) hooks.grads(g, false, true);
      });
  }
  // The head's groups: the final norm and head, and a tied head's embedding (each group once: a window
  // closed twice would count twice).
  std::vector<std::string> head_groups() const {
    return P.has("head.w") ? std::vector<std::string>{"final"} : std::vector<std::string>{"final", "embed.tok"};
  }

  void weight_job(std::function<void()> job) {
    if (defer) current_mb->jobs.push_back(std::move(job));
    else job();
  }

  Impl(CudaDevice& d, const Model& m, const GpuStageConfig& c, GpuParams& p, const GpuTp& t, GemmType g,
       const std::string& attention_kernel, const GpuEp& e)
      : dev(d), model(m), cfg(c), P(p), tp(t), ep(e), type(g) {
    sh = layer_shape(m, c.micro_batch, TensorParallel{nullptr, t.size, t.rank, t.sp, nullptr});
    sh.loss_scale = c.loss_scale;
    for (int l = c.l0; l < c.l1; ++l)
      TESSEL_CHECK(!m.is_moe_layer(l) || ep.experts, "stage " << c.stage << ": MoE layer " << l << " without an experts store");
    // Before any device work: an unknown name, or one this shard's shape or precision cannot run, is bad input.
    const bool bf16_gemms = type == GemmType::bf16 || type == GemmType::bf16_fp32;
    attention = kg::Attention(kg::resolve_attention_kernel(attention_kernel, bf16_gemms, attn_shape()));
    if (sh.rope) upload_rope_table(*sh.rope);
  }

  // layer_shape's kernels::cpu::rope_table (double angles, rounded once to float) copied up once per stage,
  // so every layer and micro-batch rotates by the CPU runtime's exact table.
  void upload_rope_table(const kernels::cpu::RopeTable& t) {
    const std::size_t bytes = t.cos.size() * sizeof(float);
    rope_cos = buf(t.cos.size());
    rope_sin = buf(t.sin.size());
    cuda_ok(cudaMemcpyAsync(f32(rope_cos), t.cos.data(), bytes, cudaMemcpyHostToDevice, s()), "rotary table upload");
    cuda_ok(cudaMemcpyAsync(f32(rope_sin), t.sin.data(), bytes, cudaMemcpyHostToDevice, s()), "rotary table upload");
    cuda_ok(cudaStreamSynchronize(s()), "rotary table upload");  // the host table need not outlive the copies
    rope = {f32(rope_cos), f32(rope_sin), t.seq, t.d};
  }
  bool rotary() const { return rope.cos != nullptr; }

  cudaStream_t s() const { return dev.compute(); }
  bool half() const { return type == GemmType::bf16_fp32; }
  DBuf buf(std::size_t n) { return dev.alloc_f32(n); }
  DBuf buf16(std::size_t n) { return dev.alloc(n * sizeof(__nv_bfloat16)); }
  static __nv_bfloat16* bf16(const DBuf& b) { return b ? static_cast<__nv_bfloat16*>(b->get()) : nullptr; }
  // A GEMM operand written directly by the kernel producing it: bf16 under bf16 GEMMs, else fp32. The
  // kernel gets the pointer of the operand's type and null for the other form.
  DBuf operand_buf(std::size_t n) { return half() ? buf16(n) : buf(n); }
  float* as_f32(const DBuf& g) const { return half() ? nullptr : f32(g); }
  __nv_bfloat16* as_bf16(const DBuf& g) const { return half() ? bf16(g) : nullptr; }
  std::string L(int l, const char* n) const { return "layers." + std::to_string(l) + "." + n; }
  const void* W(const std::string& n) const { return half() ? static_cast<const void*>(P.half(n)) : P.data(n); }
  float* bias(const std::string& n) { return P.has(n) ? P.data(n) : nullptr; }
  float* bgrad(const std::string& n) { return P.has(n) ? P.grad(n) : nullptr; }

  // The profile's work counts (TIMED_W): bytes per element of a GEMM operand; a column sum of [R, C] into an
  // accumulated vector; causal attention's FLOPs, `gemms` s x s x d products halved by the mask (forward 2:
  // Q K^T and P V; backward 5: both again, dP, dQ, dK); rows of the softmax statistics.
  double operand_bytes() const { return half() ? 2.0 : 4.0; }
  static double col_sum_bytes(double rows, double cols, double es = 4.0) { return es * rows * cols + 8.0 * cols; }
  double attention_flops(double gemms) const {
    return gemms * 2.0 * sh.batch * sh.heads * double(sh.seq) * sh.seq * sh.head_dim * 0.5;
  }
  double stats_rows() const { return double(sh.batch) * sh.heads * sh.seq; }

  // The GEMM operand form of an fp32 activation: itself, or a bf16 copy.
  DBuf operand(const DBuf& x, std::size_t n) {
    if (!half()) return x;
    DBuf b = buf16(n);
    TIMED_W("to_bf16", 0.0, 6.0 * double(n), kg::to_bf16(s(), f32(x), bf16(b), n));
    return b;
  }
  // C (and the bias) in fp32, or with out16 (bf16 GEMMs only) in bf16: GemmType::bf16, rounded once.
  void mm_to(const char* what, bool out16, bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B,
             int ldb, float beta, void* C, int ldc, const void* b = nullptr) {
    const GemmType t = out16 ? GemmType::bf16 : type;
    kg::GemmArgs a{ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, t, b ? kg::Epilogue::bias : kg::Epilogue::none, b};
    const double es = type == GemmType::fp32 || type == GemmType::tf32 ? 4.0 : 2.0, cs = out16 ? 2.0 : 4.0;
    const double m = M, n = N, k = K;
    const double bytes = es * (m * k + k * n) + cs * m * n * (beta != 0.0f ? 2.0 : 1.0) + (b ? cs * n : 0.0);
    TIMED_W(what, 2.0 * m * n * k, bytes, dev.gemm().run(s(), a));
  }
  void mm(const char* what, bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb,
          float beta, float* C, int ldc, const float* b = nullptr) {
    mm_to(what, false, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, b);
  }
  // y[T,out] = x W + b;  dx[T,in] (+)= dy W^T;  dW += x^T dy, db += colsum(dy).
  DBuf linear(const DBuf& gx, int in, int out, const std::string& w, const std::string& b) {
    DBuf y = buf(std::size_t(sh.tokens) * out);
    mm("gemm_fwd", false, false, sh.tokens, out, in, gx->get(), in, W(w), out, 0.0f, f32(y), out, bias(b));
    return y;
  }
  // The same, y in the GEMMs' operand type: under bf16 GEMMs a bf16 output with the bias's bf16 copy (the
  // MLP's inner activations, which only activation kernels read), as autocast's bf16 linear.
  DBuf linear_act(const DBuf& gx, int in, int out, const std::string& w, const std::string& b) {
    if (!half()) return linear(gx, in, out, w, b);
    DBuf y = buf16(std::size_t(sh.tokens) * out);
    mm_to("gemm_fwd", true, false, false, sh.tokens, out, in, gx->get(), in, W(w), out, 0.0f, y->get(), out,
          P.has(b) ? P.half(b) : nullptr);
    return y;
  }
  void linear_dx(const DBuf& gdy, int in, int out, const std::string& w, float* dx, bool acc) {
    mm("gemm_dgrad", false, true, sh.tokens, in, out, gdy->get(), out, W(w), out, acc ? 1.0f : 0.0f, dx, in);
  }
  // The bias gradient sums dy (fp32) when given, else the GEMM operand gdy itself (bf16 under bf16 GEMMs).
  void weight_grad(const DBuf& gx, const DBuf& gdy, const DBuf& dy, int in, int out, const std::string& w,
                   const std::string& b) {
    weight_job([this, gx, gdy, dy, in, out, w, b] {
      mm("gemm_wgrad", true, false, in, out, sh.tokens, gx->get(), in, gdy->get(), out, 1.0f, P.grad(w), out);
      float* db = bgrad(b);
      if (!db) return;
      if (dy || !half())
        TIMED_W("bias_grad", 0.0, col_sum_bytes(sh.tokens, out), kg::col_sum(s(), f32(dy ? dy : gdy), sh.tokens, out, db));
      else
        TIMED_W("bias_grad", 0.0, col_sum_bytes(sh.tokens, out, 2.0), kg::col_sum_bf16(s(), bf16(gdy), sh.tokens, out, db));
    });
  }

  // ---- tensor-parallel collectives, timed on the trace's tp lane (comm stream) ----
  // The event is the collective's own op kind inside the enclosing op's stage, micro-batch and layers, named
  // as the CPU runtime's Recorder::record_comm names it, so compare matches it to the simulator's by kind.
  void collective(const char* op, double bytes, const std::function<void()>& run) {
    dev.comm_waits_compute();
    OpIdentity oid = current;
    oid.op = op;
    std::string name = op;
    if (oid.stage >= 0) name += " s" + std::to_string(oid.stage);
    if (oid.mb >= 0) name += " mb" + std::to_string(oid.mb);
    const std::size_t id = dev.begin_op(trace::Stream::tp, oid, name, 0.0, bytes);
    if (!tp.record_only) run();
    dev.end_op(id);
    if (!tp.record_only) dev.compute_waits_comm();
  }
  DBuf gather_tokens(const DBuf& local) {  // [Tl,h] -> [T,h]
    if (!tp.sp) return local;
    DBuf full = buf(std::size_t(sh.tokens) * sh.hidden);
    const std::size_t n = std::size_t(sh.local_tokens) * sh.hidden;
    collective("tp_allgather", double(n) * tp.size * 4, [&] { tp.comm->all_gather(f32(local), f32(full), n); });
    if (tp.record_only)  // --only-rank: no peers; this rank's block stands in for every rank's
      for (int r = 0; r < tp.size; ++r) stand_in(f32(full) + std::size_t(r) * n, f32(local), n);
    return full;
  }
  // --only-rank's stand-in for a collective's output that no peer fills: real values of the right size
  // (the buffer would otherwise be whatever the allocator last held, NaNs included), not a sum over ranks.
  void stand_in(float* dst, const float* src, std::size_t n) {
    cuda_ok(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, s()), "--only-rank stand-in copy");
  }
  DBuf reduce_tokens(const DBuf& partial) {  // [T,h] partial sums -> [Tl,h]
    if (tp.size == 1) return partial;
    if (!tp.sp) {
      const std::size_t n = std::size_t(sh.tokens) * sh.hidden;
      collective("tp_allreduce", double(n) * 4, [&] { tp.comm->all_reduce(f32(partial), n); });
      return partial;
    }
    DBuf local = buf(std::size_t(sh.local_tokens) * sh.hidden);
    const std::size_t n = std::size_t(sh.local_tokens) * sh.hidden;
    collective("tp_reducescatter", double(n) * tp.size * 4, [&] { tp.comm->reduce_scatter(f32(partial), f32(local), n); });
    if (tp.record_only) stand_in(f32(local), f32(partial) + std::size_t(tp.rank) * n, n);  // its own block, unsummed
    return local;
  }
  OpIdentity current;

  // The normalised rows of x as the GEMMs read them, all T tokens: under bf16 GEMMs without sequence
  // parallelism the norm writes the bf16 operand alone; otherwise fp32 rows, all-gathered over tp under SP,
  // then operand().
  // local_fp32: the fp32 rows of this rank's tokens instead (a MoE layer's router and dispatch read them).
  DBuf norm_operand(const std::string& g, const std::string& b, const DBuf& x, DBuf& mu, DBuf& rs, bool local_fp32 = false) {
    const std::size_t n = std::size_t(sh.local_tokens) * sh.hidden;
    mu = buf(sh.local_tokens);
    rs = buf(sh.local_tokens);
    const bool direct = half() && !tp.sp && !local_fp32;
    DBuf y = direct ? buf16(n) : buf(n);
    float* y32 = direct ? nullptr : f32(y);
    __nv_bfloat16* y16 = direct ? bf16(y) : nullptr;
    const double R = sh.local_tokens, C = sh.hidden, stats = sh.layernorm ? 2.0 : 1.0;
    const double bytes = (4.0 + (y32 ? 4.0 : 0.0) + (y16 ? 2.0 : 0.0)) * R * C + 4.0 * stats * (R + C);
    if (sh.layernorm)
      TIMED_W("norm_fwd", 0.0, bytes, kg::layernorm_fwd(s(), f32(x), P.data(g), P.data(b), y32, f32(mu), f32(rs), sh.local_tokens, sh.hidden, sh.eps, y16));
    else
      TIMED_W("norm_fwd", 0.0, bytes, kg::rmsnorm_fwd(s(), f32(x), P.data(g), y32, f32(rs), sh.local_tokens, sh.hidden, sh.eps, y16));
    if (local_fp32) return y;
    return direct ? y : operand(gather_tokens(y), std::size_t(sh.tokens) * sh.hidden);
  }
  // dx = the norm's input gradient, plus dres (a residual branch's gradient) when given.
  void norm_bwd(const std::string& g, const std::string& b, const DBuf& dy, const DBuf& x, const DBuf& mu,
                const DBuf& rs, float* dx, const float* dres = nullptr) {
    // dy, x (and dres) read, dx written; the statistics; gamma read, its gradients (and beta's) updated.
    const double R = sh.local_tokens, C = sh.hidden, stats = sh.layernorm ? 2.0 : 1.0;
    const double bytes = (12.0 + (dres ? 4.0 : 0.0)) * R * C + 4.0 * stats * R + 4.0 * C + 8.0 * stats * C;
    if (sh.layernorm)
      TIMED_W("norm_bwd", 0.0, bytes, kg::layernorm_bwd(s(), f32(dy), f32(x), P.data(g), f32(mu), f32(rs), dx, P.grad(g), P.grad(b), sh.local_tokens, sh.hidden, dres));
    else
      TIMED_W("norm_bwd", 0.0, bytes, kg::rmsnorm_bwd(s(), f32(dy), f32(x), P.data(g), f32(rs), dx, P.grad(g), sh.local_tokens, sh.hidden, dres));
  }
  kg::AttentionShape attn_shape() const { return {sh.batch, sh.seq, sh.heads, sh.kv_heads, sh.head_dim}; }
  // q, k, v (and attention's output gradient) as bf16-output GEMMs write them, for the attention variants
  // that read bf16 operands (cudnn and the experimental ones; fp32 and tc read fp32 ones, tc rounding them as
  // it loads them). Rotary models keep fp32 q/k: the rotation runs on fp32 rows.
  bool attention_bf16_io() const { return half() && kg::attention_takes_bf16(attention.config().variant) && !rotary(); }
  // One attention call's tensors: the layer's q, k, v (compact rows, fp32 or bf16 as attention_bf16_io says),
  // fp32 out and lse; the backward's gradients.
  kg::AttentionArgs attention_args(const Acts& a, bool io16) const {
    kg::AttentionArgs g;
    g.shape = attn_shape();
    g.dtype = io16 ? kg::AttnDtype::bf16 : kg::AttnDtype::fp32;
    const int qd = sh.heads * sh.head_dim, kd = sh.kv_heads * sh.head_dim;
    g.q = a.q->get(), g.ldq = qd, g.k = a.k->get(), g.ldk = kd, g.v = a.v->get(), g.ldv = kd;
    g.out = f32(a.attn), g.ldo = qd, g.lse = f32(a.lse);
    return g;
  }

  // ---- a mixture-of-experts MLP (moe_forward / moe_backward below) ----
  // Routed expert e's weight w ("w1", "wg", "w2") of layer l, by its logical name.
  std::string expert_param(int l, int e, const char* w) const {
    return L(l, ("moe.expert." + std::to_string(e) + "." + w).c_str());
  }
  const void* WE(const std::string& n) const {
    return half() ? static_cast<const void*>(ep.experts->half(n)) : ep.experts->data(n);
  }
  // Element `at` of a buffer in the GEMMs' operand type.
  void* op_at(const DBuf& b, std::size_t at) const { return static_cast<char*>(b->get()) + at * (half() ? 2 : 4); }
  static std::int32_t* i32(const DBuf& b) { return static_cast<std::int32_t*>(b->get()); }
  template <class T>
  DBuf upload(const std::vector<T>& v, const char* what) {
    DBuf b = dev.alloc(std::max<std::size_t>(1, v.size()) * sizeof(T));
    if (!v.empty()) cuda_ok(cudaMemcpyAsync(b->get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s()), what);
    cuda_ok(cudaStreamSynchronize(s()), what);
    return b;
  }
  std::vector<float> download(const DBuf& b, std::size_t n, const char* what) {
    std::vector<float> v(n);
    if (n > 0) cuda_ok(cudaMemcpyAsync(v.data(), b->get(), n * sizeof(float), cudaMemcpyDeviceToHost, s()), what);
    cuda_ok(cudaStreamSynchronize(s()), what);
    return v;
  }
  // An fp32 GEMM whatever the run's GEMM type: the router (Megatron-Core's --moe-router-dtype fp32), so
  // tokens are routed as the CPU runtime routes them.
  void mm_fp32(const char* what, bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
               float beta, float* C, int ldc) {
    kg::GemmArgs g{ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, GemmType::fp32, kg::Epilogue::none, nullptr};
    const double m = M, n = N, k = K;
    TIMED_W(what, 2.0 * m * n * k, 4.0 * (m * k + k * n + m * n * (beta != 0.0f ? 2.0 : 1.0)), dev.gemm().run(s(), g));
  }
  // The dense MLP over all T tokens (g2: their norm output as the GEMMs read it) into [T, h] partial sums:
  // the layer's own MLP (prefix "mlp.", f = ffn / tp) or a MoE layer's shared expert ("moe.shared.").
  DBuf mlp_forward(int l, const std::string& prefix, int f, const DBuf& g2, DBuf& h1, DBuf& gate, DBuf& gact);
  // Its backward from the output gradient over all T tokens (gdmf, operand form) into [T, h] partial sums.
  DBuf mlp_backward(int l, const std::string& prefix, int f, const DBuf& g2, const DBuf& h1, const DBuf& gate,
                    const DBuf& gact, const DBuf& gdmf);
  // The ep all-to-all of rows of `width` (rows per peer), timed on the tp lane as the CPU runtime's.
  DBuf ep_exchange(const DBuf& send, const std::vector<int>& send_rows, const std::vector<int>& recv_rows, int width);
  // One local expert's rows: the R rows of `src` that `index` names; under expert tensor parallelism
  // (etp > 1) in a block of rmax rows padded with zero rows (which stay zero through the MLP and add
  // nothing to its weight gradients), all-gathered over the etp ranks into etp x rmax rows, as the CPU
  // runtime's etp_gather. expert_rows_back: such a block's partial sums (this rank's FFN slice)
  // reduce-scattered over the etp ranks, this rank's R rows written to dst.
  DBuf expert_rows(const DBuf& src, const std::int32_t* index, int R, int rmax);
  void expert_rows_back(const DBuf& block, int R, int rmax, float* dst);
  DBuf moe_forward(int l, Acts& a);                           // [Tl, h]: the MLP's output (no residual)
  DBuf moe_backward(int l, const Acts& a, const DBuf& dout);  // [Tl, h]: the gradient at the ln2 output

  DBuf layer_forward(int l, const DBuf& x, Acts& a);
  DBuf layer_backward(int l, const Acts& a, const DBuf& dout);
  DBuf embed_forward(Mb& st);
  void embed_backward(Mb& st, const DBuf& dx);
  void head_forward(Mb& st, const DBuf& x);
  DBuf head_backward(Mb& st);
};

DBuf GpuStage::Impl::layer_forward(int l, const DBuf& x, Acts& a) {
  kg::NvtxRange r("layer_forward");
  const LayerScope label(current, l);
  const int T = sh.tokens, h = sh.hidden, qd = sh.heads * sh.head_dim, kd = sh.kv_heads * sh.head_dim, f = sh.ffn;
  a.x = x;
  a.g1 = norm_operand(L(l, "ln1.w"), L(l, "ln1.b"), x, a.mu1, a.rs1);
  const bool io16 = attention_bf16_io();
  const auto qkv = [&](int out, const char* w, const char* b) {
    return io16 ? linear_act(a.g1, h, out, L(l, w), L(l, b)) : linear(a.g1, h, out, L(l, w), L(l, b));
  };
  a.q = qkv(qd, "attn.wq", "attn.bq");
  a.k = qkv(kd, "attn.wk", "attn.bk");
  a.v = qkv(kd, "attn.wv", "attn.bv");
  // Rotary: q and k turn after their GEMMs, bias included (runtime/gpt_layer.cpp); every rank holds all T
  // tokens here (any SP all-gather came first), so row t sits at position t % seq. a.q/a.k keep the rotated
  // values that attention reads and its backward needs; full recomputation re-runs this function.
  if (rotary()) {
    TIMED_W("rope", 0.0, 8.0 * T * qd, kg::rope_fwd(s(), rope, f32(a.q), T, sh.heads, qd));
    TIMED_W("rope", 0.0, 8.0 * T * kd, kg::rope_fwd(s(), rope, f32(a.k), T, sh.kv_heads, kd));
  }
  a.attn = buf(std::size_t(T) * qd);
  a.lse = buf(std::size_t(sh.batch) * sh.heads * sh.seq);
  // q, k, v read (fp32 or bf16), the output written in fp32, the log-sum-exps written.
  const double in_bytes = (io16 ? 2.0 : 4.0) * T * (qd + 2.0 * kd);
  TIMED_W("attention_fwd", attention_flops(2.0), in_bytes + 4.0 * T * qd + 4.0 * stats_rows(),
          attention.forward(s(), attention_args(a, io16)));
  a.ga = operand(a.attn, std::size_t(T) * qd);
  DBuf partial = buf(std::size_t(T) * h);
  mm("gemm_fwd", false, false, T, h, qd, a.ga->get(), qd, W(L(l, "attn.wo")), h, 0.0f, f32(partial), h);
  a.x2 = reduce_tokens(partial);  // x2 = (attention out + x) + bo, in one pass
  TIMED_W("residual_add", 0.0, 12.0 * sh.local_tokens * h + (P.has(L(l, "attn.bo")) ? 4.0 * h : 0.0),
          kg::residual_add(s(), f32(a.x2), f32(x), bias(L(l, "attn.bo")), f32(a.x2), sh.local_tokens, h));

  if (model.is_moe_layer(l)) {
    DBuf out = moe_forward(l, a);
    TIMED_W("residual_add", 0.0, 12.0 * sh.local_tokens * h,
            kg::residual_add(s(), f32(out), f32(a.x2), nullptr, f32(out), sh.local_tokens, h));
    return out;
  }
  a.g2 = norm_operand(L(l, "ln2.w"), L(l, "ln2.b"), a.x2, a.mu2, a.rs2);
  partial = mlp_forward(l, "mlp.", f, a.g2, a.h1, a.gate, a.gact);
  DBuf out = reduce_tokens(partial);
  TIMED_W("residual_add", 0.0, 12.0 * sh.local_tokens * h + (P.has(L(l, "mlp.b2")) ? 4.0 * h : 0.0),
          kg::residual_add(s(), f32(out), f32(a.x2), bias(L(l, "mlp.b2")), f32(out), sh.local_tokens, h));
  return out;
}

DBuf GpuStage::Impl::layer_backward(int l, const Acts& a, const DBuf& dout) {
  kg::NvtxRange r("layer_backward");
  const LayerScope label(current, l);
  const int T = sh.tokens, Tl = sh.local_tokens, h = sh.hidden, qd = sh.heads * sh.head_dim, kd = sh.kv_heads * sh.head_dim, f = sh.ffn;
  const std::size_t nl = std::size_t(Tl) * h;
  DBuf dx2 = buf(nl);
  if (model.is_moe_layer(l)) {
    const DBuf dyl = moe_backward(l, a, dout);
    norm_bwd(L(l, "ln2.w"), L(l, "ln2.b"), dyl, a.x2, a.mu2, a.rs2, f32(dx2), f32(dout));  // + the residual's dout
  } else {
    if (float* b2 = bgrad(L(l, "mlp.b2"))) TIMED_W("bias_grad", 0.0, col_sum_bytes(Tl, h), kg::col_sum(s(), f32(dout), Tl, h, b2));
    DBuf dmf = gather_tokens(dout), gdmf = operand(dmf, std::size_t(T) * h);
    DBuf dy2l = reduce_tokens(mlp_backward(l, "mlp.", f, a.g2, a.h1, a.gate, a.gact, gdmf));
    norm_bwd(L(l, "ln2.w"), L(l, "ln2.b"), dy2l, a.x2, a.mu2, a.rs2, f32(dx2), f32(dout));  // + the residual's dout
  }

  if (float* bo = bgrad(L(l, "attn.bo"))) TIMED_W("bias_grad", 0.0, col_sum_bytes(Tl, h), kg::col_sum(s(), f32(dx2), Tl, h, bo));
  DBuf dpf = gather_tokens(dx2), gdpf = operand(dpf, std::size_t(T) * h);
  // attention's output gradient: bf16 from its GEMM where attention takes bf16 operands (as q, k, v).
  const bool io16 = attention_bf16_io();
  DBuf da = io16 ? buf16(std::size_t(T) * qd) : buf(std::size_t(T) * qd);
  mm_to("gemm_dgrad", io16, false, true, T, qd, h, gdpf->get(), h, W(L(l, "attn.wo")), h, 0.0f, da->get(), qd);
  weight_grad(a.ga, gdpf, nullptr, qd, h, L(l, "attn.wo"), "");
  DBuf dq = buf(std::size_t(T) * qd), dk = buf(std::size_t(T) * kd), dv = buf(std::size_t(T) * kd);
  DBuf delta = buf(std::size_t(sh.batch) * sh.heads * sh.seq);
  // q, k, v, out and its gradient read (q, k, v and the gradient in bf16 or fp32, out in fp32), dq, dk, dv
  // written in fp32; the log-sum-exps read, delta written.
  kg::AttentionArgs g = attention_args(a, io16);
  g.dout = da->get(), g.lddo = qd, g.dq = f32(dq), g.lddq = qd, g.dk = f32(dk), g.lddk = kd, g.dv = f32(dv), g.lddv = kd;
  g.delta = f32(delta);
  // bf16 operands: q, k, v and dout 2 bytes, out and the gradients 4 (T (12 qd + 12 kd) as before); fp32:
  // every tensor 4 bytes (4 T (4 qd + 4 kd)).
  const double bwd_bytes = io16 ? T * (12.0 * qd + 12.0 * kd) : 4.0 * T * (4.0 * qd + 4.0 * kd);
  TIMED_W("attention_bwd", attention_flops(5.0), bwd_bytes + 8.0 * stats_rows(), attention.backward(s(), g));
  // Rotary: attention's dq/dk are gradients of the rotated q/k; R^T carries them back to the GEMM outputs
  // before the input, weight and bias gradients read them.
  if (rotary()) {
    TIMED_W("rope", 0.0, 8.0 * T * qd, kg::rope_bwd(s(), rope, f32(dq), T, sh.heads, qd));
    TIMED_W("rope", 0.0, 8.0 * T * kd, kg::rope_bwd(s(), rope, f32(dk), T, sh.kv_heads, kd));
  }
  DBuf gdq = operand(dq, std::size_t(T) * qd), gdk = operand(dk, std::size_t(T) * kd), gdv = operand(dv, std::size_t(T) * kd);
  DBuf dy1 = buf(std::size_t(T) * h);
  linear_dx(gdq, h, qd, L(l, "attn.wq"), f32(dy1), false);
  linear_dx(gdk, h, kd, L(l, "attn.wk"), f32(dy1), true);
  linear_dx(gdv, h, kd, L(l, "attn.wv"), f32(dy1), true);
  weight_grad(a.g1, gdq, dq, h, qd, L(l, "attn.wq"), L(l, "attn.bq"));
  weight_grad(a.g1, gdk, dk, h, kd, L(l, "attn.wk"), L(l, "attn.bk"));
  weight_grad(a.g1, gdv, dv, h, kd, L(l, "attn.wv"), L(l, "attn.bv"));
  DBuf dy1l = reduce_tokens(dy1), dx = buf(nl);
  norm_bwd(L(l, "ln1.w"), L(l, "ln1.b"), dy1l, a.x, a.mu1, a.rs1, f32(dx), f32(dx2));  // + the residual's dx2
  return dx;
}

DBuf GpuStage::Impl::mlp_forward(int l, const std::string& prefix, int f, const DBuf& g2, DBuf& h1, DBuf& gate, DBuf& gact) {
  const int T = sh.tokens, h = sh.hidden;
  const auto N = [&](const char* n) { return L(l, (prefix + n).c_str()); };
  // The MLP's activations in the GEMMs' operand type throughout: h1 (and gate) as the first GEMMs write
  // them, gact as the second GEMM reads it (bf16 under bf16 GEMMs, fp32 otherwise).
  h1 = linear_act(g2, h, f, N("w1"), N("b1"));
  const std::size_t nf = std::size_t(T) * f;
  const double eb = operand_bytes();
  gact = operand_buf(nf);
  if (sh.swiglu) {
    gate = linear_act(g2, h, f, N("wg"), N("bg"));
    if (half())
      TIMED_W("activation_fwd", 0.0, 3.0 * eb * double(nf), kg::swiglu_fwd_bf16(s(), bf16(gate), bf16(h1), bf16(gact), nf));
    else
      TIMED_W("activation_fwd", 0.0, 3.0 * eb * double(nf), kg::swiglu_fwd(s(), f32(gate), f32(h1), f32(gact), nf));
  } else {
    if (half())
      TIMED_W("activation_fwd", 0.0, 2.0 * eb * double(nf), kg::gelu_fwd_bf16(s(), bf16(h1), bf16(gact), nf));
    else
      TIMED_W("activation_fwd", 0.0, 2.0 * eb * double(nf), kg::gelu_fwd(s(), f32(h1), f32(gact), nf));
  }
  DBuf partial = buf(std::size_t(T) * h);
  mm("gemm_fwd", false, false, T, h, f, gact->get(), f, W(N("w2")), h, 0.0f, f32(partial), h);
  return partial;
}

DBuf GpuStage::Impl::mlp_backward(int l, const std::string& prefix, int f, const DBuf& g2, const DBuf& h1, const DBuf& gate,
                                  const DBuf& gact, const DBuf& gdmf) {
  const int T = sh.tokens, h = sh.hidden;
  const auto N = [&](const char* n) { return L(l, (prefix + n).c_str()); };
  const std::size_t nf = std::size_t(T) * f;
  // The MLP's activation gradients in the GEMMs' operand type, as its activations: the second GEMM's input
  // gradient, the activation's backward, and the bias gradients summed from them (weight_grad).
  const double eb = operand_bytes();
  DBuf dact = operand_buf(nf);
  mm_to("gemm_dgrad", half(), false, true, T, f, h, gdmf->get(), h, W(N("w2")), h, 0.0f, dact->get(), f);
  weight_grad(gact, gdmf, nullptr, f, h, N("w2"), "");  // b2's gradient is the caller's (a residual bias)
  DBuf gdh1 = operand_buf(nf), dy2 = buf(std::size_t(T) * h);
  if (sh.swiglu) {
    DBuf gdg = operand_buf(nf);
    if (half())
      TIMED_W("activation_bwd", 0.0, 5.0 * eb * double(nf),
              kg::swiglu_bwd_bf16(s(), bf16(dact), bf16(gate), bf16(h1), bf16(gdg), bf16(gdh1), nf));
    else
      TIMED_W("activation_bwd", 0.0, 5.0 * eb * double(nf),
              kg::swiglu_bwd(s(), f32(dact), f32(gate), f32(h1), f32(gdg), f32(gdh1), nf));
    linear_dx(gdg, h, f, N("wg"), f32(dy2), false);
    weight_grad(g2, gdg, nullptr, h, f, N("wg"), N("bg"));
  } else {
    if (half())
      TIMED_W("activation_bwd", 0.0, 3.0 * eb * double(nf), kg::gelu_bwd_bf16(s(), bf16(dact), bf16(h1), bf16(gdh1), nf));
    else
      TIMED_W("activation_bwd", 0.0, 3.0 * eb * double(nf), kg::gelu_bwd(s(), f32(dact), f32(h1), f32(gdh1), nf));
  }
  linear_dx(gdh1, h, f, N("w1"), f32(dy2), sh.swiglu);
  weight_grad(g2, gdh1, nullptr, h, f, N("w1"), N("b1"));
  return dy2;
}

namespace {
std::vector<std::size_t> floats_per_peer(const std::vector<int>& rows, int width) {
  std::vector<std::size_t> n(rows.size());
  for (std::size_t p = 0; p < rows.size(); ++p) n[p] = std::size_t(rows[p]) * std::size_t(width);
  return n;
}
}  // namespace

DBuf GpuStage::Impl::ep_exchange(const DBuf& send, const std::vector<int>& send_rows, const std::vector<int>& recv_rows,
                                 int width) {
  if (ep.size == 1) return send;
  const std::size_t rows = std::size_t(std::accumulate(recv_rows.begin(), recv_rows.end(), 0));
  const double bytes = double(std::accumulate(send_rows.begin(), send_rows.end(), 0)) * width * sizeof(float);
  DBuf recv;
  collective("ep_alltoall", bytes, [&] {
    recv = buf(std::max<std::size_t>(1, rows) * width);  // after comm waited for compute: memory it may have read
    all_to_all(*ep.comm, f32(send), floats_per_peer(send_rows, width), f32(recv), floats_per_peer(recv_rows, width),
               dev.comm());
  });
  return recv;
}

DBuf GpuStage::Impl::expert_rows(const DBuf& src, const std::int32_t* index, int R, int rmax) {
  const int h = sh.hidden, et = ep.etp_size;
  const int rows = et > 1 ? rmax : R;
  DBuf mine = buf(std::max<std::size_t>(1, std::size_t(rows)) * h);
  if (rows > R)
    TIMED_W("moe_permute", 0.0, 4.0 * double(rows - R) * h, kg::fill(s(), f32(mine) + std::size_t(R) * h, std::size_t(rows - R) * h, 0.0f));
  TIMED_W("moe_permute", 0.0, 8.0 * R * h + 4.0 * R, kg::gather_rows(s(), f32(src), index, nullptr, R, h, f32(mine)));
  if (et == 1) return mine;
  const std::size_t part = std::size_t(rmax) * h;
  DBuf all;
  collective("tp_allgather", double(part) * et * sizeof(float), [&] {
    all = buf(part * et);  // after comm waited for compute: memory it may have read
    ep.etp_comm->all_gather(f32(mine), f32(all), part);
  });
  return all;
}

void GpuStage::Impl::expert_rows_back(const DBuf& block, int R, int rmax, float* dst) {
  const std::size_t part = std::size_t(rmax) * sh.hidden;
  DBuf mine;
  collective("tp_reducescatter", double(part) * ep.etp_size * sizeof(float), [&] {
    mine = buf(std::max<std::size_t>(1, part));
    ep.etp_comm->reduce_scatter(f32(block), f32(mine), part);
  });
  if (R > 0)
    cuda_ok(cudaMemcpyAsync(dst, f32(mine), std::size_t(R) * sh.hidden * sizeof(float), cudaMemcpyDeviceToDevice, s()),
            "expert rows");
}

// runtime/moe_layer.cpp's forward on the device, for this rank's Tl tokens: the router GEMM in fp32, the
// routing on the host (moe_route, the CPU runtime's; the logits come down, as Megatron-Core's all-to-all
// dispatcher syncs for its counts), the slots gathered in dispatch order, the all-to-all of the counts and
// rows (one ep_alltoall), the local experts' MLPs as a loop of GEMMs over their rows (expert-major), the
// outputs back by the reverse all-to-all, and the weighted sum per token; the shared expert as the dense MLP.
DBuf GpuStage::Impl::moe_forward(int l, Acts& a) {
  const int Tl = sh.local_tokens, h = sh.hidden, E = sh.experts, k = sh.top_k, fe = sh.expert_ffn;
  const int S = Tl * k, El = E / ep.size, first = ep.rank * El;
  const std::size_t nl = std::size_t(Tl) * h;
  auto mp = std::make_shared<MoeActs>();
  MoeActs& m = *mp;
  a.moe = mp;
  m.yl = norm_operand(L(l, "ln2.w"), L(l, "ln2.b"), a.x2, a.mu2, a.rs2, true);

  // Router and routing.
  DBuf logits = buf(std::size_t(Tl) * E);
  mm_fp32("gemm_fwd", false, false, Tl, E, h, f32(m.yl), h, P.data(L(l, "moe.router")), E, 0.0f, f32(logits), E);
  m.probs = download(logits, std::size_t(Tl) * E, "router logits");
  m.topi.assign(std::size_t(S), 0.0f);
  m.topw.assign(std::size_t(S), 0.0f);
  m.counts.assign(std::size_t(E), 0.0f);
  // The selection bias as it stands (E values; update_selection_bias moves it between steps, a checkpoint sets it).
  const std::string bias_name = L(l, "moe.bias");
  const std::vector<float> bias = P.has(bias_name) ? P.download_values(bias_name) : std::vector<float>{};
  moe_route(sh, bias.empty() ? nullptr : bias.data(), Tl, m.probs.data(), m.topi.data(), m.topw.data(), m.counts.data());
  if (tp.size > 1) {  // the micro-batch's counts over the SP shards: E values, not in the trace (as the CPU runtime's)
    DBuf c = upload(m.counts, "expert counts");
    dev.comm_waits_compute();
    tp.comm->all_reduce(f32(c), std::size_t(E));
    dev.compute_waits_comm();
    m.counts = download(c, std::size_t(E), "expert counts");
  }
  if (!recomputing) aux_loss += moe_aux_loss(sh, m.probs.data(), m.counts.data(), Tl);

  // Dispatch: the slots' rows in dispatch order, then the counts and rows to the experts' owners.
  moe_dispatch_plan(m.topi.data(), S, E, ep.size, m.order, m.sent);
  std::vector<std::int32_t> token(static_cast<std::size_t>(S)), inv(static_cast<std::size_t>(S));
  std::vector<float> weight(static_cast<std::size_t>(S));
  for (int i = 0; i < S; ++i) {
    const int slot = m.order[std::size_t(i)];
    token[std::size_t(i)] = slot / k;
    weight[std::size_t(i)] = m.topw[std::size_t(slot)];
    inv[std::size_t(slot)] = i;
  }
  m.disp_index = upload(token, "dispatch index");
  m.disp_scale = upload(weight, "dispatch weights");
  m.inv = upload(inv, "combine index");
  m.topw_d = upload(m.topw, "router weights");
  DBuf rows = buf(std::max<std::size_t>(1, std::size_t(S)) * h);
  TIMED_W("moe_permute", 0.0, 8.0 * S * h + 4.0 * S,
          kg::gather_rows(s(), f32(m.yl), i32(m.disp_index), nullptr, S, h, f32(rows)));
  m.got = m.sent;
  DBuf recv = rows;
  const std::vector<int> send_rows = moe_rows_per_peer(m.sent, ep.size, El);
  if (ep.size > 1) {
    collective("ep_alltoall", double(S) * h * sizeof(float), [&] {
      const std::vector<float> sent(m.sent.begin(), m.sent.end());
      DBuf sd = upload(sent, "expert counts"), gd = buf(sent.size());
      const std::vector<std::size_t> per(std::size_t(ep.size), std::size_t(El));
      all_to_all(*ep.comm, f32(sd), per, f32(gd), per, dev.comm());
      std::vector<float> got(sent.size());
      cuda_ok(cudaMemcpyAsync(got.data(), gd->get(), got.size() * sizeof(float), cudaMemcpyDeviceToHost, dev.comm()),
              "expert counts");
      cuda_ok(cudaStreamSynchronize(dev.comm()), "expert counts");
      m.got.assign(got.begin(), got.end());
      const std::vector<int> recv_rows = moe_rows_per_peer(m.got, ep.size, El);
      recv = buf(std::max<std::size_t>(1, std::size_t(std::accumulate(recv_rows.begin(), recv_rows.end(), 0))) * h);
      all_to_all(*ep.comm, f32(rows), floats_per_peer(send_rows, h), f32(recv), floats_per_peer(recv_rows, h), dev.comm());
    });
  }
  // Received rows (peer-major: peer p's for local expert 0, 1, ...) to expert-major, and the way back.
  m.rows.assign(std::size_t(El), 0);
  for (int p = 0; p < ep.size; ++p)
    for (int j = 0; j < El; ++j) m.rows[std::size_t(j)] += m.got[std::size_t(p) * El + j];
  m.off.assign(std::size_t(El), 0);
  for (int j = 1; j < El; ++j) m.off[std::size_t(j)] = m.off[std::size_t(j - 1)] + m.rows[std::size_t(j - 1)];
  const int R = std::accumulate(m.rows.begin(), m.rows.end(), 0);
  m.received = R;
  std::vector<std::int32_t> to(static_cast<std::size_t>(R)), from(static_cast<std::size_t>(R));
  std::vector<int> fill = m.off;
  int q = 0;
  for (int p = 0; p < ep.size; ++p)
    for (int j = 0; j < El; ++j)
      for (int r = 0; r < m.got[std::size_t(p) * El + j]; ++r, ++q) {
        const int e = fill[std::size_t(j)]++;
        to[std::size_t(e)] = q;
        from[std::size_t(q)] = e;
      }
  m.to_experts = upload(to, "expert rows");
  m.from_experts = upload(from, "expert rows");
  // Expert tensor parallelism: every etp rank's rows per expert, for the padded blocks (not in the trace,
  // as the CPU runtime's).
  const int et = ep.etp_size, fl = fe / et;
  m.rmax = m.rows;
  if (et > 1) {
    DBuf mine = upload(std::vector<float>(m.rows.begin(), m.rows.end()), "expert rows"), all = buf(std::size_t(El) * et);
    dev.comm_waits_compute();
    ep.etp_comm->all_gather(f32(mine), f32(all), std::size_t(El));
    dev.compute_waits_comm();
    const std::vector<float> counts = download(all, std::size_t(El) * et, "expert rows");
    for (int r = 0; r < et; ++r)
      for (int j = 0; j < El; ++j)
        m.rmax[std::size_t(j)] = std::max(m.rmax[std::size_t(j)], int(counts[std::size_t(r) * El + j]));
  }

  // The local experts: a loop of GEMMs, each over its own rows.
  m.xe.assign(std::size_t(El), nullptr);
  m.h1e.assign(std::size_t(El), nullptr);
  m.gatee.assign(std::size_t(El), nullptr);
  m.acte.assign(std::size_t(El), nullptr);
  DBuf eout = buf(std::max<std::size_t>(1, std::size_t(R)) * h);
  const auto expert = [&](int j, const char* w) { return expert_param(l, first + j, w); };
  const double eb = operand_bytes();
  for (int j = 0; j < El; ++j) {
    const int Rj = m.rows[std::size_t(j)], o = m.off[std::size_t(j)], rm = m.rmax[std::size_t(j)];
    const int Ra = et > 1 ? et * rm : Rj;  // the rows this rank's slice runs on
    if (Ra == 0) continue;
    const DBuf x = expert_rows(recv, i32(m.to_experts) + o, Rj, rm);
    const DBuf& xe = m.xe[std::size_t(j)] = operand(x, std::size_t(Ra) * h);
    const std::size_t n = std::size_t(Ra) * fl;
    DBuf& h1 = m.h1e[std::size_t(j)] = operand_buf(n);
    DBuf& act = m.acte[std::size_t(j)] = operand_buf(n);
    mm_to("gemm_fwd", half(), false, false, Ra, fl, h, xe->get(), h, WE(expert(j, "w1")), fl, 0.0f, h1->get(), fl);
    if (sh.swiglu) {
      DBuf& gate = m.gatee[std::size_t(j)] = operand_buf(n);
      mm_to("gemm_fwd", half(), false, false, Ra, fl, h, xe->get(), h, WE(expert(j, "wg")), fl, 0.0f, gate->get(), fl);
      if (half())
        TIMED_W("activation_fwd", 0.0, 3.0 * eb * double(n), kg::swiglu_fwd_bf16(s(), bf16(gate), bf16(h1), bf16(act), n));
      else
        TIMED_W("activation_fwd", 0.0, 3.0 * eb * double(n), kg::swiglu_fwd(s(), f32(gate), f32(h1), f32(act), n));
    } else if (half()) {
      TIMED_W("activation_fwd", 0.0, 2.0 * eb * double(n), kg::gelu_fwd_bf16(s(), bf16(h1), bf16(act), n));
    } else {
      TIMED_W("activation_fwd", 0.0, 2.0 * eb * double(n), kg::gelu_fwd(s(), f32(h1), f32(act), n));
    }
    if (et == 1) {
      mm("gemm_fwd", false, false, Ra, h, fl, act->get(), fl, WE(expert(j, "w2")), h, 0.0f, f32(eout) + std::size_t(o) * h, h);
    } else {
      DBuf partial = buf(std::size_t(Ra) * h);
      mm("gemm_fwd", false, false, Ra, h, fl, act->get(), fl, WE(expert(j, "w2")), h, 0.0f, f32(partial), h);
      expert_rows_back(partial, Rj, rm, f32(eout) + std::size_t(o) * h);
    }
  }

  // Combine: back to the senders in their dispatch order, then each token's weighted sum in slot order.
  DBuf back_send = buf(std::max<std::size_t>(1, std::size_t(R)) * h);
  TIMED_W("moe_permute", 0.0, 8.0 * R * h + 4.0 * R, kg::gather_rows(s(), f32(eout), i32(m.from_experts), nullptr, R, h, f32(back_send)));
  DBuf back = ep_exchange(back_send, moe_rows_per_peer(m.got, ep.size, El), send_rows, h);
  m.slot_out = buf(std::max<std::size_t>(1, std::size_t(S)) * h);
  TIMED_W("moe_permute", 0.0, 8.0 * S * h + 4.0 * S, kg::gather_rows(s(), f32(back), i32(m.inv), nullptr, S, h, f32(m.slot_out)));
  DBuf out = buf(nl);
  TIMED_W("moe_unpermute", 0.0, 4.0 * S * h + 4.0 * S + 4.0 * double(nl),
          kg::combine_rows(s(), f32(m.slot_out), f32(m.topw_d), Tl, k, h, f32(out), false));

  // The shared expert over all tokens (column/row-parallel under tp), reduced back to this rank's tokens.
  if (P.has(L(l, "moe.shared.w1"))) {
    m.sg = operand(gather_tokens(m.yl), std::size_t(sh.tokens) * h);
    DBuf mine = reduce_tokens(mlp_forward(l, "moe.shared.", sh.shared_ffn, m.sg, m.sh1, m.sgate, m.sact));
    TIMED_W("residual_add", 0.0, 12.0 * double(nl), kg::add(s(), f32(out), f32(mine), f32(out), nl));
  }
  return out;
}

DBuf GpuStage::Impl::moe_backward(int l, const Acts& a, const DBuf& dout) {
  TESSEL_CHECK(a.moe, "MoE layer " << l << ": backward without its forward's routing");
  const MoeActs& m = *a.moe;
  const int T = sh.tokens, Tl = sh.local_tokens, h = sh.hidden, E = sh.experts, k = sh.top_k, fe = sh.expert_ffn;
  const int S = Tl * k, El = E / ep.size, first = ep.rank * El, R = m.received;
  const std::size_t nl = std::size_t(Tl) * h;

  // The shared expert, as the dense MLP's backward; else the gradient starts from zero.
  DBuf dyl;
  if (P.has(L(l, "moe.shared.w1"))) {
    DBuf gdmf = operand(gather_tokens(dout), std::size_t(T) * h);
    dyl = reduce_tokens(mlp_backward(l, "moe.shared.", sh.shared_ffn, m.sg, m.sh1, m.sgate, m.sact, gdmf));
  } else {
    dyl = buf(nl);
    TIMED_W("moe_unpermute", 0.0, 4.0 * double(nl), kg::fill(s(), f32(dyl), nl, 0.0f));
  }

  // The chosen weights' gradients (each slot's output against its token's gradient), and each slot's output
  // gradient (its weight times dout) to its expert's owner.
  DBuf dwd = buf(std::max<std::size_t>(1, std::size_t(S)));
  TIMED_W("moe_unpermute", 0.0, 4.0 * S * h + 4.0 * double(nl) + 4.0 * S,
          kg::row_dots(s(), f32(dout), f32(m.slot_out), S, k, h, f32(dwd)));
  const std::vector<float> dw = download(dwd, std::size_t(S), "router weight gradients");
  DBuf rows = buf(std::max<std::size_t>(1, std::size_t(S)) * h);
  TIMED_W("moe_permute", 0.0, 8.0 * S * h + 8.0 * S,
          kg::gather_rows(s(), f32(dout), i32(m.disp_index), f32(m.disp_scale), S, h, f32(rows)));
  const std::vector<int> send_rows = moe_rows_per_peer(m.sent, ep.size, El), recv_rows = moe_rows_per_peer(m.got, ep.size, El);
  DBuf recv = ep_exchange(rows, send_rows, recv_rows, h);
  // Each local expert's backward over the rows its forward ran on (under etp > 1 the output gradients
  // gathered as the inputs were, the input gradients reduce-scattered back); the weight GEMMs queued as the
  // dense ones (a split I defers them).
  const auto expert = [&](int j, const char* w) { return expert_param(l, first + j, w); };
  const int et = ep.etp_size, fl = fe / et;
  const double eb = operand_bytes();
  GpuParams& PE = *ep.experts;
  DBuf dxin = buf(std::max<std::size_t>(1, std::size_t(R)) * h);
  for (int j = 0; j < El; ++j) {
    const int Rj = m.rows[std::size_t(j)], o = m.off[std::size_t(j)], rm = m.rmax[std::size_t(j)];
    const int Ra = et > 1 ? et * rm : Rj;
    if (Ra == 0) continue;
    const DBuf gd = operand(expert_rows(recv, i32(m.to_experts) + o, Rj, rm), std::size_t(Ra) * h);
    const DBuf &xe = m.xe[std::size_t(j)], &h1 = m.h1e[std::size_t(j)], &gate = m.gatee[std::size_t(j)], &act = m.acte[std::size_t(j)];
    const std::size_t n = std::size_t(Ra) * fl;
    const std::string w1 = expert(j, "w1"), wg = expert(j, "wg"), w2 = expert(j, "w2");
    DBuf dact = operand_buf(n), dh = operand_buf(n), dg = sh.swiglu ? operand_buf(n) : nullptr;
    mm_to("gemm_dgrad", half(), false, true, Ra, fl, h, gd->get(), h, WE(w2), h, 0.0f, dact->get(), fl);
    weight_job([this, &PE, act, gd, Ra, fl, h, w2] {
      mm("gemm_wgrad", true, false, fl, h, Ra, act->get(), fl, gd->get(), h, 1.0f, PE.grad(w2), h);
    });
    if (sh.swiglu && half())
      TIMED_W("activation_bwd", 0.0, 5.0 * eb * double(n), kg::swiglu_bwd_bf16(s(), bf16(dact), bf16(gate), bf16(h1), bf16(dg), bf16(dh), n));
    else if (sh.swiglu)
      TIMED_W("activation_bwd", 0.0, 5.0 * eb * double(n), kg::swiglu_bwd(s(), f32(dact), f32(gate), f32(h1), f32(dg), f32(dh), n));
    else if (half())
      TIMED_W("activation_bwd", 0.0, 3.0 * eb * double(n), kg::gelu_bwd_bf16(s(), bf16(dact), bf16(h1), bf16(dh), n));
    else
      TIMED_W("activation_bwd", 0.0, 3.0 * eb * double(n), kg::gelu_bwd(s(), f32(dact), f32(h1), f32(dh), n));
    const DBuf block = et > 1 ? buf(std::size_t(Ra) * h) : nullptr;
    float* dx = et > 1 ? f32(block) : f32(dxin) + std::size_t(o) * h;
    if (sh.swiglu) {
      mm("gemm_dgrad", false, true, Ra, h, fl, dg->get(), fl, WE(wg), fl, 0.0f, dx, h);
      weight_job([this, &PE, xe, dg, Ra, fl, h, wg] {
        mm("gemm_wgrad", true, false, h, fl, Ra, xe->get(), h, dg->get(), fl, 1.0f, PE.grad(wg), fl);
      });
    }
    mm("gemm_dgrad", false, true, Ra, h, fl, dh->get(), fl, WE(w1), fl, sh.swiglu ? 1.0f : 0.0f, dx, h);
    weight_job([this, &PE, xe, dh, Ra, fl, h, w1] {
      mm("gemm_wgrad", true, false, h, fl, Ra, xe->get(), h, dh->get(), fl, 1.0f, PE.grad(w1), fl);
    });
    if (et > 1) expert_rows_back(block, Rj, rm, f32(dxin) + std::size_t(o) * h);
  }

  // The input gradients back to the tokens' ranks, summed per token.
  DBuf back_send = buf(std::max<std::size_t>(1, std::size_t(R)) * h);
  TIMED_W("moe_permute", 0.0, 8.0 * R * h + 4.0 * R, kg::gather_rows(s(), f32(dxin), i32(m.from_experts), nullptr, R, h, f32(back_send)));
  DBuf back = ep_exchange(back_send, recv_rows, send_rows, h);
  DBuf slots = buf(std::max<std::size_t>(1, std::size_t(S)) * h);
  TIMED_W("moe_permute", 0.0, 8.0 * S * h + 4.0 * S, kg::gather_rows(s(), f32(back), i32(m.inv), nullptr, S, h, f32(slots)));
  TIMED_W("moe_unpermute", 0.0, 4.0 * S * h + 8.0 * double(nl), kg::combine_rows(s(), f32(slots), nullptr, Tl, k, h, f32(dyl), true));

  // Router: the logits' gradient on the host (moe_router_grad), then its input and weight gradients in fp32.
  std::vector<float> dz(std::size_t(Tl) * E);
  moe_router_grad(sh, m.probs.data(), m.topi.data(), m.counts.data(), dw.data(), Tl, dz.data());
  DBuf dzd = upload(dz, "router logit gradients");
  const std::string router = L(l, "moe.router");
  mm_fp32("gemm_dgrad", false, true, Tl, h, E, f32(dzd), E, P.data(router), E, 1.0f, f32(dyl), h);
  weight_job([this, yl = m.yl, dzd, Tl, h, E, router] {
    mm_fp32("gemm_wgrad", true, false, h, E, Tl, f32(yl), h, f32(dzd), E, 1.0f, P.grad(router), E);
  });
  // The micro-batch's load, counted here because the backward runs once per micro-batch whatever is recomputed.
  if (P.has(L(l, "moe.bias"))) {
    std::vector<float>& lo = load[l];
    lo.resize(std::size_t(E), 0.0f);
    for (int e = 0; e < E; ++e) lo[std::size_t(e)] += m.counts[std::size_t(e)];
  }
  return dyl;
}

// Vocab-parallel lookup (partial per shard, summed over tp or reduce-scattered by token) plus positions.
DBuf GpuStage::Impl::embed_forward(Mb& st) {
  const GpuParam& tok = P.at("embed.tok");
  DBuf full = buf(std::size_t(sh.tokens) * sh.hidden);
  const double T = sh.tokens, h = sh.hidden, Tl = sh.local_tokens;
  // The output written; the rows of this rank's vocabulary shard read (a 1/tp share of the tokens on
  // average; repeated tokens read once at best, so this is at most); the tokens.
  // Under bf16 GEMMs the lookup reads the table's bf16 copy, as Megatron's bf16 embedding does (and as the
  // tied head's GEMM reads it), so ZeRO moves the table in bf16 too.
  if (half())
    TIMED_W("embedding_fwd", 0.0, 4.0 * T * h + 2.0 * T * h / tp.size + 4.0 * T,
            kg::embedding_fwd_bf16(s(), P.half("embed.tok"), int(tok.rows), int(tok.row0), sh.hidden, st.tokens, sh.tokens, f32(full)));
  else
    TIMED_W("embedding_fwd", 0.0, 4.0 * T * h * (1.0 + 1.0 / tp.size) + 4.0 * T,
            kg::embedding_fwd(s(), P.data("embed.tok"), int(tok.rows), int(tok.row0), sh.hidden, st.tokens, sh.tokens, f32(full)));
  DBuf x = reduce_tokens(full);
  if (P.has("embed.pos"))
    TIMED_W("embedding_fwd", 0.0, 8.0 * Tl * h + 4.0 * std::min(Tl, double(sh.seq)) * h,
            kg::add_positions(s(), f32(x), P.data("embed.pos"), sh.local_tokens, tp.sp ? tp.rank * sh.local_tokens : 0, sh.seq, sh.hidden));
  return x;
}

void GpuStage::Impl::embed_backward(Mb& st, const DBuf& dx) {
  const double T = sh.tokens, h = sh.hidden, Tl = sh.local_tokens;
  if (P.has("embed.pos"))
    TIMED_W("embedding_bwd", 0.0, 4.0 * Tl * h + 8.0 * std::min(Tl, double(sh.seq)) * h,
            kg::add_positions_bwd(s(), f32(dx), P.grad("embed.pos"), sh.local_tokens, tp.sp ? tp.rank * sh.local_tokens : 0, sh.seq, sh.hidden));
  const GpuParam& tok = P.at("embed.tok");
  DBuf full = gather_tokens(dx);
  // For this rank's share of the tokens (1/tp on average): the gradient read, its table rows updated.
  TIMED_W("embedding_bwd", 0.0, 12.0 * T * h / tp.size + 4.0 * T,
          kg::embedding_bwd(s(), f32(full), int(tok.rows), int(tok.row0), sh.hidden, st.tokens, sh.tokens, P.grad("embed.tok")));
}

// Final norm, LM head (weights [V_local, h]: logits = y W^T) and cross-entropy over this vocab shard.
void GpuStage::Impl::head_forward(Mb& st, const DBuf& x) {
  const std::string w = P.has("head.w") ? "head.w" : "embed.tok";
  const GpuParam& hw = P.at(w);
  const int V = int(hw.rows);
  st.head_x = x;
  st.head_g = norm_operand("final_ln.w", "final_ln.b", x, st.head_mu, st.head_rs);
  st.logits = buf(std::size_t(sh.tokens) * V);
  mm("gemm_head", false, true, sh.tokens, V, sh.hidden, st.head_g->get(), sh.hidden, W(w), sh.hidden, 0.0f, f32(st.logits), V);
  st.row_max = buf(sh.tokens);
  st.row_sum = buf(sh.tokens);
  DBuf loss = buf(sh.tokens);
  const double logits = 4.0 * double(sh.tokens) * V, rows = 4.0 * double(sh.tokens);
  if (tp.size == 1) {
    TIMED_W("cross_entropy_fwd", 0.0, logits + 4.0 * rows, kg::cross_entropy_fwd(s(), f32(st.logits), sh.tokens, V, int(hw.row0), st.targets, f32(loss),
                                          f32(st.row_max), f32(st.row_sum)));
  } else {
    // Vocab-parallel (Megatron's): the max, then the exp-sums and target logits, reduced over the tp group.
    const int T = sh.tokens;
    TIMED_W("cross_entropy_fwd", 0.0, logits + rows, kg::cross_entropy_max(s(), f32(st.logits), T, V, f32(st.row_max)));
    collective("tp_allreduce", double(T) * 4, [&] { tp.comm->all_reduce(f32(st.row_max), T, ReduceOp::max); });
    DBuf sums = buf(2 * std::size_t(T));  // [row_sum | target logit]
    TIMED_W("cross_entropy_fwd", 0.0, logits + 4.0 * rows, kg::cross_entropy_partial(s(), f32(st.logits), T, V, int(hw.row0), st.targets, f32(st.row_max), f32(sums)));
    collective("tp_allreduce", double(T) * 8, [&] { tp.comm->all_reduce(f32(sums), 2 * std::size_t(T)); });
    TIMED_W("cross_entropy_fwd", 0.0, 4.0 * rows, kg::cross_entropy_loss(s(), T, f32(st.row_max), f32(sums), f32(loss)));
    cuda_ok(cudaMemcpyAsync(f32(st.row_sum), f32(sums), std::size_t(T) * sizeof(float), cudaMemcpyDeviceToDevice, s()),
            "cross-entropy statistics");
  }
  if (loss_sum) TIMED_W("cross_entropy_fwd", 0.0, rows, kg::col_sum(s(), f32(loss), sh.tokens, 1, loss_sum));
}

DBuf GpuStage::Impl::head_backward(Mb& st) {
  const std::string w = P.has("head.w") ? "head.w" : "embed.tok";
  const GpuParam& hw = P.at(w);
  const int V = int(hw.rows);
  DBuf dloss = buf(sh.tokens);  // d(loss_scale * mean over T) / d loss_r
  TIMED_W("cross_entropy_bwd", 0.0, 4.0 * double(sh.tokens), kg::fill(s(), f32(dloss), sh.tokens, cfg.loss_scale / float(sh.tokens)));
  // The logits' gradient feeds the two head GEMMs only: written once, in their operand type.
  const std::size_t nv = std::size_t(sh.tokens) * V;
  DBuf gdl = operand_buf(nv);
  // The logits read, their gradient written in the GEMMs' operand type; the row statistics and targets.
  TIMED_W("cross_entropy_bwd", 0.0, (4.0 + operand_bytes()) * double(nv) + 16.0 * double(sh.tokens), kg::cross_entropy_bwd(s(), f32(st.logits), sh.tokens, V, int(hw.row0), st.targets, f32(st.row_max),
                                        f32(st.row_sum), f32(dloss), as_f32(gdl), as_bf16(gdl)));
  st.logits.reset();
  DBuf dy = buf(std::size_t(sh.tokens) * sh.hidden);
  mm("gemm_head", false, false, sh.tokens, sh.hidden, V, gdl->get(), V, W(w), sh.hidden, 0.0f, f32(dy), sh.hidden);
  weight_job([this, gdl, hg = st.head_g, V, w] {
    mm("gemm_head", true, false, V, sh.hidden, sh.tokens, gdl->get(), V, hg->get(), sh.hidden, 1.0f, P.grad(w), sh.hidden);
  });
  DBuf dyl = reduce_tokens(dy), dx = buf(std::size_t(sh.local_tokens) * sh.hidden);
  norm_bwd("final_ln.w", "final_ln.b", dyl, st.head_x, st.head_mu, st.head_rs, f32(dx));
  return dx;
}

GpuStage::GpuStage(CudaDevice& dev, const Model& m, const GpuStageConfig& cfg, GpuParams& params, const GpuTp& tp,
                   GemmType gemm, const std::string& attention_kernel, const GpuEp& ep)
    : impl_(std::make_unique<Impl>(dev, m, cfg, params, tp, gemm, attention_kernel, ep)) {
}
GpuStage::~GpuStage() = default;

void GpuStage::set_loss_sink(float* loss_sum) { impl_->loss_sum = loss_sum; }
double GpuStage::take_aux_loss() { return std::exchange(impl_->aux_loss, 0.0); }

void GpuStage::update_selection_bias(const std::function<void(std::vector<float>&)>& dp_sum, float rate) {
  Impl& I = *impl_;
  for (auto& [l, lo] : I.load) {
    dp_sum(lo);
    const std::string name = I.L(l, "moe.bias");
    std::vector<float> bias = I.P.download_values(name);
    TESSEL_CHECK(bias.size() == lo.size(), name << ": " << bias.size() << " values, load of " << lo.size() << " experts");
    move_selection_bias(bias.data(), lo, rate);  // the CPU runtime's rule
    I.P.set_values(name, bias, I.s());  // every copy, ZeRO-1's master shard included
    std::fill(lo.begin(), lo.end(), 0.0f);
  }
}
void GpuStage::set_param_hooks(ParamHooks h) { impl_->hooks = std::move(h); }
const GpuStageConfig& GpuStage::config() const { return impl_->cfg; }
std::size_t GpuStage::activation_elems() const { return std::size_t(impl_->sh.local_tokens) * impl_->sh.hidden; }
int GpuStage::tokens() const { return impl_->sh.tokens; }

// The CPU Stage's count (stage_forward_flops, runtime/gpt_layer.hpp).
double GpuStage::forward_flops() const {
  const Impl& I = *impl_;
  int moe = 0;
  for (int l = I.cfg.l0; l < I.cfg.l1; ++l) moe += I.model.is_moe_layer(l);
  return stage_forward_flops(I.sh, I.cfg.l1 - I.cfg.l0, I.cfg.last, I.model.vocab, I.tp.size, moe);
}

DBuf GpuStage::forward(int mb, DBuf in, const std::int32_t* tokens, const std::int32_t* targets) {
  Impl& I = *impl_;
  I.current = {"forward", I.cfg.stage, I.cfg.chunk, mb, I.cfg.l0, I.cfg.l1};
  // A micro-batch's state lives from its forward to its B, or its W after a split I: one still here
  // (an I whose W never ran) would hand its queued weight GEMMs to the next step's W.
  TESSEL_CHECK(I.mbs.count(mb) == 0, "stage " << I.cfg.stage << ": forward of micro-batch " << mb
                                               << " while its previous backward is unfinished (an I without its W?)");
  Impl::Mb& st = I.mbs[mb];
  st.tokens = tokens;
  st.targets = targets;
  DBuf x = in;
  if (I.cfg.first) {
    I.enter({"embed.tok", "embed.pos"});
    I.prefetch_layer(I.cfg.l0);
    x = I.embed_forward(st);
    I.leave({"embed.tok", "embed.pos"});
  }
  st.acts.assign(std::size_t(I.cfg.l1 - I.cfg.l0), Acts{});
  for (int l = I.cfg.l0; l < I.cfg.l1; ++l) {
    Acts& a = st.acts[std::size_t(l - I.cfg.l0)];
    const std::string group = "layers." + std::to_string(l);
    I.enter({group});
    I.prefetch_layer(l + 1, true);
    DBuf out = I.layer_forward(l, x, a);
    I.leave({group});
    if (I.cfg.recompute == Recompute::full) {  // keep the block input only
      Acts kept;
      kept.x = x;
      a = std::move(kept);
    }
    x = out;
  }
  if (I.cfg.last) {
    I.enter(I.head_groups());
    I.head_forward(st, x);
    I.leave(I.head_groups());
    return nullptr;
  }
  return x;
}

DBuf GpuStage::backward(int mb, DBuf dout, bool defer_weight) {
  Impl& I = *impl_;
  I.current = {defer_weight ? "input_grad" : "backward", I.cfg.stage, I.cfg.chunk, mb, I.cfg.l0, I.cfg.l1};
  auto it = I.mbs.find(mb);
  TESSEL_CHECK(it != I.mbs.end(), "backward of stage " << I.cfg.stage << " mb " << mb << " before its forward");
  Impl::Mb& st = it->second;
  I.current_mb = &st;
  I.defer = defer_weight;
  DBuf g = dout;
  if (I.cfg.last) {
    const std::vector<std::string> head = I.head_groups();
    I.enter(head);
    I.prefetch_layer(I.cfg.l1 - 1);
    I.grads_begin(head, true);
    g = I.head_backward(st);
    // A tied head on the stage that also looks the tokens up: embed.tok's gradient stays open through the
    // layers and closes with the embeddings', one reduction a micro-batch instead of two.
    const bool tied_here = I.cfg.first && head.size() == 2;
    I.grads_end(tied_here ? std::vector<std::string>{"final"} : head, true);
    I.leave(head);
  }
  for (int l = I.cfg.l1 - 1; l >= I.cfg.l0; --l) {
    Acts& a = st.acts[std::size_t(l - I.cfg.l0)];
    const std::string group = "layers." + std::to_string(l);
    I.enter({group});
    I.prefetch_layer(l - 1);
    I.grads_begin({group}, true);
    if (I.cfg.recompute == Recompute::full) {  // re-run the forward from the kept input
      const DBuf x = a.x;
      I.recomputing = true;
      (void)I.layer_forward(l, x, a);
      I.recomputing = false;
    }
    g = I.layer_backward(l, a, g);
    I.grads_end({group}, true);
    I.leave({group});
    a = Acts{};
  }
  if (I.cfg.first) {  // the embeddings' gradients are complete here, split I or not
    const std::vector<std::string> embed{"embed.tok", "embed.pos"};
    I.grads_begin(embed, false);
    I.embed_backward(st, g);
    I.grads_end(embed, false);
  }
  I.defer = false;
  I.current_mb = nullptr;
  if (defer_weight) {  // the saved activations go now; what the queued GEMMs read stays with them
    st.acts.clear();
    st.head_x = st.head_mu = st.head_rs = st.head_g = st.logits = st.row_max = st.row_sum = nullptr;
  } else {
    I.mbs.erase(it);
  }
  return I.cfg.first ? nullptr : g;
}

void GpuStage::backward_weight(int mb) {
  Impl& I = *impl_;
  auto it = I.mbs.find(mb);
  TESSEL_CHECK(it != I.mbs.end(), "W of stage " << I.cfg.stage << " mb " << mb << " before its I");
  I.current = {"weight_grad", I.cfg.stage, I.cfg.chunk, mb, I.cfg.l0, I.cfg.l1};
  for (const auto& job : it->second.jobs) job();
  I.mbs.erase(it);
}

}  // namespace tessel::rt::cuda
