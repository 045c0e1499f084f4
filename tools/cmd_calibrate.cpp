// tessel calibrate: fit a Profile (a system JSON every command takes with --system) from `tessel bench --json`
// output and/or measured traces, and print the fit residuals per category (sim/calibrate/fit.hpp); or, with
// --published, fit a system's efficiency numbers to published measurements (sim/calibrate/published_fit.hpp).
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/json_reader.hpp"
#include "sim/calibrate/bench_data.hpp"
#include "sim/calibrate/calibration.hpp"
#include "sim/calibrate/checkpoint_fit.hpp"
#include "sim/calibrate/fit.hpp"
#include "sim/calibrate/published_fit.hpp"
#include "sim/calibrate/trace_fit.hpp"
#include "sim/validate.hpp"
#include "tools/cli.hpp"
#include "tools/closed_loop.hpp"
#include "tools/commands.hpp"
#include "tools/format.hpp"
#include "traces/chrome.hpp"

namespace tessel::cmd {

namespace {

Json fit_to_json(const calib::FitResult& f, const calib::TraceFit* tf) {
  Json j;
  j["gemm_GFLOPs"] = f.gemm_rate / 1e9;
  j["gemm_k_overhead"] = f.k_overhead;
  j["gemm_tile"] = {f.tile.m, f.tile.n};
  j["gemm_memory_bound_rows"] = f.gemm_memory_bound;
  j["kernel_overhead_us"] = f.kernel_overhead_s * 1e6;
  j["memory_GBps"] = f.mem_rate / 1e9;
  j["stream_GBps"] = f.stream_rate / 1e9;
  j["gemm_memory_GBps"] = f.gemm_memory_rate / 1e9;
  j["link_latency_us"] = f.link_latency_s * 1e6;
  j["link_GBps"] = f.link_bw / 1e9;
  Json links = Json::array();
  for (const auto& l : f.links) {
    links.push_back({{"comm", l.comm}, {"collective", l.collective}, {"rows", l.rows}, {"alpha_us", l.alpha_s * 1e6},
                     {"bw_GBps", l.bw / 1e9}, {"rms_rel", l.rms}, {"rms_rel_one_line", l.rms_one_line}});
    if (l.large_bytes > 0) {
      links.back()["large_from_MB"] = l.large_bytes / 1e6;
      links.back()["large_GBps"] = l.large_bw / 1e9;
    }
  }
  j["links"] = links;
  Json res = Json::array();
  for (const auto& r : f.residuals)
    res.push_back({{"category", r.category}, {"rows", r.rows}, {"median_abs_pct", 100 * r.median_abs},
                   {"max_abs_pct", 100 * r.max_abs}, {"rms_pct", 100 * r.rms}});
  j["residuals"] = res;
  Json kinds = Json::array();
  for (const auto& k : f.kinds)
    kinds.push_back({{"kind", to_string(k.kind)}, {"direction", k.backward ? "bwd" : "fwd"}, {"rows", k.rows},
                     {k.kind == CostKind::attention ? "GFLOPs" : "GBps", k.rate / 1e9}, {"median_abs_pct", 100 * k.median_abs}});
  j["kinds"] = kinds;
  Json cont = Json::object();
  for (const auto& c : f.contention) cont[to_string(c.kind)] = c.factor;
  j["contention"] = cont;
  j["host_cores"] = f.profile.host.cores;
  j["bench_noise_pct"] = f.noise >= 0 ? Json(100 * f.noise) : Json(nullptr);
  if (tf) {
    Json k = Json::array();
    for (const auto& o : tf->kinds)
      k.push_back({{"op", o.op}, {"events", o.events}, {"measured_s", o.measured_s}, {"predicted_s", o.predicted_s},
                   {"predicted_after_s", o.predicted_after_s}, {"scale", o.scale}, {"median_ratio", o.median_ratio},
                   {"achieved_GFLOPs", o.achieved_flops / 1e9}});
    j["trace_kinds"] = k;
    j["trace_method"] = tf->method;
    if (tf->method == "per-op") {
      j["trace_glue_fwd_GBps"] = tf->glue_fwd_Bps / 1e9;
      j["trace_glue_bwd_GBps"] = tf->glue_bwd_Bps / 1e9;
      j["trace_wgrad_factor"] = tf->wgrad_factor;
      j["trace_wgrad_fitted"] = tf->wgrad_fitted;
    } else {
      j["trace_compute_scale"] = tf->compute_scale;
      j["trace_memory_scale"] = tf->memory_scale;
      j["trace_comm_scale"] = tf->comm_scale;
    }
    j["trace_rms_rel_before"] = tf->rms_before;
    j["trace_rms_rel_after"] = tf->rms_after;
    j["trace_noise_pct"] = 100 * tf->noise;
  }
  j["notes"] = f.notes;
  j["warnings"] = tf ? tf->warnings : std::vector<std::string>{};
  return j;
}

void print_report(const calib::FitResult& f, const calib::TraceFit* tf, const std::string& out) {
  // Parts without rows are kept from the base system (said in the notes), not fitted as 0.
  std::cout << "fitted: ";
  if (f.gemm_rate > 0)
    std::cout << "GEMM " << fmt::fixed(f.gemm_rate / 1e9, 2) << " GFLOP/s, K overhead " << fmt::fixed(f.k_overhead, 1)
              << ", tile " << f.tile.m << "x" << f.tile.n << " (" << f.gemm_memory_bound << " rows memory-bound), ";
  else
    std::cout << "GEMM kept, ";
  if (f.gemm_rate > 0 || f.mem_rate > 0) std::cout << "kernel overhead " << fmt::fixed(f.kernel_overhead_s * 1e6, 2) << " us, ";
  if (f.mem_rate > 0) std::cout << "memory " << fmt::fixed(f.mem_rate / 1e9, 2) << " GB/s, ";
  else std::cout << "memory kept, ";
  if (f.gemm_memory_rate > 0 && f.gemm_memory_rate != f.mem_rate)
    std::cout << "GEMM memory roofline " << fmt::fixed(f.gemm_memory_rate / 1e9, 2) << " GB/s, ";
  if (f.link_bw > 0)
    std::cout << "link " << fmt::fixed(f.link_latency_s * 1e6, 2) << " us + " << fmt::fixed(f.link_bw / 1e9, 2) << " GB/s";
  else
    std::cout << "link kept";
  std::cout << "\n\n";
  std::vector<std::vector<std::string>> rows = {{"residuals (pred/meas - 1)", "rows", "median |err|", "max |err|", "rms"}};
  for (const auto& r : f.residuals)
    rows.push_back({r.category, std::to_string(r.rows), fmt::pct(r.median_abs), fmt::pct(r.max_abs), fmt::pct(r.rms)});
  std::cout << fmt::table(rows);
  if (!f.links.empty()) {
    std::vector<std::vector<std::string>> l = {
        {"per-collective alpha/beta", "rows", "alpha (us)", "bw (GB/s)", "past (MB)", "then (GB/s)", "rms", "one line"}};
    for (const auto& k : f.links)
      l.push_back({k.collective + " (" + k.comm + ")", std::to_string(k.rows), fmt::fixed(k.alpha_s * 1e6, 2),
                   fmt::fixed(k.bw / 1e9, 3), k.large_bytes > 0 ? fmt::fixed(k.large_bytes / 1e6, 3) : "-",
                   k.large_bytes > 0 ? fmt::fixed(k.large_bw / 1e9, 3) : "-", fmt::pct(k.rms), fmt::pct(k.rms_one_line)});
    std::cout << "\n" << fmt::table(l);
  }
  if (tf) {
    std::vector<std::vector<std::string>> t = {
        {"trace op kind", "events", "measured", "predicted", "scale", "median ratio", "GFLOP/s", "predicted after"}};
    for (const auto& o : tf->kinds)
      t.push_back({o.op, std::to_string(o.events), fmt::seconds(o.measured_s), fmt::seconds(o.predicted_s),
                   fmt::fixed(o.scale, 3), fmt::fixed(o.median_ratio, 3), fmt::fixed(o.achieved_flops / 1e9, 2),
                   fmt::seconds(o.predicted_after_s)});
    std::cout << "\n" << fmt::table(t);
    if (tf->method == "per-op")
      std::cout << "per-op trace fit: glue " << fmt::fixed(tf->glue_fwd_Bps / 1e9, 3) << " GB/s forward, "
                << fmt::fixed(tf->glue_bwd_Bps / 1e9, 3) << " GB/s backward, weight-gradient GEMM class x"
                << fmt::fixed(tf->wgrad_factor, 3) << (tf->wgrad_fitted ? "" : " (the bench's)");
    else
      std::cout << "scales applied to the profile: compute x" << fmt::fixed(tf->compute_scale, 3) << ", memory x"
                << fmt::fixed(tf->memory_scale, 3) << ", communication x" << fmt::fixed(tf->comm_scale, 3);
    std::cout << "; op rms error (of the rms duration; each op the median of its steady-state instances) "
              << fmt::pct(tf->rms_before) << " -> " << fmt::pct(tf->rms_after) << "\n";
  }
  for (const auto& n : f.notes) std::cout << "note: " << n << "\n";
  std::cout << "profile: " << out << "\n";
}

// The host's load average over the last minute (getloadavg(3)); -1 when it cannot be read.
double load_average() {
  double l[1] = {-1};
  return getloadavg(l, 1) == 1 ? l[0] : -1;
}

std::string noise_warning(const calib::Calibration& c) {
  std::ostringstream os;
  os.precision(3);
  if (c.noise > calib::kNoiseFlag)
    os << "the measurements vary by " << calib::noise_text(c.noise) << " between repeats (load average " << load_average()
       << "), above the " << 100 * calib::kNoiseFlag << "% a profile can be trusted at: its predictions may be off by as much";
  if (c.contention_noise > calib::kNoiseFlag)
    os << (os.str().empty() ? "" : "; ") << calib::contention_unsteady_text(c.fit) << ", above the "
       << 100 * calib::kNoiseFlag << "% a profile can be trusted at: the host's cores were not steady while the "
       << "benches ran, so the fitted contention holds part of the time";
  return os.str();
}

void add_noise_json(Json& r, const calib::Calibration& c) {
  r["noise_pct"] = c.noise >= 0 ? Json(100 * c.noise) : Json(nullptr);
  r["contention_noise_pct"] = c.contention_noise >= 0 ? Json(100 * c.contention_noise) : Json(nullptr);
  r["trusted"] = !c.flagged;
  r["load_average"] = load_average();
}

void print_noise(const calib::Calibration& c) {
  if (c.noise < 0) return;
  std::cout << "noise (repeat variation): " << fmt::fixed(100 * c.noise, 1) << "%, load average "
            << fmt::fixed(load_average(), 2) << (c.flagged ? ": NOT TRUSTED (above 10%)" : "") << "\n";
  if (c.contention_noise >= 0)
    std::cout << "contention steadiness (interquartile range of the rows' busy/alone over its median): "
              << fmt::fixed(100 * c.contention_noise, 1) << "%\n";
}

// --published ROWS: the efficiency grid searched against validate's predictions of the (selected) rows, from
// --base-system or the preset of the rows' GPU.
int calibrate_published(const cli::CommandLine& cl, const std::string& out) {
  for (const char* f : {"--bench", "--trace", "--checkpoints", "--comm", "--max-ranks"})
    if (cl.has(f))
      throw InputError(std::string("--published fits a system's efficiencies to published rows; ") + f +
                       " belongs to the fit from bench and trace measurements, give one or the other");
  const std::string path = *cl.get("--published");
  Json rows = parse_json_file(path, "--published ");
  if (cl.has("--only")) rows = select_rows(rows, path, cl.get_list("--only"));
  const std::string preset = calib::rows_system_preset(rows, path);
  const System base = load_system(cl.get_or("--base-system", preset));
  const std::vector<calib::GridAxis> grid = calib::efficiency_grid();
  calib::PublishedFit fit = calib::fit_published(rows, path, base, grid);
  fit.profile.name = cl.get_or("--name", base.name + "-calibrated");
  fit.profile.drop_error_bands();  // the base's validated bands do not hold for a refit profile; unknown until measured
  const std::string origin = path + (cl.has("--only") ? " --only " + *cl.get("--only") : std::string());
  Json j = system_to_json(fit.profile);
  j["source"] = calib::describe_published_fit(fit, grid, origin, base.name);
  write_file_atomic(out, j.dump(2) + "\n");
  if (cl.flag("--json")) {
    Json r;
    Json fitted = Json::object(), axes = Json::array();
    for (std::size_t a = 0; a < grid.size(); ++a) {
      fitted[grid[a].field] = fit.best[a];
      axes.push_back({{"field", grid[a].field}, {"values", grid[a].values}});
    }
    r["fitted"] = fitted;
    r["grid"] = axes;
    r["candidates"] = fit.candidates;
    r["mape_pct"] = fit.mape_pct;
    r["max_abs_error_pct"] = fit.max_abs_pct;
    r["validation"] = validation_to_json(fit.at_best);
    r["profile"] = out;
    std::cout << r.dump(2) << "\n";
    return 0;
  }
  std::cout << "fitted to " << fit.at_best.rows.size() << " values of " << origin << " (" << fit.candidates
            << " grid points, from " << base.name << "): ";
  for (std::size_t a = 0; a < grid.size(); ++a) std::cout << (a ? ", " : "") << grid[a].field << " " << fit.best[a];
  std::cout << "; MAPE " << fmt::fixed(fit.mape_pct, 2) << "%, max " << fmt::fixed(fit.max_abs_pct, 2) << "%\n\n"
            << validation_text(fit.at_best) << "\nprofile: " << out << "\n";
  return 0;
}

Json checkpoint_json(const calib::CheckpointFit& ckpt, const System& profile) {
  return {{"saves", ckpt.saves}, {"loads", ckpt.loads}, {"save_bytes", ckpt.save_bytes},
          {"save_s", ckpt.save_s}, {"load_bytes", ckpt.load_bytes}, {"load_s", ckpt.load_s},
          {"node_write_GBps", profile.storage->node_write_bw / 1e9},
          {"node_read_GBps", profile.storage->node_read_bw / 1e9}};
}

void print_checkpoint_fit(const calib::CheckpointFit& ckpt, const System& profile) {
  std::cout << "storage: node write " << fmt::fixed(profile.storage->node_write_bw / 1e9, 4) << " GB/s"
            << (ckpt.saves ? " (" + std::to_string(ckpt.saves) + " saves)" : std::string(" (kept)"))
            << ", node read " << fmt::fixed(profile.storage->node_read_bw / 1e9, 4) << " GB/s"
            << (ckpt.loads ? " (" + std::to_string(ckpt.loads) + " loads)" : std::string(" (kept)")) << "\n";
}

}  // namespace

int calibrate(const Args& args) {
  cli::CommandLine cl("calibrate", args,
                      {{"--bench", true, "bench document(s) of `tessel bench --json`: one, or one alone and one --concurrent N (contention)"},
                       {"--published", true, "rows of published measurements (validate's schema): fit the efficiency grid to them"},
                       {"--only", true, "with --published: comma-separated row id prefixes to fit (e.g. korthikanti22_t4)"},
                       {"--trace", true, "comma list of measured Chrome traces (`tessel run --trace`): per-op fit"},
                       {"--checkpoints", true, "comma list of `tessel run --json` documents: the storage bandwidth from their checkpoint saves and loads"},
                       {"--base-system", true, "system preset or JSON the profile starts from [cpu; --published: the rows' GPU's]"},
                       {"--comm", true, "communicator whose collective rows set the link: thread|mpi|nccl [thread]"},
                       {"--max-ranks", true, "ignore collective rows of larger groups (e.g. the core count) [all]"},
                       {"--max-noise", true, "refuse to write a profile when the measurements vary by more (percent) [25]"},
                       {"--name", true, "name of the profile [<base>-calibrated]"},
                       {"-o", true, "write the profile (a system JSON) here (required)"},
                       {"--json", false, "print the fit report as one JSON document"},
                       {"--closed-loop", false, "bench, calibrate, predict and run held-out layouts: the loop (below)"},
                       {"--quick", false, "closed loop: a tiny model and 3 held-out layouts (checks the mechanics)"},
                       {"--repeats", true, "closed loop: repeats of the whole loop [1; --quick 1]"},
                       {"--steps", true, "closed loop: optimizer steps per run, the first is warm-up [6; --quick 3]"},
                       {"--runs", true, "closed loop: runs of each held-out layout, a pass over all apart; the fastest is kept [3; --quick 2]"},
                       {"--out", true, "closed loop: folder for its bench, traces, profiles and results [closed_loop]"},
                       {"--backend", true, "closed loop: cpu or cuda (CUDA builds) [cpu]"},
                       {"--gpu-threads", false, "closed loop, cuda: every rank a thread on the one GPU"},
                       {"--no-mpi", false, "closed loop: leave out the held-out layouts run under mpirun"},
                       {"--svg", true, "closed loop: write the predicted-vs-measured figure here"}},
                      0);
  if (cl.print_help()) return 0;
  if (cl.flag("--closed-loop")) return closed_loop(cl);
  for (const char* f : {"--quick", "--repeats", "--steps", "--runs", "--out", "--backend", "--gpu-threads", "--svg", "--no-mpi"})
    if (cl.has(f)) throw InputError(std::string(f) + ": a flag of --closed-loop, which is not given");
  const auto out = cl.get("-o");
  if (!out) throw InputError("-o PROFILE.json is required (where the fitted system goes)");
  if (!cl.has("--bench") && !cl.has("--trace") && !cl.has("--checkpoints") && !cl.has("--published"))
    throw InputError("give --bench FILE and/or --trace FILES, or --published ROWS (or --checkpoints RUNS "
                     "for the storage bandwidth)");
  check_writable(*out, "-o");
  if (cl.has("--published")) return calibrate_published(cl, *out);
  if (cl.has("--only")) throw InputError("--only selects rows of --published, and none is given");
  calib::CalibrationInputs in;
  in.base = load_system(cl.get_or("--base-system", "cpu"));
  in.options.comm = cl.get_or("--comm", "thread");
  if (in.options.comm != "thread" && in.options.comm != "mpi" && in.options.comm != "nccl")
    throw InputError("--comm " + in.options.comm + ": expected thread, mpi or nccl");
  in.options.max_ranks = static_cast<int>(cl.get_int("--max-ranks", 2, 1 << 16).value_or(0));
  in.refuse_noise = cl.get_double("--max-noise", 0.0, 1000.0).value_or(100 * calib::kNoiseRefuse) / 100;
  in.name = cl.get_or("--name", "");
  in.output = *out;
  if (cl.has("--bench"))
    for (const std::string& path : cl.get_list("--bench")) in.benches.push_back(calib::load_bench(path));
  if (cl.has("--trace")) {
    for (const auto& p : cl.get_list("--trace")) {
      refuse_directory(p, "--trace ");  // the reader names the path only (compare's positional files share it)
      in.traces.push_back(trace::read_chrome_trace(p));
      in.trace_origins.push_back(p);
    }
  }
  if (cl.has("--checkpoints")) in.checkpoint_runs = cl.get_list("--checkpoints");
  const calib::Calibration c = calib::calibrate(in);
  for (const auto& w : c.trace.warnings) std::cerr << "tessel calibrate: warning: " << w << "\n";
  if (c.flagged) std::cerr << "tessel calibrate: warning: " << noise_warning(c) << "\n";
  Json j = system_to_json(c.fit.profile);
  j["source"] = c.source;  // from the profile as written, naming which fit set which field
  write_file_atomic(*out, j.dump(2) + "\n");
  calib::FitResult fit = c.fit;
  fit.notes.insert(fit.notes.end(), c.provenance.notes.begin(), c.provenance.notes.end());  // the report lists both fits' notes
  if (cl.flag("--json")) {
    Json r = fit_to_json(fit, c.traced ? &c.trace : nullptr);
    add_noise_json(r, c);
    if (c.checkpoint) r["checkpoints"] = checkpoint_json(*c.checkpoint, c.fit.profile);
    r["profile"] = *out;
    std::cout << r.dump(2) << "\n";
  } else {
    if (c.checkpoint) print_checkpoint_fit(*c.checkpoint, c.fit.profile);
    print_report(fit, c.traced ? &c.trace : nullptr, *out);
    print_noise(c);
  }
  return 0;
}

}  // namespace tessel::cmd
