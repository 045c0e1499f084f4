// What a training run reports, on either runtime (`tessel run` prints it, as lines or as one JSON
// document: docs/runtime.md): each step's loss, gradient norm and time, every rank's memory, and the
// recovery checkpoints it wrote or resumed from.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/comm/comm.hpp"

namespace tessel::rt {

struct StepRecord {
  int step = 0;             // 1-based, as printed: a resumed run's first step is its checkpoint's step + 1
  double loss = 0;          // mean token cross-entropy over the global batch
  double grad_norm = 0;     // global, before clipping
  double seconds = 0;       // wall time of the step (the CPU runtime: the slowest rank's)
  double tokens_per_s = 0;  // global batch x sequence length / seconds
  std::optional<double> aux_loss;  // MoE: the load-balancing loss (coefficient included), not in `loss`
  // The CPU runtime, summed over its ranks (runtime/host_sched.hpp): CPU seconds, and seconds runnable but
  // waiting for a core.
  std::optional<double> cpu_s, run_delay_s;
};

// One rank's memory in bytes, as its runtime counts it; a field the runtime does not count is absent.
struct RankMemory {
  int rank = 0;
  // Between steps: parameters (and their bf16 copies on CUDA), gradients, AdamW moments; this rank's
  // shards under ZeRO.
  std::int64_t parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;
  // CPU runtime: the peak of activations held for the backward (Recorder), and the peak of the state
  // above during the step (StateMemory::peak: ZeRO's gathered parameters and full gradients).
  std::optional<std::int64_t> peak_activation_bytes, peak_state_bytes;
  // CUDA runtime: the caching allocator's peak in use and what it reserved from the device.
  std::optional<std::int64_t> device_peak_bytes, device_reserved_bytes;
};

// Collective over `world` (host buffers): every rank's entry, in world-rank order, on every rank.
std::vector<RankMemory> gather_rank_memory(Comm& world, const RankMemory& mine);

}  // namespace tessel::rt
