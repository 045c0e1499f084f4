// Fuzz targets for traces: Tessel Chrome traces, PyTorch profiler (Kineto) traces, and whole trace files
// (gzip or plain, told apart by magic bytes and sniffing, as `tessel compare` does). A parsed trace goes to
// the consumers of `tessel compare`: summaries, per-rank statistics, the SVG timeline; a Tessel trace must
// survive a write/read round trip with its events intact.
#include <cstdio>
#include <fstream>

#include "util/error.hpp"
#include "tests/fuzz/fuzz_check.hpp"
#include "tests/fuzz/targets.hpp"
#include "traces/chrome.hpp"
#include "traces/compare.hpp"
#include "traces/event_reader.hpp"
#include "traces/kineto.hpp"
#include "traces/steps.hpp"
#include "traces/summary.hpp"
#include "traces/svg.hpp"

namespace tessel::fuzz {

namespace {
void use_trace(const trace::Trace& t) {
  const trace::Trace back = trace::parse_chrome_trace(trace::to_chrome_json(t), "round-trip");
  FUZZ_CHECK(back.events.size() == t.events.size(), "Chrome trace round trip lost or added events");
  (void)trace::summarize(t);
  (void)trace::rank_stats(t);
  // compare's step split: a trace that is not whole steps is an InputError, anything else splits into
  // steps whose events cover the trace once.
  try {
    const trace::StepSplit steps = trace::split_steps(t, "fuzz-trace");
    FUZZ_CHECK(steps.step_of.size() == t.events.size(), "step split does not cover every event");
    const trace::StepChoice c = trace::choose_step(steps, std::nullopt, "--step", "fuzz-trace");
    FUZZ_CHECK(c.step >= 0 && c.step < steps.count(), "chosen step outside the trace's steps");
    (void)trace::step_trace(t, steps, c.step);
  } catch (const InputError&) {
  }
  trace::SvgOptions opt;
  opt.width_px = 200;  // small: the point is the code path, not the picture
  (void)trace::timeline_svg(t, opt);
}

void use_kineto(const trace::kineto::KinetoTrace& k) {
  (void)trace::summarize(k);
  use_trace(trace::kineto::to_trace(k));
}
}  // namespace

void chrome_trace(std::string_view data) { use_trace(trace::parse_chrome_trace(std::string(data), "fuzz-trace.json")); }

void kineto_trace(std::string_view data) { use_kineto(trace::kineto::parse_kineto(std::string(data), "fuzz-kineto.json")); }

void trace_file(std::string_view data) {
  const std::string path = scratch_dir() + "/trace.json.gz";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    FUZZ_CHECK(out.good(), "cannot write the scratch trace file");
  }
  const std::string text = trace::read_trace_bytes(path);
  if (trace::kineto::sniff_kineto(text)) use_kineto(trace::kineto::parse_kineto(text, path));
  else use_trace(trace::parse_chrome_trace(text, path));
}

}  // namespace tessel::fuzz
