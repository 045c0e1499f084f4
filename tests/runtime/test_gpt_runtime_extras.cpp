// Recovery-checkpoint resume, the measured trace's op identities, and the activation-memory tracker.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <mutex>

#include "runtime/comm/thread_comm.hpp"
#include "sim/engine/sim_trace.hpp"
#include "sim/engine/simulate.hpp"
#include "traces/compare.hpp"
#include "runtime/trainer_checkpoint.hpp"
#include "tests/runtime/runtime_test_util.hpp"

using namespace tessel;
using namespace tessel::test;

namespace {

std::string fresh_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("tessel_rt_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

}  // namespace

TEST_CASE("resume continues with bit-identical losses on the same layout and within 1e-5 on another") {
  // Same layout: the checkpoint holds parameters and Adam moments exactly and the data is a function of the
  // step, so steps 3-4 after a resume must equal steps 3-4 of an uninterrupted run bit for bit.
  Layout a = layout(2, 2, 1, "1f1b", 1, 8);
  a.zero_stage = 0;
  const auto whole = run_losses(a, 4, "", "");
  const std::string dir = fresh_dir("resume");
  run_losses(a, 2, "", dir);
  const auto resumed = run_losses(a, 2, dir, "");
  REQUIRE(resumed.size() == 2u);
  CHECK(resumed[0] == whole[2]);
  CHECK(resumed[1] == whole[3]);
  // Another layout (tp1 pp4 dp2, ZeRO-1): resharded on load; fp32 reordering only, so 1e-5 relative.
  Layout b = layout(1, 4, 2, "1f1b", 1, 8);
  b.zero_stage = 1;
  const auto other = run_losses(b, 2, dir, "");
  CHECK(rel_err(other[0], whole[2]) < 1e-5);
  CHECK(rel_err(other[1], whole[3]) < 1e-5);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a checkpoint moves between stage splits") {
  // Saved by pp 2 with 3 + 5 layers (the first rank holds layers 0-2, the second 3-7), resumed by 5 + 3, by
  // an interleaved pp 2 x vpp 2 split 1,3,2,2 (rank 0 holds layers 0 and 4-5, rank 1 layers 1-3 and 6-7)
  // and by one rank: each reads its layers wherever the saver held them. The losses of steps 3-4 are the
  // uninterrupted even-split run's within 1e-5 relative (fp32 reordering only, as across layouts above).
  Layout even = layout(1, 2, 1, "1f1b", 1, 8);
  const auto whole = run_losses(even, 4, "", "");
  Layout saver = even;
  saver.stage_layers = {3, 5};
  const std::string dir = fresh_dir("resplit");
  run_losses(saver, 2, "", dir);
  Layout flipped = even;
  flipped.stage_layers = {5, 3};
  Layout inter = layout(1, 2, 1, "interleaved", 2, 8);
  inter.stage_layers = {1, 3, 2, 2};
  for (const Layout& l : {flipped, inter, layout(1, 1, 1, "1f1b", 1, 8)}) {
    CAPTURE(l.describe());
    const auto resumed = run_losses(l, 2, dir, "");
    REQUIRE(resumed.size() == 2u);
    CHECK(rel_err(resumed[0], whole[2]) < 1e-5);
    CHECK(rel_err(resumed[1], whole[3]) < 1e-5);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("the measured trace names every compute op with its stage, chunk and micro-batch, and pairs p2p ops") {
  // pp 2 x vpp 2 zbv with 4 micro-batches: each of the 4 stages runs F, I and W once per micro-batch;
  // every send has one recv with the same flow id.
  Layout l = layout(1, 2, 1, "zbv", 2, 4);
  rt::TrainOptions opt;
  opt.record_trace = true;
  const auto r = rt::train_threads(micro_gpt(), l, opt, 1);
  std::map<std::string, int> per_op;
  std::map<std::int64_t, int> flows;
  for (const auto& e : r.trace.events) {
    if (e.op == "forward" || e.op == "input_grad" || e.op == "weight_grad" || e.op == "backward") {
      CHECK(e.stage >= 0);
      CHECK(e.chunk >= 0);
      CHECK(e.mb >= 0);
      CHECK(e.layer_end - e.layer_begin == 2);  // 8 layers over 4 stages
      ++per_op[e.op];
    }
    if (e.op == "send" || e.op == "recv") ++flows[e.flow_id];
  }
  CHECK(per_op["forward"] == 16);
  CHECK(per_op["input_grad"] + per_op["backward"] == 16);
  CHECK(per_op["weight_grad"] + per_op["backward"] == 16);
  for (const auto& [id, n] : flows) CHECK(n == 2);
  CHECK(!flows.empty());
  CHECK(r.trace.process_names.size() == 2u);
}

// The measured trace and the simulator's trace of the same layout align op by op (design: the op args
// are the shared identity): every op of the simulated trace finds its measured counterpart and every op the
// run has on the simulated ranks finds its simulated one: the tensor-parallel collectives one per layer,
// the vocab-parallel embedding's and cross-entropy's (three all-reduces, Megatron's) and the head's, with
// and without SP, and the recvs under the receiving stage. What only the run has: the folded tp peers' ops.
TEST_CASE("a simulated trace of the run's layout aligns with the measured one op by op") {
  for (bool sp : {false, true}) {
    CAPTURE(sp);
    Layout l = layout(2, 2, 1, "zbv", 2, 4);
    l.recompute = Recompute::none;
    l.sequence_parallel = sp;
    l.attention = AttentionImpl::unfused;
    l.precision = Precision::fp32;
    const Model m = micro_gpt();
    rt::TrainOptions opt;
    opt.record_trace = true;
    const auto run = rt::train_threads(m, l, opt, 1);
    const System sys = load_system("cpu");
    const engine::SimReport sim = engine::simulate(m, l, sys);
    const trace::Trace st = engine::to_trace(sim, sys);
    const trace::Comparison c = trace::compare_traces(st, run.trace);
    std::string only_a;
    for (const auto& o : c.only_in_a) only_a += o.op + " x" + std::to_string(o.count) + " ";
    CAPTURE(only_a);
    CHECK(c.unmatched_a.empty());
    CHECK(c.matched == c.events_a);
    int edge_ops = 0;  // matched tp collectives over a stage's range: embedding, cross-entropy, head
    for (const auto& p : c.pairs) {
      const auto& e = st.events[p.a];
      edge_ops += e.stream == trace::Stream::tp && e.layer_end - e.layer_begin == 2;
    }
    // Per micro-batch, 5 of them: embedding forward, 3 cross-entropy all-reduces, the head's input gradient;
    // SP adds the head's gather and the embedding's backward gather.
    CHECK(edge_ops == l.num_microbatches() * (sp ? 7 : 5));
    // SP's once-a-step all-reduce of the tp-replicated gradients carries the run's bytes: norms, row-parallel
    // biases and, on the first stage, the learned positions (partial under SP, as the norms).
    int sp_reductions = 0;
    for (const auto& p : c.pairs) {
      const auto& e = st.events[p.a];
      if (e.op != "tp_allreduce" || e.mb >= 0) continue;
      ++sp_reductions;
      CAPTURE(e.rank);
      CHECK(e.bytes == run.trace.events[p.b].bytes);
    }
    CHECK(sp_reductions == (sp ? 2 : 0));  // the two simulated ranks: tp rank 0 of each stage
    for (std::size_t i : c.unmatched_b) {
      const auto& e = run.trace.events[i];
      CAPTURE(e.name);
      CHECK(e.rank % l.tp != 0);  // a folded tp peer
    }
  }
}

TEST_CASE("activation memory: selective keeps less than none, full less than selective") {
  // Selective drops the b*H*s*s probabilities per layer; full keeps only each block's input, so the peaks
  // must be strictly ordered on the same layout and schedule.
  std::int64_t peak[3];
  int i = 0;
  for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
    Layout l = layout(1, 2, 1, "1f1b", 1, 8);
    l.recompute = rc;
    l.recompute_layers = 1;
    peak[i++] = rt::train_threads(micro_gpt(), l, {}, 1).peak_activation_bytes[0];
  }
  MESSAGE("peak activation bytes none/selective/full: " << peak[0] << " " << peak[1] << " " << peak[2]);
  CHECK(peak[0] > peak[1]);
  CHECK(peak[1] > peak[2]);
}

// The CPU runtime blocks at each recv where its list has it, so the list fixes when a rank waits. Its sends
// never wait (buffered), so it plays the list the simulator plays: every recv right before the op that
// consumes it. (Until 2026-12 it played ZB's rendezvous-safe order, whose recvs can sit a gap early: a
// zb1p first stage waited for B mb k's gradient before running F mb k+2, and pp2 zb1p measured 367 ms a
// step where the simulator, with the same op times, gave 290 ms.)
TEST_CASE("the CPU runtime plays the simulator's list: each recv right before the op that consumes it") {
  const Model m = micro_gpt();
  const System sys = load_system("cpu");
  struct Case { int pp; const char* schedule; int vpp, gbs; };
  for (const Case& c : {Case{2, "zb1p", 1, 8}, Case{4, "1f1b", 1, 8}, Case{2, "interleaved", 2, 4}, Case{2, "zbv", 2, 4},
                        Case{2, "gpipe", 1, 4}}) {
    Layout l = layout(1, c.pp, 1, c.schedule, c.vpp, c.gbs);
    l.recompute = Recompute::none;
    l.attention = AttentionImpl::unfused;
    CAPTURE(l.describe());
    const sched::Schedule run = rt::runtime_schedule(l, rt::SendMode::eager);
    const sched::Schedule sim = engine::simulate(m, l, sys).schedule;
    REQUIRE(run.ranks.size() == sim.ranks.size());
    for (std::size_t r = 0; r < run.ranks.size(); ++r) {
      std::string a, b;
      for (const auto& x : run.ranks[r])
        if (!sched::is_wait_send(x.type)) a += x.token() + " ";
      for (const auto& x : sim.ranks[r]) b += x.token() + " ";
      CAPTURE(r);
      CHECK(a == b);
      // Each recv is followed, after any other recvs, by the compute that consumes it.
      const auto& acts = run.ranks[r];
      for (std::size_t k = 0; k < acts.size(); ++k) {
        if (!sched::is_comm(acts[k].type) || sched::is_send(acts[k].type) || sched::is_wait_send(acts[k].type)) continue;
        std::size_t n = k + 1;
        while (n < acts.size() && (sched::is_comm(acts[n].type) || sched::is_wait_send(acts[n].type))) ++n;
        REQUIRE(n < acts.size());
        const bool fwd = acts[k].type == sched::ActionType::RECV_F;
        const sched::Action& use = acts[n];
        CAPTURE(acts[k].token());
        CAPTURE(use.token());
        CHECK(use.mb == acts[k].mb);
        CHECK(use.stage == acts[k].stage);
        CHECK((fwd ? use.type == sched::ActionType::F : use.type != sched::ActionType::F));
      }
    }
    // The rendezvous order the CUDA runtime keeps differs where it moves a recv a gap early (zb1p's RECV_B).
    if (std::string(c.schedule) == "zb1p") {
      const sched::Schedule nccl = rt::runtime_schedule(l, rt::SendMode::rendezvous);
      std::string a, b;
      for (const auto& x : nccl.ranks[0]) a += x.token() + " ";
      for (const auto& x : run.ranks[0]) b += x.token() + " ";
      CHECK(a != b);
    }
  }
}

// The step's end as both sides have it: the gradient norm's pass before the optimizer (every rank its shard
// under ZeRO, dp rank 0 of unsharded replicas, which hold the same gradients) and zeroing the gradients after
// it, on every rank, once a step. The simulator places the same ops on the same ranks.
TEST_CASE("the gradient norm and the gradients' zeroing are ops of the measured and the simulated step") {
  for (int zero : {0, 1}) {
    CAPTURE(zero);
    Layout l = layout(1, 1, 2, "1f1b", 1, 4);
    l.recompute = Recompute::none;
    l.attention = AttentionImpl::unfused;
    l.zero_stage = zero;
    const Model m = micro_gpt();
    rt::TrainOptions opt;
    opt.record_trace = true;
    const int steps = 2;
    const auto run = rt::train_threads(m, l, opt, steps);
    std::map<std::pair<int, std::string>, int> n;
    for (const auto& e : run.trace.events) ++n[{e.rank, e.op}];
    for (int rank = 0; rank < 2; ++rank) {
      CAPTURE(rank);
      CHECK(n[{rank, "zero_grad"}] == steps);
      CHECK(n[{rank, "grad_norm"}] == (zero >= 1 || rank == 0 ? steps : 0));
    }
    const System sys = load_system("cpu");
    const trace::Trace st = engine::to_trace(engine::simulate(m, l, sys), sys);
    std::map<std::pair<int, std::string>, int> s;
    for (const auto& e : st.events) ++s[{e.rank, e.op}];
    for (int rank = 0; rank < 2; ++rank) {
      CAPTURE(rank);
      CHECK(s[{rank, "zero_grad"}] == 1);
      CHECK(s[{rank, "grad_norm"}] == (zero >= 1 || rank == 0 ? 1 : 0));
    }
    const trace::Comparison c = trace::compare_traces(st, run.trace);
    CHECK(c.unmatched_a.empty());
  }
}
