// --system, --min-headroom and --gpus-per-domain: the system a planning command prices with, the memory margin it
// must keep, and how the job's ranks fill its NVLink domains.
#pragma once

#include <string>

#include "sim/system.hpp"
#include "tools/cli.hpp"

namespace tessel::cli {

// The --system preset or file (fallback when absent), with --min-headroom GiB as its planning margin (it
// replaces the file's min_headroom_GiB) and --gpus-per-domain as its node size (the job's share of each).
System read_system(const CommandLine& cl, const std::string& fallback);

inline constexpr const char* kMinHeadroomHelp =
    "GiB to keep free beyond the predicted peak: a layout fits when peak + this <= the GPU's memory [0]";
inline constexpr const char* kFragmentationHelp =
    "memory the allocator holds beyond the tensors, as a fraction of what a step allocates and frees (activations, "
    "extras, gathered weights, recompute buffers), 0 to 1 (stacks: 0.10 PyTorch's caching allocator, 0.05 with "
    "expandable segments; docs/stacks.md) [0, or the stack's]";
inline constexpr const char* kFp8ParamGatherHelp =
    "fp8 primary weights (Megatron-Core's --fp8-param-gather, NeMo's fp8_params): the GEMMs' weights kept in fp8 "
    "instead of 16-bit plus the cached fp8 cast, and all-gathered in fp8 by the distributed optimizer; needs "
    "--precision fp8 and --zero 1 or more [off, or the stack's: megatron-bridge-2025 on]";
inline constexpr const char* kNoFp8ParamGatherHelp =
    "16-bit weights with Transformer Engine's cached fp8 cast, over a stack's or recipe's fp8 primary weights";
inline constexpr const char* kGpusPerDomainHelp =
    "GPUs of the job in each NVLink domain (node), ranks filling them in order; fewer than the system has leaves "
    "the rest to other jobs, as Slurm's --segment does on GB200 NVL72 (16 trays: 64 of 72) [all of them]";

}  // namespace tessel::cli
