// The CPU runtime's heap: freed blocks stay in the process.
//
// glibc hands every block above its mmap threshold (128 KiB at first, raised as such blocks are freed) to the
// kernel as its own mapping and unmaps it on free, and trims the top of a heap back to the kernel past 128 KiB
// free. The runtime allocates and frees its activations, gradients and communication buffers every op, so a
// step re-faulted megabytes of fresh zero pages, and ranks that are threads of one process mapped and unmapped
// under one address-space lock: on a 2-core machine, dp2 ZeRO-1 at micro-batch 2 (a 4-layer, 256-wide GPT)
// lost 8% of its step there (docs/runtime.md). keep_freed_memory() raises both limits once, before any rank
// starts: blocks up to glibc's largest threshold (32 MiB on 64-bit) come from the heap and go back to it, and
// sets the top pad to a thread arena's heap (64 MiB), without which glibc unmaps a thread's heap when it
// empties.
// PyTorch's CPU tuning guide gives the same reason for running training under a caching allocator (jemalloc,
// tcmalloc).
#pragma once

namespace tessel::rt {

// Idempotent; a no-op where the C library is not glibc.
void keep_freed_memory();

}  // namespace tessel::rt
