#include "sim/calibrate/kind_fit.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "util/error.hpp"
#include "sim/cost/comm.hpp"
#include "sim/cost/compute.hpp"

namespace tessel::calib {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The charge a kernel row is fitted on: its FLOPs on the attention path, else its bytes.
double charge(const KernelRow& r) { return r.path == "attention" ? r.flops : r.bytes; }

// sum n_i (t_i - c) / sum n_i a_i: 1/rate at which the rows' per-step total is right (fit.cpp).
double total_inverse_rate(const std::vector<const KernelRow*>& rows, double c) {
  double num = 0, den = 0;
  for (const KernelRow* r : rows) {
    num += r->per_step * (r->time_s - c);
    den += r->per_step * charge(*r);
  }
  return den > 0 ? num / den : 0;
}

// AdamW's rate at each size the bench measured (the parameters a row steps: its bytes over 30), where it
// measured two or more: bytes / (t - the kernels' overhead), as cost::adamw_time prices it. Rows of one size
// (none in the bench, but a merged document may hold them) are taken by the total rule.
void fit_optimizer_sizes(const BenchData& b, double c, System& profile) {
  std::vector<std::pair<double, std::vector<const KernelRow*>>> sizes;
  for (const KernelRow& r : b.kernels) {
    if (r.kernel != "adamw") continue;
    const double n = r.bytes / cost::kAdamWBytesPerParam;
    auto it = std::find_if(sizes.begin(), sizes.end(), [&](const auto& s) { return s.first == n; });
    if (it == sizes.end()) sizes.push_back({n, {&r}});
    else it->second.push_back(&r);
  }
  profile.gpu.optimizer_params.clear();
  profile.gpu.optimizer_Bps.clear();
  if (sizes.size() < 2) return;
  std::sort(sizes.begin(), sizes.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  for (const auto& [n, rows] : sizes) {
    const double w = total_inverse_rate(rows, cost::kAdamWKernels * c);
    if (!(w > 0) || !std::isfinite(w)) {  // at the overhead: no rate by size, the kind's one rate prices it
      profile.gpu.optimizer_params.clear();
      profile.gpu.optimizer_Bps.clear();
      return;
    }
    profile.gpu.optimizer_params.push_back(n);
    profile.gpu.optimizer_Bps.push_back(1.0 / w);
  }
}

}  // namespace

bool kernel_kind(const std::string& k, CostKind& kind, bool& backward) {
  struct Entry {
    const char* name;
    CostKind kind;
    bool backward;
  };
  static const Entry table[] = {
      {"layernorm_fwd", CostKind::norm, false},          {"layernorm_bwd", CostKind::norm, true},
      {"gelu_fwd", CostKind::activation, false},         {"gelu_bwd", CostKind::activation, true},
      {"cross_entropy_fwd", CostKind::cross_entropy, false}, {"cross_entropy_bwd", CostKind::cross_entropy, true},
      {"embedding_fwd", CostKind::embedding, false},     {"embedding_bwd", CostKind::embedding, true},
      {"attention_fwd", CostKind::attention, false},     {"attention_bwd", CostKind::attention, true},
      {"adamw", CostKind::optimizer, false}};
  for (const Entry& e : table)
    if (k == e.name) {
      kind = e.kind;
      backward = e.backward;
      return true;
    }
  return false;
}

std::vector<KindFit> fit_kind_rates(const BenchData& b, double c, System& profile) {
  std::vector<KindFit> out;
  for (int k = 0; k < kCostKinds; ++k)
    for (bool bwd : {false, true}) {
      std::vector<const KernelRow*> rows;
      for (const KernelRow& r : b.kernels) {
        CostKind kind;
        bool backward;
        if (kernel_kind(r.kernel, kind, backward) && idx(kind) == k && backward == bwd) rows.push_back(&r);
      }
      if (rows.empty()) continue;
      const double w = total_inverse_rate(rows, c);
      if (!(w > 0) || !std::isfinite(w))
        throw InputError(b.origin + ": the " + rows.front()->kernel + " rows do not determine a rate (their times do not "
                         "exceed the kernel overhead " + std::to_string(c * 1e6) + " us)");
      KindFit f;
      f.kind = static_cast<CostKind>(k);
      f.backward = bwd;
      f.rows = static_cast<int>(rows.size());
      f.rate = 1.0 / w;
      std::vector<double> rel;
      for (const KernelRow* r : rows) rel.push_back(std::abs((charge(*r) * w + c) / r->time_s - 1));
      f.median_abs = median(rel);
      if (f.kind == CostKind::attention) (bwd ? profile.gpu.attention_flops.bwd : profile.gpu.attention_flops.fwd) = f.rate;
      else (bwd ? profile.gpu.kernel_Bps[static_cast<std::size_t>(k)].bwd : profile.gpu.kernel_Bps[static_cast<std::size_t>(k)].fwd) = f.rate;
      out.push_back(f);
    }
  fit_optimizer_sizes(b, c, profile);
  // Half a measured attention core (forward without backward) cannot price the other half: both or neither
  // (the bench times both); with one, the attention rows set the path's efficiency only (fit.cpp).
  if (!(profile.gpu.attention_flops.fwd > 0 && profile.gpu.attention_flops.bwd > 0)) profile.gpu.attention_flops = {};
  return out;
}

std::vector<Residuals> fit_gemm_classes(const std::vector<GemmRow>& rows, Precision p, System& profile) {
  std::vector<Residuals> out;
  for (GemmClass cls : {GemmClass::dgrad, GemmClass::wgrad}) {
    double meas = 0, pred = 0;
    std::vector<const GemmRow*> mine;
    for (const GemmRow& r : rows)
      if (r.cls == cls) {
        mine.push_back(&r);
        meas += r.time_s;
        pred += cost::gemm_time(profile.gpu, p, {r.m, r.n, r.k, r.batch});
      }
    if (mine.empty() || !(pred > 0)) continue;
    const double factor = meas / pred;
    (cls == GemmClass::dgrad ? profile.gpu.gemm_dgrad_factor : profile.gpu.gemm_wgrad_factor) = factor;
    // The measured weight gradients already pay whatever output the runtime writes: no fp32-output charge on top.
    if (cls == GemmClass::wgrad) profile.gpu.gemm_fp32_out = 1;
    Residuals res;
    res.category = std::string("gemm ") + to_string(cls);
    res.rows = static_cast<int>(mine.size());
    std::vector<double> rel;
    double ss = 0;
    for (const GemmRow* r : mine) {
      const double e = factor * cost::gemm_time(profile.gpu, p, {r->m, r->n, r->k, r->batch}) / r->time_s - 1;
      ss += e * e;
      rel.push_back(std::abs(e));
    }
    res.median_abs = median(rel);
    res.max_abs = *std::max_element(rel.begin(), rel.end());
    res.rms = std::sqrt(ss / rel.size());
    out.push_back(res);
  }
  return out;
}

namespace {

// Sum of busy over sum of alone times of the rows of one kind, weighted like the fit (per-step counts).
struct Ratio {
  double busy = 0, alone = 0;
  int rows = 0;
  std::vector<double> each;  // every row's busy / alone
  void add(double b, double a, double w) {
    busy += w * b;
    alone += w * a;
    ++rows;
    if (a > 0 && b > 0) each.push_back(b / a);
  }
};

// Quartile q (0.25, 0.5, 0.75) of `v` by linear interpolation between order statistics.
double quartile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double at = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(at);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (at - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

[[noreturn]] void mismatch(const BenchData& a, const BenchData& b, const std::string& what) {
  throw InputError("--bench " + a.origin + " and " + b.origin + ": " + what + "; the contention fit compares the same rows "
                   "measured alone and on several threads at once (two runs of `tessel bench` of one build)");
}

}  // namespace

std::vector<ContentionFit> fit_contention(const BenchData& alone, const BenchData& busy, System& profile) {
  if (alone.gemm.size() != busy.gemm.size() || alone.membw.size() != busy.membw.size() ||
      alone.kernels.size() != busy.kernels.size())
    mismatch(alone, busy, "their gemm, membw and kernels rows differ in number");
  std::vector<Ratio> r(kCostKinds);
  for (std::size_t i = 0; i < alone.gemm.size(); ++i) {
    const GemmRow &a = alone.gemm[i], &b = busy.gemm[i];
    if (a.m != b.m || a.n != b.n || a.k != b.k || a.batch != b.batch || a.cls != b.cls)
      mismatch(alone, busy, "gemm[" + std::to_string(i) + "] is another shape");
    r[idx(CostKind::gemm)].add(b.time_s, a.time_s, 1);
  }
  for (std::size_t i = 0; i < alone.membw.size(); ++i) {
    if (alone.membw[i].kernel != busy.membw[i].kernel || alone.membw[i].bytes != busy.membw[i].bytes)
      mismatch(alone, busy, "membw[" + std::to_string(i) + "] is another kernel or size");
    r[idx(CostKind::memory)].add(busy.membw[i].time_s, alone.membw[i].time_s, 1);
  }
  for (std::size_t i = 0; i < alone.kernels.size(); ++i) {
    const KernelRow &a = alone.kernels[i], &b = busy.kernels[i];
    if (a.kernel != b.kernel || a.bytes != b.bytes) mismatch(alone, busy, "kernels[" + std::to_string(i) + "] is another kernel or shape");
    CostKind kind;
    bool bwd;
    if (kernel_kind(a.kernel, kind, bwd)) r[idx(kind)].add(b.time_s, a.time_s, a.per_step);
  }
  profile.host.cores = busy.concurrent;
  profile.host.contention.fill(1.0);
  std::vector<ContentionFit> out;
  for (int k = 0; k < kCostKinds; ++k) {
    if (r[k].rows == 0 || !(r[k].alone > 0)) continue;
    // The GEMM grid (16-1024 a side) and the STREAM rows (32 kB to 12 MB) are not weighted by their use in a
    // step, so a time-weighted total is the largest rows' slowdown: the 12 MB triad's DRAM share (1.3-2.4x with
    // both cores busy) stood for every element-wise glue op of a few hundred kB that stays in cache (1.0x). Their
    // factor is the median row's. The kernel rows are the model's own ops, weighted by their per-step counts.
    const bool grid = k == idx(CostKind::gemm) || k == idx(CostKind::memory);
    const double ratio = grid && !r[k].each.empty() ? quartile(r[k].each, 0.5) : r[k].busy / r[k].alone;
    // Within the parser's [0.1, 20]: a ratio outside it is no contention but a disturbed measurement.
    const double f = std::clamp(ratio, 0.1, 20.0);
    profile.host.contention[static_cast<std::size_t>(k)] = f;
    ContentionFit c{static_cast<CostKind>(k), r[k].rows, f};
    if (grid && static_cast<int>(r[k].each.size()) >= kContentionSteadyRows) {
      c.q1 = quartile(r[k].each, 0.25);
      c.q3 = quartile(r[k].each, 0.75);
      if (k == idx(CostKind::gemm)) c.spread = (c.q3 - c.q1) / quartile(r[k].each, 0.5);
      c.faster = std::max(0.0, 1 - f);
    }
    out.push_back(c);
  }
  profile.host.contention[idx(CostKind::glue)] = profile.host.contention[idx(CostKind::memory)];
  return out;
}

void set_collective_links(const std::vector<LinkFit>& links, System& profile) {
  for (const LinkFit& l : links) {
    if (!(l.bw > 0)) continue;
    for (cost::Collective c : {cost::Collective::all_reduce, cost::Collective::all_gather, cost::Collective::reduce_scatter,
                               cost::Collective::broadcast, cost::Collective::send_recv})
      if (l.collective == cost::to_string(c)) profile.node.collective[static_cast<std::size_t>(c)] = {l.alpha_s, l.bw, l.large_bytes, l.large_bw};
  }
}

double bench_noise(const BenchData& b) {
  std::vector<double> s;
  for (const GemmRow& r : b.gemm)
    if (r.spread >= 0) s.push_back(r.spread);
  for (const MemRow& r : b.membw)
    if (r.spread >= 0) s.push_back(r.spread);
  for (const KernelRow& r : b.kernels)
    if (r.spread >= 0) s.push_back(r.spread);
  return s.empty() ? -1 : median(s);
}

}  // namespace tessel::calib
