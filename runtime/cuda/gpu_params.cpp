#include "runtime/cuda/gpu_params.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/kernels.hpp"
#include "models/util/error.hpp"

namespace tessel::rt::cuda {

namespace kg = kernels::cuda;

namespace {
// A copy ordered on stream s and finished on return. Not plain cudaMemcpy: that runs on the legacy default
// stream, which the non-blocking compute stream does not wait for, and a pageable host-to-device
// cudaMemcpy may return before its transfer lands.
void copy_sync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s, const char* what) {
  cuda_ok(cudaMemcpyAsync(dst, src, bytes, kind, s), what);
  cuda_ok(cudaStreamSynchronize(s), what);
}
}  // namespace

GpuParams::GpuParams(CudaDevice& dev, const Model& m, const std::vector<std::string>& names, int tp, int tp_rank,
                     int zero_dp, int zero_rank)
    : dev_(dev), zero_dp_(zero_dp), zero_rank_(zero_rank) {
  for (const ParamSpec& s : gpt_param_specs(m)) {
    if (std::find(names.begin(), names.end(), s.name) == names.end()) continue;
    GpuParam p;
    p.spec = s;
    p.rows = s.rows;
    p.cols = s.cols;
    if (s.shard_dim == 0) {
      p.rows = s.rows / tp;
      p.row0 = p.rows * tp_rank;
    } else if (s.shard_dim == 1) {
      p.cols = s.cols / tp;
      p.col0 = p.cols * tp_rank;
    }
    p.offset = total_;
    total_ += (p.size() + 63) / 64 * 64;  // 256-byte aligned starts: bf16 GEMM operands need 16 bytes
    index_[s.name] = params_.size();
    params_.push_back(p);
  }
  TESSEL_CHECK(zero_dp >= 1 && zero_rank >= 0 && zero_rank < zero_dp, "ZeRO rank " << zero_rank << " of " << zero_dp);
  // Equal shards of 64-element (256-byte) multiples, so every shard starts aligned.
  const std::size_t unit = 64 * std::size_t(zero_dp);
  padded_ = (total_ + unit - 1) / unit * unit;
  shard_ = padded_ / std::size_t(zero_dp);
  data_ = dev.alloc_f32(padded_);
  grad_ = dev.alloc_f32(padded_);
  const std::size_t moments = sharded() ? shard_ : padded_;
  m_ = dev.alloc_f32(moments);
  v_ = dev.alloc_f32(moments);
  half_ = dev.alloc(padded_ * sizeof(__nv_bfloat16));
  scratch_ = dev.alloc(sizeof(double));
  std::vector<DBuf> all{data_, grad_, m_, v_};
  if (sharded()) {
    shard_grad_ = dev.alloc_f32(shard_);
    all.push_back(shard_grad_);
  }
  const cudaStream_t s = dev.compute();
  for (const DBuf& b : all) cuda_ok(cudaMemsetAsync(b->get(), 0, b->bytes(), s), "parameter buffers");
}

const GpuParam& GpuParams::at(const std::string& n) const {
  auto it = index_.find(n);
  TESSEL_CHECK(it != index_.end(), "parameter " << n << " is not on this rank");
  return params_[it->second];
}

const __nv_bfloat16* GpuParams::half(const std::string& n) const {
  return static_cast<const __nv_bfloat16*>(half_->get()) + at(n).offset;
}

void GpuParams::upload(const ParamStore& host) {
  for (const GpuParam& p : params_) {
    const Param& h = host.at(p.spec.name);
    TESSEL_CHECK(h.size() == p.size(), "shard of " << p.spec.name << ": host " << h.size() << ", device " << p.size());
    cuda_ok(cudaMemcpyAsync(f32(data_) + p.offset, host.data(h), p.size() * sizeof(float), cudaMemcpyHostToDevice,
                            dev_.compute()),
            "parameter upload");
  }
  refresh_half(dev_.compute());
  cuda_ok(cudaStreamSynchronize(dev_.compute()), "parameter upload");
}

void GpuParams::synthesise(std::uint64_t seed) {
  for (const GpuParam& p : params_) {
    float* d = f32(data_) + p.offset;
    if (p.spec.init == InitKind::ones) throw_if_failed(kg::fill(dev_.compute(), d, p.size(), 1.0f));
    else if (p.spec.init == InitKind::uniform)  // uniform in [-a, a) has std a / sqrt(3)
      throw_if_failed(kg::fill_uniform(dev_.compute(), d, p.size(), seed + p.offset,
                                       static_cast<float>(p.spec.stddev * std::sqrt(3.0))));
  }
  refresh_half(dev_.compute());
}

void GpuParams::zero_grad(cudaStream_t s) { cuda_ok(cudaMemsetAsync(grad_->get(), 0, grad_->bytes(), s), "zero_grad"); }

void GpuParams::refresh_half(cudaStream_t s) {
  throw_if_failed(kg::to_bf16(s, f32(data_), static_cast<__nv_bfloat16*>(half_->get()), total_));
}

double GpuParams::local_grad_sq(cudaStream_t s, const std::function<bool(const GpuParam&)>& counted) {
  auto* acc = static_cast<double*>(scratch_->get());
  cuda_ok(cudaMemsetAsync(acc, 0, sizeof(double), s), "grad norm");
  const std::size_t z0 = shard_begin(), z1 = z0 + shard_;
  for (const GpuParam& p : params_) {
    if (!counted(p)) continue;
    if (!sharded()) {
      throw_if_failed(kg::sum_squares(s, f32(grad_) + p.offset, p.size(), acc));
      continue;
    }
    const std::size_t a = std::max(p.offset, z0), b = std::min(p.offset + p.size(), z1);
    if (a < b) throw_if_failed(kg::sum_squares(s, f32(shard_grad_) + (a - z0), b - a, acc));
  }
  double out = 0;
  cuda_ok(cudaMemcpyAsync(&out, acc, sizeof(double), cudaMemcpyDeviceToHost, s), "grad norm");
  cuda_ok(cudaStreamSynchronize(s), "grad norm");
  return out;
}

// The clip coefficient scales each gradient as AdamW reads it (the gradient buffer keeps the unclipped
// values), and the unsharded step writes the GEMMs' bf16 parameter copy in the same pass: one read of
// every parameter, gradient and moment per step. ZeRO-1 refreshes the copy after its all-gather.
void GpuParams::adamw(cudaStream_t s, const kernels::cpu::AdamW& hp, int step, double clip_coef) {
  const float coef = clip_coef < 1.0 ? static_cast<float>(clip_coef) : 1.0f;
  if (!sharded()) {
    auto* half = static_cast<__nv_bfloat16*>(half_->get());
    for (const GpuParam& p : params_) {
      kernels::cpu::AdamW h = hp;
      if (!p.spec.decay) h.weight_decay = 0.0f;  // matrices only, as the CPU optimizer
      throw_if_failed(kg::adamw_step(s, f32(data_) + p.offset, f32(grad_) + p.offset, f32(m_) + p.offset,
                                     f32(v_) + p.offset, p.size(), h, step, coef, half + p.offset));
    }
    return;
  }
  const std::size_t z0 = shard_begin(), z1 = z0 + shard_;
  for (const GpuParam& p : params_) {  // each parameter's part inside the shard
    const std::size_t a = std::max(p.offset, z0), b = std::min(p.offset + p.size(), z1);
    if (a >= b) continue;
    kernels::cpu::AdamW h = hp;
    if (!p.spec.decay) h.weight_decay = 0.0f;
    throw_if_failed(kg::adamw_step(s, f32(data_) + a, f32(shard_grad_) + (a - z0), f32(m_) + (a - z0),
                                   f32(v_) + (a - z0), b - a, h, step, coef));
  }
}

std::vector<float> GpuParams::download_grad(const std::string& n) {
  const GpuParam& p = at(n);
  std::vector<float> h(p.size());
  copy_sync(h.data(), f32(grad_) + p.offset, h.size() * sizeof(float), cudaMemcpyDeviceToHost, dev_.compute(), "download");
  return h;
}

void GpuParams::download_state(const std::string& n, std::vector<float>& data, std::vector<float>& exp_avg,
                               std::vector<float>& exp_avg_sq) {
  const GpuParam& p = at(n);
  cuda_ok(cudaStreamSynchronize(dev_.compute()), "checkpoint download");
  for (auto [buf, out] : {std::pair{f32(data_), &data}, std::pair{m_all(), &exp_avg}, std::pair{v_all(), &exp_avg_sq}}) {
    TESSEL_CHECK(buf != f32(m_) || !sharded(), "sharded moments: gather_moments() first");
    out->resize(p.size());
    copy_sync(out->data(), buf + p.offset, p.size() * sizeof(float), cudaMemcpyDeviceToHost, dev_.compute(),
              "checkpoint download");
  }
}

void GpuParams::upload_state(const std::string& n, const std::vector<float>& data, const std::vector<float>& exp_avg,
                             const std::vector<float>& exp_avg_sq) {
  const GpuParam& p = at(n);
  cuda_ok(cudaStreamSynchronize(dev_.compute()), "checkpoint upload");
  for (auto [buf, in] : {std::pair{f32(data_), &data}, std::pair{m_all(), &exp_avg}, std::pair{v_all(), &exp_avg_sq}}) {
    TESSEL_CHECK(buf != f32(m_) || !sharded(), "sharded moments: load_moments_begin() first");
    TESSEL_CHECK(in->size() == p.size(), "checkpoint upload of " << n << ": " << in->size() << " values for " << p.size());
    copy_sync(buf + p.offset, in->data(), p.size() * sizeof(float), cudaMemcpyHostToDevice, dev_.compute(),
              "checkpoint upload");
  }
}

void GpuParams::gather_moments(Comm& dp) {
  if (!sharded()) return;
  m_full_ = dev_.alloc_f32(padded_);
  v_full_ = dev_.alloc_f32(padded_);
  cuda_ok(cudaStreamSynchronize(dev_.compute()), "gather moments");
  dp.all_gather(f32(m_), f32(m_full_), shard_);
  dp.all_gather(f32(v_), f32(v_full_), shard_);
  dp.barrier();  // NCCL: the gathers are on the comm stream; the downloads that follow read their output
}

void GpuParams::release_moments() {
  m_full_.reset();
  v_full_.reset();
}

void GpuParams::load_moments_begin() {
  if (!sharded()) return;
  m_full_ = dev_.alloc_f32(padded_);
  v_full_ = dev_.alloc_f32(padded_);
  for (const DBuf& b : {m_full_, v_full_}) cuda_ok(cudaMemsetAsync(b->get(), 0, b->bytes(), dev_.compute()), "load moments");
  cuda_ok(cudaStreamSynchronize(dev_.compute()), "load moments");
}

void GpuParams::load_moments_end() {
  if (!sharded()) return;
  const std::size_t bytes = shard_ * sizeof(float);
  copy_sync(f32(m_), f32(m_full_) + shard_begin(), bytes, cudaMemcpyDeviceToDevice, dev_.compute(), "load moments");
  copy_sync(f32(v_), f32(v_full_) + shard_begin(), bytes, cudaMemcpyDeviceToDevice, dev_.compute(), "load moments");
  release_moments();
}

}  // namespace tessel::rt::cuda
