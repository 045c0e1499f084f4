#include "sim/calibrate/trace_events.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "sim/engine/host_model.hpp"
#include "traces/steps.hpp"
#include "util/error.hpp"

namespace tessel::calib {

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double spread_of(std::vector<double> v) {
  if (v.size() < 2) return 0;
  std::sort(v.begin(), v.end());
  const double med = median_of(v);
  return med > 0 ? (v[(3 * v.size()) / 4] - v[v.size() / 4]) / med : 0;
}

std::vector<TraceSpec> trace_specs(const std::vector<trace::Trace>& traces, const std::vector<std::string>& origins) {
  std::vector<TraceSpec> out;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const Json& od = traces[i].other_data;
    const std::string& where = origins.at(i);
    // A trace of `tessel simulate` carries the prediction itself (and names the model only by name): fitting
    // the cost model to its own output would be circular.
    if (od.is_object() && od.contains("tool") && od.at("tool").is_string() &&
        od.at("tool").get<std::string>().rfind("tessel simulate", 0) == 0)
      throw InputError(where + ": a simulated trace (otherData.tool \"" + od.at("tool").get<std::string>() +
                       "\"); calibrate fits measured traces: write one with `tessel run --trace`");
    if (!od.is_object() || !od.contains("model") || !od.contains("layout"))
      throw InputError(where + ": otherData must hold the model and layout (a trace of `tessel run --trace`)");
    out.push_back({parse_model(od.at("model"), where + ": otherData.model"),
                   parse_layout(od.at("layout"), where + ": otherData.layout")});
  }
  return out;
}

bool predicted_op(const std::string& op, int stage, int rank, const Layout& l, const StepCosts& c, double& out) {
  if (op == "optimizer") {
    const int pp = rank / (l.tp * l.cp * l.dp);
    if (pp < 0 || pp >= static_cast<int>(c.tail.size())) return false;
    out = c.tail[static_cast<std::size_t>(pp)].optimizer_s;
    return out > 0;
  }
  if (stage < 0 || stage >= static_cast<int>(c.work.stages.size())) return false;
  const StageWork& st = c.work.stages[static_cast<std::size_t>(stage)];
  if (op == "forward") out = st.f;
  else if (op == "backward") out = st.i + st.w;
  else if (op == "input_grad") out = st.i;
  else if (op == "weight_grad") out = st.w;
  else return false;
  return out > 0;
}

namespace {

// A compute event of a stage op must belong to the trace's layout: a micro-batch or stage outside it would
// be fitted as one more op of the step (and a stage beyond the estimate's silently skipped).
void check_in_layout(const trace::OpEvent& e, const Layout& l, std::size_t stages, const std::string& where) {
  if (e.stream != trace::Stream::compute ||
      (e.op != "forward" && e.op != "backward" && e.op != "input_grad" && e.op != "weight_grad"))
    return;
  const int mbs = l.num_microbatches();
  std::ostringstream os;
  os << where << ": event '" << e.name << "' (rank " << e.rank << ", " << e.op << ", stage " << e.stage << ", mb " << e.mb
     << ", ts " << e.start_us << " us): ";
  if (e.mb < 0 || e.mb >= mbs) {
    os << "mb " << e.mb << " is outside the layout's " << mbs << " micro-batch(es) (global_batch " << l.global_batch
       << " / (micro_batch " << l.micro_batch << " x dp " << l.dp << ")); events must belong to the traced layout";
    throw InputError(os.str());
  }
  if (e.stage < 0 || e.stage >= static_cast<int>(stages)) {
    os << "stage " << e.stage << " is outside the layout's " << stages << " stage(s) (pp " << l.pp << " x vpp " << l.vpp
       << "); events must belong to the traced layout";
    throw InputError(os.str());
  }
}

// A fitted event's duration must be a measurement: Tessel's traces give times to the nanosecond (%.3f us,
// traces/chrome.cpp), so a duration between 0 and 1 ns was not measured, and fitting it would scale the
// rates by up to 1e300. (0 us events are skipped below; the trace reader bounds durations from above.)
constexpr double kMinMeasuredUs = 1e-3;

void check_measured(const trace::OpEvent& e, const std::string& where) {
  if (e.dur_us <= 0 || e.dur_us >= kMinMeasuredUs) return;
  std::ostringstream os;
  os << where << ": event '" << e.name << "' (rank " << e.rank << ", " << e.op << ", stage " << e.stage << ", mb " << e.mb
     << ", ts " << e.start_us << " us): dur " << e.dur_us << " us is below the trace's 1 ns resolution; a fitted "
     << "op's duration must be a measurement (at least 0.001 us)";
  throw InputError(os.str());
}

}  // namespace

void check_events(const std::vector<trace::Trace>& traces, const std::vector<TraceSpec>& specs,
                  const std::vector<std::string>& origins) {
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const std::size_t stages = static_cast<std::size_t>(specs[i].layout.num_stages());
    for (const trace::OpEvent& e : traces[i].events) {
      check_in_layout(e, specs[i].layout, stages, origins.at(i));
      if (e.stream == trace::Stream::compute) check_measured(e, origins.at(i));
    }
  }
}

namespace {

bool fitted_kind(const std::string& op) {
  return op == "forward" || op == "backward" || op == "input_grad" || op == "weight_grad" || op == "optimizer";
}

// The load around compute event i, in one pass over the other ranks' compute events (quadratic in them; a CPU
// run has a few thousand): `busy` = the mean ranks computing during it, itself included (the pool view). With
// `cores` > 0, the host model's view, each rank on its home core: `crowd` = the mean ranks computing on its
// core, itself included, and `busy_cores` = the mean cores with a rank computing, its own always.
struct Load {
  double busy = 1, crowd = 1, busy_cores = 1;
};

Load load_around(const trace::Trace& t, const std::vector<std::size_t>& compute, std::size_t i, int cores) {
  const trace::OpEvent& e = t.events[i];
  Load out;
  if (!(e.dur_us > 0)) return out;
  const int mine = cores > 0 ? engine::home_core(e.rank, cores) : 0;
  const double b = e.start_us, f = e.start_us + e.dur_us;
  double all = 0, same = 0;
  std::vector<std::vector<std::pair<double, double>>> on(static_cast<std::size_t>(std::max(cores, 0)));
  for (std::size_t j : compute) {
    const trace::OpEvent& o = t.events[j];
    if (o.rank == e.rank) continue;
    const double lo = std::max(b, o.start_us), hi = std::min(f, o.start_us + o.dur_us);
    if (hi <= lo) continue;
    all += hi - lo;
    if (cores <= 0) continue;
    const int k = engine::home_core(o.rank, cores);
    if (k == mine) same += hi - lo;
    else on[static_cast<std::size_t>(k)].emplace_back(lo, hi);
  }
  out.busy = 1 + all / e.dur_us;
  out.crowd = 1 + same / e.dur_us;
  double covered = 0;  // other cores' busy time: the union of their ranks' intervals, core by core
  for (auto& v : on) {
    std::sort(v.begin(), v.end());
    double end = -1e300;
    for (const auto& [lo, hi] : v) {
      if (hi <= end) continue;
      covered += hi - std::max(lo, end);
      end = hi;
    }
  }
  out.busy_cores = 1 + covered / e.dur_us;
  return out;
}

}  // namespace

MeasuredOps measure_ops(const std::vector<trace::Trace>& traces, const std::vector<std::string>& origins, int cores) {
  MeasuredOps out;
  using Key = std::tuple<std::size_t, int, std::string, int, int, int>;
  std::map<Key, std::size_t> at;
  std::vector<std::vector<double>> durations, busy, crowd, busy_cores;
  for (std::size_t ti = 0; ti < traces.size(); ++ti) {
    const trace::Trace& t = traces[ti];
    const trace::StepSplit split = trace::split_steps(t, origins.at(ti));
    const int first_steady = split.count() > 1 ? 1 : 0;  // step 0 is warm-up when there is another
    std::vector<std::size_t> compute;
    for (std::size_t i = 0; i < t.events.size(); ++i)
      if (t.events[i].stream == trace::Stream::compute) compute.push_back(i);
    for (std::size_t i = 0; i < t.events.size(); ++i) {
      const trace::OpEvent& e = t.events[i];
      if (e.stream != trace::Stream::compute || !fitted_kind(e.op) || !(e.dur_us > 0)) {
        ++out.skipped;
        continue;
      }
      if (split.step_of[i] < first_steady) continue;
      const Key k{ti, e.rank, e.op, e.stage, e.chunk, e.mb};
      auto [it, fresh] = at.emplace(k, out.ops.size());
      if (fresh) {
        MeasuredOp m;
        m.trace = ti;
        m.rank = e.rank;
        m.op = e.op;
        m.stage = e.stage;
        m.chunk = e.chunk;
        m.mb = e.mb;
        m.flops = e.flops;
        out.ops.push_back(m);
        durations.emplace_back();
        busy.emplace_back();
        crowd.emplace_back();
        busy_cores.emplace_back();
      }
      durations[it->second].push_back(e.dur_us * 1e-6);
      const Load load = load_around(t, compute, i, cores);
      busy[it->second].push_back(load.busy);
      if (cores > 0) {
        crowd[it->second].push_back(load.crowd);
        busy_cores[it->second].push_back(load.busy_cores);
      }
    }
  }
  std::vector<double> spreads;
  for (std::size_t k = 0; k < out.ops.size(); ++k) {
    MeasuredOp& m = out.ops[k];
    m.instances = static_cast<int>(durations[k].size());
    m.median_s = median_of(durations[k]);
    m.spread = spread_of(durations[k]);
    double s = 0;
    for (double b : busy[k]) s += b / busy[k].size();
    m.busy_ranks = s;
    if (!crowd[k].empty()) {
      m.crowd = m.busy_cores = 0;
      for (std::size_t j = 0; j < crowd[k].size(); ++j) {
        m.crowd += crowd[k][j] / crowd[k].size();
        m.busy_cores += busy_cores[k][j] / crowd[k].size();
      }
    }
    if (m.instances > 1) spreads.push_back(m.spread);
  }
  out.noise = median_of(spreads);
  return out;
}

}  // namespace tessel::calib
