// tessel estimate: the analytical step time, throughput, communication and memory of one layout; with --tokens
// or --steps, the time to train under failures (docs/goodput.md).
#include <cmath>
#include <iostream>

#include "sim/estimate.hpp"
#include "sim/goodput_mc.hpp"
#include "sim/workload.hpp"
#include "tools/commands.hpp"
#include "tools/format.hpp"
#include "tools/layer_ops.hpp"
#include "tools/goodput_args.hpp"
#include "tools/spec_args.hpp"
#include "util/atomic_file.hpp"

namespace tessel::cmd {

namespace {
// The exact parameter count with thousands separators and a short form: "124,439,808 params (124.4 M)".
std::string params_text(std::int64_t n) {
  std::string digits = std::to_string(n), grouped;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  const double v = static_cast<double>(n);
  const std::string short_form = v >= 1e12 ? fmt::fixed(v / 1e12, 2) + " T"
                                 : v >= 1e9 ? fmt::fixed(v / 1e9, 2) + " B"
                                            : fmt::fixed(v / 1e6, 1) + " M";
  return grouped + " params (" + short_form + ")";
}


// How an fp8 layout holds and casts its GEMM weights (Layout::fp8_params, Layout::fp8_weight_cast).
std::string fp8_weights_text(const Layout& l) {
  const bool torchao = l.fp8_weight_cast == Fp8WeightCast::per_microbatch;
  if (l.fp8_params())
    return torchao ? "16-bit weights, each shard cast to fp8 before its all-gather (FSDP2's float8 all-gather)"
                   : "fp8 primary weights gathered in fp8";
  if (torchao) return "16-bit weights cast to fp8 in every micro-batch's forward and backward (torchao)";
  return l.zero_stage == 3 ? "16-bit weights, cast to fp8 after each gather" : "16-bit weights with their cached fp8 cast";
}

std::string hours(double s) { return fmt::fixed(s / 3600, s < 36000 ? 2 : 1) + " h"; }

// Whence the job's MTBF: each rate term of the failure model.
std::string mtbf_text(const goodput::Plan& p, const goodput::Job& job) {
  std::string why;
  if (job.reliability.gpu_mtbf_s > 0)
    why = std::to_string(p.gpus) + " GPUs at " + fmt::fixed(job.reliability.gpu_mtbf_s / 3600, 0) + " h each";
  if (job.reliability.node_mtbf_s > 0)
    why += (why.empty() ? "" : " and ") + std::to_string(p.nodes) + " nodes at " +
           fmt::fixed(job.reliability.node_mtbf_s / 3600, 0) + " h each";
  return hours(p.mtbf_s) + " (" + why + ")";
}

// The time-to-train block of the human report.
// Each pipeline stage's layers, its seconds per micro-batch (forward and both backward halves) and its rank's
// memory, and the stages' imbalance (stage_imbalance): where the split puts the embedding and the head.
void print_stages(const cli::Specs& s, const Estimate& e) {
  const Layout& l = s.layout;
  if (l.num_stages() < 2) return;
  std::vector<std::vector<std::string>> rows = {{"stage", "pp rank", "layers", "time per micro-batch", "rank memory"}};
  for (int st = 0; st < l.num_stages(); ++st) {
    const int first = l.first_layer_of_stage(st, s.model.layers), n = l.layers_of_stage(st, s.model.layers);
    std::string layers = n == 0 ? "none" : n == 1 ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(first + n - 1);
    if (st == 0) layers += " + embedding";
    if (st == l.num_stages() - 1) layers += " + head, loss";
    const auto k = static_cast<std::size_t>(st);
    const int rank = l.rank_of_stage(st);
    rows.push_back({std::to_string(st), std::to_string(rank), layers, fmt::seconds(e.stage_f[k] + e.stage_i[k] + e.stage_w[k]),
                    fmt::gib(e.memory[static_cast<std::size_t>(rank)].total())});
  }
  std::cout << "\npipeline stages:\n" << fmt::table(rows) << "stage imbalance: " << fmt::pct(stage_imbalance(e))
            << " (the slowest stage's time over the mean stage's, less 1)\n";
}

void print_time_to_train(const cli::CommandLine& cl, const goodput::Job& job, const goodput::Plan& p,
                         const goodput::McResult* mc) {
  const double wall = p.wall_s;
  std::vector<std::vector<std::string>> rows = {
      {"metric", "value"},
      {"checkpoint", fmt::bytes(p.bytes.total_write) + " (fp32 values and Adam moments); busiest GPU " +
                         fmt::bytes(p.bytes.max_rank_write) + ", busiest node " + fmt::bytes(p.bytes.max_node_write)},
      {"save (stops training)", fmt::seconds(p.ckpt.blocking_s) +
                                    (p.async ? ": asynchronous, the copy to host memory; durable " +
                                                   fmt::seconds(p.ckpt.lag_s) + " later"
                                             : ": synchronous, the write to storage")},
      {"load on restart", fmt::seconds(p.ckpt.load_s) + " (" + fmt::bytes(p.bytes.total_read) + " read)"},
      {"job MTBF", mtbf_text(p, job)},
      {"restart", fmt::seconds(job.reliability.restart_overhead_s) + " overhead + " + fmt::seconds(p.ckpt.load_s) + " load"},
      {"checkpoint interval", "every " + std::to_string(p.interval_steps) + (p.interval_steps == 1 ? " step = " : " steps = ") + fmt::seconds(p.interval_s) +
                                  " (Daly " + fmt::seconds(p.daly_s) + ", Young " + fmt::seconds(p.young_s) + ")"},
      {"expected failures", fmt::fixed(p.failures, 1)},
      {"goodput", fmt::pct(p.goodput) + " (of the wall time, first order: checkpoints " + fmt::pct(p.checkpoint_s / wall) +
                      ", restarts " + fmt::pct(p.restart_total_s / wall) + ", lost work " + fmt::pct(p.lost_work_s / wall) + ")"},
      {"time to train", fmt::fixed(p.days, 1) + " days (" + fmt::fixed(p.work_s / 86400, 1) + " without failures)"},
      {"GPU-hours", fmt::si(p.gpu_hours, " GPU-hours")},
  };
  if (p.usd) rows.push_back({"cost", "$" + fmt::si(*p.usd, "") + " at $" + fmt::fixed(*job.usd_per_gpu_hour, 2) + " per GPU-hour"});
  if (mc)
    rows.push_back({"Monte Carlo (" + std::to_string(mc->runs) + " runs, seed " + std::to_string(mc->seed) + ")",
                    "goodput " + fmt::pct(mc->goodput) + " (" + fmt::fixed(100 * std::abs(mc->goodput - p.goodput), 2) +
                        " points from the closed form); days P10 / P50 / P90 " + fmt::fixed(mc->p10_s / 86400, 1) + " / " +
                        fmt::fixed(mc->p50_s / 86400, 1) + " / " + fmt::fixed(mc->p90_s / 86400, 1)});
  std::cout << "\ntime to train (docs/goodput.md): " << cli::job_length_text(cl, job) << " of " << fmt::seconds(p.step_s)
            << "\n" << fmt::table(rows);
}

Json monte_carlo_json(const goodput::McResult& mc, const goodput::Plan& p) {
  return {{"runs", mc.runs},
          {"seed", mc.seed},
          {"goodput", mc.goodput},
          {"goodput_gap_points", 100 * std::abs(mc.goodput - p.goodput)},
          {"mean_days", mc.mean_wall_s / 86400},
          {"days_p10", mc.p10_s / 86400},
          {"days_p50", mc.p50_s / 86400},
          {"days_p90", mc.p90_s / 86400},
          {"mean_failures", mc.mean_failures},
          {"checkpoint_s", mc.mean_checkpoint_s},
          {"restart_s", mc.mean_restart_s},
          {"lost_work_s", mc.mean_lost_s}};
}
// The attention kernel's shape and the share of the GPU's long-sequence rate it is priced at, where that
// depends on the shape: a layer's flash op as the lowering priced it, on a GPU whose rate varies with the key
// length and head dim (efficiency.attention_curve) or with tiles too few to fill its SMs
// (cost::attention_wave_factor). Null for unfused attention, or where neither applies.
Json attention_kernel_json(const cli::Specs& s) {
  if (s.layout.attention != AttentionImpl::flash) return nullptr;
  const GpuSpec& gpu = s.system.gpu;
  for (const cost::WorkOp& op : lower_layer(s.model, s.layout, s.system).ops) {
    if (op.cls != cost::OpClass::attention) continue;
    const cost::AttentionKernel f = cost::attention_kernel(op, s.layout.runs_fa2(), false);
    const cost::AttentionKernel b = cost::attention_kernel(op, s.layout.runs_fa2(), true);
    const double curve_f = cost::attention_curve_factor(gpu, false, op.attn_seq, op.attn_head_dim);
    const double curve_b = cost::attention_curve_factor(gpu, true, op.attn_seq, op.attn_head_dim);
    const double wave_f = cost::attention_wave_factor(gpu, f), wave_b = cost::attention_wave_factor(gpu, b);
    if (gpu.attention_curve.empty() && wave_f == 1 && wave_b == 1) return nullptr;
    return {{"keys", op.attn_seq},
            {"head_dim", op.attn_head_dim},
            {"queries", op.attn_queries},
            {"batch_heads", op.attn_batch_heads},
            {"causal", op.attn_causal},
            {"tiles", cost::attention_tiles(op.attn_batch_heads, op.attn_queries)},
            {"sms", gpu.sms},
            {"curve_share_fwd", curve_f},
            {"curve_share_bwd", curve_b},
            {"wave_share_fwd", wave_f},
            {"wave_share_bwd", wave_b},
            {"rate_share_fwd", curve_f * wave_f},
            {"rate_share_bwd", curve_b * wave_b}};
  }
  return nullptr;
}
}  // namespace

int estimate(const Args& args) {
  auto opts = cli::spec_options();
  opts.push_back({"--json", false, "print one JSON document"});
  opts.push_back({"--ops", false, kOpsHelp});
  for (auto& o : cli::goodput_options()) opts.push_back(std::move(o));
  opts.push_back({"--mc-runs", true, "time to train: Monte-Carlo runs of the whole job, 0 for none [1000]"});
  opts.push_back({"--seed", true, "time to train: the Monte Carlo's seed [1]"});
  opts.push_back({"--goodput-svg", true, "time to train: write goodput against the checkpoint interval (SVG) here"});
  cli::CommandLine cl("estimate", args, opts, 0);
  if (cl.print_help()) return 0;
  const cli::Specs s = cli::read_specs(cl);
  const std::optional<goodput::Job> job = cli::read_goodput_job(cl, s.model, s.layout.global_batch, s.system);
  if (!job)
    for (const char* f : {"--mc-runs", "--seed", "--goodput-svg"})
      if (cl.has(f)) throw InputError(std::string(f) + " " + *cl.get(f) + ": only with --tokens N or --steps N");
  const int mc_runs = static_cast<int>(cl.get_int("--mc-runs", 0, 1000000).value_or(1000));
  const auto seed = static_cast<std::uint64_t>(cl.get_int("--seed", 0, INT64_MAX).value_or(1));
  if (auto svg = cl.get("--goodput-svg")) {
    if (mc_runs == 0) throw InputError("--goodput-svg " + *svg + ": its points are Monte-Carlo runs; give --mc-runs above 0");
    check_writable(*svg, "--goodput-svg");
  }
  const Estimate e = tessel::estimate(s.model, s.layout, s.system, s.gpus);
  std::optional<goodput::Plan> plan;
  std::optional<goodput::McResult> mc;
  if (job) {
    plan = goodput::plan(s.model, e, s.system, *job);
    if (mc_runs > 0) mc = goodput::monte_carlo(goodput::mc_job(*plan), mc_runs, seed);
    if (auto svg = cl.get("--goodput-svg")) {
      // A fifth of the runs at each of the curve's Monte-Carlo points (at least 50): nine points cost about two runs.
      const auto curve = goodput::goodput_curve(*plan, std::max(50, mc_runs / 5), seed);
      write_file_atomic(*svg, goodput::goodput_svg(*plan, curve, s.model.name + " on " + std::to_string(s.gpus) + " x " +
                                                                   s.system.gpu.name + ", " + s.layout.describe()));
    }
  }
  if (cl.flag("--json")) {
    Json j = estimate_to_json(e);
    // How sure the step is: the system's band (a property of the system, not of the estimate), as step bounds too.
    const bool moe = s.model.moe.enabled();
    j["error_band"] = error_band_to_json(s.system.step_band(moe));
    if (const auto& b = s.system.step_band(moe)) {
      j["error_band"]["step_low_s"] = e.step_s / (1 + b->step_pct / 100);
      j["error_band"]["step_high_s"] = e.step_s * (1 + b->step_pct / 100);
    }
    j["model"] = model_to_json(s.model);
    j["params"] = s.model.total_params();
    j["system"] = s.system.name;
    j["attention_kernel"] = attention_kernel_json(s);
    // Only when asked (--tokens / --steps): the document is otherwise unchanged.
    if (plan) {
      j["time_to_train"] = goodput::plan_to_json(*plan);
      j["time_to_train"]["monte_carlo"] = mc ? monte_carlo_json(*mc, *plan) : Json();
    }
    if (cl.flag("--ops")) add_layer_ops_json(s.model, s.layout, s.system, j);
    j["tool"] = std::string("tessel ") + TESSEL_VERSION;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << s.model.name << ", " << params_text(s.model.total_params()) << ", on " << s.gpus << " x "
            << s.system.gpu.name << " (" << s.system.name << ")\n"
            << "layout: " << s.layout.describe() << ", global batch " << s.layout.global_batch << ", "
            << e.microbatches << " micro-batches per pipeline, seq " << s.model.seq_len << "\n";
  if (s.layout.precision == Precision::fp8)
    std::cout << "precision: fp8, " << to_string(s.layout.fp8_recipe) << " scaling (--fp8-recipe; docs/stacks.md), "
              << fp8_weights_text(s.layout) << " (--fp8-param-gather; docs/stacks.md)\n";
  if (s.layout.runs_fa2())
    std::cout << "flash attention: FlashAttention-2, " << s.system.gpu.attention_fa2 << " of the fused kernel's rate on this GPU (--flash-kernel; docs/stacks.md)\n";
  if (const Json a = attention_kernel_json(s); !a.is_null()) {
    const auto share = [&](const char* what) {
      return fmt::fixed(a[std::string(what) + "_fwd"].get<double>(), 2) + " / " +
             fmt::fixed(a[std::string(what) + "_bwd"].get<double>(), 2);
    };
    const bool waves = a["wave_share_fwd"].get<double>() < 1 || a["wave_share_bwd"].get<double>() < 1;
    std::cout << "attention kernel: " << fmt::fixed(a["keys"].get<double>(), 0) << " keys a call, head dim "
              << fmt::fixed(a["head_dim"].get<double>(), 0);
    if (waves)
      std::cout << ", " << fmt::fixed(a["tiles"].get<double>(), 0) << " tiles of " << fmt::fixed(cost::kAttentionBlock, 0) << " queries on "
                << a["sms"].get<int>()
                << " SMs";
    std::cout << ": " << share("rate_share") << " (forward / backward) of the GPU's long-sequence attention rate";
    if (!waves)
      std::cout << " (efficiency.attention_curve)\n";
    else
      std::cout << " (key length and head dim " << share("curve_share") << ", efficiency.attention_curve; SMs kept busy "
                << share("wave_share") << ", docs/simulator.md)\n";
  }
  if (s.layout.unfused.any())
    std::cout << "unfused kernels: " << to_string(s.layout.unfused) << ", one op a kernel as PyTorch eager runs them (--unfused; docs/stacks.md)\n";
  if (s.model.moe.enabled())
    std::cout << "experts: " << s.model.moe.experts << " routed, top-" << s.model.moe.top_k << ", ep" << s.layout.ep
              << " etp" << s.layout.expert_tp() << " edp" << s.layout.expert_dp()
              << "; routing "
              << (s.layout.moe_capacity > 0
                      ? "capacity factor " + fmt::fixed(s.layout.moe_capacity, 2) + " (experts padded to it, tokens beyond dropped)"
                  : s.layout.moe_skew != 1.0
                      ? "dropless, the busiest EP rank " + fmt::fixed(s.layout.moe_skew, 2) + "x the mean tokens"
                      : std::string("balanced (every expert the same tokens; --moe-skew, --moe-capacity-factor for others)"))
              << "\n";
  if (s.model.moe.enabled() && s.layout.ep > 1) {
    // Where the all-to-all runs: a group across domains is paced by its member with the fewest domain peers.
    const int domain = s.system.node.gpus_per_node;
    const cost::NodeSplit split = cost::node_split(ep_group(s.layout), domain);
    std::cout << "ep groups: ";
    if (split.inside_one_node(s.layout.ep))
      std::cout << "each inside one NVLink domain of " << domain << " GPUs\n";
    else
      std::cout << "across NVLink domains of " << domain << " GPUs (up to " << split.nodes << " a group; a member with "
                << split.fewest << " of its " << s.layout.ep << " in its domain sends " << s.layout.ep - split.fewest << "/"
                << s.layout.ep << " of its all-to-all buffer over the network"
                << (split.most > split.fewest ? "; --gpus-per-domain places fewer ranks per domain" : "") << ")\n";
  }
  std::cout << "\n";
  std::vector<std::vector<std::string>> rows = {
      {"metric", "value"},
      {"step time", fmt::seconds(e.step_s) + ", " + fmt::band(s.system.step_band(s.model.moe.enabled()), s.model.moe.enabled())},
      {"tokens/s", fmt::si(e.tokens_per_s, "tokens/s")},
      {"model TFLOP/s/GPU", fmt::rate(e.model_tflops_per_gpu)},
      {"hardware TFLOP/s/GPU (this recompute)", fmt::rate(e.hw_tflops_per_gpu)},
      {"TFLOP/s/GPU, Narayanan eq. 3 (full recompute)", fmt::rate(e.tflops_eq3_per_gpu)},
      {"MFU / HFU", fmt::pct(e.mfu) + " / " + fmt::pct(e.hfu) + " of " +
                        fmt::fixed(s.system.gpu.peak(s.layout.precision) / 1e12, s.system.gpu.peak(s.layout.precision) < 100e12 ? 1 : 0) + " TFLOP/s (" +
                        to_string(s.layout.precision) + " peak)"},
      {"MFU, attention counted causal", fmt::pct(e.mfu_causal) + " (above: full, as Megatron-LM and PaLM count it)"},
      {"pipeline bubble (idle)", fmt::pct(e.bubble_fraction)},
      {"compute (busiest rank)", fmt::seconds(e.compute_s)},
      {"TP comm (exposed)", fmt::seconds(e.tp_comm_s) + " (" + fmt::seconds(e.tp_exposed_s) + ")"},
      {"CP comm (exposed)", fmt::seconds(e.cp_comm_s) + " (" + fmt::seconds(e.cp_exposed_s) + ")"},
      {"EP comm (exposed)", fmt::seconds(e.ep_comm_s) + " (" + fmt::seconds(e.ep_exposed_s) + ")"},
      {"PP comm (exposed)", fmt::seconds(e.pp_comm_s) + " (" + fmt::seconds(e.pp_exposed_s) + ")"},
      {"DP comm (exposed)", fmt::seconds(e.dp_comm_s) + " (" + fmt::seconds(e.dp_exposed_s) + ")"},
      {"compute lost to overlapped comm", fmt::seconds(e.overlap_slowdown_s)},
      {"optimizer step", fmt::seconds(e.optimizer_s)},
      {"gradient norm, zeroing", fmt::seconds(e.grad_norm_s) + ", " + fmt::seconds(e.zero_grad_s)},
  };
  std::cout << fmt::table(rows) << "\n";
  if (s.layout.zero_stage == 3 && !s.layout.overlap_param_gather)
    std::cout << "note: ZeRO-3 prefetches each layer's forward all-gather behind the previous layer's compute "
                 "(DeepSpeed's prefetch, modelled whatever --no-overlap says: it sets Megatron's bucket overlap)\n\n";
  std::vector<std::vector<std::string>> mem = {
      {"pp rank", "weights", "grads", "optimizer", "activations", "extras", "fragmentation", "reserved", "total", "of capacity"}};
  for (const auto& m : e.memory)
    mem.push_back({std::to_string(m.rank), fmt::gib(m.weights_bytes), fmt::gib(m.grads_bytes), fmt::gib(m.optimizer_bytes),
                   fmt::gib(m.activations_bytes), fmt::gib(m.extras_bytes + m.zero3_gather_bytes + m.recompute_transient_bytes),
                   fmt::gib(m.fragmentation_bytes), fmt::gib(m.reserved_bytes), fmt::gib(m.total()), fmt::pct(m.total() / e.capacity_bytes)});
  std::cout << "memory per GPU by pipeline rank";
  if (s.layout.fragmentation > 0)
    std::cout << " (fragmentation: the allocator's " << fmt::pct(s.layout.fragmentation) << " of activations, extras and transients)";
  std::cout << ":\n" << fmt::table(mem);
  std::cout << "peak " << fmt::gib(e.peak_memory_bytes) << " on pipeline rank " << e.peak_rank << " of "
            << fmt::gib(e.capacity_bytes)
            << (e.min_headroom_bytes > 0 ? " with " + fmt::gib(e.min_headroom_bytes) + " kept free" : std::string())
            << (e.fits ? " (fits)" : " (DOES NOT FIT)") << "\n";
  print_stages(s, e);
  if (cl.flag("--ops")) print_layer_ops(s.model, s.layout, s.system);
  if (plan) print_time_to_train(cl, *job, *plan, mc ? &*mc : nullptr);
  return 0;
}

}  // namespace tessel::cmd
