// tessel calibrate --closed-loop: the closed loop in one command (docs/calibration.md, "The closed loop").
// One repeat: `tessel bench` alone and on every core at once, the calibration runs (`tessel run --trace`),
// the fit (sim/calibrate/calibration.hpp), then for each held-out layout the prediction (the event simulator
// on the profile, in this process) and the measurement (`tessel run`), compared step by step and op by op
// (sim/calibrate/loop_stats.hpp). Bench and runs are child processes of this executable, one at a time.
#pragma once

#include <string>
#include <vector>

#include "models/model.hpp"
#include "sim/calibrate/loop_stats.hpp"
#include "sim/layout.hpp"
#include "tools/cli.hpp"
#include "util/json_reader.hpp"

namespace tessel::cmd {

// A layout of the loop, as both `tessel run` flags and the simulator's Layout take it.
struct LoopLayout {
  std::string name;
  int tp = 1, pp = 1, dp = 1, vpp = 1, mbs = 1, gbs = 4;
  std::string schedule = "1f1b", recompute = "none";
  bool sp = false;
  int zero = 0;
  bool mpi = false;  // its ranks processes under mpirun, not threads of one process
  int ranks() const { return tp * pp * dp; }
};

// One held-out layout measured and predicted.
struct LoopRow {
  std::string layout;
  int ranks = 1;
  double measured_s = 0;        // median of the steady-state steps (all after the first), the fastest run's
  double spread = 0;            // their interquartile range over the median
  // Every held-out layout runs --runs times (3; --quick 2), a pass over all of them apart, so a disturbance of
  // a few seconds falls on one run of a layout, not on all: each run's median step, in pass order (runs_s),
  // and the next-fastest of them (other_run_s). measured_s, spread, the host block and the per-op errors are
  // the fastest run's. Empty and 0 where the layout ran once (calibration, drift).
  std::vector<double> runs_s;
  double other_run_s = 0;
  // next-fastest / fastest - 1: how far the kept run stands from the one that confirms it; 0 where the
  // layout ran once.
  double run_to_run() const { return other_run_s > 0 && measured_s > 0 ? other_run_s / measured_s - 1 : 0; }
  double predicted_s = 0;
  double error = 0;             // predicted / measured - 1
  std::vector<calib::OpError> ops;
  // The host's cores in a step (CPU backend, where the kernel counts them: runtime/host_sched.hpp), medians
  // of the steady-state steps: the ranks' CPU seconds, their seconds runnable but waiting for a core, and the
  // cores' idle seconds (cores x step - CPU); predicted: the engine's compute ops' CPU seconds (each op's time
  // alone, times its position's threads) and the idle seconds that leaves (below zero where the engine counts
  // a rank's all-reduce waits as CPU: docs/calibration.md). measured_cpu_s < 0: not measured, no `host` block.
  double measured_cpu_s = -1, measured_run_delay_s = -1, measured_idle_s = -1;
  double predicted_cpu_s = -1, predicted_idle_s = -1;
  // Steal time over the run (Linux /proc/stat: the hypervisor running something else on this guest's vCPUs),
  // as a share of the cores' time; negative: not known.
  double steal = -1;
};

struct LoopRepeat {
  int repeat = 0;
  double load_before = -1, load_after = -1;  // load average over the last minute
  double calibration_noise = -1;             // the fit's (bench and calibration traces)
  double contention_noise = -1;              // the contention fit's unsteadiness (calib::Calibration)
  std::string contention_unsteady;           // why, when above the flag level (calib::contention_unsteady_text)
  double measurement_noise = 0;              // median spread of the held-out runs' steps
  // Median over the held-out layouts of LoopRow::run_to_run(): how far one layout's two fastest runs disagree, which
  // a disturbance lasting a whole run (its steps steady, no steal counted) shows and the spread does not.
  double run_to_run = 0;
  // The machine's drift over the repeat: every calibration run measured again after the held-out runs, the
  // largest |end / start - 1| of their median steps. A load that comes and goes between runs leaves each run's
  // steps steady (small spreads) while it moves the runs apart, which only a repeated run shows; and a slowdown
  // of one core, which the one-rank run does not feel, moves the two-rank one (on a 2-vCPU VM the multi-rank
  // held-out runs of a repeat were 13-36% slower than in the other repeats, in both passes, while the
  // one-rank rerun moved 3.8%).
  double drift = 0;
  // Each calibration layout's runs (median steps, in pass order); the fit took the fastest one's trace.
  std::vector<std::vector<double>> calibration_runs_s;
  std::string drift_layout;                  // the calibration layout that moved most, and its median steps
  double drift_from_s = 0, drift_to_s = 0;   // at the start and at the end
  // The largest steal share of one run of the repeat (calibration, held-out or drift): a run whose host lost
  // its vCPUs to another guest is slower with steady steps, which neither the noises nor the drift see when
  // it falls on one run. Negative: not known.
  double steal = -1;
  bool trusted = true;                       // the noises, the drift and the steal within 10%
  std::string profile;                       // its file
  Json calibration;                          // the fit report (as calibrate --json writes it)
  std::vector<LoopRow> rows;
  double median_abs_error = 0, op_median_abs_error = 0, kendall_tau = 0;
};

struct LoopResult {
  std::string backend = "cpu";
  bool quick = false;
  int cores = 0;
  int runs = 3;  // runs of each held-out layout (--runs)
  Model model;
  std::vector<LoopLayout> calibration, held_out;
  std::vector<LoopRepeat> repeats;
  std::string date;  // UTC, when the loop ended
};

int closed_loop(const cli::CommandLine& cl);

// closed_loop_report.cpp: the JSON document, the text tables and the figure.
Json loop_to_json(const LoopResult& r);
void print_loop(const LoopResult& r);
// Predicted against measured: step times (left) and per-op totals (right), log-log, one colour per repeat.
std::string loop_svg(const LoopResult& r);

}  // namespace tessel::cmd
