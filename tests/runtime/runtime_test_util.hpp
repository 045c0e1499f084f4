// Helpers for the runtime numerics tests: a micro GPT that still exercises every path (8 layers so pp 4 x
// vpp 2 has a layer per stage; 2 heads and even sizes so tp 2 splits heads, ffn and vocab), and layouts.
#pragma once

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "models/model.hpp"
#include "runtime/comm/thread_comm.hpp"
#include "runtime/trainer.hpp"
#include "runtime/trainer_checkpoint.hpp"
#include "sim/layout.hpp"

namespace tessel::test {

inline Model micro_gpt() {
  Model m;
  m.name = "micro";
  m.layers = 8;
  m.hidden = 16;
  m.heads = 2;
  m.kv_heads = 2;
  m.head_dim = 8;
  m.ffn = 32;
  m.vocab = 32;
  m.seq_len = 8;
  return m;
}

inline Layout layout(int tp, int pp, int dp, const std::string& schedule, int vpp, int gbs) {
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.vpp = vpp;
  l.schedule = sched::parse_schedule(schedule, "case");
  l.micro_batch = 1;
  l.global_batch = gbs;
  l.precision = Precision::fp32;
  return l;
}

inline double rel_err(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

// Rank 0's losses of `steps` steps of layout l on ranks as threads, optionally resuming from / saving a
// recovery checkpoint to a folder (seed 1234 both ways).
inline std::vector<double> run_losses(const Layout& l, int steps, const std::string& resume, const std::string& save,
                                      const Model& m = micro_gpt()) {
  std::vector<double> losses;
  std::mutex mu;
  rt::run_threads(l.gpus(), [&](rt::Comm& world) {
    rt::Trainer t(m, l, {}, world, rt::Recorder::Clock::now());
    if (!resume.empty()) rt::load_checkpoint(t, resume, 1234);
    std::vector<double> mine;
    for (int i = 0; i < steps; ++i) mine.push_back(t.step().loss);
    if (!save.empty()) rt::save_checkpoint(t, save, 1234);
    std::lock_guard<std::mutex> lk(mu);
    if (world.rank() == 0) losses = mine;
  });
  return losses;
}

}  // namespace tessel::test
