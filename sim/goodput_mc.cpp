#include "sim/goodput_mc.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "util/error.hpp"

namespace tessel::goodput {

namespace {

// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014): a run's
// seed from the job's seed and the run's index, so runs are independent of each other and of their order.
std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The failures of the job's GPUs and nodes are independent Poisson processes; their superposition is one
// Poisson process whose rate is the sum (the job's 1 / M), so the time to the next failure of any of them is
// exponential with mean M. Drawn by inverting a 53-bit uniform: the standard fixes mt19937_64's output but not
// its distributions', so the same seed gives the same failures with every standard library.
class Failures {
 public:
  Failures(std::uint64_t seed, double mtbf_s) : rng_(seed), mtbf_s_(mtbf_s) {}
  double next() {
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    return -mtbf_s_ * std::log1p(-u);
  }

 private:
  std::mt19937_64 rng_;
  double mtbf_s_;
};

struct RunOut {
  double wall_s = 0, failures = 0, checkpoint_s = 0, restart_s = 0;
};

// One run. Work goes in segments of interval_s (the last one shorter), counted by index so that the end is
// exact. A checkpoint follows every segment but the last; it is durable at once (synchronous) or lag_s after
// its copy (asynchronous), and a failure before then falls back to the one before.
RunOut play(const McJob& j, Failures& f) {
  const long long segments = std::max(1LL, static_cast<long long>(std::ceil(j.work_s / j.interval_s - 1e-9)));
  const double last = j.work_s - static_cast<double>(segments - 1) * j.interval_s;
  RunOut o;
  double t = 0, fail = f.next();
  long long computed = 0, durable = 0;  // segments computed since the start, and up to the last durable checkpoint
  long long pending = -1;               // an asynchronous checkpoint not yet durable: its segment count
  double pending_at = 0;
  bool restarting = false;
  const auto failure = [&] {
    if (pending >= 0 && pending_at <= fail) durable = pending;
    pending = -1;
    t = fail;
    fail = t + f.next();
    o.failures += 1;
    restarting = true;
  };
  while (true) {
    if (restarting) {
      if (fail < t + j.restart_s) {
        o.restart_s += fail - t;
        failure();
        continue;
      }
      t += j.restart_s;
      o.restart_s += j.restart_s;
      restarting = false;
      computed = durable;
    }
    // Whole segments with their checkpoints that end before the next failure (and before the last segment) go in
    // one jump, so that a run costs its failures, not its checkpoints. When a write outlasts a segment (the
    // plan never asks for that) the checkpoints go one by one.
    const double cycle = j.interval_s + j.blocking_s;
    if (j.lag_s <= j.interval_s && computed + 1 < segments) {
      const long long n = std::min(static_cast<long long>((fail - t) / cycle), segments - 1 - computed);
      if (n > 0) {
        t += static_cast<double>(n) * cycle;
        computed += n;
        o.checkpoint_s += static_cast<double>(n) * j.blocking_s;
        if (j.lag_s > 0) {
          // Every checkpoint but the last was durable before the next copy ended (lag <= interval).
          durable = std::max(durable, computed - 1);
          pending = computed;
          pending_at = t + j.lag_s;
        } else {
          durable = computed;
        }
        continue;
      }
    }
    const double seg = computed + 1 == segments ? last : j.interval_s;
    if (fail < t + seg) {
      failure();
      continue;
    }
    t += seg;
    if (++computed == segments) break;
    if (fail < t + j.blocking_s) {
      failure();
      continue;
    }
    t += j.blocking_s;
    o.checkpoint_s += j.blocking_s;
    if (pending >= 0 && pending_at <= t) durable = pending;
    if (j.lag_s > 0) {
      pending = computed;
      pending_at = t + j.lag_s;
    } else {
      durable = computed;
    }
    TESSEL_CHECK(o.failures < 1e9, "a Monte-Carlo run past 1e9 failures");
  }
  o.wall_s = t;
  return o;
}

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double q) {
  const std::size_t n = sorted.size();
  const std::size_t rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(n)));
  return sorted[std::min(n, std::max<std::size_t>(rank, 1)) - 1];
}

}  // namespace

McJob mc_job(const Plan& p) {
  McJob j;
  j.work_s = p.work_s;
  j.interval_s = p.interval_s;
  j.blocking_s = p.ckpt.blocking_s;
  j.lag_s = p.ckpt.lag_s;
  j.restart_s = p.restart_s;
  j.mtbf_s = p.mtbf_s;
  return j;
}

McResult monte_carlo(const McJob& job, int runs, std::uint64_t seed) {
  TESSEL_CHECK(runs >= 1 && job.work_s > 0 && job.interval_s > 0 && job.mtbf_s > 0,
               "Monte Carlo of " << runs << " runs, work " << job.work_s << " s, interval " << job.interval_s
                                 << " s, MTBF " << job.mtbf_s << " s");
  McResult r;
  r.runs = runs;
  r.seed = seed;
  std::vector<double> walls;
  walls.reserve(static_cast<std::size_t>(runs));
  double failures = 0, checkpoint = 0, restart = 0;
  for (int i = 0; i < runs; ++i) {
    Failures f(splitmix64(seed ^ splitmix64(static_cast<std::uint64_t>(i))), job.mtbf_s);
    const RunOut o = play(job, f);
    walls.push_back(o.wall_s);
    failures += o.failures;
    checkpoint += o.checkpoint_s;
    restart += o.restart_s;
  }
  double total = 0;
  for (double w : walls) total += w;
  const double n = runs;
  r.mean_wall_s = total / n;
  r.goodput = job.work_s / r.mean_wall_s;
  r.mean_failures = failures / n;
  r.mean_checkpoint_s = checkpoint / n;
  r.mean_restart_s = restart / n;
  r.mean_lost_s = r.mean_wall_s - job.work_s - r.mean_checkpoint_s - r.mean_restart_s;
  std::sort(walls.begin(), walls.end());
  r.p10_s = percentile(walls, 0.10);
  r.p50_s = percentile(walls, 0.50);
  r.p90_s = percentile(walls, 0.90);
  return r;
}

std::vector<CurvePoint> goodput_curve(const Plan& p, int runs, std::uint64_t seed) {
  const McJob base = mc_job(p);
  // From a sixteenth to sixteen times the plan's interval; not below one step, nor below the write of an
  // asynchronous checkpoint (one in flight at a time), nor above the whole job.
  const double lo = std::max({p.interval_s / 16.0, p.step_s, p.ckpt.lag_s});
  const double hi = std::max(lo, std::min(p.interval_s * 16.0, p.work_s));
  constexpr int kPoints = 33, kEvery = 4;
  std::vector<CurvePoint> out;
  for (int i = 0; i < kPoints; ++i) {
    CurvePoint c;
    c.interval_s = lo * std::pow(hi / lo, static_cast<double>(i) / (kPoints - 1));
    c.closed_form =
        p.work_s / expected_wall_s(p.work_s, c.interval_s, base.blocking_s, base.restart_s + base.lag_s, base.mtbf_s);
    if (i % kEvery == 0) {
      McJob j = base;
      j.interval_s = c.interval_s;
      const McResult r = monte_carlo(j, runs, seed + static_cast<std::uint64_t>(i));
      c.simulated = true;
      c.monte_carlo = r.goodput;
      c.p10_goodput = p.work_s / r.p90_s;
      c.p90_goodput = p.work_s / r.p10_s;
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace tessel::goodput
