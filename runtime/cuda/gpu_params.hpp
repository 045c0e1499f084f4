// One rank's GPT parameters on the GPU: the same names, shards and order as runtime/params.hpp's
// ParamStore, in flat device buffers (fp32 master data and gradients, AdamW moments, and a bf16 shadow of
// the data that the mixed-precision GEMMs read, refreshed after every optimizer step).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/cpu/optimizer.hpp"
#include "runtime/cuda/device.hpp"
#include "runtime/params.hpp"

namespace tessel::rt::cuda {

struct GpuParam {
  ParamSpec spec;
  std::int64_t rows = 1, cols = 1, row0 = 0, col0 = 0;  // local shard, as ParamStore shards
  std::size_t offset = 0;
  std::size_t size() const { return static_cast<std::size_t>(rows * cols); }
};

class GpuParams {
 public:
  GpuParams(CudaDevice& dev, const Model& m, const std::vector<std::string>& names, int tp, int tp_rank);

  // The CPU runtime's seeded initialisation, copied up: the GPU starts from the CPU reference's weights.
  void upload(const ParamStore& host);
  // Synthesised weights (--only-rank): a hash-uniform fill of the right scale on the device.
  void synthesise(std::uint64_t seed);

  bool has(const std::string& n) const { return index_.count(n) > 0; }
  const GpuParam& at(const std::string& n) const;
  float* data(const std::string& n) { return f32(data_) + at(n).offset; }
  float* grad(const std::string& n) { return f32(grad_) + at(n).offset; }
  const __nv_bfloat16* half(const std::string& n) const;
  const std::vector<GpuParam>& params() const { return params_; }
  std::size_t count() const { return total_; }
  float* flat_grad() { return f32(grad_); }

  void zero_grad(cudaStream_t s);
  void refresh_half(cudaStream_t s);
  // Global-norm clipping then AdamW (kernels/cpu/optimizer.hpp's contract). `norm_sq` is the reduced sum
  // of squares of every rank's gradients (the caller reduces across ranks).
  void adamw(cudaStream_t s, const kernels::cpu::AdamW& hp, int step, double clip_coef);
  // Device sum of squares of this rank's gradients, counting tp-replicated parameters on tp rank 0 only.
  double local_grad_sq(cudaStream_t s, bool count_replicated);
  // Host copy of one parameter's gradient (the numerics test).
  std::vector<float> download_grad(const std::string& n);

 private:
  CudaDevice& dev_;
  std::vector<GpuParam> params_;
  std::map<std::string, std::size_t> index_;
  std::size_t total_ = 0;
  DBuf data_, grad_, m_, v_, half_, scratch_;
};

}  // namespace tessel::rt::cuda
