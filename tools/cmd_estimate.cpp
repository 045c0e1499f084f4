// tessel estimate: the analytical step time, throughput, communication and memory of one layout.
#include <iostream>

#include "sim/estimate.hpp"
#include "tools/commands.hpp"
#include "tools/format.hpp"
#include "tools/spec_args.hpp"

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
}  // namespace

int estimate(const Args& args) {
  auto opts = cli::spec_options();
  opts.push_back({"--json", false, "print one JSON document"});
  cli::CommandLine cl("estimate", args, opts, 0);
  if (cl.print_help()) return 0;
  const cli::Specs s = cli::read_specs(cl);
  const Estimate e = tessel::estimate(s.model, s.layout, s.system, s.gpus);
  if (cl.flag("--json")) {
    Json j = estimate_to_json(e);
    j["model"] = model_to_json(s.model);
    j["params"] = s.model.total_params();
    j["system"] = s.system.name;
    j["tool"] = std::string("tessel ") + TESSEL_VERSION;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << s.model.name << ", " << params_text(s.model.total_params()) << ", on " << s.gpus << " x "
            << s.system.gpu.name << " (" << s.system.name << ")\n"
            << "layout: " << s.layout.describe() << ", global batch " << s.layout.global_batch << ", "
            << e.microbatches << " micro-batches per pipeline, seq " << s.model.seq_len << "\n\n";
  std::vector<std::vector<std::string>> rows = {
      {"metric", "value"},
      {"step time", fmt::seconds(e.step_s)},
      {"tokens/s", fmt::si(e.tokens_per_s, "tokens/s")},
      {"model TFLOP/s/GPU", fmt::rate(e.model_tflops_per_gpu)},
      {"hardware TFLOP/s/GPU (this recompute)", fmt::rate(e.hw_tflops_per_gpu)},
      {"TFLOP/s/GPU, Narayanan eq. 3 (full recompute)", fmt::rate(e.tflops_eq3_per_gpu)},
      {"MFU / HFU", fmt::pct(e.mfu) + " / " + fmt::pct(e.hfu) + " of " +
                        fmt::fixed(s.system.gpu.peak(s.layout.precision) / 1e12, s.system.gpu.peak(s.layout.precision) < 100e12 ? 1 : 0) + " TFLOP/s (" +
                        to_string(s.layout.precision) + " peak)"},
      {"pipeline bubble (idle)", fmt::pct(e.bubble_fraction)},
      {"compute (busiest rank)", fmt::seconds(e.compute_s)},
      {"TP comm (exposed)", fmt::seconds(e.tp_comm_s) + " (" + fmt::seconds(e.tp_exposed_s) + ")"},
      {"CP comm (exposed)", fmt::seconds(e.cp_comm_s) + " (" + fmt::seconds(e.cp_exposed_s) + ")"},
      {"PP comm (exposed)", fmt::seconds(e.pp_comm_s) + " (" + fmt::seconds(e.pp_exposed_s) + ")"},
      {"DP comm (exposed)", fmt::seconds(e.dp_comm_s) + " (" + fmt::seconds(e.dp_exposed_s) + ")"},
      {"compute lost to overlapped comm", fmt::seconds(e.overlap_slowdown_s)},
      {"optimizer step", fmt::seconds(e.optimizer_s)},
  };
  std::cout << fmt::table(rows) << "\n";
  if (s.layout.zero_stage == 3 && !s.layout.overlap_param_gather)
    std::cout << "note: ZeRO-3 prefetches each layer's forward all-gather behind the previous layer's compute "
                 "(DeepSpeed's prefetch, modelled whatever --no-overlap says: it sets Megatron's bucket overlap)\n\n";
  std::vector<std::vector<std::string>> mem = {
      {"pp rank", "weights", "grads", "optimizer", "activations", "extras", "reserved", "total", "of capacity"}};
  for (const auto& m : e.memory)
    mem.push_back({std::to_string(m.rank), fmt::gib(m.weights_bytes), fmt::gib(m.grads_bytes), fmt::gib(m.optimizer_bytes),
                   fmt::gib(m.activations_bytes), fmt::gib(m.extras_bytes + m.zero3_gather_bytes + m.recompute_transient_bytes), fmt::gib(m.reserved_bytes),
                   fmt::gib(m.total()), fmt::pct(m.total() / e.capacity_bytes)});
  std::cout << "memory per GPU by pipeline rank:\n" << fmt::table(mem);
  std::cout << "peak " << fmt::gib(e.peak_memory_bytes) << " on pipeline rank " << e.peak_rank << " of "
            << fmt::gib(e.capacity_bytes) << (e.fits ? " (fits)" : " (DOES NOT FIT)") << "\n";
  return 0;
}

}  // namespace tessel::cmd
