// cuDNN's fused attention through cudnn-frontend (attention_cudnn.hpp says what it computes). The graphs
// follow cudnn-frontend's SDPA samples (samples/cpp/sdpa/fp16_fwd.cpp, fp16_bwd.cpp): bf16 I/O, fp32
// intermediates and compute, a top-left-aligned causal band (right bound 0), the softmax statistics as an
// fp32 output of the forward and an input of the backward.
//
// libcudnn is opened at the first call (cudnn-frontend's dynamic loading), not linked: tessel starts on a
// machine without cuDNN, and only this variant then fails, naming the library.
#include "kernels/cuda/attention_cudnn.hpp"

#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#include "kernels/cuda/attention_kernels.hpp"
#include "kernels/cuda/check.cuh"

// cudnn-frontend's dynamic loading looks the backend's symbols up in this handle (cudnn_frontend_shim.h).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace tessel::kernels::cuda {

namespace fe = cudnn_frontend;

namespace {

// Tensor uids of the graphs' variant packs.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

Status fe_status(fe::error_t e, const char* what) {
  if (e.is_good()) return {};
  return {1, std::string("attention (cudnn): ") + what + ": " + e.get_message()};
}

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return {static_cast<int>(e), std::string("attention (cudnn): ") + what + ": " + cudaGetErrorString(e)};
}

// libcudnn.so.9 (the cuDNN 9 ABI the headers describe), opened once per process.
Status load_cudnn() {
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    for (const char* name : {"libcudnn.so.9", "libcudnn.so"})
      if ((fe::cudnn_dlhandle = dlopen(name, RTLD_NOW | RTLD_GLOBAL))) return;
    const char* why = dlerror();
    error = std::string("cannot open libcudnn.so.9 (") + (why ? why : "not found") +
            "); put cuDNN 9's library directory on LD_LIBRARY_PATH";
  });
  if (!error.empty()) return {1, "attention (cudnn): " + error};
  return {};
}

// [batch, heads, seq, d] over token-major rows of `heads * d` bf16 elements (BSHD, compact).
fe::graph::Tensor_attributes bshd(const char* name, std::int64_t uid, const AttentionShape& a, int heads) {
  const std::int64_t b = a.batch, s = a.seq, h = heads, d = a.d;
  return fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({b, h, s, d}).set_stride({s * h * d, d, h * d, 1});
}

fe::graph::Tensor_attributes stats(const AttentionShape& a) {
  const std::int64_t b = a.batch, s = a.seq, h = a.hq;
  return fe::graph::Tensor_attributes()
      .set_name("stats")
      .set_uid(kStats)
      .set_dim({b, h, s, 1})
      .set_stride({h * s, s, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

float scale_of(const AttentionShape& a) { return 1.0f / std::sqrt(static_cast<float>(a.d)); }

std::shared_ptr<fe::graph::Graph> forward_graph(const AttentionShape& a) {
  auto g = new_graph();
  auto q = g->tensor(bshd("q", kQ, a, a.hq));
  auto k = g->tensor(bshd("k", kK, a, a.hkv));
  auto v = g->tensor(bshd("v", kV, a, a.hkv));
  auto opts = fe::graph::SDPA_attributes()
                  .set_name("attention_fwd")
                  .set_generate_stats(true)
                  .set_attn_scale(scale_of(a))
                  .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                  .set_diagonal_band_right_bound(0);
  auto [o, st] = g->sdpa(q, k, v, opts);
  const fe::graph::Tensor_attributes o_attr = bshd("o", kO, a, a.hq);
  o->set_output(true).set_uid(kO).set_dim(o_attr.get_dim()).set_stride(o_attr.get_stride());
  st->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
  return g;
}

// Deterministic: no atomics in dQ, so a step is reproducible, as the hand-written kernels are.
std::shared_ptr<fe::graph::Graph> backward_graph(const AttentionShape& a) {
  auto g = new_graph();
  auto q = g->tensor(bshd("q", kQ, a, a.hq));
  auto k = g->tensor(bshd("k", kK, a, a.hkv));
  auto v = g->tensor(bshd("v", kV, a, a.hkv));
  auto o = g->tensor(bshd("o", kO, a, a.hq));
  auto dout = g->tensor(bshd("dout", kDO, a, a.hq));
  auto st = g->tensor(stats(a));
  auto opts = fe::graph::SDPA_backward_attributes()
                  .set_name("attention_bwd")
                  .set_attn_scale(scale_of(a))
                  .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                  .set_diagonal_band_right_bound(0)
                  .set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, st, opts);
  for (auto [t, uid, heads] : {std::tuple{dq, kDQ, a.hq}, std::tuple{dk, kDK, a.hkv}, std::tuple{dv, kDV, a.hkv}}) {
    const fe::graph::Tensor_attributes attr = bshd("grad", uid, a, heads);
    t->set_output(true).set_uid(uid).set_dim(attr.get_dim()).set_stride(attr.get_stride());
  }
  return g;
}

// Stream-ordered scratch freed on the stream when it goes out of scope.
class Scratch {
 public:
  explicit Scratch(cudaStream_t s) : s_(s) {}
  ~Scratch() {
    for (void* p : blocks_) (void)cudaFreeAsync(p, s_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Status alloc(std::size_t bytes, void*& p) {
    p = nullptr;
    if (bytes == 0) return {};
    TESSEL_STATUS_CHECK(cuda_status(cudaMallocAsync(&p, bytes, s_), "scratch"));
    blocks_.push_back(p);
    return {};
  }

 private:
  cudaStream_t s_;
  std::vector<void*> blocks_;
};

// q, k, v (and dout) as compact bf16: the caller's when they are bf16, else rounded copies.
Status bf16_operand(Scratch& sc, cudaStream_t s, const AttentionArgs& a, const void* p, int ld, int heads, const void*& out) {
  if (a.dtype == AttnDtype::bf16) {
    out = p;
    return {};
  }
  const int rows = a.shape.batch * a.shape.seq, cols = heads * a.shape.d;
  void* dst = nullptr;
  TESSEL_STATUS_CHECK(sc.alloc(std::size_t(rows) * cols * 2, dst));
  TESSEL_STATUS_CHECK(detail::round_rows_bf16(s, static_cast<const float*>(p), ld, rows, cols, dst));
  out = dst;
  return {};
}

}  // namespace

struct CudnnAttention {
  cudnnHandle_t handle = nullptr;
  // (backward, batch, seq, hq, hkv, d) -> its graph with the plan built.
  std::map<std::tuple<bool, int, int, int, int, int>, std::shared_ptr<fe::graph::Graph>> graphs;
  ~CudnnAttention() {
    if (handle) (void)fe::detail::destroy_handle(handle);
  }

  Status graph(bool backward, const AttentionShape& a, std::shared_ptr<fe::graph::Graph>& out) {
    auto& g = graphs[{backward, a.batch, a.seq, a.hq, a.hkv, a.d}];
    if (!g) {
      auto built = backward ? backward_graph(a) : forward_graph(a);
      TESSEL_STATUS_CHECK(fe_status(built->build(handle, {fe::HeurMode_t::A}), backward ? "backward graph" : "forward graph"));
      g = std::move(built);
    }
    out = g;
    return {};
  }

  Status execute(cudaStream_t s, fe::graph::Graph& g, std::unordered_map<std::int64_t, void*>& pack, Scratch& sc) {
    std::int64_t ws_bytes = 0;
    TESSEL_STATUS_CHECK(fe_status(g.get_workspace_size(ws_bytes), "workspace size"));
    void* ws = nullptr;
    TESSEL_STATUS_CHECK(sc.alloc(static_cast<std::size_t>(ws_bytes), ws));
    if (fe::detail::set_stream(handle, s) != CUDNN_STATUS_SUCCESS) return {1, "attention (cudnn): cudnnSetStream failed"};
    return fe_status(g.execute(handle, pack, ws), "execute");
  }
};

void CudnnAttentionDeleter::operator()(CudnnAttention* p) const { delete p; }

bool attention_cudnn_built() { return true; }

namespace {

Status ready(CudnnAttentionPtr& state) {
  if (state) return {};
  TESSEL_STATUS_CHECK(load_cudnn());
  CudnnAttentionPtr fresh(new CudnnAttention);
  if (fe::detail::create_handle(&fresh->handle) != CUDNN_STATUS_SUCCESS) return {1, "attention (cudnn): cudnnCreate failed"};
  state = std::move(fresh);
  return {};
}

Status forward(CudnnAttention& st, cudaStream_t s, const AttentionArgs& a) {
  const AttentionShape& sh = a.shape;
  std::shared_ptr<fe::graph::Graph> g;
  TESSEL_STATUS_CHECK(st.graph(false, sh, g));
  Scratch sc(s);
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  TESSEL_STATUS_CHECK(bf16_operand(sc, s, a, a.q, a.ldq, sh.hq, q));
  TESSEL_STATUS_CHECK(bf16_operand(sc, s, a, a.k, a.ldk, sh.hkv, k));
  TESSEL_STATUS_CHECK(bf16_operand(sc, s, a, a.v, a.ldv, sh.hkv, v));
  const int rows = sh.batch * sh.seq, qd = sh.hq * sh.d;
  void* o = nullptr;
  TESSEL_STATUS_CHECK(sc.alloc(std::size_t(rows) * qd * 2, o));
  std::unordered_map<std::int64_t, void*> pack = {{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)},
                                                  {kV, const_cast<void*>(v)}, {kO, o}, {kStats, a.lse}};
  TESSEL_STATUS_CHECK(st.execute(s, *g, pack, sc));
  return detail::widen_rows_bf16(s, o, rows, qd, a.out, a.ldo);
}

Status backward(CudnnAttention& st, cudaStream_t s, const AttentionArgs& a) {
  const AttentionShape& sh = a.shape;
  std::shared_ptr<fe::graph::Graph> g;
  TESSEL_STATUS_CHECK(st.graph(true, sh, g));
  Scratch sc(s);
  const void *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  TESSEL_STATUS_CHECK(bf16_operand(sc, s, a, a.q, a.ldq, sh.hq, q));
  TESSEL_STATUS_CHECK(bf16_operand(sc, s, a, a.k, a.ldk, sh.hkv, k));
  TESSEL_STATUS_CHECK(bf16_operand(sc, s, a, a.v, a.ldv, sh.hkv, v));
  TESSEL_STATUS_CHECK(bf16_operand(sc, s, a, a.dout, a.lddo, sh.hq, dout));
  const int rows = sh.batch * sh.seq, qd = sh.hq * sh.d, kd = sh.hkv * sh.d;
  void *o = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  TESSEL_STATUS_CHECK(sc.alloc(std::size_t(rows) * qd * 2, o));
  TESSEL_STATUS_CHECK(detail::round_rows_bf16(s, a.out, a.ldo, rows, qd, o));
  TESSEL_STATUS_CHECK(sc.alloc(std::size_t(rows) * qd * 2, dq));
  TESSEL_STATUS_CHECK(sc.alloc(std::size_t(rows) * kd * 2, dk));
  TESSEL_STATUS_CHECK(sc.alloc(std::size_t(rows) * kd * 2, dv));
  std::unordered_map<std::int64_t, void*> pack = {
      {kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)}, {kO, o},
      {kDO, const_cast<void*>(dout)}, {kStats, a.lse}, {kDQ, dq}, {kDK, dk}, {kDV, dv}};
  TESSEL_STATUS_CHECK(st.execute(s, *g, pack, sc));
  TESSEL_STATUS_CHECK(detail::widen_rows_bf16(s, dq, rows, qd, a.dq, a.lddq));
  TESSEL_STATUS_CHECK(detail::widen_rows_bf16(s, dk, rows, kd, a.dk, a.lddk));
  return detail::widen_rows_bf16(s, dv, rows, kd, a.dv, a.lddv);
}

// cudnn-frontend reports most failures as error_t, but its dynamic loading throws (a missing symbol).
template <class F>
Status guarded(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return {1, std::string("attention (cudnn): ") + e.what()};
  }
}

}  // namespace

Status cudnn_attention_fwd(CudnnAttentionPtr& state, cudaStream_t s, const AttentionArgs& a) {
  return guarded([&] {
    TESSEL_STATUS_CHECK(ready(state));
    return forward(*state, s, a);
  });
}

Status cudnn_attention_bwd(CudnnAttentionPtr& state, cudaStream_t s, const AttentionArgs& a) {
  return guarded([&] {
    TESSEL_STATUS_CHECK(ready(state));
    return backward(*state, s, a);
  });
}

}  // namespace tessel::kernels::cuda
