#include "sim/engine/simulate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "util/error.hpp"
#include "sim/engine/host_model.hpp"
#include "sim/estimate.hpp"

namespace tessel::engine {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}


sched::Schedule schedule_for(const Layout& l, const StepCosts& sc, const std::optional<sched::Schedule>& given) {
  const sched::CommModel comm = sched::CommModel::Eager;  // as the engine plays transfers (job_pipeline.cpp)
  sched::Schedule s;
  bool lowered_here = false;
  // A file is checked by the validator as written, before any lowering, so that its message points at
  // the file's own actions (the lowered schedule's positions are not the file's); generated schedules are
  // valid by construction (tests/schedule), and eager transfers cannot deadlock a valid compute order.
  sched::ValidateOptions vo;
  vo.comm = comm;
  vo.max_violations = 1;
  auto check = [&](const sched::Schedule& x) {
    const auto rep = sched::validate(x, vo);
    if (!rep.ok())
      throw InputError("schedule '" + x.generator + "': " + rep.violations[0].rule + ": " + rep.violations[0].message);
  };
  if (given) {
    check(*given);
    s = *given;
    // PyTorch 2.15's send waits retire a send's buffer; the engine plays transfers eagerly (a send never
    // blocks its rank), so they are not played.
    for (auto& rank : s.ranks) std::erase_if(rank, [](const sched::Action& a) { return sched::is_wait_send(a.type); });
    bool lowered = false;
    for (const auto& r : s.ranks)
      for (const auto& a : r) lowered = lowered || sched::is_comm(a.type);
    if (!lowered) {
      s = sched::lower(s, sched::GapOrder::SendsFirst);
      lowered_here = true;
    }
  } else {
    sched::GenParams p = schedule_params(l);
    sched::Costs c;
    c.F.clear();
    c.B.clear();
    c.W.clear();
    for (const auto& st : sc.work.stages) {
      c.F.push_back(st.f);
      c.B.push_back(st.i);
      c.W.push_back(st.w);
    }
    c.comm = sc.p2p_s;
    p.costs = c;
    // Under the engine's eager transfers the order of comm ops inside a gap does not change any time, so
    // the cheapest lowering does (Auto would search orders for blocking runtimes).
    // Without a pipeline the schedule name does not apply (layout_problem): micro-batches run one forward
    // and backward at a time, as Megatron's forward_backward_no_pipelining and the runtime play them, so
    // one micro-batch's activations are held whatever the name (a GPipe order would hold all m).
    const sched::Kind kind = l.pp == 1 && l.vpp == 1 ? sched::Kind::one_f_one_b : l.schedule;
    s = sched::lower(sched::generate(kind, p), sched::GapOrder::SendsFirst);
  }
  // Lowering a valid compute order just in time cannot break it under eager transfers; checked all the same.
  if (lowered_here) check(s);
  for (int st = 0; st < s.num_stages && st < l.num_stages(); ++st)
    if (s.rank_of(st) != l.rank_of_stage(st))
      throw InputError("schedule '" + s.generator + "': stage " + std::to_string(st) + " on rank " +
                       std::to_string(s.rank_of(st)) + ", but layout schedule " + sched::name(l.schedule) + " places it on rank " +
                       std::to_string(l.rank_of_stage(st)));
  return s;
}

}  // namespace

SimReport simulate(const Model& m, const Layout& l, const System& sys, SimOptions opt) {
  const auto t0 = std::chrono::steady_clock::now();
  check_runnable(m, l, sys, l.gpus());
  SimReport r;
  r.model = m;
  r.layout = l;
  r.system_name = sys.name;
  r.fidelity = opt.fidelity;
  r.gpus = l.gpus();
  r.microbatches = l.num_microbatches();
  r.costs = step_costs(m, l, sys);
  const Cluster cluster(l, sys, opt.fidelity);
  // The event graph holds a few tasks per position, stage and micro-batch: about 0.85 GB per million of
  // them here (measured: 4M in 3.4 GB and 8 s), so the limit keeps a run within a few GB.
  constexpr double kMaxPositionMicrobatches = 1 << 22;
  const double units = double(cluster.num_positions()) * l.vpp * l.num_microbatches();
  if (units > kMaxPositionMicrobatches)
    throw TooLargeToSimulate("simulation of " + std::to_string(cluster.num_positions()) + " rank positions x " + std::to_string(l.vpp) +
                     " stages each x " + std::to_string(l.num_microbatches()) + " micro-batches = " +
                     std::to_string(static_cast<long long>(units)) + " is over the limit of " +
                     std::to_string(static_cast<long long>(kMaxPositionMicrobatches)) +
                     " (use fewer micro-batches: a larger micro-batch or a smaller global batch; or --fidelity replica)");
  JobSpec spec;
  spec.layout = &l;
  spec.system = &sys;
  spec.costs = &r.costs;
  spec.fidelity = opt.fidelity;
  spec.ep_piece_budget = opt.ep_piece_budget;
  r.schedule = schedule_for(l, r.costs, opt.schedule);
  r.schedule_s = seconds_since(t0);
  spec.schedule = &r.schedule;
  r.job = build_job(spec, cluster);
  if (sys.host.cores > 0) {
    // Ranks sharing a host's cores (sim/engine/host_model.hpp): every compute op also priced with all cores
    // busy, from the same job built on the busy system.
    const System busy = busy_system(sys);
    const StepCosts busy_costs = step_costs(m, l, busy);
    JobSpec bs = spec;
    bs.system = &busy;
    bs.costs = &busy_costs;
    std::vector<int> first_rank;
    for (int p = 0; p < cluster.num_positions(); ++p) first_rank.push_back(cluster.global_rank(p));
    attach_host(r.job, build_job(bs, cluster), sys, l.tp, first_rank);
  }
  r.positions = cluster.num_positions();
  r.tasks = r.job.graph.size();
  const auto t1 = std::chrono::steady_clock::now();
  r.build_s = std::chrono::duration<double>(t1 - t0).count();
  {
    Simulator sim(r.job.graph);
    RunOptions ro;
    ro.memory_timeline = opt.memory_timeline;
    r.run = sim.run(ro);
  }
  r.run_s = seconds_since(t1);
  const auto t2 = std::chrono::steady_clock::now();
  r.events = r.run.events;
  for (auto t : r.job.step_end) r.step_s = std::max(r.step_s, r.run.end[t]);
  r.tokens_per_s = static_cast<double>(l.global_batch) * m.seq_len / r.step_s;
  const double flops = model_flops_per_step(r.costs.work);
  r.model_tflops_per_gpu = flops / r.step_s / r.gpus / 1e12;
  r.mfu = flops / r.step_s / r.gpus / sys.gpu.peak(l.precision);
  r.capacity_bytes = sys.gpu.memory_bytes;
  r.ranks = summarize_ranks(r.job, r.run, cluster, r.step_s);
  for (auto& k : r.ranks) {
    // The allocator's holes beside the activations it holds at the peak (estimate.cpp counts them alike).
    k.peak_bytes += l.fragmentation * (k.peak_activation_bytes + r.costs.zero3_gather_bytes + r.costs.recompute_transient_bytes);
    if (k.peak_bytes > r.peak_bytes) {
      r.peak_bytes = k.peak_bytes;
      r.peak_rank = k.global_rank;
    }
  }
  r.fits = r.peak_bytes + sys.min_headroom_bytes <= r.capacity_bytes;
  if (opt.critical_path)
    for (auto t : critical_path(r.job, r.run))
      r.critical_path.push_back({t, cluster.global_rank(r.job.info[t].pos), describe_task(r.job, t, cluster),
                                 r.run.start[t], r.run.end[t]});
  r.analysis_s = seconds_since(t2);
  return r;
}

}  // namespace tessel::engine
