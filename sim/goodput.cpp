#include "sim/goodput.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "sim/cost/memory.hpp"
#include "util/error.hpp"

namespace tessel::goodput {

namespace {

// docs/checkpoint-format.md: a checkpoint stores fp32 tensor pieces by logical name, the value ("<name>") and
// AdamW's two moments ("optim.exp_avg.<name>", "optim.exp_avg_sq.<name>"), each element once in the world.
// Under 16-bit training the fp32 value is the master copy; the 16-bit weights are derived from it on load.
constexpr double kValueBytes = 4.0, kMomentBytes = 8.0;

// What a rank saves beside its tensors (the "RNG and data position"): PyTorch's CPU generator state is
// 5,056 bytes (torch.get_rng_state()), Python's and NumPy's Mersenne Twisters 624 32-bit words (2,496 bytes)
// each, CUDA's Philox generator a seed and an offset, which Megatron-LM saves per rank (get_rng_state in
// megatron/training/checkpointing.py); the data position is one integer (meta.json's consumed_samples). Rounded
// up to 16 KiB per rank: negligible beside the tensors, and kept so that a tiny model's count is honest.
constexpr double kRankBlobBytes = 16384.0;

constexpr double kDay = 86400.0, kHour = 3600.0;

// Parameters each pipeline rank stores (per tp rank): the memory model's count per GPU, less the copies the
// format stores once.
std::vector<double> stored_params(const Model& m, const Estimate& e) {
  const Layout& l = e.layout;
  std::vector<double> p;
  // The routed experts apart (expert_params_stored): their copies are not the dp replicas'.
  for (std::size_t r = 0; r < e.rank_params.size(); ++r)
    p.push_back(e.rank_params[r] - (r < e.expert_params.size() ? e.expert_params[r] : 0.0));
  TESSEL_CHECK(static_cast<int>(p.size()) == l.pp, "memory of " << p.size() << " pipeline ranks for pp " << l.pp);
  const int stages = l.num_stages();
  // The tied embedding's second copy, held for the head by the last stage (sim/workload.cpp): the first stage's
  // rank alone writes the table (runtime/trainer_checkpoint.cpp, checkpoint_owns).
  if (m.tied_embeddings && stages > 1)
    p[static_cast<std::size_t>(l.rank_of_stage(stages - 1))] -= static_cast<double>(m.vocab) * m.hidden / l.tp;
  // tp-replicated learned positions, counted whole on every tp rank, are written by tp rank 0 alone: spread
  // evenly over the tp ranks, the total is exact.
  p[static_cast<std::size_t>(l.rank_of_stage(0))] -=
      static_cast<double>(m.tp_replicated_embedding_params()) * (l.tp - 1) / l.tp;
  return p;
}

// One rank of a pipeline rank: what it writes (dp 0 of cp 0 writes the replicated state, the others their
// shards only) and what it reads back on a restart (the state it holds).
struct RankBytes {
  double writer = 0, other = 0, read = 0;
};

RankBytes rank_bytes(double params, const Layout& l, double d) {
  // Sharded over dp x cp as the memory model shards them (cost::state_bytes_per_param): the moments from ZeRO-1;
  // the fp32 value with them under 16-bit training (the master copy is optimizer state), from ZeRO-3 under fp32
  // (the value is the weight). Each rank writes its own shard, as Megatron-LM's distributed optimizer and
  // PyTorch DCP save sharded state (the CPU runtime gathers shards to dp rank 0 first: docs/goodput.md).
  const bool moments_sharded = l.zero_stage >= 1;
  const bool value_sharded = l.precision == Precision::fp32 ? l.zero_stage >= 3 : l.zero_stage >= 1;
  const double value = kValueBytes * params, moments = kMomentBytes * params;
  const double shard = (value_sharded ? value / d : 0.0) + (moments_sharded ? moments / d : 0.0);
  const double whole = (value_sharded ? 0.0 : value) + (moments_sharded ? 0.0 : moments);
  RankBytes b;
  b.other = shard + kRankBlobBytes;
  b.writer = b.read = shard + whole + kRankBlobBytes;
  return b;
}

struct Sums {
  double write = 0, read = 0;
};

// The ranks [a, b) in Megatron's order (tp fastest, then cp, dp, pp): pipeline rank r holds [r S, (r + 1) S)
// with S = tp cp dp, and its first `first_writers` ranks write the replicated state: tp of them (cp 0, dp 0)
// for the layers' parameters, etp x ep (edp 0, the expert fold's outermost) for the routed experts'.
Sums range_sums(const std::vector<RankBytes>& per_pp, const Layout& l, long long a, long long b, long long first_writers) {
  const long long s = static_cast<long long>(l.tp) * l.cp * l.dp;
  Sums out;
  for (long long r = a / s; r * s < b; ++r) {
    const long long lo = std::max(a, r * s), hi = std::min(b, (r + 1) * s);
    const long long writers = std::max(0LL, std::min(hi, r * s + first_writers) - lo);
    const RankBytes& rb = per_pp[static_cast<std::size_t>(r)];
    out.write += static_cast<double>(writers) * rb.writer + static_cast<double>(hi - lo - writers) * rb.other;
    out.read += static_cast<double>(hi - lo) * rb.read;
  }
  return out;
}

}  // namespace

CheckpointBytes checkpoint_bytes(const Model& m, const Estimate& e, int gpus_per_node) {
  TESSEL_CHECK(gpus_per_node >= 1, "gpus per node " << gpus_per_node);
  const Layout& l = e.layout;
  std::vector<RankBytes> per_pp, experts_pp;
  for (double p : stored_params(m, e)) per_pp.push_back(rank_bytes(p, l, static_cast<double>(l.dp) * l.cp));
  // A MoE model's routed experts: every GPU of a stage holds its own shard (ep x etp of them differ), the edp
  // copies of each shard hold the same values; the distributed optimizer shards their state over edp.
  for (std::size_t r = 0; r < per_pp.size(); ++r)
    experts_pp.push_back(rank_bytes(r < e.expert_params.size() ? e.expert_params[r] : 0.0, l, l.expert_dp()));
  const long long n = l.gpus(), expert_writers = static_cast<long long>(l.expert_tp()) * l.ep;
  const auto sums = [&](long long a, long long b) {
    Sums x = range_sums(per_pp, l, a, b, l.tp);
    if (m.moe.enabled()) {
      const Sums y = range_sums(experts_pp, l, a, b, expert_writers);
      // Each rank's blob (kRankBlobBytes) is counted once, with the other parameters.
      x.write += y.write - static_cast<double>(b - a) * kRankBlobBytes;
      x.read += y.read - static_cast<double>(b - a) * kRankBlobBytes;
    }
    return x;
  };
  CheckpointBytes out;
  const Sums all = sums(0, n);
  out.total_write = all.write;
  out.total_read = all.read;
  for (std::size_t r = 0; r < per_pp.size(); ++r)
    out.max_rank_write = std::max(out.max_rank_write, per_pp[r].writer + (m.moe.enabled() ? experts_pp[r].writer - kRankBlobBytes : 0.0));
  for (long long a = 0; a < n; a += gpus_per_node) {
    const Sums node = sums(a, std::min(n, a + gpus_per_node));
    out.max_node_write = std::max(out.max_node_write, node.write);
    out.max_node_read = std::max(out.max_node_read, node.read);
  }
  return out;
}

CheckpointTimes checkpoint_times(const CheckpointBytes& b, const StorageSpec& s) {
  TESSEL_CHECK(s.node_write_bw > 0 && s.node_read_bw > 0 && s.d2h_bw > 0, "storage bandwidths must be positive");
  // Every node writes at once: the busiest node at its own bandwidth, or all of them at the file system's cap.
  const auto through = [&](double node_bytes, double node_bw, double total_bytes) {
    return std::max(node_bytes / node_bw, s.aggregate_bw > 0 ? total_bytes / s.aggregate_bw : 0.0);
  };
  CheckpointTimes t;
  t.save_s = through(b.max_node_write, s.node_write_bw, b.total_write);
  t.load_s = through(b.max_node_read, s.node_read_bw, b.total_read);
  if (s.async) {
    // Asynchronous: training waits for the copy of its state to host memory (every GPU copies its own at
    // once, the busiest rank last); the write to storage runs behind the next steps.
    t.blocking_s = b.max_rank_write / s.d2h_bw;
    t.lag_s = t.save_s;
  } else {
    t.blocking_s = t.save_s;
  }
  return t;
}

double job_mtbf_s(const ReliabilitySpec& r, int gpus, int gpus_per_node) {
  // Independent Poisson processes add their rates: each GPU's and each node's.
  const double nodes = std::ceil(static_cast<double>(gpus) / gpus_per_node);
  double rate = 0;
  if (r.gpu_mtbf_s > 0) rate += gpus / r.gpu_mtbf_s;
  if (r.node_mtbf_s > 0) rate += nodes / r.node_mtbf_s;
  TESSEL_CHECK(rate > 0, "a failure model without a rate");
  return 1.0 / rate;
}

// Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9):530-531, 1974.
double young_interval_s(double delta_s, double mtbf_s) { return std::sqrt(2.0 * delta_s * mtbf_s); }

// Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", Future Generation
// Computer Systems 22(3):303-312, 2006: tau = sqrt(2 delta M) [1 + (delta / 2M)^(1/2) / 3 + (delta / 2M) / 9]
// - delta for delta < 2M, and tau = M beyond; tau is the computation between checkpoints, delta the time a
// checkpoint stops it.
double daly_interval_s(double delta_s, double mtbf_s) {
  if (delta_s >= 2.0 * mtbf_s) return mtbf_s;
  const double x = delta_s / (2.0 * mtbf_s);
  return std::sqrt(2.0 * delta_s * mtbf_s) * (1.0 + std::sqrt(x) / 3.0 + x / 9.0) - delta_s;
}

// Daly 2006's expected wall time under exponential failures, which may also strike during checkpoints and
// restarts: T_w = M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau for T_s of computation.
double expected_wall_s(double work_s, double interval_s, double delta_s, double restart_s, double mtbf_s) {
  return mtbf_s * std::exp(restart_s / mtbf_s) * std::expm1((interval_s + delta_s) / mtbf_s) * work_s / interval_s;
}

Plan plan(const Model& m, const Estimate& e, const System& sys, const Job& job) {
  Plan p;
  p.gpus = e.layout.gpus();
  const int per_node = sys.node.gpus_per_node;
  p.nodes = (p.gpus + per_node - 1) / per_node;
  p.steps = job.steps;
  p.bytes = checkpoint_bytes(m, e, per_node);
  p.ckpt = checkpoint_times(p.bytes, job.storage);
  p.async = job.storage.async;
  p.mtbf_s = job_mtbf_s(job.reliability, p.gpus, per_node);
  p.restart_s = job.reliability.restart_overhead_s + p.ckpt.load_s;
  p.young_s = young_interval_s(p.ckpt.blocking_s, p.mtbf_s);
  p.daly_s = daly_interval_s(p.ckpt.blocking_s, p.mtbf_s);
  return with_step_time(p, e.step_s, job);
}

Plan with_step_time(const Plan& base, double step_s, const Job& job) {
  TESSEL_CHECK(step_s > 0 && base.steps >= 1, "step " << step_s << " s, " << base.steps << " steps");
  Plan p = base;
  p.step_s = step_s;
  p.work_s = p.steps * step_s;
  // Checkpoints fall on step boundaries: Daly's interval in whole steps, at least one; when asynchronous at
  // least the previous checkpoint's write (one in flight at a time); at most the whole job.
  double k = std::max(1.0, std::round(p.daly_s / step_s));
  if (p.async) k = std::max(k, std::ceil(p.ckpt.lag_s / step_s));
  k = std::min(k, p.steps);
  p.interval_steps = static_cast<long long>(k);
  p.interval_s = k * step_s;
  // An asynchronous checkpoint is durable lag_s after the copy: a failure in that window falls back one
  // checkpoint further, so each restart ends lag_s later, as if the restart were that much longer
  // (docs/goodput.md derives it; the Monte Carlo plays the window itself).
  const double restart = p.restart_s + p.ckpt.lag_s;
  p.wall_s = expected_wall_s(p.work_s, p.interval_s, p.ckpt.blocking_s, restart, p.mtbf_s);
  if (!std::isfinite(p.wall_s) || p.wall_s > 1e6 * p.work_s)
    throw InfeasibleLayout("the job would not finish: restarts of " + std::to_string(restart) + " s and checkpoints "
                           "stopping it " + std::to_string(p.ckpt.blocking_s) + " s every " +
                           std::to_string(p.interval_s) + " s, against a job MTBF of " + std::to_string(p.mtbf_s) +
                           " s, make the expected wall time over a million times the work");
  p.goodput = p.work_s / p.wall_s;
  p.failures = p.wall_s / p.mtbf_s;
  p.checkpoints = p.steps / k;
  // First-order split (Young's): a failure strikes mid-interval on average and loses half of it, plus the
  // durability lag; the Monte Carlo reports the split it plays.
  p.checkpoint_s = p.checkpoints * p.ckpt.blocking_s;
  p.restart_total_s = p.failures * p.restart_s;
  p.lost_work_s = p.failures * ((p.interval_s + p.ckpt.blocking_s) / 2.0 + p.ckpt.lag_s);
  p.days = p.wall_s / kDay;
  p.gpu_hours = p.wall_s * p.gpus / kHour;
  p.usd.reset();
  if (job.usd_per_gpu_hour) p.usd = p.gpu_hours * *job.usd_per_gpu_hour;
  return p;
}

Json plan_to_json(const Plan& p) {
  Json j;
  j["steps"] = static_cast<long long>(p.steps);
  j["step_s"] = p.step_s;
  j["work_s"] = p.work_s;
  j["gpus"] = p.gpus;
  j["nodes"] = p.nodes;
  j["checkpoint"] = {{"bytes", p.bytes.total_write},         {"bytes_busiest_rank", p.bytes.max_rank_write},
                     {"bytes_busiest_node", p.bytes.max_node_write}, {"read_bytes", p.bytes.total_read},
                     {"read_bytes_busiest_node", p.bytes.max_node_read}, {"write_s", p.ckpt.save_s},
                     {"durable_lag_s", p.ckpt.lag_s},         {"load_s", p.ckpt.load_s},
                     {"async", p.async}};
  j["save_s"] = p.ckpt.blocking_s;  // Daly's delta: what each checkpoint stops training for
  j["job_mtbf_s"] = p.mtbf_s;
  j["restart_s"] = p.restart_s;
  j["young_interval_s"] = p.young_s;
  j["daly_interval_s"] = p.daly_s;
  j["interval_steps"] = p.interval_steps;
  j["interval_s"] = p.interval_s;
  j["wall_s"] = p.wall_s;
  j["days"] = p.days;
  j["goodput"] = p.goodput;
  j["expected_failures"] = p.failures;
  j["checkpoints"] = p.checkpoints;
  j["checkpoint_s"] = p.checkpoint_s;
  j["restart_total_s"] = p.restart_total_s;
  j["lost_work_s"] = p.lost_work_s;
  j["gpu_hours"] = p.gpu_hours;
  j["usd"] = p.usd ? Json(*p.usd) : Json();
  return j;
}

}  // namespace tessel::goodput
