// One rank's GPT parameters on the GPU: the same names, shards and order as runtime/params.hpp's
// ParamStore, in flat device buffers (fp32 master data and gradients, AdamW moments, and a bf16 shadow of
// the data that the mixed-precision GEMMs read, refreshed after every optimizer step).
//
// ZeRO-1 (Megatron's distributed optimizer): with zero_dp > 1 the flat buffers are padded to zero_dp equal
// shards, and this rank keeps AdamW moments for its shard only; the trainer reduce-scatters the gradients
// into shard_grad(), steps the shard, and all-gathers the updated values. Elementwise, so the same update
// as unsharded AdamW; only the gradient norm's summation order differs.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kernels/cpu/optimizer.hpp"
#include "runtime/cuda/device.hpp"
#include "runtime/comm/comm.hpp"
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
  GpuParams(CudaDevice& dev, const Model& m, const std::vector<std::string>& names, int tp, int tp_rank,
            int zero_dp = 1, int zero_rank = 0);

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
  std::size_t count() const { return total_; }     // elements of the flat buffers in use (padding excluded)
  std::size_t padded() const { return padded_; }   // zero_dp * shard_size()
  float* flat_grad() { return f32(grad_); }
  float* flat_data() { return f32(data_); }
  bool sharded() const { return zero_dp_ > 1; }
  std::size_t shard_size() const { return shard_; }
  std::size_t shard_begin() const { return shard_ * std::size_t(zero_rank_); }
  float* shard_grad() { return f32(shard_grad_); }

  void zero_grad(cudaStream_t s);
  void refresh_half(cudaStream_t s);
  // Clipping by `clip_coef` then AdamW (kernels/cpu/optimizer.hpp's contract), on every parameter (the bf16
  // copy written in the same pass) or, when sharded, on this rank's shard of the flat buffer (gradients
  // from shard_grad(); the caller all-gathers the values afterwards, then calls refresh_half). The clip is
  // applied as the gradients are read: the gradient buffers keep the unclipped gradient.
  void adamw(cudaStream_t s, const kernels::cpu::AdamW& hp, int step, double clip_coef);
  // Device sum of squares of the gradients of the parameters `counted` accepts (the caller's rule: each
  // tensor counted once in the world); when sharded, of the parts inside this rank's shard.
  double local_grad_sq(cudaStream_t s, const std::function<bool(const GpuParam&)>& counted);
  // Host copy of one parameter's gradient (the numerics test).
  std::vector<float> download_grad(const std::string& n);
  // Recovery checkpoints: one parameter's value and AdamW moments to and from the host (synchronous). When
  // sharded, the moments of the whole buffer are assembled first (gather_moments, collective over the dp
  // group) and released after (release_moments); loading writes them whole and keeps this rank's shard
  // (load_moments_begin / load_moments_end).
  void download_state(const std::string& n, std::vector<float>& data, std::vector<float>& exp_avg,
                      std::vector<float>& exp_avg_sq);
  void upload_state(const std::string& n, const std::vector<float>& data, const std::vector<float>& exp_avg,
                    const std::vector<float>& exp_avg_sq);  // then refresh_half() once after the last
  void gather_moments(Comm& dp);
  void release_moments();
  void load_moments_begin();
  void load_moments_end();

 private:
  CudaDevice& dev_;
  std::vector<GpuParam> params_;
  std::map<std::string, std::size_t> index_;
  std::size_t total_ = 0, padded_ = 0, shard_ = 0;
  int zero_dp_ = 1, zero_rank_ = 0;
  DBuf data_, grad_, m_, v_, half_, scratch_, shard_grad_;
  DBuf m_full_, v_full_;  // whole-buffer moments while a sharded checkpoint is written or read
  float* m_all() { return m_full_ ? f32(m_full_) : f32(m_); }  // moments indexed by flat offset
  float* v_all() { return v_full_ ? f32(v_full_) : f32(v_); }
};

}  // namespace tessel::rt::cuda
