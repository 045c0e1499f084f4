#include "sim/cost/compute.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "util/error.hpp"

namespace tessel::cost {

double gemm_flops(const GemmShape& g) {
  return 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k) *
         static_cast<double>(g.batch);
}

namespace {
double peak_for(const GpuSpec& gpu, Precision p) {
  double peak = gpu.peak(p);
  // fp8 GEMMs on a GPU without fp8 fall back to bf16 (as Transformer Engine would refuse; explore rejects).
  if (peak <= 0) peak = gpu.peak(Precision::bf16);
  TESSEL_CHECK(peak > 0, "GPU " << gpu.name << " has no peak for " << to_string(p));
  return peak;
}
}  // namespace

double gemm_time(const GpuSpec& gpu, Precision p, const GemmShape& g) {
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) return 0.0;
  const double eff = p == Precision::fp8 && gpu.gemm_efficiency_fp8 > 0 ? gpu.gemm_efficiency_fp8 : gpu.gemm_efficiency;
  const double per_sm = peak_for(gpu, p) * eff / gpu.sms;
  double best = std::numeric_limits<double>::infinity();
  for (const GemmTile& t : gpu.gemm_tiles) {
    const double tiles = std::ceil(static_cast<double>(g.m) / t.m) * std::ceil(static_cast<double>(g.n) / t.n) *
                         static_cast<double>(g.batch);
    const double waves = std::ceil(tiles / gpu.sms);
    const double tile_time = 2.0 * t.m * t.n * (static_cast<double>(g.k) + gpu.gemm_k_overhead) / per_sm;
    best = std::min(best, waves * tile_time);
  }
  const double elt = bytes_per_element(p);
  const double bytes = elt * static_cast<double>(g.batch) *
                       (static_cast<double>(g.m) * g.k + static_cast<double>(g.k) * g.n + static_cast<double>(g.m) * g.n);
  const double mem_eff = gpu.gemm_memory_efficiency > 0 ? gpu.gemm_memory_efficiency : gpu.memory_efficiency;
  const double mem = bytes / (gpu.memory_bw_Bps * mem_eff);
  return (std::max(best, mem) + gpu.kernel_overhead_s) * gpu.time_factor[idx(CostKind::gemm)];
}

double memory_time(const GpuSpec& gpu, double bytes, int kernels, CostKind kind, bool backward) {
  if (bytes <= 0) return 0.0;
  const double measured = gpu.kernel_Bps[static_cast<std::size_t>(idx(kind))].get(backward);
  const double rate = measured > 0 ? measured : gpu.memory_bw_Bps * gpu.memory_efficiency;
  return (bytes / rate + kernels * gpu.kernel_overhead_s) * gpu.time_factor[static_cast<std::size_t>(idx(kind))];
}

double adamw_rate(const GpuSpec& gpu, double params) {
  const std::vector<double>& n = gpu.optimizer_params;
  const std::vector<double>& r = gpu.optimizer_Bps;
  if (n.empty()) return 0;
  if (params <= n.front()) return r.front();
  if (params >= n.back()) return r.back();
  std::size_t i = 1;
  while (n[i] < params) ++i;
  // Linear in log(size) and log(rate) between the measured sizes: the rate falls by cache level, a power law
  // over each stretch more nearly than a line.
  const double t = std::log(params / n[i - 1]) / std::log(n[i] / n[i - 1]);
  return r[i - 1] * std::pow(r[i] / r[i - 1], t);
}

double adamw_time(const GpuSpec& gpu, double params) {
  const double sized = adamw_rate(gpu, params);
  if (!(sized > 0) || params <= 0)
    return memory_time(gpu, kAdamWBytesPerParam * params, kAdamWKernels, CostKind::optimizer);
  return (kAdamWBytesPerParam * params / sized + kAdamWKernels * gpu.kernel_overhead_s) *
         gpu.time_factor[idx(CostKind::optimizer)];
}

double grad_pass_time(const GpuSpec& gpu, double bytes) {
  return bytes > 0 ? memory_time(gpu, bytes, 1, CostKind::optimizer) : 0.0;
}

bool measured_attention_core(const GpuSpec& gpu) { return gpu.attention_flops.fwd > 0 && gpu.attention_flops.bwd > 0; }

double attention_core_time(const GpuSpec& gpu, double exec_flops, bool backward, int launches) {
  if (exec_flops <= 0) return 0.0;
  TESSEL_CHECK(measured_attention_core(gpu), "attention core rate not measured on " << gpu.name);
  return (exec_flops / gpu.attention_flops.get(backward) + launches * gpu.kernel_overhead_s) *
         gpu.time_factor[idx(CostKind::attention)];
}

namespace {
// Log-linear interpolation of ys over ascending xs at x, clamped to the end points.
double interp_log(const std::vector<double>& xs, const std::vector<double>& ys, double x) {
  if (xs.size() == 1 || x <= xs.front()) return ys.front();
  if (x >= xs.back()) return ys.back();
  std::size_t i = 1;
  while (xs[i] < x) ++i;
  const double t = std::log(x / xs[i - 1]) / std::log(xs[i] / xs[i - 1]);
  return ys[i - 1] + t * (ys[i] - ys[i - 1]);
}

// The rate at (seq, head_dim): along the length in the two head-dim rows around head_dim, then between them
// (no allocation: explore prices every layout's attention through here).
double curve_rate(const AttentionCurve& c, int dir, double seq, double head_dim) {
  const std::vector<double>& hds = c.head_dim[static_cast<std::size_t>(dir)];
  const auto& rows = c.rate[static_cast<std::size_t>(dir)];
  if (hds.size() == 1 || head_dim <= hds.front()) return interp_log(c.seq, rows.front(), seq);
  if (head_dim >= hds.back()) return interp_log(c.seq, rows.back(), seq);
  std::size_t i = 1;
  while (hds[i] < head_dim) ++i;
  const double lo = interp_log(c.seq, rows[i - 1], seq), hi = interp_log(c.seq, rows[i], seq);
  const double t = std::log(head_dim / hds[i - 1]) / std::log(hds[i] / hds[i - 1]);
  return lo + t * (hi - lo);
}
}  // namespace

double attention_curve_factor(const GpuSpec& gpu, bool backward, double seq, double head_dim) {
  const AttentionCurve& c = gpu.attention_curve;
  if (c.empty() || !(seq > 0) || !(head_dim > 0)) return 1.0;
  const int dir = backward ? 1 : 0;
  return curve_rate(c, dir, seq, head_dim) / curve_rate(c, dir, c.seq.back(), c.reference_head_dim);
}

double attention_tiles(double batch_heads, double queries) { return batch_heads * std::ceil(queries / kAttentionBlock); }

double attention_occupancy(int slots, double batch_heads, double queries, bool causal) {
  if (slots <= 0 || !(batch_heads > 0) || !(queries > 0)) return 1.0;
  const double n = std::ceil(queries / kAttentionBlock), S = slots;
  if (causal) return std::min(1.0, batch_heads * (n + 1) / (2 * S));
  const double tiles = std::ceil(attention_tiles(batch_heads, queries));
  return tiles / (S * std::ceil(tiles / S));
}

double attention_wave_factor(const GpuSpec& gpu, const AttentionKernel& k) {
  const double occ = attention_occupancy(gpu.sms, k.batch_heads, k.queries, k.causal);
  const AttentionCurve& c = gpu.attention_curve;
  if (c.empty() || !(c.tokens > 0)) return occ;
  // The measured points all hold `tokens` tokens of `hidden / head dim` heads, so every point has the same
  // tiles; taken at the reference point.
  const int dir = k.backward ? 1 : 0;
  const double seq = c.seq.back();
  const double ref = attention_occupancy(gpu.sms, (c.tokens / seq) * (c.hidden / c.reference_head_dim), seq,
                                         c.causal[static_cast<std::size_t>(dir)]);
  return std::min(1.0, occ / ref);
}

double attention_time(const GpuSpec& gpu, Precision p, double flops, double bytes, const AttentionKernel& k) {
  if (flops <= 0) return 0.0;
  // FP8 recipes (Transformer Engine) keep the attention core in 16-bit: only linear layers run in fp8.
  if (p == Precision::fp8) p = Precision::bf16;
  const double eff = gpu.attention_efficiency * (k.fa2 ? gpu.attention_fa2 : 1.0) *
                     attention_curve_factor(gpu, k.backward, k.seq, k.head_dim) * attention_wave_factor(gpu, k);
  const double compute = flops / (peak_for(gpu, p) * eff);
  const double mem = bytes / (gpu.memory_bw_Bps * gpu.memory_efficiency);
  return (std::max(compute, mem) + gpu.kernel_overhead_s) * gpu.time_factor[idx(CostKind::attention)];
}

}  // namespace tessel::cost
