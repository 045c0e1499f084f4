#include "runtime/cuda/gpu_params.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/kernels.hpp"
#include "models/util/error.hpp"

namespace tessel::rt::cuda {

namespace kg = kernels::cuda;

namespace {
void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw kg::DeviceError(std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace

GpuParams::GpuParams(CudaDevice& dev, const Model& m, const std::vector<std::string>& names, int tp, int tp_rank)
    : dev_(dev) {
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
  data_ = dev.alloc_f32(total_);
  grad_ = dev.alloc_f32(total_);
  m_ = dev.alloc_f32(total_);
  v_ = dev.alloc_f32(total_);
  half_ = dev.alloc(total_ * sizeof(__nv_bfloat16));
  scratch_ = dev.alloc(sizeof(double));
  const cudaStream_t s = dev.compute();
  for (const DBuf& b : {data_, grad_, m_, v_}) cuda_ok(cudaMemsetAsync(b->get(), 0, b->bytes(), s), "parameter buffers");
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

double GpuParams::local_grad_sq(cudaStream_t s, bool count_replicated) {
  auto* acc = static_cast<double*>(scratch_->get());
  cuda_ok(cudaMemsetAsync(acc, 0, sizeof(double), s), "grad norm");
  for (const GpuParam& p : params_)
    if (p.spec.shard_dim >= 0 || count_replicated) throw_if_failed(kg::sum_squares(s, f32(grad_) + p.offset, p.size(), acc));
  double out = 0;
  cuda_ok(cudaMemcpyAsync(&out, acc, sizeof(double), cudaMemcpyDeviceToHost, s), "grad norm");
  cuda_ok(cudaStreamSynchronize(s), "grad norm");
  return out;
}

void GpuParams::adamw(cudaStream_t s, const kernels::cpu::AdamW& hp, int step, double clip_coef) {
  if (clip_coef < 1.0) throw_if_failed(kg::scale(s, f32(grad_), total_, static_cast<float>(clip_coef)));
  for (const GpuParam& p : params_) {
    kernels::cpu::AdamW h = hp;
    if (!p.spec.decay) h.weight_decay = 0.0f;  // matrices only, as the CPU optimizer
    throw_if_failed(kg::adamw_step(s, f32(data_) + p.offset, f32(grad_) + p.offset, f32(m_) + p.offset,
                                   f32(v_) + p.offset, p.size(), h, step));
  }
  refresh_half(s);
}

std::vector<float> GpuParams::download_grad(const std::string& n) {
  const GpuParam& p = at(n);
  std::vector<float> h(p.size());
  cuda_ok(cudaStreamSynchronize(dev_.compute()), "download");
  cuda_ok(cudaMemcpy(h.data(), f32(grad_) + p.offset, h.size() * sizeof(float), cudaMemcpyDeviceToHost), "download");
  return h;
}

}  // namespace tessel::rt::cuda
