#include "runtime/cuda/gpu_params.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/kernels.hpp"
#include "util/error.hpp"
#include "runtime/zero_partition.hpp"

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
                     int zero_dp, int zero_rank, int zero_stage, bool bf16_gemms, bool first_stage)
    : dev_(dev), zero_dp_(zero_dp), zero_rank_(zero_rank), zero_stage_(zero_stage), bf16_gemms_(bf16_gemms),
      first_stage_(first_stage) {
  TESSEL_CHECK(zero_dp >= 1 && zero_rank >= 0 && zero_rank < zero_dp, "ZeRO rank " << zero_rank << " of " << zero_dp);
  TESSEL_CHECK(zero_stage >= 0 && zero_stage <= 3, "ZeRO stage " << zero_stage);
  const std::size_t dp = std::size_t(zero_dp);
  const auto aligned = [](std::size_t n) { return (n + 63) / 64 * 64; };  // 256-byte starts: bf16 GEMM operands need 16 bytes
  // The rank's parameters in spec order, each with its group (the groups are contiguous runs of the specs).
  std::vector<std::string> group_of;
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
    const std::string g = zero_group_of(s.name);
    if (!group_of.empty() && group_of.back() != g)
      for (const std::string& seen : group_of)
        TESSEL_CHECK(seen != g, "parameter " << s.name << " is not contiguous with its ZeRO group " << g);
    group_of.push_back(g);
    index_[s.name] = params_.size();
    params_.push_back(p);
  }
  // The flat layout, group by group; inside a group the parameters kernels read in fp32 come first (the
  // others after, each in spec order), so a group's fp32 values are one run at its start: in dp rank 0's
  // chunk when they fit there, which lets ZeRO-1/2 broadcast them instead of gathering the group in fp32
  // (values_in_bf16). The fp32 store (small_) repeats that run group by group, padding included.
  for (std::size_t i = 0; i < params_.size();) {
    std::size_t j = i;
    while (j < params_.size() && group_of[j] == group_of[i]) ++j;
    GpuZeroGroup g{group_of[i], total_, total_, 0, 0};
    g.small_begin = small_size_;
    for (const bool fp32 : {true, false})
      for (std::size_t k = i; k < j; ++k) {
        GpuParam& p = params_[k];
        if (reads_fp32(p.spec) != fp32) continue;
        p.offset = total_;
        if (fp32) p.small = small_size_ + (p.offset - g.begin);
        total_ += aligned(p.size());
        if (fp32) g.fp32_span = total_ - g.begin;
      }
    small_size_ += g.fp32_span;
    g.end = total_;
    if (sharded()) {  // ZeRO: a group ends at a multiple of zero_dp 64-element chunks, so its chunks are even and aligned
      g.chunk = aligned((g.end - g.begin + dp - 1) / dp);
      total_ = g.begin + g.chunk * dp;
      for (std::size_t k = i; k < j; ++k) params_[k].group = groups_.size();
      groups_.push_back(g);
    } else {  // buckets: the groups' spans
      g.chunk = g.end - g.begin;
      buckets_.push_back(g);
    }
    i = j;
  }
  padded_ = total_;
  for (GpuZeroGroup& g : groups_) {
    g.local = shard_;
    shard_ += g.chunk;
  }
  group_grad_.resize(groups_.size());
  group_data_.resize(groups_.size());
  group_half_.resize(groups_.size());
  std::vector<DBuf> all;
  if (!sharded_values()) {
    data_ = dev.alloc_f32(padded_);
    all.push_back(data_);
  } else {
    shard_data_ = dev.alloc_f32(shard_);
    all.push_back(shard_data_);
  }
  if (this->zero_stage() < 3) {  // zeroed: the padding between parameters is gathered too
    half_ = dev.alloc(padded_ * sizeof(__nv_bfloat16));
    cuda_ok(cudaMemsetAsync(half_->get(), 0, half_->bytes(), dev.compute()), "parameter buffers");
  }
  if (sharded_values() && this->zero_stage() < 3 && small_size_ > 0) {
    small_ = dev.alloc_f32(small_size_);
    all.push_back(small_);
  }
  if (!grouped()) {
    grad_ = dev.alloc_f32(padded_);
    all.push_back(grad_);
  }
  const std::size_t moments = sharded() ? shard_ : padded_;
  m_ = dev.alloc_f32(moments);
  v_ = dev.alloc_f32(moments);
  all.push_back(m_);
  all.push_back(v_);
  scratch_ = dev.alloc(sizeof(double));
  if (sharded()) {
    shard_grad_ = dev.alloc_f32(shard_);
    all.push_back(shard_grad_);
  }
  const cudaStream_t s = dev.compute();
  for (const DBuf& b : all) cuda_ok(cudaMemsetAsync(b->get(), 0, b->bytes(), s), "parameter buffers");
}

template <class F>
void GpuParams::for_owned(F&& f) const {
  for (const GpuParam& p : params_) {
    const GpuZeroGroup& g = groups_.at(p.group);
    const std::size_t own0 = g.begin + g.chunk * std::size_t(zero_rank_), own1 = own0 + g.chunk;
    const std::size_t a = std::max(p.offset, own0), b = std::min(p.offset + p.size(), own1);
    if (a < b) f(p, a, b, g.local + (a - own0));
  }
}

namespace {
std::vector<std::size_t> named(const std::vector<GpuZeroGroup>& groups, const std::vector<std::string>& want) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < groups.size(); ++i)
    if (std::find(want.begin(), want.end(), groups[i].name) != want.end()) out.push_back(i);
  return out;
}
std::size_t index_of(const std::vector<GpuZeroGroup>& groups, const std::string& name) {
  for (std::size_t i = 0; i < groups.size(); ++i)
    if (groups[i].name == name) return i;
  return groups.size();
}
}  // namespace

std::vector<std::size_t> GpuParams::stage_groups(int l0, int l1, bool first, bool last) const {
  return named(groups_, zero_stage_group_names(l0, l1, first, last, !has("head.w")));
}

std::vector<std::size_t> GpuParams::stage_buckets(int l0, int l1, bool first, bool last) const {
  return named(buckets(), zero_stage_group_names(l0, l1, first, last, !has("head.w")));
}

std::size_t GpuParams::bucket_index(const std::string& name) const { return index_of(buckets(), name); }

GpuParams::StateBytes GpuParams::state_bytes() const {
  const auto b = [](const DBuf& d) { return d ? d->bytes() : std::size_t(0); };
  return {b(data_) + b(half_) + b(shard_data_) + b(small_), b(grad_) + b(shard_grad_), b(m_) + b(v_)};
}

std::size_t GpuParams::zero_grad_bytes() const { return (grouped() ? shard_grad_ : grad_)->bytes(); }

std::size_t GpuParams::stepped_elements() const {
  std::size_t n = 0;
  if (!sharded())
    for (const GpuParam& p : params_) n += p.size();
  else
    for_owned([&](const GpuParam&, std::size_t a, std::size_t b, std::size_t) { n += b - a; });
  return n;
}

std::size_t GpuParams::group_index(const std::string& name) const { return index_of(groups_, name); }

bool GpuParams::begin_group_grad(std::size_t g, cudaStream_t s) {
  TESSEL_CHECK(grouped(), "per-group gradients need ZeRO-2/3");
  DBuf& b = group_grad_.at(g);
  if (b) return false;
  b = dev_.alloc_f32(groups_[g].chunk * std::size_t(zero_dp_));
  cuda_ok(cudaMemsetAsync(b->get(), 0, b->bytes(), s), "group gradient");
  max_live_ = std::max(max_live_, ++live_);
  return true;
}

DBuf GpuParams::take_group_grad(std::size_t g) {
  TESSEL_CHECK(group_grad_.at(g), "ZeRO group " << groups_[g].name << ": no live gradient to reduce");
  return std::move(group_grad_[g]);
}

void GpuParams::prepare_gather(std::size_t gi, cudaStream_t s) {
  TESSEL_CHECK(zero_stage() == 3, "gathering a parameter group needs ZeRO-3");
  TESSEL_CHECK(!gathered(gi), "ZeRO group " << groups_.at(gi).name << " is gathered already");
  const GpuZeroGroup& g = groups_[gi];
  const std::size_t span = g.chunk * std::size_t(zero_dp_);
  group_half_[gi] = dev_.alloc(span * sizeof(__nv_bfloat16));
  if (!values_in_bf16(gi)) {
    group_data_[gi] = dev_.alloc_f32(span);
    return;
  }
  if (g.fp32_span > 0) group_data_[gi] = dev_.alloc_f32(g.fp32_span);
  auto* mine = static_cast<__nv_bfloat16*>(group_half_[gi]->get()) + g.chunk * std::size_t(zero_rank_);
  throw_if_failed(kg::to_bf16(s, f32(shard_data_) + g.local, mine, g.chunk));
}

void GpuParams::gather(std::size_t gi, Comm& dp, cudaStream_t s) {
  TESSEL_CHECK(gathered(gi), "ZeRO group " << groups_.at(gi).name << ": gather before prepare_gather");
  const GpuZeroGroup& g = groups_[gi];
  if (!values_in_bf16(gi)) {
    dp.all_gather(f32(shard_data_) + g.local, f32(group_data_[gi]), g.chunk);
    return;
  }
  exchange_bf16(g, dp, s, static_cast<__nv_bfloat16*>(group_half_[gi]->get()),
                g.fp32_span > 0 ? f32(group_data_[gi]) : nullptr);
}

// bf16 pairs travel as 32-bit words: an all-gather copies bits. The group and its chunks start at multiples
// of 64 elements, so the words are aligned and the counts even. Rank 0's chunk starts with the group's fp32
// run (values_in_bf16), which it copies into `run` and broadcasts.
void GpuParams::exchange_bf16(const GpuZeroGroup& g, Comm& dp, cudaStream_t s, __nv_bfloat16* half, float* run) {
  dp.all_gather(reinterpret_cast<const float*>(half + g.chunk * std::size_t(zero_rank_)), reinterpret_cast<float*>(half),
                g.chunk / 2);
  if (g.fp32_span == 0) return;
  if (zero_rank_ == 0)
    cuda_ok(cudaMemcpyAsync(run, f32(shard_data_) + g.local, g.fp32_span * sizeof(float), cudaMemcpyDeviceToDevice, s),
            "parameter values");
  dp.broadcast(run, g.fp32_span, 0);
}

void GpuParams::finish_gather(std::size_t g, cudaStream_t s) {
  if (values_in_bf16(g)) return;  // the gather wrote the copy itself
  const std::size_t n = groups_[g].chunk * std::size_t(zero_dp_);
  throw_if_failed(kg::to_bf16(s, f32(group_data_.at(g)), static_cast<__nv_bfloat16*>(group_half_[g]->get()), n));
}

void GpuParams::release_group(std::size_t g) {
#ifdef TESSEL_FAKE_CUDA
  // The fake CUDA runs work at issue and its allocator hands blocks out again with their contents: NaN in
  // what a released group held, so a pointer kept past its window reads NaN, as after the CPU's release.
  for (const DBuf& b : {group_data_.at(g), group_half_.at(g)})
    if (b) cuda_ok(cudaMemsetAsync(b->get(), 0xFF, b->bytes(), dev_.compute()), "released group");
#endif
  group_data_.at(g).reset();
  group_half_.at(g).reset();
}

void GpuParams::synthesise_values(std::size_t gi, float* values, std::uint64_t seed, cudaStream_t s) {
  const GpuZeroGroup& g = groups_.at(gi);
  cuda_ok(cudaMemsetAsync(values, 0, g.chunk * std::size_t(zero_dp_) * sizeof(float), s), "synthesised group");
  synthesise_into(values - g.begin, g.begin, g.end, seed, s);
}

void GpuParams::synthesise_group(std::size_t gi, std::uint64_t seed, cudaStream_t s) {
  TESSEL_CHECK(zero_stage() == 3 && !gathered(gi), "synthesise_group: ZeRO-3, a group not gathered");
  const GpuZeroGroup& g = groups_[gi];
  const std::size_t span = g.chunk * std::size_t(zero_dp_);
  group_half_[gi] = dev_.alloc(span * sizeof(__nv_bfloat16));
  const bool bf16 = values_in_bf16(gi);
  DBuf whole = dev_.alloc_f32(span);
  synthesise_values(gi, f32(whole), seed, s);
  throw_if_failed(kg::to_bf16(s, f32(whole), static_cast<__nv_bfloat16*>(group_half_[gi]->get()), span));
  if (!bf16) {
    group_data_[gi] = whole;
  } else if (g.fp32_span > 0) {
    group_data_[gi] = dev_.alloc_f32(g.fp32_span);
    cuda_ok(cudaMemcpyAsync(f32(group_data_[gi]), f32(whole), g.fp32_span * sizeof(float), cudaMemcpyDeviceToDevice, s),
            "synthesised group");
  }
}

const GpuParam& GpuParams::at(const std::string& n) const {
  auto it = index_.find(n);
  TESSEL_CHECK(it != index_.end(), "parameter " << n << " is not on this rank");
  return params_[it->second];
}

float* GpuParams::data(const std::string& n) {
  const GpuParam& p = at(n);
  if (!sharded_values()) return f32(data_) + p.offset;
  if (zero_stage() < 3) {
    TESSEL_CHECK(reads_fp32(p.spec), "ZeRO-" << zero_stage() << " with bf16 GEMMs keeps " << n
                                             << "'s fp32 values sharded: read its bf16 copy (half)");
    return f32(small_) + p.small;
  }
  const DBuf& b = group_data_[p.group];
  TESSEL_CHECK(b, "ZeRO-3: parameter " << n << " read outside its group's gather (" << groups_[p.group].name << ")");
  const std::size_t at = p.offset - groups_[p.group].begin;
  TESSEL_CHECK((at + p.size()) * sizeof(float) <= b->bytes(),
               "ZeRO-3 with bf16 GEMMs gathers only the fp32 values kernels read: read " << n << "'s bf16 copy (half)");
  return f32(b) + at;
}

const __nv_bfloat16* GpuParams::half(const std::string& n) const {
  const GpuParam& p = at(n);
  if (zero_stage() < 3) return static_cast<const __nv_bfloat16*>(half_->get()) + p.offset;
  const DBuf& b = group_half_[p.group];
  TESSEL_CHECK(b, "ZeRO-3: parameter " << n << " read outside its group's gather (" << groups_[p.group].name << ")");
  return static_cast<const __nv_bfloat16*>(b->get()) + (p.offset - groups_[p.group].begin);
}

float* GpuParams::grad(const std::string& n) {
  const GpuParam& p = at(n);
  if (!grouped()) return f32(grad_) + p.offset;
  const DBuf& b = group_grad_[p.group];
  TESSEL_CHECK(b, "ZeRO-" << zero_stage() << ": gradient of " << n << " used outside its group's backward window ("
                          << groups_[p.group].name << ")");
  return f32(b) + (p.offset - groups_[p.group].begin);
}

float* GpuParams::flat_grad() {
  TESSEL_CHECK(!grouped(), "ZeRO-" << zero_stage() << " keeps no whole gradient buffer");
  return f32(grad_);
}

float* GpuParams::flat_data() {
  TESSEL_CHECK(!sharded_values(), "ZeRO-" << zero_stage() << " keeps no whole fp32 parameter buffer here");
  return f32(data_);
}

void GpuParams::synthesise_into(float* base, std::size_t begin, std::size_t end, std::uint64_t seed, cudaStream_t s) {
  for (const GpuParam& p : params_) {
    if (p.offset < begin || p.offset >= end) continue;
    float* d = base + p.offset;
    if (p.spec.init == InitKind::ones) throw_if_failed(kg::fill(s, d, p.size(), 1.0f));
    else if (p.spec.init == InitKind::uniform)  // uniform in [-a, a) has std a / sqrt(3)
      throw_if_failed(kg::fill_uniform(s, d, p.size(), seed + p.offset, static_cast<float>(p.spec.stddev * std::sqrt(3.0))));
  }
}

// ZeRO-3 holds no whole buffer: each parameter passes through a buffer of its own size, and this rank keeps
// its runs of it.
void GpuParams::upload(const ParamStore& host) {
  const cudaStream_t s = dev_.compute();
  for (const GpuParam& p : params_) {
    const Param& h = host.at(p.spec.name);
    TESSEL_CHECK(h.size() == p.size(), "shard of " << p.spec.name << ": host " << h.size() << ", device " << p.size());
    const std::size_t bytes = p.size() * sizeof(float);
    if (!sharded_values()) {
      cuda_ok(cudaMemcpyAsync(f32(data_) + p.offset, host.data(h), bytes, cudaMemcpyHostToDevice, s), "parameter upload");
      continue;
    }
    DBuf one = dev_.alloc_f32(p.size());
    copy_sync(f32(one), host.data(h), bytes, cudaMemcpyHostToDevice, s, "parameter upload");
    keep_owned(p, f32(one), s);
  }
  refresh_half(s);
  cuda_ok(cudaStreamSynchronize(s), "parameter upload");
  if (sharded_values()) dev_.memory().empty_cache();  // the staging blocks are not kept for the step
}

void GpuParams::synthesise(std::uint64_t seed) {
  const cudaStream_t s = dev_.compute();
  for (const GpuParam& p : params_) {
    if (!sharded_values()) {
      synthesise_into(f32(data_), p.offset, p.offset + 1, seed, s);
      continue;
    }
    DBuf one = dev_.alloc_f32(p.size());
    cuda_ok(cudaMemsetAsync(one->get(), 0, one->bytes(), s), "synthesised parameters");  // zero-initialised ones
    synthesise_into(f32(one) - p.offset, p.offset, p.offset + 1, seed, s);
    keep_owned(p, f32(one), s);
  }
  refresh_half(s);
  cuda_ok(cudaStreamSynchronize(s), "synthesised parameters");
  if (sharded_values()) dev_.memory().empty_cache();
}

// Sharded values: this rank's runs of parameter p, whose whole values are at `values`, into the shard;
// below ZeRO-3 also its whole bf16 copy and, for what kernels read in fp32, its fp32 store.
void GpuParams::keep_owned(const GpuParam& p, const float* values, cudaStream_t s) {
  const GpuZeroGroup& g = groups_[p.group];
  const std::size_t own0 = g.begin + g.chunk * std::size_t(zero_rank_), own1 = own0 + g.chunk;
  const std::size_t a = std::max(p.offset, own0), b = std::min(p.offset + p.size(), own1);
  if (a < b)
    copy_sync(f32(shard_data_) + g.local + (a - own0), values + (a - p.offset), (b - a) * sizeof(float),
              cudaMemcpyDeviceToDevice, s, "parameter shard");
  if (zero_stage() == 3) return;
  throw_if_failed(kg::to_bf16(s, values, static_cast<__nv_bfloat16*>(half_->get()) + p.offset, p.size()));
  if (reads_fp32(p.spec))
    copy_sync(f32(small_) + p.small, values, p.size() * sizeof(float), cudaMemcpyDeviceToDevice, s, "parameter values");
  cuda_ok(cudaStreamSynchronize(s), "parameter values");  // `values` may go when this returns
}

void GpuParams::gather_values(std::size_t gi, const float* values, cudaStream_t s) {
  TESSEL_CHECK(sharded_values() && zero_stage() < 3, "gather_values: only ZeRO-1/2 with sharded values");
  const GpuZeroGroup& g = groups_.at(gi);
  throw_if_failed(kg::to_bf16(s, values, static_cast<__nv_bfloat16*>(half_->get()) + g.begin, g.chunk * std::size_t(zero_dp_)));
  for (const GpuParam& p : params_)
    if (p.group == gi && reads_fp32(p.spec))
      cuda_ok(cudaMemcpyAsync(f32(small_) + p.small, values + (p.offset - g.begin), p.size() * sizeof(float),
                              cudaMemcpyDeviceToDevice, s),
              "parameter values");
}

void GpuParams::exchange_values_bf16(std::size_t gi, Comm& dp, cudaStream_t s) {
  TESSEL_CHECK(zero_stage() < 3 && values_in_bf16(gi), "ZeRO group " << groups_.at(gi).name << " is not exchanged in bf16");
  const GpuZeroGroup& g = groups_[gi];
  exchange_bf16(g, dp, s, static_cast<__nv_bfloat16*>(half_->get()) + g.begin,
                g.fp32_span > 0 ? f32(small_) + g.small_begin : nullptr);
}

double GpuParams::exchange_bytes(std::size_t gi) const {
  const GpuZeroGroup& g = groups_.at(gi);
  const double span = double(g.chunk) * zero_dp_;
  return values_in_bf16(gi) ? 2.0 * span + 4.0 * double(g.fp32_span) : 4.0 * span;
}

void GpuParams::zero_grad(cudaStream_t s) {
  const DBuf& g = grouped() ? shard_grad_ : grad_;  // ZeRO-2/3: the group gradients are zeroed as they start
  cuda_ok(cudaMemsetAsync(g->get(), 0, g->bytes(), s), "zero_grad");
}

void GpuParams::refresh_half(cudaStream_t s, std::size_t gi) {
  TESSEL_CHECK(!sharded_values(), "refresh_half of a group needs the whole fp32 values");
  const GpuZeroGroup& g = groups_.at(gi);
  throw_if_failed(kg::to_bf16(s, f32(data_) + g.begin, static_cast<__nv_bfloat16*>(half_->get()) + g.begin,
                              g.chunk * std::size_t(zero_dp_)));
}

void GpuParams::refresh_half(cudaStream_t s) {
  if (sharded_values()) return;  // each gather (gather_values, or ZeRO-3's per group) makes the bf16 copy
  throw_if_failed(kg::to_bf16(s, f32(data_), static_cast<__nv_bfloat16*>(half_->get()), total_));
}

double GpuParams::local_grad_sq(cudaStream_t s, const std::function<bool(const GpuParam&)>& counted) {
  auto* acc = static_cast<double*>(scratch_->get());
  cuda_ok(cudaMemsetAsync(acc, 0, sizeof(double), s), "grad norm");
  if (!sharded()) {
    for (const GpuParam& p : params_)
      if (counted(p)) throw_if_failed(kg::sum_squares(s, f32(grad_) + p.offset, p.size(), acc));
  } else {
    for_owned([&](const GpuParam& p, std::size_t a, std::size_t b, std::size_t local) {
      if (counted(p)) throw_if_failed(kg::sum_squares(s, f32(shard_grad_) + local, b - a, acc));
    });
  }
  double out = 0;
  cuda_ok(cudaMemcpyAsync(&out, acc, sizeof(double), cudaMemcpyDeviceToHost, s), "grad norm");
  cuda_ok(cudaStreamSynchronize(s), "grad norm");
  return out;
}

// The clip coefficient scales each gradient as AdamW reads it (the gradient buffer keeps the unclipped
// values), and the unsharded step writes the GEMMs' bf16 parameter copy in the same pass: one read of
// every parameter, gradient and moment per step. ZeRO-1/2 write their chunk of the copy in the same pass
// under bf16 GEMMs (the exchange all-gathers it), or refresh it after the fp32 all-gather; ZeRO-3 steps
// its shard of the values, which the next gathers read.
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
  // ZeRO-1/2 with sharded values: each rank's chunk of the bf16 copy is written as its values are, in
  // place for the bf16 all-gather (exchange_values_bf16).
  auto* half = sharded_values() && zero_stage() < 3 ? static_cast<__nv_bfloat16*>(half_->get()) : nullptr;
  for_owned([&](const GpuParam& p, std::size_t a, std::size_t b, std::size_t local) {  // p's runs in the shard
    kernels::cpu::AdamW h = hp;
    if (!p.spec.decay) h.weight_decay = 0.0f;
    float* value = sharded_values() ? f32(shard_data_) + local : f32(data_) + a;
    throw_if_failed(kg::adamw_step(s, value, f32(shard_grad_) + local, f32(m_) + local, f32(v_) + local, b - a, h,
                                   step, coef, half ? half + a : nullptr));
  });
}

std::vector<std::pair<float*, std::size_t>> GpuParams::grad_runs(bool shard,
                                                                 const std::function<bool(const GpuParam&)>& pick) {
  std::vector<std::pair<float*, std::size_t>> runs;
  if (!shard) {
    for (const GpuParam& p : params_)
      if (pick(p)) runs.emplace_back(grad(p.spec.name), p.size());
    return runs;
  }
  TESSEL_CHECK(sharded(), "gradient shard runs without ZeRO");
  for_owned([&](const GpuParam& p, std::size_t a, std::size_t b, std::size_t local) {
    if (pick(p)) runs.emplace_back(f32(shard_grad_) + local, b - a);
  });
  return runs;
}

std::vector<float> GpuParams::download_grad(const std::string& n) {
  const GpuParam& p = at(n);
  std::vector<float> h(p.size());
  copy_sync(h.data(), grad(n), h.size() * sizeof(float), cudaMemcpyDeviceToHost, dev_.compute(), "download");
  return h;
}

std::vector<float> GpuParams::download_values(const std::string& n) {
  std::vector<float> h(at(n).size());
  copy_sync(h.data(), data(n), h.size() * sizeof(float), cudaMemcpyDeviceToHost, dev_.compute(), "download");
  return h;
}

void GpuParams::set_values(const std::string& n, const std::vector<float>& values, cudaStream_t s) {
  const GpuParam& p = at(n);
  TESSEL_CHECK(values.size() == p.size(), n << ": " << values.size() << " values for " << p.size() << " elements");
  TESSEL_CHECK(zero_stage() < 3, n << ": ZeRO-3 keeps values only inside their group's gather");
  const std::size_t bytes = p.size() * sizeof(float);
  if (sharded_values()) {
    DBuf tmp = dev_.alloc_f32(p.size());
    copy_sync(f32(tmp), values.data(), bytes, cudaMemcpyHostToDevice, s, "parameter values");
    keep_owned(p, f32(tmp), s);
    return;
  }
  copy_sync(f32(data_) + p.offset, values.data(), bytes, cudaMemcpyHostToDevice, s, "parameter values");
  throw_if_failed(kg::to_bf16(s, f32(data_) + p.offset, static_cast<__nv_bfloat16*>(half_->get()) + p.offset, p.size()));
  cuda_ok(cudaStreamSynchronize(s), "parameter values");
}

std::vector<std::uint16_t> GpuParams::download_half(const std::string& n) const {
  std::vector<std::uint16_t> h(at(n).size());
  copy_sync(h.data(), half(n), h.size() * sizeof(std::uint16_t), cudaMemcpyDeviceToHost, dev_.compute(), "download");
  return h;
}

// Recovery checkpoints. Sharded, one group at a time through buffers of one group's size (the whole
// buffer under ZeRO-1, one group), so saving adds at most three group-sized buffers to the device's peak.
std::vector<float> GpuParams::download_shard_grad(const std::string& n) {
  TESSEL_CHECK(sharded(), "the gradient shard of " << n << " without ZeRO");
  const GpuParam& want = at(n);
  std::vector<float> h;
  for_owned([&](const GpuParam& p, std::size_t a, std::size_t b, std::size_t local) {
    if (&p != &want) return;
    const std::size_t at = h.size();
    h.resize(at + (b - a));
    copy_sync(h.data() + at, f32(shard_grad_) + local, (b - a) * sizeof(float), cudaMemcpyDeviceToHost, dev_.compute(),
              "download");
  });
  return h;
}

void GpuParams::save_states(Comm* dp, std::vector<HostParamState>& out) {
  const cudaStream_t s = dev_.compute();
  cuda_ok(cudaStreamSynchronize(s), "checkpoint download");
  out.assign(params_.size(), {});
  const auto down = [&](std::vector<float>& to, const float* from, std::size_t n) {
    to.resize(n);
    copy_sync(to.data(), from, n * sizeof(float), cudaMemcpyDeviceToHost, s, "checkpoint download");
  };
  if (!sharded()) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const GpuParam& p = params_[i];
      down(out[i].data, f32(data_) + p.offset, p.size());
      down(out[i].exp_avg, f32(m_) + p.offset, p.size());
      down(out[i].exp_avg_sq, f32(v_) + p.offset, p.size());
    }
    return;
  }
  TESSEL_CHECK(dp, "a sharded checkpoint needs the data-parallel group");
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const GpuZeroGroup& g = groups_[gi];
    const std::size_t span = g.chunk * std::size_t(zero_dp_);
    DBuf m = dev_.alloc_f32(span), v = dev_.alloc_f32(span), d = sharded_values() ? dev_.alloc_f32(span) : nullptr;
    dp->all_gather(f32(m_) + g.local, f32(m), g.chunk);
    dp->all_gather(f32(v_) + g.local, f32(v), g.chunk);
    if (d) dp->all_gather(f32(shard_data_) + g.local, f32(d), g.chunk);
    dp->barrier();  // NCCL: the gathers are on the dp communicator's stream; the downloads below read their output
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const GpuParam& p = params_[i];
      if (p.group != gi) continue;
      const std::size_t at = p.offset - g.begin;
      down(out[i].data, d ? f32(d) + at : f32(data_) + p.offset, p.size());
      down(out[i].exp_avg, f32(m) + at, p.size());
      down(out[i].exp_avg_sq, f32(v) + at, p.size());
    }
  }
}

void GpuParams::load_states(const std::vector<HostParamState>& in) {
  const cudaStream_t s = dev_.compute();
  cuda_ok(cudaStreamSynchronize(s), "checkpoint upload");
  TESSEL_CHECK(in.size() == params_.size(), "checkpoint upload: " << in.size() << " parameters for " << params_.size());
  const auto up = [&](float* to, const std::vector<float>& from, const GpuParam& p) {
    TESSEL_CHECK(from.size() == p.size(), "checkpoint upload of " << p.spec.name << ": " << from.size() << " values for " << p.size());
    copy_sync(to, from.data(), p.size() * sizeof(float), cudaMemcpyHostToDevice, s, "checkpoint upload");
  };
  if (!sharded()) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const GpuParam& p = params_[i];
      up(f32(data_) + p.offset, in[i].data, p);
      up(f32(m_) + p.offset, in[i].exp_avg, p);
      up(f32(v_) + p.offset, in[i].exp_avg_sq, p);
    }
    refresh_half(s);
    return;
  }
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {  // each group whole, then this rank's chunk kept
    const GpuZeroGroup& g = groups_[gi];
    const std::size_t span = g.chunk * std::size_t(zero_dp_);
    DBuf m = dev_.alloc_f32(span), v = dev_.alloc_f32(span), d = sharded_values() ? dev_.alloc_f32(span) : nullptr;
    for (const DBuf& b : {m, v, d})
      if (b) cuda_ok(cudaMemsetAsync(b->get(), 0, b->bytes(), s), "checkpoint upload");  // the padding
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const GpuParam& p = params_[i];
      if (p.group != gi) continue;
      const std::size_t at = p.offset - g.begin;
      up(d ? f32(d) + at : f32(data_) + p.offset, in[i].data, p);
      up(f32(m) + at, in[i].exp_avg, p);
      up(f32(v) + at, in[i].exp_avg_sq, p);
    }
    const std::size_t own = g.chunk * std::size_t(zero_rank_), bytes = g.chunk * sizeof(float);
    copy_sync(f32(m_) + g.local, f32(m) + own, bytes, cudaMemcpyDeviceToDevice, s, "checkpoint upload");
    copy_sync(f32(v_) + g.local, f32(v) + own, bytes, cudaMemcpyDeviceToDevice, s, "checkpoint upload");
    if (d) copy_sync(f32(shard_data_) + g.local, f32(d) + own, bytes, cudaMemcpyDeviceToDevice, s, "checkpoint upload");
    if (d && zero_stage() < 3) {  // the bf16 copy and fp32 store from the group's whole values
      gather_values(gi, f32(d), s);
      cuda_ok(cudaStreamSynchronize(s), "checkpoint upload");
    }
  }
  refresh_half(s);
  cuda_ok(cudaStreamSynchronize(s), "checkpoint upload");
}

}  // namespace tessel::rt::cuda
