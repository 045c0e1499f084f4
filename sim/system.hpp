// System: where a model runs. GPU (peak rate per dtype, memory, SMs, efficiency curves), node (GPUs per node,
// intra-node link), network (per-GPU NIC, latency, oversubscription above a pod). Parsed once from JSON with
// units in key names and converted here to SI (bytes, seconds, FLOP/s). Presets in sim/presets/, each number
// cited there. A Profile is a System whose efficiency numbers were fitted from measurements (calibrate).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/json_reader.hpp"
#include "sim/layout.hpp"

namespace tessel {

struct GemmTile {
  int m = 128, n = 128;
};

// The smallest memory efficiency a system file may give (gpu.efficiency.memory, gemm_memory).
inline constexpr double kMinMemoryEfficiency = 0.001;

// The kinds of work a measured profile may rate on their own (docs/calibration.md, "Per-op rates"): GEMMs,
// the attention core, the element-wise kinds (sim/cost/op.cpp maps the lowered ops to them; `memory` is
// element-wise work of no named kind) and communication. A profile's `gpu.kernels` gives the element-wise
// kinds' rates; its `host.contention` slows every kind apart when the host's cores are all busy.
enum class CostKind : std::uint8_t {
  gemm, attention, memory, norm, activation, softmax, cross_entropy, embedding, optimizer, glue, comm
};
inline constexpr int kCostKinds = 11;
const char* to_string(CostKind k);
inline constexpr int idx(CostKind k) { return static_cast<int>(k); }

// A measured rate forward and backward (0: not measured, the kind falls back to the System's general rate).
struct DirRate {
  double fwd = 0, bwd = 0;
  double get(bool backward) const { return backward ? bwd : fwd; }
};

// The tensor-core generation, where it changes what a cost is made of (gpu.arch; absent: other). Hopper's fp8
// GEMMs take only the TN layout, so an fp8 operand the backward reads transposed is quantized twice (a
// transposed copy); Blackwell reads either layout and alone runs MXFP8 (block-scaled) GEMMs (Transformer
// Engine's docs, low_precision_training: fp8_current_scaling and mxfp8).
enum class GpuArch { ampere, hopper, blackwell, other };

// The fused attention kernel's rate by key length and head dim, as a shape around `attention_efficiency`
// (gpu.efficiency.attention_curve): measured TFLOP/s at each sequence length (ascending) per head dim, forward
// and backward. attention_time multiplies the efficiency by rate(head dim, length) / rate(reference_head_dim,
// the longest length), log-linear between the points and the nearest point outside them; so `attention` is
// the long-sequence rate at the reference head dim and a calibrated profile keeps the shape. Empty: 1. A system
// file may name a built-in curve instead ("cudnn-h100", sim/curves/); system_to_json writes the curve out.
struct AttentionCurve {
  std::vector<double> seq;
  double reference_head_dim = 0;
  std::array<std::vector<double>, 2> head_dim;              // [0] forward, [1] backward, ascending
  std::array<std::vector<std::vector<double>>, 2> rate;     // [dir][head dim][seq], FLOP/s
  // The shape the rates were measured at, for the kernel's occupancy (cost::attention_wave_factor): every
  // point at `tokens` = batch x sequence and `hidden` = heads x head dim, causal or not per direction (0
  // tokens: not given, the rates taken as fully occupied).
  double tokens = 0, hidden = 0;
  std::array<bool, 2> causal{};
  std::string source;
  bool empty() const { return seq.empty(); }
};

struct GpuSpec {
  std::string name;
  GpuArch arch = GpuArch::other;
  // Dense peak FLOP/s per precision; 0 = not supported. Index by Precision (bf16, fp16, fp8, fp32).
  std::array<double, 4> peak_flops{};
  double tf32_flops = 0;       // for fp32 GEMMs with TF32 allowed (informational)
  double memory_bytes = 0;
  double memory_bw_Bps = 0;    // bytes/s, datasheet
  int sms = 0;
  // Efficiency model (see sim/cost/compute.hpp): GEMM time over candidate output tiles with tile and wave
  // quantization, a per-tile K overhead (prologue/epilogue), and a ceiling efficiency.
  double gemm_efficiency = 0.8;
  double gemm_efficiency_fp8 = 0;  // fp8 GEMMs' ceiling when measured apart (0: gemm_efficiency)
  double gemm_k_overhead = 64;  // elements of K added per tile for fill/drain
  std::vector<GemmTile> gemm_tiles{{256, 128}, {128, 128}, {128, 64}};
  double attention_efficiency = 0.5;  // fused (flash) attention: fraction of the matrix peak
  double memory_efficiency = 0.8;     // achieved fraction of memory_bw_Bps for element-wise kernels
  // The GEMMs' memory roofline as a fraction of memory_bw_Bps, when it differs from the element-wise kernels'
  // (0: memory_efficiency). A calibrated CPU profile: BLAS streams at the copy rate, the runtime's scalar
  // loops some 100x below it.
  double gemm_memory_efficiency = 0;
  double kernel_overhead_s = 4e-6;    // per-kernel launch and tail
  // Compute slowdown while communication overlaps it on the same GPU (NCCL kernels hold SMs and memory
  // bandwidth): a compute op progresses at 1 / (1 + overlap_slowdown) of its rate meanwhile. 0 = none.
  double overlap_slowdown = 0;
  // Measured per-kind rates (a calibrated profile's `gpu.kernels`; the presets measure none). Element-wise
  // kinds: bytes/s of the bytes the cost model charges that op (sim/workload.cpp), forward and backward (the
  // optimizer: fwd); 0: memory_bw_Bps * memory_efficiency. The attention core measured as one kernel: FLOP/s
  // of the flash path's executed count (F/2 forward, 2.5 F/2 backward), on either attention path; 0:
  // attention_efficiency of the peak (flash), the batched GEMMs and softmax (unfused). The GEMM classes:
  // time of the input- and weight-gradient GEMMs over the tile model's (transposed operands; the weight
  // gradient's bias sums where a runtime computes them beside it).
  std::array<DirRate, kCostKinds> kernel_Bps{};
  // AdamW's measured rate (bytes/s of 30 B a parameter) by the parameters one rank steps, ascending in
  // `params` (gpu.kernels.optimizer.params / by_params_GBps); empty: kernel_Bps[optimizer] prices every size.
  // Its state (parameter, gradient, two moments: 16 B a parameter) leaves the caches as a rank's share grows:
  // alone on a 2-core machine the bench's AdamW ran 12.3 GB/s at 0.5 Mi parameters and 9.95 GB/s at 3 Mi
  // (repetitions within 6%), a fifth apart, which one rate would split between a 4-rank and a 1-rank layout.
  std::vector<double> optimizer_params, optimizer_Bps;
  DirRate attention_flops{};
  double gemm_dgrad_factor = 1, gemm_wgrad_factor = 1;
  // A 16-bit (or fp8) GEMM writing an fp32 output over the same GEMM writing 16-bit: the weight gradient
  // accumulated into fp32 main grads (Megatron's gradient-accumulation fusion, --gradient-accumulation-fusion,
  // on by default: the wgrad GEMM adds into main_grad in fp32). 1: not measured (efficiency.gemm_fp32_out).
  double gemm_fp32_out = 1;
  // FlashAttention-2's rate over the fused attention kernel's (attention_efficiency: cuDNN's through Transformer
  // Engine, what NeMo runs), for a layout whose stack runs FA2 (Layout::flash_kernel: PyTorch's SDPA). Hopper:
  // 0.62, the FlashAttention-3 paper's H100 figures (efficiency.attention_fa2). 1: not told apart.
  double attention_fa2 = 1;
  AttentionCurve attention_curve;
  // Time multiplier per kind (1: none). Not a file key: the host model (sim/engine/host_model.hpp) prices a
  // step a second time with its contention here, for the moments every core is busy.
  std::array<double, kCostKinds> time_factor{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

  double peak(Precision p) const { return peak_flops[static_cast<int>(p)]; }
  bool fp8_transposed_copy() const { return arch != GpuArch::blackwell; }
  // Whether any element-wise kind has a measured rate (the lowering then prices the head's norm and loss apart).
  bool kind_rates() const;
};

// A link measured for one collective (node.collectives; 0 bandwidth: the node's link). A host's collectives
// have a second regime: past large_bytes (the message size the rates are charged on: 0 for none) the buffers
// leave the caches, and the bytes beyond it move at large_bw_Bps (sim/cost/comm.cpp, link_seconds).
struct LinkRate {
  double latency_s = 0, bw_Bps = 0;
  double large_bytes = 0, large_bw_Bps = 0;
};

struct NodeSpec {
  int gpus_per_node = 8;
  double intra_bw_Bps = 0;       // bytes/s per GPU per direction (NVLink/NVSwitch)
  double intra_latency_s = 0;
  double intra_efficiency = 0.8; // achieved bus-bandwidth fraction of intra_bw_Bps for large collectives
  // Per collective (index cost::Collective: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast,
  // send_recv), a measured latency per step and bus bandwidth inside the node, in place of the link above
  // (a calibrated profile: each collective of a CPU communicator runs its own code path).
  std::array<LinkRate, 6> collective{};
};

// The host that runs the ranks, when ranks share its cores (a CPU runtime: each rank a thread or a process).
// cores 0: no host model (a GPU per rank). Otherwise the event engine shares the cores among the ranks that
// compute (sim/engine/host_model.hpp): ranks beyond the cores time-share them, and each kind runs
// `contention` times slower when every core is busy than alone (memory and cache shared), linearly between.
struct HostSpec {
  int cores = 0;
  std::array<double, kCostKinds> contention{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
};

struct NetworkSpec {
  double nic_bw_Bps = 0;         // bytes/s per GPU per direction
  double latency_s = 0;
  double efficiency = 0.8;       // achieved fraction of nic_bw_Bps
  int pod_gpus = 0;              // GPUs with full bisection; 0 = the whole cluster
  double oversubscription = 1.0; // bandwidth divisor for traffic leaving a pod
};

// What interrupts a job and what a restart costs (the optional "reliability" object; docs/goodput.md).
// Failures of GPUs and of nodes (host parts counted per node) are independent Poisson processes, so their
// rates add over the job's GPUs and nodes; a term is absent when its MTBF is 0.
struct ReliabilitySpec {
  double gpu_mtbf_s = 0;          // mean time between failures of one GPU
  double node_mtbf_s = 0;         // of one node
  double restart_overhead_s = 0;  // detection, rescheduling and warm-up of a restart (the load is computed)
};

// The checkpoint path (the optional "storage" object; docs/goodput.md).
struct StorageSpec {
  double node_write_bw = 0;  // bytes/s one node writes to the checkpoint file system
  double node_read_bw = 0;   // bytes/s one node reads from it
  double aggregate_bw = 0;   // the file system's cap over all nodes, bytes/s; 0: none
  double d2h_bw = 0;         // bytes/s of one GPU's device-to-host copy
  bool async = false;        // asynchronous saves: only the device-to-host copy blocks training
};

// How far this system's predictions have been from measurement: the mean absolute step-time error over the
// published rows validate scores on this hardware class (docs/validation.md), or a calibration's held-out error.
// Printed beside every step time so that a reader sees how sure the number is.
struct ErrorBand {
  std::string hardware_class;  // "A100", "Hopper": the rows it was measured on
  double step_pct = 0;         // mean |predicted step / measured step - 1| x 100
  int rows = 0;                // rows behind it
  std::string basis;           // where the figure comes from, in words
  // What the rows are, as the printed band names them (key "rows_of"; empty: "rows of published.json"). A
  // profile from `calibrate --closed-loop`: the held-out layouts it was checked on, on its own host.
  std::string rows_of;
};

struct System {
  std::string name;
  GpuSpec gpu;
  NodeSpec node;
  NetworkSpec net;
  HostSpec host;
  double memory_reserved_bytes = 0;  // CUDA context, NCCL buffers, library workspaces (fragmentation: Layout's)
  // A planning margin kept free beyond the predicted peak (--min-headroom, "min_headroom_GiB"): a layout fits
  // when peak + this <= capacity. Unlike the reserve it is not part of the peak; it is what the user asks to
  // keep spare against the model's error and allocator behaviour it does not see.
  double min_headroom_bytes = 0;
  int max_gpus = 1 << 20;            // largest cluster this preset may describe
  std::optional<ReliabilitySpec> reliability;
  std::optional<StorageSpec> storage;
  std::optional<ErrorBand> error_band;  // none: no validated rows on this hardware
  // The same for mixture-of-experts models ("moe_error_band"), from the MoE rows of published-moe.json: their
  // errors are not those of dense models on the same hardware, so neither band stands in for the other.
  std::optional<ErrorBand> moe_error_band;

  // The band a model's step times carry: the MoE band for a mixture-of-experts model, else the dense one.
  const std::optional<ErrorBand>& step_band(bool moe) const { return moe ? moe_error_band : error_band; }
  // A refit profile's: the base's validated bands do not hold for it, unknown until it is measured.
  void drop_error_bands() {
    error_band.reset();
    moe_error_band.reset();
  }
};

System parse_system(const Json& j, const std::string& where);
// {"class", "step_pct", "rows", "basis"}, or null without a band.
Json error_band_to_json(const std::optional<ErrorBand>& b);
Json system_to_json(const System& s);
// A preset name ("dgx-a100") or a path to a JSON file; InputError lists the presets otherwise.
System load_system(const std::string& name_or_path);
std::vector<std::string> system_preset_names();

// The system preset of a GPU by its name ("NVIDIA A100 SXM 80GB" as a paper writes it, "NVIDIA H200" as the
// CUDA driver reports it); nullopt when no preset describes that GPU. A GPU of several node presets maps to
// its multi-GPU node (published runs and the runtime's devices are in such nodes).
std::optional<std::string> system_preset_for_gpu(const std::string& gpu);
// The same, for a published row: InputError "row <row_id>: hardware.gpu ... matches no system preset" with
// the presets known.
std::string system_for_gpu(const std::string& gpu, const std::string& row_id);

}  // namespace tessel
